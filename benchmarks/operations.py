"""Every operation's benchmark in one run and one table: attention, the normalisations, rotary positions, the
linear layer and the KV-cache write, each next to PyTorch (kernels.bench's harness and timings).

    python -m benchmarks.operations [--only attention.prefill linear.decode ...] [--out kernels.md]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file from any directory too

from benchmarks import attention, kv_cache, linear, norm, rope
from kernels.bench import main

GROUPS = {
    f"{module.__name__.rsplit('.', 1)[1]}.{name}": cases
    for module in (attention, norm, rope, linear, kv_cache)
    for name, cases in module.GROUPS.items()
}

if __name__ == "__main__":
    main(GROUPS, "python -m benchmarks.operations", __doc__)
