#!/usr/bin/env bash
# Build every kernel with the Triton the GPU machine runs (3.6, beside torch 2.11), on this CPU machine, whose
# own Triton is another (3.9): a kernel one version compiles and the other refuses is found before a GPU call.
#   bash scripts/compile_as_gpu.sh [compile_check's arguments]   e.g. --arch 90 120 --ptx /tmp/ptx36
# The wheel is fetched once into ~/.cache/triton-gpu (about 190 MB) and put first on PYTHONPATH for this run only.
set -euo pipefail
VERSION=${TRITON_GPU_VERSION:-3.6.0}
SITE=${XDG_CACHE_HOME:-$HOME/.cache}/triton-gpu/$VERSION
if [[ ! -d "$SITE/triton" ]]; then
  mkdir -p "$SITE"
  python3 -m pip download -q --no-deps "triton==$VERSION" -d "$SITE.whl"
  python3 -m pip install -q --no-deps --target "$SITE" "$SITE.whl"/triton-"$VERSION"-*.whl
fi
cd "$(dirname "$0")/.."
env -u TRITON_INTERPRET PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" python3 -c \
  "import triton; assert triton.__version__ == '$VERSION', triton.__version__; print('triton', triton.__version__)"
env -u TRITON_INTERPRET PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" python3 -m kernels.compile_check "$@"
