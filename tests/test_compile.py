"""Every kernel builds for the GPUs a Space may offer, and uses no more shared memory than that GPU
has and than kernels/config.py estimates when it validates a config (compiled here, no GPU needed)."""

import importlib
import os
import pkgutil
import re
import subprocess
import sys

import pytest
from triton.runtime.jit import KernelInterface  # a triton.jit function, compiled or interpreted

import kernels
from kernels.config import GPUS, tma_matmul

MEASURING_ONLY = {"_l2_flush_kernel"}  # kernels.ncu_check's cache flush between measured calls
TMA_ONLY = {"_linear_persistent_kernel"}  # config.tma_matmul's GPUs, 16-bit dtypes


def every_kernel() -> set[str]:
    """The name of every triton.jit kernel (a function named *_kernel) in the kernels package."""
    names = set()
    for info in pkgutil.walk_packages(kernels.__path__, "kernels."):
        module = importlib.import_module(info.name)
        names |= {
            name for name, fn in vars(module).items() if isinstance(fn, KernelInterface) and name.endswith("_kernel")
        }
    return names - MEASURING_ONLY


# The GPUs at the two ends of what a Space offers, Turing (64 KB of shared memory a block, no bf16, no TMA) and
# Hopper (the persistent TMA linear, programmatic dependent launch), and the two Blackwells: the B200 (the TMA
# linear on tcgen05, whose barriers take shared memory of their own) and ZeroGPU's RTX Pro 6000 (99 KB, no
# wgmma: the tile linear). `python -m kernels.compile_check` builds for the A100, A10G and L4 too.
@pytest.mark.parametrize(
    "arch,dtypes", [(75, ["float16"]), (90, ["bfloat16"]), (100, ["bfloat16"]), (120, ["float16"])]
)
def test_kernels_compile_for_space_gpus(arch, dtypes, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-W", "ignore", "-m", "kernels.compile_check", "--arch", f"sm_{arch}", "--dtype", *dtypes]
    cmd += ["--ptx", str(tmp_path)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith(f"sm_{arch} ")]
    assert lines and all(line.endswith(" ok") for line in lines), done.stdout
    (summary,) = [line for line in done.stdout.splitlines() if line.startswith("summary ")]
    assert f"sm_{arch} {GPUS[arch].name}: {len(lines)} launches" in summary and "all ok" in summary, summary
    # Each line names the kernel its launcher launched: every kernel the package defines is among them.
    compiled = {m.group(1) for line in lines if (m := re.search(r"\((\w+_kernel)\)", line))}
    assert compiled == every_kernel() - (set() if tma_matmul(GPUS[arch].capability) else TMA_ONLY), done.stdout
    # Each launch's PTX, for reading a kernel's instructions before and after a change, built for this GPU.
    written = sorted((tmp_path / f"sm_{arch}").glob("*/*.ptx"))
    assert len(written) == len(lines)
    assert all(f".target sm_{arch}" in p.read_text() for p in written)


@pytest.mark.parametrize(
    "args,message", [(["--arch", "91"], "unknown --arch 91"), (["--dtype", "half"], "unknown --dtype half")]
)
def test_a_bad_choice_is_one_line_naming_the_allowed_ones(args, message):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-W", "ignore", "-m", "kernels.compile_check", *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    allowed = "75 80 86 89 90 100 120" if "arch" in message else "float16 bfloat16"
    assert done.returncode != 0 and done.stderr.strip() == f"{message}: choose from {allowed}", done.stderr


def test_the_stamped_variants_build_and_the_plain_ones_read_no_timer(tmp_path):
    """Every kernel's variant that stamps its programs (kernels.stamps) builds for the H200 and reads the global
    timer and the SM id; the variant launched when nothing stamps reads neither (the calls compile to nothing)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    base = [sys.executable, "-W", "ignore", "-m", "kernels.compile_check", "--arch", "90", "--dtype", "float16"]
    for flag, folder in (["--stamped"], tmp_path / "on"), ([], tmp_path / "off"):
        done = subprocess.run(
            [*base, *flag, "--ptx", str(folder)], env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0 and "all ok" in done.stdout, done.stdout + done.stderr[-3000:]
    on, off = sorted((tmp_path / "on").rglob("*.ptx")), sorted((tmp_path / "off").rglob("*.ptx"))
    assert [p.name for p in on] == [p.name for p in off] and on
    for stamped, plain in zip(on, off, strict=True):
        assert "%globaltimer" in stamped.read_text() and "%smid" in stamped.read_text(), stamped.name
        assert "%smid" not in plain.read_text(), plain.name
