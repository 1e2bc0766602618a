"""Bytes and FLOPs of each named operation, from the traffic model beside its kernel, and the chart
category each name falls under. Every Traffic has two levels: bytes between L2 and the SMs (every load
and store the kernel issues, tile re-reads included: what tiling controls) and bytes to and from HBM
(what the L2 lets through, given the working set and this device's L2 size).

The decoder only names its operations (explorer.model.ops.Op); each operation's book (kernels.operations) is
where a name becomes bytes. A Triton call is booked at the tiles it ran with; the torch backend's calls are
booked as PyTorch runs them (unfused bias, GELU and residual passes; SDPA at its floor, since its tiles are its
own).
Results are cached: one step of GPT-2 small names about 170 operations, most of them alike.
"""

from __future__ import annotations

import functools
import operator

from kernels.config import Traffic
from kernels.operations import OPERATIONS, operation

from ..model.ops import PART_CATEGORIES, Op


@functools.lru_cache(maxsize=8192)
def op_traffic(op: Op, lengths: tuple[int, ...] = ()) -> Traffic:
    """Modeled traffic of one call, as its operation books it (kernels.operations); `lengths` (keys per sequence)
    for the operations whose traffic depends on them only."""
    book = operation(op.kernel).book
    triton = op.backend == "triton"
    return book(
        op.sizes, op.dtype.itemsize, triton=triton, config=op.config, dtype=op.dtype, device=op.device, lengths=lengths
    )


def _read(op: Op, lengths: tuple[int, ...]) -> tuple[int, ...]:
    """The lengths where the kernel reads them, else none (so alike calls share one cache entry)."""
    return lengths if OPERATIONS[op.kernel].by_length else ()


def traffic_at(op: Op, lengths: tuple[int, ...]) -> Traffic:
    """op_traffic, given the lengths only where the kernel reads them."""
    return op_traffic(op, _read(op, lengths))


def total_traffic(ops, lengths: tuple[int, ...]) -> Traffic:
    """Modeled traffic of a pass's operations together; `lengths` as traffic_at takes them."""
    return functools.reduce(operator.add, (traffic_at(op, lengths) for op in ops))


def step_traffic(step) -> dict[str, Traffic]:
    """Modeled traffic of one Step, per chart category. In a decode step each sequence attends over
    as many keys as the new token's position (its length once the fed token is in the cache)."""
    return dict(_by_category(step.ops, tuple(step.positions) if step.phase == "decode" else ()))


@functools.lru_cache(maxsize=1024)
def op_parts(op: Op, lengths: tuple[int, ...] = ()) -> dict[str, Traffic] | None:
    """Modeled traffic of one call by the operations it runs, where one launch runs several (kernels.operations'
    `parts`); else None."""
    split = OPERATIONS[op.kernel].parts
    if split is None or op.backend != "triton":
        return None
    return split(op.sizes, op.dtype.itemsize, config=op.config, dtype=op.dtype, device=op.device, lengths=lengths)


@functools.lru_cache(maxsize=4096)
def _by_category(ops: tuple[Op, ...], lengths: tuple[int, ...]) -> dict[str, Traffic]:
    """Each category's traffic; a launch that runs several operations is split into theirs (PART_CATEGORIES)."""
    out: dict[str, Traffic] = {}
    for op in ops:
        for kind, t in _categories(op, _read(op, lengths)):
            out[kind] = out[kind] + t if kind in out else t
    return out


def _categories(op: Op, lengths: tuple[int, ...]) -> list[tuple[str, Traffic]]:
    """(chart category, traffic) of one call: its own category, or each operation's where it runs several."""
    split = op_parts(op, lengths)
    if split is None:
        return [(op.category, op_traffic(op, lengths))]
    return [(PART_CATEGORIES[name], t) for name, t in split.items()]
