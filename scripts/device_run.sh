#!/usr/bin/env bash
# GPU runs on the device machine, in two parts that each fit one call (see the device notes in
# benchmarks/RESULTS.md). Each stage has its own time limit so a slow one cannot starve the rest;
# logs and tables go to $OUT (at most 8 files come back).
#   bash scripts/device_run.sh tests   GPU test suite, kernel benchmark, whole-generation tokens/s
#   bash scripts/device_run.sh decode  one decode step profiled, the sequence sweep, the app via its API
#   bash scripts/device_run.sh sweeps  graph tests, one decode step profiled, decode-attention and linear tile sweeps
set -u
PART=${1:-tests}
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 GRADIO_ANALYTICS_ENABLED=False
stage() { echo; echo "== $(date +%T) $*"; }

stage environment
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, '| triton', triton.__version__, '| transformers', transformers.__version__)"

if [ "$PART" = tests ]; then
  stage "GPU tests (compiled kernels, bf16/fp16/fp32, CUDA graphs)"
  timeout "${T_TESTS:-170}" python3 -m pytest -q -n 16 -p no:cacheprovider tests/test_layer_norm.py tests/test_linear.py \
    tests/test_attention.py tests/test_decode_attention.py tests/test_config.py tests/test_model.py tests/test_graphs.py tests/test_kv_write.py \
    >"$OUT/gpu-tests.log" 2>&1
  echo "pytest exit $?"; grep -E "passed|failed|error" "$OUT/gpu-tests.log" | tail -n 3
  grep -E "^(FAILED|ERROR)" "$OUT/gpu-tests.log" | head -n 15

  stage "kernel benchmark"
  timeout "${T_KERNELS:-100}" python3 -m kernels.bench --out "$OUT/kernels.md" 2>&1 | tail -n 32

  stage "generation tokens/s"
  timeout "${T_GEN:-120}" python3 benchmarks/generation.py --repeats 2 2>&1 | tee "$OUT/generation.md" | tail -n 12
elif [ "$PART" = sweeps ]; then
  python3 -c "import sys; sys.path.insert(0, 'scripts'); from device_app_check import gpt2_shaped; from pathlib import Path; gpt2_shaped(Path('/tmp/gpt2-shaped'))" >/dev/null 2>&1
  stage "CUDA graph and profiling tests" | tee "$OUT/run.log"
  timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_graphs.py 2>&1 | tail -n 3 | tee -a "$OUT/run.log"
  stage "one decode step, GPT-2-small-shaped, profiled; eager and CUDA graph" | tee -a "$OUT/run.log"
  timeout 90 python3 -m explorer.bench generate --model /tmp/gpt2-shaped --new-tokens 64 --graph both --cache on \
    --profile --out "$OUT/generate.csv" 2>&1 | grep -v "it/s\]" | grep -v "^\[" | tee -a "$OUT/run.log"
  stage "tile sweep, decode attention B=1 H=12 T=8192 D=64" | tee -a "$OUT/run.log"
  timeout 90 python3 -m explorer.bench tiles --kernel decode_attention --shape B=1,H=12,T=8192,D=64 \
    --grid "block_n=32,64,128;split_k=8,16,32,64;num_warps=2,4;num_stages=2,3" --out "$OUT/sweep-decode.csv" 2>&1 \
    | grep -v "run/s\]" | head -n 24 | tee -a "$OUT/run.log"
  stage "tile sweep, linear M=1024 K=768 N=3072" | tee -a "$OUT/run.log"
  timeout 100 python3 -m explorer.bench tiles --kernel linear --shape M=1024,K=768,N=3072 \
    --grid "block_m=64,128;block_n=64,128,256;block_k=32,64;num_warps=4,8;num_stages=3,4" --out "$OUT/sweep-linear.csv" 2>&1 \
    | grep -v "run/s\]" | head -n 24 | tee -a "$OUT/run.log"
else
  python3 -c "import sys; sys.path.insert(0, 'scripts'); from device_app_check import gpt2_shaped; from pathlib import Path; gpt2_shaped(Path('/tmp/gpt2-shaped'))" >/dev/null 2>&1
  stage "one decode step, GPT-2-small-shaped, profiled; eager and CUDA graph" | tee "$OUT/run.log"
  timeout "${T_PROFILE:-120}" python3 -m explorer.bench generate --model /tmp/gpt2-shaped --new-tokens 128 --graph both \
    --profile --out "$OUT/generate.csv" 2>&1 | grep -v "it/s\]" | grep -v "^\[" | tee -a "$OUT/run.log"

  stage "cache on/off, 1024 new tokens, bundled model, both backends" | tee -a "$OUT/run.log"
  timeout "${T_SEQ:-200}" python3 -m explorer.bench sequence --prompt-lengths 1 --new-tokens 1024 --out "$OUT/seq.csv" 2>&1 \
    | grep -v "it/s\]" | tee -a "$OUT/run.log" | tail -n 12

  stage "the app, driven through gradio_client" | tee -a "$OUT/run.log"
  timeout "${T_APP:-90}" python3 scripts/device_app_check.py 128 2>&1 | grep -v "Loading weights" | tee -a "$OUT/run.log" \
    | grep -E "^###|tokens/s|first token|warm-up|launches|ms/token|bandwidth|text:" | head -n 40
fi
stage done
