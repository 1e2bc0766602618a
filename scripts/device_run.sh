#!/usr/bin/env bash
# GPU runs on the device machine, in parts that each fit one call (at most 10 minutes). Each stage has
# its own time limit so a slow one cannot starve the rest; logs and tables go to $OUT (at most 8 files
# come back).
#   bash scripts/device_run.sh measure  ncu_check, whole-generation rates (both clocks), the measurement tests,
#                                       one decode step profiled and counted
#   bash scripts/device_run.sh full     ncu_check and an L1 probe, the whole test suite, one decode step profiled
#   bash scripts/device_run.sh sweeps   tile sweeps by the one timing method, the app via its API
#   bash scripts/device_run.sh ladder   the fusion ladder: its tests, one decode step per rung next to PyTorch and
#                                       torch.compile, whole generations
#   bash scripts/device_run.sh record   the whole test suite, the ladder, every lesson recorded
#   bash scripts/device_run.sh app      whole generations, the app's endpoints through gradio_client
#   bash scripts/device_run.sh kernels  a sequence sweep, the kernel benchmark
#   bash scripts/device_run.sh prefill  linear, graph and model tests, the prefill linear sweep, whole generations,
#                                       the host time of eager launches
#   bash scripts/device_run.sh confirm  kernel, graph and model tests, the kernel benchmark, the read floor under decode
#                                       attention, host times (twice),
#                                       whole generations, the ladder
set -u
PART=${1:-measure}
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 GRADIO_ANALYTICS_ENABLED=False
LOG="$OUT/run.log"
stage() { echo; echo "== $(date +%T) $*"; } 
say() { stage "$@" | tee -a "$LOG"; }
tests_ran() {  # pytest's exit status, its closing line and its failures, from $OUT/gpu-tests.log
  echo "pytest exit $1" | tee -a "$LOG"; grep -E "passed|failed|error" "$OUT/gpu-tests.log" | tail -n 3 | tee -a "$LOG"
  grep -E "^(FAILED|ERROR)" "$OUT/gpu-tests.log" | head -n 20 | tee -a "$LOG"
}

say environment
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a "$LOG"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, '| triton', triton.__version__, '| transformers', transformers.__version__)" | tee -a "$LOG"
python3 -c "import sys; sys.path.insert(0, 'scripts'); from device_app_check import gpt2_shaped; from pathlib import Path; gpt2_shaped(Path('/tmp/gpt2-shaped'))" >/dev/null 2>&1

if [ "$PART" = measure ]; then
  say "traffic models against hardware counters (ncu)"
  timeout "${T_NCU:-200}" python3 -m kernels.ncu_check --dtype bf16 --out "$OUT/ncu.csv" --json "$OUT/ncu_h200.json" 2>&1 \
    | grep -v "^==PROF==" | tail -n 60 | tee -a "$LOG"
  say "whole generations: tokens/s against transformers and the PyTorch CUDA-graph loop; both clocks"
  timeout "${T_GEN:-200}" python3 benchmarks/generation.py --repeats 2 2>&1 | tee "$OUT/generation.md" | tail -n 16 | tee -a "$LOG"
  say "measurement tests on the GPU"
  timeout "${T_TESTS:-150}" python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_launches.py tests/test_graphs.py \
    tests/test_timing.py tests/test_kv_write.py tests/test_traffic.py tests/test_metrics.py tests/test_bench.py \
    tests/test_actions.py tests/test_model.py >"$OUT/gpu-tests.log" 2>&1
  tests_ran $?
  say "one decode step, GPT-2-small-shaped: profiled at spread positions, kernels counted; eager and CUDA graph"
  timeout "${T_PROFILE:-120}" python3 -m explorer.bench generate --model /tmp/gpt2-shaped --new-tokens 128 --graph both \
    --cache on --profile --out "$OUT/generate.csv" 2>&1 | grep -v "it/s\]" | grep -v "^\[" | tail -n 60 | tee -a "$LOG"
