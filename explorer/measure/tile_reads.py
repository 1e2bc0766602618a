"""Which program of a launch reads which tile of its inputs, and how many times each input row is requested
from L2: the SM-request level of the traffic models (kernels.ops.linear.traffic, kernels.ops.attention.traffic)
drawn tile by tile, for a prefill's matmul and its attention at the tiles a run's launches were given.

The walks follow the kernels' own loops: the matmul's output tiles in GROUP_M order (tile_coords), one program
per tile or, in the persistent form, tile t on program t % PROGRAMS; each program requests its row band of x and
its row band of the weight over the whole reduction (rows past the edge wrap onto rows it already has). The
attention's query tiles each request every key tile below the diagonal whole, then the tiles the diagonal (or
the keys' end) crosses with a mask: only the keys before the end are loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernels.config import cdiv

WHOLE, MASKED = 1, 2  # what a query tile does with a key tile (0: does not read it)


@dataclass(frozen=True)
class LinearReads:
    """A matmul y = x @ weight.T of (rows, inp) by (out, inp) at (block_m, block_n, group_m)."""

    rows: int
    out: int
    inp: int
    block_m: int
    block_n: int
    group_m: int
    programs: int  # programs launched: one per tile, or the persistent form's, each walking tiles by this stride
    program: list  # program[m][n]: the program that computes output tile (m, n)
    order: list  # order[m][n]: the tile's place in the walk (0 first)
    x_requests: list  # x_requests[r]: programs that request x's row r (each over all inp columns)
    w_requests: list  # w_requests[c]: programs that request the weight's row c

    def requested(self, itemsize: int) -> int:
        """Bytes of x and the weight the programs request from L2."""
        return (sum(self.x_requests) + sum(self.w_requests)) * self.inp * itemsize

    def unique(self, itemsize: int) -> int:
        """Bytes of x and the weight, each once."""
        return (self.rows + self.out) * self.inp * itemsize


@dataclass(frozen=True)
class AttentionReads:
    """Causal (or full) attention of tq queries over tk keys, `positions` query positions per program (BLOCK_M
    for the flash kernel, BLOCK_R / group for the grouped one), key tiles of block_n, per (sequence, head)."""

    tq: int
    tk: int
    positions: int
    block_n: int
    causal: bool
    kinds: list  # kinds[i][j]: WHOLE, MASKED or 0, what query tile i does with key tile j
    key_requests: list  # key_requests[k]: query tiles that load key k (and its value)

    def requested_keys(self) -> int:
        return sum(self.key_requests)


def _tile(t: int, tiles_m: int, tiles_n: int, group_m: int) -> tuple[int, int]:
    """kernels.ops.linear.kernel.tile_coords in plain Python: (row tile, column tile) of tile number t."""
    size = group_m * tiles_n
    first = (t // size) * group_m
    height = min(tiles_m - first, group_m)
    return first + (t % size) % height, (t % size) // height


def linear(rows, out, inp, block_m, block_n, group_m, programs: int | None = None) -> LinearReads:
    """The matmul's walk: which program computes each output tile, in what order, and how many programs request
    each row of x and of the weight. programs None: one program per tile."""
    tiles_m, tiles_n = cdiv(rows, block_m), cdiv(out, block_n)
    count = tiles_m * tiles_n if programs is None else programs
    program = [[0] * tiles_n for _ in range(tiles_m)]
    order = [[0] * tiles_n for _ in range(tiles_m)]
    x_requests, w_requests = [0] * rows, [0] * out
    for t in range(tiles_m * tiles_n):
        m, n = _tile(t, tiles_m, tiles_n, group_m)
        program[m][n], order[m][n] = t % count, t
        for r in {(m * block_m + i) % rows for i in range(block_m)}:
            x_requests[r] += 1
        for c in {(n * block_n + j) % out for j in range(block_n)}:
            w_requests[c] += 1
    return LinearReads(rows, out, inp, block_m, block_n, group_m, count, program, order, x_requests, w_requests)


def attention(tq, tk, positions, block_n, causal=True) -> AttentionReads:
    """The attention's walk: what each query tile does with each key tile, and how many query tiles load each
    key, following the kernels' two loops (whole tiles, then masked ones)."""
    offset = tk - tq  # key position of query 0
    kinds, key_requests = [], [0] * tk
    for i in range(cdiv(tq, positions)):
        first = i * positions
        if causal:
            full_hi, hi = (offset + first + 1) // block_n * block_n, min(offset + first + positions, tk)
        else:
            full_hi, hi = tk // block_n * block_n, tk
        row = [0] * cdiv(tk, block_n)
        for start in range(0, max(hi, full_hi), block_n):
            row[start // block_n] = WHOLE if start < full_hi else MASKED
            for k in range(start, min(start + block_n, tk)):
                key_requests[k] += 1
        kinds.append(row)
    return AttentionReads(tq, tk, positions, block_n, causal, kinds, key_requests)


LINEAR_KERNELS = ("_linear_kernel", "_linear_persistent_kernel")
ATTENTION_KERNELS = ("_attention_kernel", "_grouped_attention_kernel")


def from_launches(launches: list[tuple]) -> dict:
    """The first prefill matmul and attention among recorded launches (kernels.launch.recording, as
    explorer.measure.occupancy.recorded gives them: phase, operation, fn, args, kwargs, grid), as the keyword
    arguments of linear() and attention(), with the operation's name; {} for a kind the launches lack."""
    out = {}
    for phase, op, fn, args, kwargs, grid in launches:
        name = fn.__name__
        if phase != "prefill":
            continue
        values = dict(zip(fn.arg_names, args, strict=False)) | kwargs
        if name in LINEAR_KERNELS and "linear" not in out:
            persistent = name == "_linear_persistent_kernel"
            out["linear"] = dict(
                operation=op,
                rows=int(values["M"]),
                out=int(values["N"]),
                inp=int(values["K"]),
                block_m=int(values["BLOCK_M"]),
                block_n=int(values["BLOCK_N"]),
                group_m=int(values["GROUP_M"]),
                programs=int(grid[0]) if persistent else None,  # min(tiles, SMs), walking tiles by the SMs
            )
        elif name in ATTENTION_KERNELS and "attention" not in out:
            grouped = name == "_grouped_attention_kernel"
            positions = int(values["BLOCK_R"]) // int(values["group"]) if grouped else int(values["BLOCK_M"])
            out["attention"] = dict(
                operation=op,
                tq=int(values["tq" if grouped else "TQ"]),
                tk=int(values["tk" if grouped else "TK"]),
                positions=positions,
                block_n=int(values["BLOCK_N"]),
                causal=bool(values["CAUSAL"]),
            )
    return out
