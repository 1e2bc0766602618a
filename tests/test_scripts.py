"""Scripts that time compiled kernels say, on a machine without a GPU, that they need one: one line and exit
status 2, never a traceback."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
CPU_TOO = ("sampling", "stream_check")  # experiments that run on CPU as well
GPU_ONLY = [
    *sorted(f"-m experiments.{p.stem}" for p in (ROOT / "experiments").glob("*.py") if p.stem not in CPU_TOO),
    "-m benchmarks.generation",
    "-m benchmarks.ladder",
    "-m kernels.bench",
]


@pytest.mark.skipif(torch.cuda.is_available(), reason="what a machine without a GPU shows")
@pytest.mark.parametrize("script", GPU_ONLY)
def test_a_gpu_only_script_says_so_in_one_line_and_exits_2(script):
    done = subprocess.run([sys.executable, *script.split()], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, (script, done.stdout[-500:], done.stderr[-2000:])
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "needs a CUDA GPU" in lines[0], lines
