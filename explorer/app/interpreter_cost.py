"""What a run's settings cost Triton's interpreter, relative to the settings its rate was measured at.

The interpreter runs every program of a grid in Python, one after another, and every loop step of a program
as a few numpy calls: a launch costs a part of its own (its arguments bound, its grid set up) and a part per
program and loop step, whatever the tile's size (a tile's numpy work is small beside Python's per call; only the
decode rung's prefetch form, which loads a program's whole weight slice at once, pays for its size). So tiles
that make more programs or more K steps cost more, and the count follows from each kernel's own tile rules
(resolve_config of each kernel: the same tiles the run will launch with). A decode step's launches are counted
by walking one block's operations at the run's fusion rung; a pass over T tokens (a prefill, every cache-off
step) by its matmuls, attention and norms.

`decode_factor` and `pass_factor` say how many times the reference settings' decode step or pass these settings
cost (the reference: default tiles, the default rung, float32, one sequence: what RATES in estimate.py was
measured at). The estimate multiplies its layer-steps by them.
"""

from __future__ import annotations

import functools

import torch

from kernels.config import cdiv

from ..model.ops import DECODE_RUNGS, DEFAULT_FUSION, Tiles
from .estimate import model_sizes

# Milliseconds of the interpreter per launch, per program and per loop step of a program, by kernel, on the
# reference 2-core machine: every operation of ten Generates timed in the run, fitted per kernel to the programs
# and steps counted below (benchmarks/RESULTS.md, "Where the estimator's constants come from"). A launch costs
# about 1 ms of its own. The tile kernel: 3.6 ms a program, 0.75 a K step. The decode rung's K loop: 2 ms a
# program, 1.6 a step, and its LayerNorm or RMSNorm 3.7 more a program. Its prefetch form loads a program's whole
# weight slice at once, so its numpy work grows with the slice: 5 ms a program and 0.015 ms a thousand weights.
# Decode attention: 6 ms a program, and below the decode rungs its splits merged by a second launch of a program
# per head. Prefill attention: 3.8 ms a program, 2.5 a key tile walked. Grouped-query attention (the Llama
# family's, prefill and decode): about 5.5 ms a program. A norm, a bias, GELU, rotary or the cache write: 1.5 ms
# a program. float16 costs as float32.
LAUNCH_MS = 1.0
PROGRAM_MS = dict(linear=3.6, decode_linear=2.0, prefetch=5.0, attention=3.8, decode_attention=6.0)
PROGRAM_MS |= dict(grouped=5.5, other=1.5)
STEP_MS = dict(linear=0.75, decode_linear=1.6, attention=2.5, decode_attention=2.5)
NORM_MS = 3.7  # a decode-linear program's norm of its rows, either form
PREFETCH_WEIGHT_MS = 0.015e-3  # per weight element a prefetch program loads and multiplies
CPU = torch.device("cpu")


def launch(kind: str, programs: int, steps: int = 0, norm: bool = False, weights: int = 0) -> float:
    """One launch's milliseconds: its own, its programs' (with a norm's statistics in each, and `weights` elements
    of a prefetch slice each), their loop steps'."""
    per_program = PROGRAM_MS[kind] + (NORM_MS if norm else 0.0) + weights * PREFETCH_WEIGHT_MS
    return LAUNCH_MS + programs * per_program + steps * STEP_MS.get(kind, 0.0)


@functools.lru_cache(maxsize=4096)
def decode_linear_ms(tiles, rows: int, out_f: int, in_f: int, dtype, fused: bool, norm: bool = False) -> float:
    """A decode-shaped projection: the decode rung's kernel (kernels.ops.decode_linear.tiles), its LayerNorm in
    each program where `norm`, or below that rung the tile kernel's split-K path (kernels.ops.linear.kernel)."""
    if not fused:
        return linear_ms(tiles, rows, out_f, in_f, dtype)
    from kernels.ops.decode_linear import tiles as decode_tiles

    cfg = decode_tiles.resolve_config(tiles, rows, out_f, in_f, dtype, CPU)
    k_per_split, splits = decode_tiles.splits_of(cfg, in_f)
    programs = cdiv(out_f, cfg.block_n) * splits
    if decode_tiles.prefetches(cfg):  # the whole slice in one or two loads
        return launch("prefetch", programs, norm=norm, weights=min(cfg.block_n, out_f) * min(k_per_split, in_f))
    return launch("decode_linear", programs, programs * cdiv(k_per_split, cfg.block_k), norm=norm)


