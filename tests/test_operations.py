"""The registry of operations (kernels.operations): every operation the decoder names is declared there once, the
modules that book, sweep, estimate, count launches and hold the models to the hardware counters read it rather
than a chain of names, and a sweep's traffic model is the one the decoder's calls are booked by."""

import ast
import dataclasses
from pathlib import Path

import pytest
import torch

from explorer.measure import sweeps, traffic
from explorer.model.ops import Op
from kernels import operations, sizes
from kernels.config import TileConfig

ROOT = Path(__file__).resolve().parent.parent
# The modules that read the registry: none of them may branch on an operation's name.
READERS = (
    "explorer/measure/traffic.py",
    "explorer/measure/sweeps.py",
    "explorer/measure/ladder.py",
    "explorer/app/estimate.py",
    "kernels/ncu_check.py",
)
NAMES = set(operations.OPERATIONS)
CPU = torch.device("cpu")


def _branches_on_a_name(path: Path) -> list[str]:
    """Each comparison of something with an operation's name (`kernel == "linear"`, `kind in ("a", "b")`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        for right in node.comparators:
            values = right.elts if isinstance(right, ast.Tuple | ast.List | ast.Set) else [right]
            if any(isinstance(v, ast.Constant) and v.value in NAMES for v in values):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("reader", READERS)
def test_the_readers_of_the_registry_branch_on_no_operation_name(reader):
    assert _branches_on_a_name(ROOT / reader) == []


def test_the_check_finds_a_chain_where_there_is_one(tmp_path):
    chain = tmp_path / "chain.py"
    chain.write_text('def f(kind):\n    if kind == "linear":\n        return 1\n    return kind in ("swiglu", "x")\n')
    assert len(_branches_on_a_name(chain)) == 2


def test_every_case_held_to_the_counters_names_an_operation_that_is():
    from kernels import ncu_check

    for case in ncu_check.CASES:
        assert operations.operation(case.kind).counted is not None, case.name


def test_every_operation_with_a_triton_kernel_declares_what_the_compile_check_builds():
    """The embeddings are PyTorch's gathers: every other operation launches a Triton kernel, built for each GPU
    under labels no other operation uses."""
    from kernels.compile_check import tensors

    labels, make = [], tensors("float16")
    for name, op in operations.OPERATIONS.items():
        cases = op.compiles(make)
        assert bool(cases) == (name not in ("embedding", "token_embedding")), name
        labels += list(cases)
    assert len(labels) == len(set(labels))


def test_every_operation_names_its_launcher_and_its_pytorch_twin_under_its_own_name():
    """The launcher is the one kernels exports (kernels.elementwise's for the separate launches), the twin the one
    of kernels.reference; the embeddings are PyTorch's gathers and have neither."""
    import kernels
    from kernels import elementwise, reference

    for name, op in operations.OPERATIONS.items():
        if name in ("embedding", "token_embedding"):
            assert op.launch is None and op.reference is None
            continue
        exported = getattr(kernels, name, None) or getattr(elementwise, name)
        assert op.launch is exported and op.launch.__name__ == name, name
        assert op.reference in (None, getattr(reference, name, None)), name
        assert op.reference is not None or not hasattr(reference, name), name


def test_every_operation_records_its_sizes_in_a_named_tuple_of_kernels_sizes():
    for name, op in operations.OPERATIONS.items():
        assert op.name == name
        assert op.sizes.__module__ == sizes.__name__ and issubclass(op.sizes, tuple) and op.sizes._fields, name


def test_an_unknown_operation_or_sweep_is_refused_with_those_there_are():
    with pytest.raises(ValueError, match="allowed: attention, decode_attention"):
        operations.operation("conv2d")
    with pytest.raises(ValueError, match="allowed: attention, decode_attention, linear"):
        operations.sweep("kv_write")


def _op(kernel: str, record, dtype=torch.float16, config=None) -> Op:
    return Op(kernel, kernel, "triton", record, dtype, CPU, config)


# A sweep's shape, as the decoder would record the same call (sizes), for the sweeps whose kernel the decoder
# launches as the sweep does.
AS_CALLED = {
    "layer_norm": lambda g: sizes.NormSizes(g["M"], g["C"], True),
    "rms_norm": lambda g: sizes.NormSizes(g["M"], g["C"], True),
    "linear": lambda g: sizes.LinearSizes(g["M"], g["N"], g["K"], True, True, False),
    "swiglu": lambda g: sizes.SwigluSizes(g["M"], g["F"], g["K"]),
    "attention": lambda g: sizes.AttentionSizes(g["B"], g["H"], g["T"], g["T"], g["D"]),
}


@pytest.mark.parametrize("kernel", sorted(AS_CALLED))
def test_a_sweeps_traffic_is_the_decoders_booking_of_the_same_call(kernel):
    sw = operations.sweep(kernel)
    shape = {k: max(1, v // 4) for k, v in sw.shape.items()}  # smaller than the default, and not all powers of two
    shape = {k: v + (3 if k in ("M", "T") else 0) for k, v in shape.items()}
    for values in list(zip(*sw.grid.values(), strict=False))[:3]:
        cfg = TileConfig(**dict(zip(sw.grid, values, strict=True)))
        swept = sw.traffic(shape, 2, cfg, torch.float16, CPU)
        booked = traffic.op_traffic(_op(kernel, AS_CALLED[kernel](shape), config=cfg))
        assert dataclasses.astuple(swept) == dataclasses.astuple(booked), (kernel, cfg)


@pytest.mark.parametrize("kernel", list(operations.SWEEPS))
def test_each_sweeps_inputs_are_about_the_size_its_estimate_counts(kernel):
    """The estimate refuses a sweep by the elements of one set of inputs (and the output beside them): the
    sweep then makes about that many, within 2x."""
    from explorer.app.settings import SWEEP_SHAPES

    shape = SWEEP_SHAPES["cpu"][kernel]
    make, _, _ = sweeps._inputs(kernel, shape, torch.float32, CPU)
    held = sum(t.numel() for t in make() if t.is_floating_point())
    counted = operations.sweep(kernel).elements(shape)
    assert 0.5 <= counted / held <= 2.0, (kernel, counted, held)