elif [ "$PART" = full ]; then
  say "traffic models against hardware counters (ncu), and where the tiled kernels' re-reads stop"
  timeout "${T_NCU:-120}" python3 -m kernels.ncu_check --dtype bf16 --out "$OUT/ncu.csv" --json "$OUT/ncu_h200.json" 2>&1 \
    | grep -v "^==PROF==" | tail -n 40 | tee -a "$LOG"
  timeout 90 /usr/local/cuda/bin/ncu --cache-control all --clock-control none --profile-from-start off --csv \
    --metrics "regex:l1tex__t_sectors_pipe_lsu_mem_global_op_(ld|ldgsts).*sum$,lts__t_sectors_srcunit_tex_op_read.sum" \
    python3 scripts/ncu_l1_probe.py > "$OUT/ncu_l1.csv" 2>&1; echo "l1 probe exit $?" | tee -a "$LOG"
  grep -v "^==PROF==" "$OUT/ncu_l1.csv" | cut -d, -f5,13- | tail -n 40 | tee -a "$LOG"
  say "the whole test suite on the GPU"
  timeout "${T_TESTS:-330}" python3 -m pytest -q -n 16 -p no:cacheprovider tests >"$OUT/gpu-tests.log" 2>&1
  tests_ran $?
  say "one decode step, GPT-2-small-shaped: profiled at spread positions, kernels counted; eager and CUDA graph"
  timeout "${T_PROFILE:-100}" python3 -m explorer.bench generate --model /tmp/gpt2-shaped --new-tokens 128 --graph both \
    --cache on --profile --out "$OUT/generate.csv" 2>&1 | grep -v "it/s\]" | grep -v "^\[" | tail -n 50 | tee -a "$LOG"
elif [ "$PART" = sweeps ]; then
  for spec in "decode_attention B=1,H=12,T=8192,D=64 block_n=32,64,128;split_k=8,16,32,64;num_warps=2,4;num_stages=2,3" \
              "linear M=1024,K=768,N=3072 block_m=64,128;block_n=64,128,256;block_k=32,64;num_warps=4,8;num_stages=3,4" \
              "attention B=1,H=12,T=1024,D=64 block_m=64,128;block_n=32,64,128;num_warps=4,8;num_stages=2,3"; do
    set -- $spec
    say "tile sweep $1 $2 (CUDA-graph replays, inputs rotated past L2)"
    timeout "${T_SWEEP:-80}" python3 -m explorer.bench tiles --kernel "$1" --shape "$2" --grid "$3" --out "$OUT/sweep-$1.csv" 2>&1 \
      | grep -v "run/s\]" | head -n 14 | tee -a "$LOG"
  done
  say "the app, driven through gradio_client"
  timeout "${T_APP:-120}" python3 scripts/device_app_check.py 128 2>&1 | grep -v "Loading weights" | tee -a "$LOG" | tail -n 40
elif [ "$PART" = prefill ]; then
  say "linear (the persistent form on Hopper), graphs (greedy picks inside the replay) and the model on the GPU"
  timeout "${T_TESTS:-200}" python3 -m pytest -q -n 16 -p no:cacheprovider tests/test_linear.py tests/test_graphs.py \
    tests/test_model.py tests/test_launch.py >"$OUT/gpu-tests.log" 2>&1
  tests_ran $?
  say "prefill linear: the tile kernel and the persistent form's tiles next to cuBLAS"
  timeout "${T_SWEEP:-150}" python3 scripts/linear_sweep.py 2>&1 | tee "$OUT/linear.md" | tee -a "$LOG" | tail -n 3
  say "whole generations: tokens/s against transformers and the PyTorch CUDA-graph loop; both clocks"
  timeout "${T_GEN:-150}" python3 benchmarks/generation.py --repeats 3 2>&1 | tee "$OUT/generation.md" | tail -n 16 | tee -a "$LOG"
  say "host time of eager launches, and where it goes"
  timeout "${T_HOST:-90}" python3 scripts/host_profile.py --calls 2>&1 | tee "$OUT/host.md" | grep "^|" | tee -a "$LOG"
elif [ "$PART" = confirm ]; then
  say "kernels, bound launches, graphs and the model on the GPU"
  timeout "${T_TESTS:-200}" python3 -m pytest -q -n 16 -p no:cacheprovider tests/test_decode_attention.py \
    tests/test_launch.py tests/test_layer_norm.py tests/test_linear.py tests/test_fused_linear.py tests/test_graphs.py \
    tests/test_model.py tests/test_ladder.py tests/test_launches.py >"$OUT/gpu-tests.log" 2>&1
  tests_ran $?
  say "kernels next to PyTorch: device time (cold L2) and eager"
  timeout "${T_BENCH:-150}" python3 -m kernels.bench --only ${BENCH:-decode layer_norm linear} --out "$OUT/bench.md" 2>&1 \
    | tail -n 24 | tee -a "$LOG"
  say "the floor under decode attention: a kernel that only reads K and V, next to SDPA and ours"
  timeout "${T_FLOOR:-90}" python3 scripts/read_floor.py 2>&1 | tee "$OUT/floor.md" | tail -n 32 | tee -a "$LOG"
  for run in 1 2; do  # twice: the host's own speed drifts between minutes
    say "host time of eager launches ($run)"
    timeout "${T_HOST:-60}" python3 scripts/host_profile.py 2>&1 | tee "$OUT/host$run.md" | grep -E "^\||eager decode" \
      | tee -a "$LOG"
  done
  say "whole generations: tokens/s against transformers and the PyTorch CUDA-graph loop; both clocks"
  timeout "${T_GEN:-150}" python3 benchmarks/generation.py --repeats 3 2>&1 | tee "$OUT/generation.md" | tail -n 16 | tee -a "$LOG"
  say "one decode step per rung, next to PyTorch"
  timeout "${T_LADDER:-120}" python3 benchmarks/ladder.py --no-compile 2>&1 | tee "$OUT/ladder.md" | tail -n 12 | tee -a "$LOG"