@functools.lru_cache(maxsize=4096)
def linear_ms(tiles, rows: int, out_f: int, in_f: int, dtype) -> float:
    from kernels.ops.linear.kernel import resolve_config

    cfg = resolve_config(tiles, rows, out_f, in_f, dtype, CPU)
    if cfg.split_k == 1:
        programs = cdiv(rows, cfg.block_m) * cdiv(out_f, cfg.block_n)
        return launch("linear", programs, programs * cdiv(in_f, cfg.block_k))
    # The split-K path (all rows in one tile): each split takes whole BLOCK_K steps, so the splits of a column tile
    # walk K's steps once between them (and may be fewer than asked); then a launch sums their partials, a program
    # per 128 columns.
    columns, k_per_split = cdiv(out_f, cfg.block_n), cdiv(cdiv(in_f, cfg.split_k), cfg.block_k) * cfg.block_k
    splits = launch("linear", columns * cdiv(in_f, k_per_split), columns * cdiv(in_f, cfg.block_k))
    return splits + launch("other", cdiv(out_f, 128))


@functools.lru_cache(maxsize=4096)
def attention_ms(tiles, batch: int, heads: int, tokens: int, head_dim: int, dtype) -> float:
    """A causal prefill: each query tile walks the key tiles up to its diagonal."""
    from kernels.ops.attention.kernel import resolve_config

    cfg = resolve_config(tiles, tokens, head_dim, dtype, CPU)
    q_tiles = cdiv(tokens, cfg.block_m)
    walked = sum(cdiv(min(tokens, (i + 1) * cfg.block_m), cfg.block_n) for i in range(q_tiles))
    return launch("attention", batch * heads * q_tiles, batch * heads * walked)


@functools.lru_cache(maxsize=4096)
def decode_attention_ms(tiles, batch: int, heads: int, positions: int, head_dim: int, dtype, fused: bool) -> float:
    from kernels.ops.decode_attention.tiles import decode_split, resolve_decode_config

    cfg = resolve_decode_config(tiles, batch * heads, positions, head_dim, dtype, CPU)
    chunk, splits = decode_split(positions, cfg)
    programs = batch * heads * splits
    ms = launch("decode_attention", programs, programs * max(0, cdiv(chunk, cfg.block_n) - 1))
    return ms if fused else ms + launch("other", batch * heads)  # below the decode rungs a merge launch follows


@functools.lru_cache(maxsize=4096)
def norm_ms(tiles, rows: int, width: int) -> float:
    from kernels.ops.layer_norm.kernel import resolve_config

    return launch("other", cdiv(rows, resolve_config(tiles, rows, width, CPU).block_m))


def projections(m: dict) -> list[tuple[int, int, bool, bool]]:
    """(out, in, with bias, normalised first) of a block's four matmuls."""
    c, kv = m["width"], 2 * m["kv_heads"] * m["head_dim"]
    if m["llama"]:  # q with k and v stacked, the output, gate and up stacked, down
        return [
            (c + kv, c, False, True),
            (c, c, False, False),
            (2 * m["hidden"], c, False, True),
            (c, m["hidden"], False, False),
        ]
    return [(3 * c, c, True, True), (c, c, True, False), (m["hidden"], c, True, True), (c, m["hidden"], True, False)]


def rotary(m: dict, batch: int) -> float:
    """A Llama's rotary positions, a launch of a program per sequence and head of q and k (none for GPT-2)."""
    return launch("other", batch * (m["heads"] + m["kv_heads"])) if m["llama"] else 0.0


