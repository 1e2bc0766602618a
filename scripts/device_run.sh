#!/usr/bin/env bash
# GPU runs on the device machine, in parts that fit one call (at most 10 minutes) together. Each stage has its
# own time limit so a slow one cannot starve the rest; logs and tables go to $OUT.
#   bash scripts/device_run.sh PART...  the parts in order:
#     h200:PART PART only where the GPU is an H200 (the matrix and the lessons' recordings are the H200's), else a line
#               saying it was skipped
#     page      what a visitor waits for through the server, and the estimates shown (benchmarks/page.py;
#               PAGE_ARGS=--no-handler leaves out the same jobs timed in-process; PAGE_ONLY=lesson,ladder only
#               the rows whose names hold one of those words)
#     page:N    the same with at most N warm-up helpers (0: none), its log and table in page-N.log and page-N.json
#     stream    when each streamed update leaves the server (experiments/stream_check.py)
#     record    the lessons and the CPU's default jobs recorded for visitors without a GPU
#     lessons:A,B those lessons recorded into the shipped recording, each labelled with this run (the rest kept)
#     matrix    Generate at the matrix of settings the GPU time model is fitted on (scripts/record_matrix.py; about
#               9 minutes: a call of its own)
#     sweeps    every kernel's tile sweep at its default GPU shape (scripts/record_sweeps.py)
#     tests:N   the whole test suite under pytest -n 16, N times in a row (Triton's cache kept in .triton-cache,
#               so a later call on the same warm machine compiles nothing again); with EXPLORER_GPU_STANDS_FOR=120
#               (or 80) set, the GPU stands for that one. Failures by name in the log, each run's junit XML in $OUT
#     occupancy the programs per SM kernels.occupancy computes for every launch, beside the driver's own count
#     timeline  every rung's decode step on the SMs, both bundled models (scripts/record_timeline.py)
#     ahead     a tile sweep's kernels compiled ahead on 0 and 8 threads and in 4, 8 and 15 processes, each from an
#               empty Triton cache (experiments.compile_ahead), and the GPU tests of kernels.ahead and the warm-up's
#               compile ahead
#     page-ahead the page with the warm-up's compile ahead on (EXPLORER_COMPILE_AHEAD=1), in page-ahead.log/json
#     megaprof  where the megakernel rung's step spends its time, operation by operation (experiments.mega_profile)
#     mega      the megakernel rung's variants beside the overlap rung, GPT-2 small's and SmolLM2's shapes
#               (experiments.one_launch_sweep; MEGA_ARGS="--batch 8" at batch 8)
#     megabatch the megakernel rung beside overlap and our torch backend at batch 8, both families, and whole
#               generations of 256 tokens on both rungs (benchmarks.ladder --batch 8, benchmarks.generation)
#     ladder    the fusion ladder alone, GPT-2 small's shape (benchmarks.ladder --no-compile)
#     bench     the fusion ladder next to PyTorch and torch.compile, whole generations
#     ops       every operation's kernels next to PyTorch (python -m benchmarks.operations)
#     ncu       the traffic models against the hardware counters (python -m kernels.ncu_check under ncu)
#     host      each launch's host time next to PyTorch's, and an eager decode step's (experiments.host_profile)
#     eager     eager steps' device and host time, run against run, and where the host's goes (experiments.eager_steps)
#     grouped   grouped decode attention's tile plan against its neighbours, B=8 and B=1 (experiments.grouped_plan)
# The page and the recording each start from an empty Triton cache: their first runs compile, as on a new machine.
set -u
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 GRADIO_ANALYTICS_ENABLED=False
LOG="$OUT/run.log"
say() { echo; echo "== $(date +%T) $*" | tee -a "$LOG"; }

say environment
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$LOG"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
python3 -c "import torch, triton, transformers, gradio; print('torch', torch.__version__, '| triton', triton.__version__,
'| transformers', transformers.__version__, '| gradio', gradio.__version__)" | tee -a "$LOG"

