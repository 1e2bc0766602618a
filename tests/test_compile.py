"""Every kernel builds for the GPUs a Space may offer, and uses no more shared memory than that GPU
has and than kernels/config.py estimates when it validates a config (compiled here, no GPU needed)."""

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("arch,dtypes", [(75, ["float16"]), (86, ["float16"]), (90, ["bfloat16"])])
def test_kernels_compile_for_space_gpus(arch, dtypes):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-W", "ignore", "-m", "kernels.compile_check", "--arch", str(arch), "--dtype", *dtypes]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith(f"sm_{arch}")]
    # 26 kernels everywhere (decode attention's vector and dot forms among them), and from Hopper on the persistent
    # linear with and without a residual
    assert len(lines) == (28 if arch >= 90 else 26) and all(line.endswith(" ok") for line in lines), done.stdout