def decode_ms(model: str, tiles: Tiles, fusion: str, dtype, batch: int, positions: int) -> float:
    """One block's decode step and its share of the LM head, in the reference machine's milliseconds."""
    m = model_sizes(model)
    fused = fusion in DECODE_RUNGS and batch <= 16
    # The one-launch rungs choose their own tiles: the megakernel's whole step, the persistent rung's blocks (a
    # GPT-2's: a Llama runs that rung as overlap). The chosen tiles cost as the defaults.
    own_step = fused and fusion == "megakernel"
    own_blocks = own_step or (fused and fusion == "persistent" and not m["llama"])
    head_tiles = Tiles() if own_step else tiles
    tiles = Tiles() if own_blocks else tiles
    linear_tiles = tiles.fixed("linear_decode")
    ms = 0.0
    for out_f, in_f, bias, norm in projections(m):
        ms += decode_linear_ms(linear_tiles, batch, out_f, in_f, dtype, fused, norm)
        if fusion == "none" and bias:  # the bias, then GELU or the residual, each a launch of its own
            ms += 2 * launch("other", 1)
    if m["llama"]:  # grouped attention takes no tiles: a program per key/value head
        ms += launch("grouped", batch * m["kv_heads"])
    else:
        attention = tiles.fixed("decode_attention")
        ms += decode_attention_ms(attention, batch, m["heads"], positions, m["head_dim"], dtype, fused)
    if not fused:  # the two norms, the cache write (a program per head) and a Llama's rotary, each a launch
        ms += 2 * norm_ms(tiles.fixed("layer_norm"), batch, m["width"]) + launch("other", batch * m["kv_heads"])
        ms += rotary(m, batch)
    head = decode_linear_ms(head_tiles.fixed("linear_decode"), batch, m["vocab"], m["width"], dtype, fused, True)
    return ms + head / m["layers"]


def pass_ms(model: str, tiles: Tiles, fusion: str, dtype, batch: int, tokens: int) -> float:
    """One block's pass over `tokens` tokens of each sequence (a prefill; a cache-off step) and its share of the
    LM head over each sequence's last row, in the reference machine's milliseconds."""
    m, rows = model_sizes(model), batch * tokens
    which = "linear_decode" if rows <= 16 else "linear"  # decode-shaped rows take linear_decode's tiles
    ms = 0.0
    for out_f, in_f, bias, _ in projections(m):
        ms += linear_ms(tiles.fixed(which), rows, out_f, in_f, dtype)
        ms += 2 * launch("other", 1) if fusion == "none" and bias else 0.0
    if m["llama"]:  # a program per key/value head, whatever the prompt's length (14-16 ms at 10-23 tokens)
        ms += launch("grouped", batch * m["kv_heads"])
    else:
        ms += attention_ms(tiles.fixed("attention"), batch, m["heads"], tokens, m["head_dim"], dtype)
    ms += 2 * norm_ms(tiles.fixed("layer_norm"), rows, m["width"]) + rotary(m, batch)  # the cache: a copy
    return ms + linear_ms(tiles.fixed("linear_decode"), batch, m["vocab"], m["width"], dtype) / m["layers"]


def decode_factor(s, dtype, positions: int) -> float:
    """A decode step at these settings against one at the reference settings (one sequence) at this length."""
    ref = decode_ms(s.model, Tiles(), DEFAULT_FUSION, torch.float32, 1, positions)
    return decode_ms(s.model, s.tiles, s.fusion, dtype, s.batch, positions) / ref


def pass_factor(s, dtype, tokens: int) -> float:
    """A pass at these settings against one at the reference tiles, rung and dtype, of as many tokens and
    sequences (the estimate counts a pass's batch and tokens itself)."""
    ref = pass_ms(s.model, Tiles(), DEFAULT_FUSION, torch.float32, s.batch, tokens)
    return pass_ms(s.model, s.tiles, s.fusion, dtype, s.batch, tokens) / ref