for PART in "${@:-page}"; do
  case "$PART" in
  h200:*)
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
      OUT="$OUT" bash "$0" "${PART#h200:}"
    else
      say "skipped ${PART#h200:}: this GPU is not an H200"
    fi ;;
  stream)
    say "streamed updates, raw and through gradio_client"
    timeout 150 python3 -m experiments.stream_check --tokens 256 2>&1 | grep -v Warning | tail -n 12 | tee -a "$LOG" ;;
  page)
    say "the page, timed through the server"
    TRITON_CACHE_DIR=$(mktemp -d) timeout 480 python3 benchmarks/page.py ${PAGE_ARGS:-} ${PAGE_ONLY:+--only "$PAGE_ONLY"} --out "$OUT/page.json" > "$OUT/page.log" 2>&1; echo "exit $?" | tee -a "$LOG"
    tail -n 24 "$OUT/page.log" | tee -a "$LOG" ;;
  page:*)
    N=${PART#page:}
    say "the page, timed through the server, with at most $N warm-up helpers"
    EXPLORER_WARM_HELPERS=$N TRITON_CACHE_DIR=$(mktemp -d) timeout 480 python3 benchmarks/page.py ${PAGE_ARGS:-} \
      ${PAGE_ONLY:+--only "$PAGE_ONLY"} --out "$OUT/page-$N.json" > "$OUT/page-$N.log" 2>&1; echo "exit $?" | tee -a "$LOG"
    grep -E "helper in|kernels ahead|warm in|ready to serve|served after|within" "$OUT/page-$N.log" | tee -a "$LOG" ;;
  record)
    say "lessons and the CPU's default jobs, recorded"
    TRITON_CACHE_DIR=$(mktemp -d) timeout 420 python3 scripts/record_lessons.py 2>&1 | tail -n 12 | tee -a "$LOG"
    cp assets/recorded/lessons_h200.json assets/recorded/jobs_h200.json "$OUT/" 2>/dev/null ;;
  lessons:*)
    NAMES=${PART#lessons:}
    say "lessons $NAMES recorded into the shipped recording"
    TRITON_CACHE_DIR=$(mktemp -d) timeout "${LESSONS_S:-300}" python3 scripts/record_lessons.py --lessons ${NAMES//,/ } \
      --into assets/recorded/lessons_h200.json 2>&1 | tail -n 12 | tee -a "$LOG"
    cp assets/recorded/lessons_h200.json "$OUT/" 2>/dev/null ;;
  matrix)
    say "the matrix of settings for the GPU time model"
    TRITON_CACHE_DIR=$PWD/.triton-cache timeout "${MATRIX_S:-560}" python3 scripts/record_matrix.py --limit-s "${MATRIX_LIMIT_S:-470}" \
      > "$OUT/matrix.log" 2>&1; echo "exit $?" | tee -a "$LOG"
    grep -v Warn "$OUT/matrix.log" | tail -n 8 | tee -a "$LOG"
    cp assets/recorded/matrix_*.json "$OUT/" 2>/dev/null ;;
  sweeps)
    say "every kernel's tile sweep"
    TRITON_CACHE_DIR=$PWD/.triton-cache timeout "${SWEEPS_S:-240}" python3 scripts/record_sweeps.py > "$OUT/sweeps.log" 2>&1
    echo "exit $?" | tee -a "$LOG"
    grep -v Warn "$OUT/sweeps.log" | tail -n 10 | tee -a "$LOG"
    cp assets/recorded/sweeps_h200.json "$OUT/" 2>/dev/null ;;
  tests:*)
    for i in $(seq 1 "${PART#tests:}"); do
      say "the test suite, run $i"
      # -v: each test's outcome as it finishes, so a run its time limit stops still names its failures
      mkdir -p "$OUT/tests-$i"
      PYTEST_REPORT_DIR="$OUT/tests-$i" TRITON_CACHE_DIR=$PWD/.triton-cache timeout "${TESTS_S:-420}" python3 -m pytest -n 16 -v -p no:cacheprovider -rfE \
        --durations=30 --junitxml="$OUT/gpu-tests-$i.xml" tests > "$OUT/gpu-tests-$i.log" 2>&1
      echo "pytest exit $?" | tee -a "$LOG"
      grep -E "passed|failed|error" "$OUT/gpu-tests-$i.log" | tail -n 2 | tee -a "$LOG"
      grep -E "(FAILED|ERROR) tests/" "$OUT/gpu-tests-$i.log" | sed -E 's/^\[gw[0-9]+\] \[ *[0-9]+%\] //' | sort -u | head -n 30 | tee -a "$LOG"
      python3 scripts/test_report.py "$OUT/tests-$i" | tee -a "$LOG"
    done ;;
  timeline)
    say "a decode step on every SM, each rung"
    TRITON_CACHE_DIR=$PWD/.triton-cache timeout "${TIMELINE_S:-240}" python3 scripts/record_timeline.py > "$OUT/timeline.log" 2>&1
    echo "exit $?" | tee -a "$LOG"
    grep -v Warn "$OUT/timeline.log" | tail -n 14 | tee -a "$LOG"
    cp assets/recorded/timeline_*.json "$OUT/" 2>/dev/null ;;
  mega)
    say "the megakernel rung's variants beside the overlap rung"
    for FAMILY in gpt2 llama; do
      TRITON_CACHE_DIR=$PWD/.triton-cache timeout "${MEGA_S:-200}" python3 -m experiments.one_launch_sweep --rung megakernel \
        --family $FAMILY --replays 100 ${MEGA_ARGS:-} 2>&1 | grep -v Warn | tail -n 12 | tee -a "$LOG"
    done ;;
  ahead)
    say "a tile sweep's kernels compiled ahead, several at once"
    timeout "${AHEAD_S:-300}" python3 -m experiments.compile_ahead --threads ${AHEAD_THREADS:-0 8} \
      --processes ${AHEAD_PROCESSES:-4 8 15} 2>&1 | grep -v Warn | tee -a "$LOG"
    TRITON_CACHE_DIR=$(mktemp -d) timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_ahead.py \
      tests/test_warm.py 2>&1 | tail -n 12 | tee -a "$LOG" ;;
  page-ahead)
    say "the page, timed through the server, the warm-up compiling ahead"
    EXPLORER_COMPILE_AHEAD=1 TRITON_CACHE_DIR=$(mktemp -d) timeout 480 python3 benchmarks/page.py ${PAGE_ARGS:-} \
      ${PAGE_ONLY:+--only "$PAGE_ONLY"} --out "$OUT/page-ahead.json" > "$OUT/page-ahead.log" 2>&1; echo "exit $?" | tee -a "$LOG"
    grep -E "helper in|kernels ahead|warm in|ready to serve|served after|within" "$OUT/page-ahead.log" | tee -a "$LOG" ;;
  megaprof)
    for FAMILY in gpt2 llama; do
      say "the megakernel rung's step by operation, $FAMILY"
      TRITON_CACHE_DIR=$PWD/.triton-cache timeout "${MEGA_S:-150}" python3 -m experiments.mega_profile --family $FAMILY \
        ${MEGAPROF_ARGS:-} 2>&1 | grep -v Warn | tail -n 16 | tee -a "$LOG"
    done ;;
  megabatch)
    for FAMILY in gpt2 llama; do
      say "the megakernel rung at batch 8, $FAMILY"
      TRITON_CACHE_DIR=$PWD/.triton-cache timeout "${MEGA_S:-150}" python3 -m benchmarks.ladder --family $FAMILY --batch 8 \
        --rungs torch overlap megakernel --replays 100 2>&1 | grep -v Warn | tail -n 8 | tee -a "$LOG"
      say "whole generations on the overlap and megakernel rungs, $FAMILY"
      TRITON_CACHE_DIR=$PWD/.triton-cache timeout "${MEGA_S:-150}" python3 -m benchmarks.generation --family $FAMILY \
        --cache on --fusions overlap megakernel --repeats 2 2>&1 | grep -v Warn | tail -n 14 | tee -a "$LOG"
    done ;;
  ladder)
    say "the ladder"
    TRITON_CACHE_DIR=$PWD/.triton-cache timeout "${LADDER_S:-200}" python3 -m benchmarks.ladder --no-compile 2>&1 | tail -n 16 | tee -a "$LOG" ;;
  occupancy)
    say "programs per SM, ours and the driver's"
    timeout 240 python3 -m kernels.occupancy --arch 90 --driver 2>&1 | grep -v -i warn | tail -n 50 | tee -a "$LOG" ;;
  bench)
    say "the fusion ladder next to PyTorch and torch.compile"
    timeout 240 python3 -m benchmarks.ladder 2>&1 | tail -n 20 | tee -a "$LOG"
    say "whole generations"
    timeout 200 python3 -m benchmarks.generation --repeats 2 2>&1 | tail -n 20 | tee -a "$LOG" ;;
  host)
    say "host time per launch"
    timeout "${HOST_S:-200}" python3 -m experiments.host_profile --steps 30 2>&1 | grep -E "^\| |bound per signature|eager decode step" | tee -a "$LOG"
    ;;
  eager)
    say "eager steps, device and host time"
    timeout "${EAGER_S:-240}" python3 -m experiments.eager_steps ${EAGER_ARGS:-} > "$OUT/eager.log" 2>&1; echo "exit $?" | tee -a "$LOG"
    # the table of runs first (the cProfile listings after it stay in eager.log)
    grep -v Warn "$OUT/eager.log" | grep -E "^\|" | tee -a "$LOG" ;;
  grouped)
    say "grouped decode attention's variants, 4096 keys"
    timeout 300 python3 -m experiments.grouped_plan 8x4096 1x4096 2>&1 | grep -v Warn | tail -n 30 | tee -a "$LOG" ;;
  ops)
    say "every operation next to PyTorch"
    timeout "${OPS_S:-240}" python3 -m benchmarks.operations --out "$OUT/operations.md" 2>&1 | tail -n 80 | tee -a "$LOG" ;;
  ncu)
    say "the traffic models against the hardware counters"
    PATH=$PATH:/usr/local/cuda/bin timeout 300 python3 -m kernels.ncu_check --dtype bf16 --out "$OUT/ncu_check.csv" \
      --json "$OUT/ncu_check.json" 2>&1 | tail -n 45 | tee -a "$LOG" ;;
  *) echo "unknown part: $PART" | tee -a "$LOG" ;;
  esac
done
say done