elif [ "$PART" = ladder ]; then
  say "the fusion ladder's tests on the GPU"
  timeout "${T_TESTS:-200}" python3 -m pytest -q -n 16 -p no:cacheprovider tests/test_fused_linear.py \
    tests/test_decode_attention.py tests/test_elementwise.py tests/test_ladder.py tests/test_graphs.py \
    tests/test_launches.py tests/test_model.py tests/test_linear.py tests/test_kv_write.py >"$OUT/gpu-tests.log" 2>&1
  tests_ran $?
  say "one decode step per rung, next to PyTorch and torch.compile"
  timeout "${T_LADDER:-200}" python3 benchmarks/ladder.py 2>&1 | tee "$OUT/ladder.md" | tail -n 14 | tee -a "$LOG"
  say "whole generations: tokens/s against transformers and the PyTorch CUDA-graph loop; both clocks"
  timeout "${T_GEN:-150}" python3 benchmarks/generation.py --repeats 2 2>&1 | tee "$OUT/generation.md" | tail -n 16 | tee -a "$LOG"
elif [ "$PART" = record ]; then
  say "the whole test suite on the GPU"
  timeout "${T_TESTS:-240}" python3 -m pytest -q -n 16 -p no:cacheprovider tests >"$OUT/gpu-tests.log" 2>&1
  tests_ran $?
  say "one decode step per rung, next to PyTorch and torch.compile"
  timeout "${T_LADDER:-150}" python3 benchmarks/ladder.py 2>&1 | tee "$OUT/ladder.md" | tail -n 12 | tee -a "$LOG"
  say "every lesson's GPU job, recorded"
  timeout "${T_RECORD:-150}" python3 scripts/record_lessons.py --out "$OUT/lessons_h200.json" 2>&1 | tail -n 20 | tee -a "$LOG"
elif [ "$PART" = app ]; then
  say "whole generations: tokens/s against transformers and the PyTorch CUDA-graph loop; both clocks"
  timeout "${T_GEN:-150}" python3 benchmarks/generation.py --repeats 2 2>&1 | tee "$OUT/generation.md" | tail -n 16 | tee -a "$LOG"
  say "the app, driven through gradio_client"
  timeout "${T_APP:-240}" python3 scripts/device_app_check.py 256 2>&1 | grep -v "Loading weights" | tee "$OUT/app.log" \
    | grep -E "^###|tokens/s|step p50|launches|peak|fusion|rung|Error|error" | tee -a "$LOG"
elif [ "$PART" = final ]; then
  say "the whole test suite on the GPU"
  timeout "${T_TESTS:-300}" python3 -m pytest -q -n 16 -p no:cacheprovider tests >"$OUT/gpu-tests.log" 2>&1
  tests_ran $?
  say "whole generations: tokens/s against transformers and the PyTorch CUDA-graph loop; both clocks"
  timeout "${T_GEN:-150}" python3 benchmarks/generation.py --repeats 2 2>&1 | tee "$OUT/generation.md" | tail -n 16 | tee -a "$LOG"
  say "the app, driven through gradio_client"
  timeout "${T_APP:-120}" python3 scripts/device_app_check.py 256 2>&1 | grep -v "Loading weights" \
    | grep -E "^###|tokens/s|step p50|launches|peak" | tee -a "$LOG"
else
  say "cache on/off, 1024 new tokens, bundled model, both backends"
  timeout "${T_SEQ:-200}" python3 -m explorer.bench sequence --prompt-lengths 1 --new-tokens 1024 --out "$OUT/seq.csv" 2>&1 \
    | grep -v "it/s\]" | tail -n 12 | tee -a "$LOG"
  say "kernel benchmark against PyTorch"
  timeout "${T_KERNELS:-150}" python3 -m kernels.bench --out "$OUT/kernels.md" 2>&1 | tail -n 32 | tee -a "$LOG"
fi
say done
