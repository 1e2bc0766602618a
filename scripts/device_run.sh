#!/usr/bin/env bash
# One call on the GPU machine (see the device notes in benchmarks/RESULTS.md): the GPU test suite,
# the kernel benchmark, whole-generation tokens/s, the tile and sequence sweeps, and the app driven
# through its API. Each stage has its own time limit so a slow one cannot starve the rest; logs and
# tables go to $OUT (at most 8 files come back).
set -u
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 GRADIO_ANALYTICS_ENABLED=False
stage() { echo; echo "== $(date +%T) $*"; }

stage environment
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, '| triton', triton.__version__, '| transformers', transformers.__version__)"

stage "GPU tests (compiled kernels, bf16/fp16/fp32)"
timeout "${T_TESTS:-130}" python3 -m pytest -q -n 16 -p no:cacheprovider tests/test_layer_norm.py tests/test_linear.py \
  tests/test_attention.py tests/test_decode_attention.py tests/test_config.py tests/test_model.py >"$OUT/gpu-tests.log" 2>&1
echo "pytest exit $?"; grep -E "passed|failed|error" "$OUT/gpu-tests.log" | tail -n 3
grep -E "^(FAILED|ERROR)" "$OUT/gpu-tests.log" | head -n 15

stage "kernel benchmark"
timeout "${T_KERNELS:-90}" python3 -m kernels.bench --out "$OUT/kernels.md" 2>&1 | tail -n 32

stage "generation tokens/s"
timeout "${T_GEN:-60}" python3 benchmarks/generation.py --repeats 2 2>&1 | tee "$OUT/generation.md" | tail -n 9

stage "tile sweep, attention at GPT-2 shape" | tee "$OUT/run.log"
timeout "${T_SWEEP:-45}" python3 -m explorer.bench tiles --kernel attention --shape B=1,H=12,T=1024,D=64 \
  --grid "block_m=64,128;block_n=32,64,128;num_warps=4,8;num_stages=2,3" --out "$OUT/sweep.csv" 2>&1 \
  | grep -v "it/s\]" | tee -a "$OUT/run.log" | tail -n 8

stage "cache on/off, 1024 new tokens, bundled model" | tee -a "$OUT/run.log"
timeout "${T_SEQ:-40}" python3 -m explorer.bench sequence --prompt-lengths 1 --new-tokens 1024 --out "$OUT/seq.csv" 2>&1 \
  | grep -v "it/s\]" | tee -a "$OUT/run.log" | tail -n 10

stage "the app, driven through gradio_client" | tee -a "$OUT/run.log"
timeout "${T_APP:-70}" python3 scripts/device_app_check.py 128 2>&1 | grep -v "Loading weights" | tee -a "$OUT/run.log" \
  | grep -E "^###|tokens/s|first token|warm-up|ms/token|bandwidth|text:" | head -n 40
stage done
