"""The two stacks the README names: requirements.txt, what a Space installs (the GPU suite's torch, Triton and
transformers), and requirements-cpu.txt, what CI and a machine without a GPU install (this test's own)."""

from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pins(name: str) -> dict[str, str]:
    """The exact pins of a requirements file and of the files it includes."""
    out = {}
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            out |= pins(line[3:])
        elif "==" in line:
            package, pinned = line.split("==")
            out[package.strip()] = pinned.strip()
    return out


def test_each_stack_pins_its_own_torch_triton_and_transformers_and_shares_the_rest():
    space, cpu = pins("requirements.txt"), pins("requirements-cpu.txt")
    for package in ("torch", "triton", "transformers"):
        assert package in space and package in cpu, package
    shared = pins("requirements-app.txt")
    assert {k: space[k] for k in shared} == shared == {k: cpu[k] for k in shared}


@pytest.mark.parametrize("package", ["torch", "triton", "transformers", "gradio", "plotly"])
def test_this_machine_runs_the_stack_its_kind_pins(package):
    """CI (no GPU) runs requirements-cpu.txt; the GPU suite runs on the H200 with what requirements.txt pins."""
    import torch

    stack = pins("requirements.txt" if torch.cuda.is_available() else "requirements-cpu.txt")
    assert version(package).split("+")[0] == stack[package]
