"""Grouped decode attention with several streams of keys stacked in the tensor cores' 16 rows.

    python -m experiments.grouped_stacked [8x4096 ...]   (batch x keys)
    python -m experiments.grouped_stacked --against-library 8x4096   (the fastest form and the library's, in turns)

experiments.grouped_clock found that at B=8 each program's keys arrive about when a plain read's do, and that the
time after is the SM issuing the tile's instructions: about 630-1000 warp instructions per 64 keys, of which 64
are the dots. Most of the rest is the softmax on 16 rows, of which SmolLM2's group fills 3. Here the 16 rows
hold S streams of keys at once: row s * G' + g is query head g (G' = the group padded to a power of two) scoring
the keys of stream s. The query tile is block-diagonal, q in the dimensions of its stream's block and zeros
elsewhere, against a key tile whose column block s holds stream s's keys (a tile of S x BLOCK_N consecutive keys,
read as it lies in memory), so one dot scores S x BLOCK_N keys and the softmax runs on 16 rows of BLOCK_N, not of
S x BLOCK_N. The dots do the same work as before: the zeros take the place of the padded rows. The output dot
yields S x S blocks of which the diagonal ones are wanted; the streams merge at the end of the split, in the
program. LAZY rescales the output only when a row's max grows by more than 2^8 (the stale max then keeps every
probability below 256). The merge across splits is the library's (grouped._grouped_merge, under PDL).
"""

import itertools
import sys

import torch
import triton
import triton.language as tl

from experiments.grouped_clock import merge_into
from kernels import pdl
from kernels.attn.decode import _partials
from kernels.config import overlaps_launches

GROWTH = 8.0  # log2 units: the stale max stays while no row's max grows by more than this


@triton.jit
def _tile(q, K, V, offs, start, hi, key_at, score_at, m_i, l_i, acc, scale_log2, MASKED: tl.constexpr,
          LAZY: tl.constexpr):  # fmt: skip
    """One tile of S x BLOCK_N keys from `start` into the running max, sum and output. MASKED: the last tile,
    whose keys from `hi` on are masked; the others are whole, so they load and score without masks."""
    if MASKED:
        inside = start + key_at < hi
        k = tl.load(K + offs, mask=inside, other=0.0)
    else:
        k = tl.load(K + offs)
    scores = tl.dot(q, tl.trans(k))
    if MASKED:
        scores = tl.where(start + score_at < hi, scores, float("-inf"))
    top = tl.max(scores, axis=1) * scale_log2
    if LAZY:
        if tl.max((top > m_i + 8.0).to(tl.int32), axis=0) > 0:
            m_new = tl.maximum(m_i, top)
            alpha = tl.exp2(m_i - tl.where(m_new == float("-inf"), 0.0, m_new))
            acc = acc * alpha[:, None]
            l_i = l_i * alpha
            m_i = m_new
    else:
        m_new = tl.maximum(m_i, top)
        alpha = tl.exp2(m_i - tl.where(m_new == float("-inf"), 0.0, m_new))
        acc = acc * alpha[:, None]
        l_i = l_i * alpha
        m_i = m_new
    m_use = tl.where(m_i == float("-inf"), 0.0, m_i)
    p = tl.exp2(scores * scale_log2 - m_use[:, None])
    l_i += tl.sum(p, axis=1)
    if MASKED:
        v = tl.load(V + offs, mask=inside, other=0.0)
    else:
        v = tl.load(V + offs)
    acc += tl.dot(p.to(v.dtype), v)
    return m_i, l_i, acc


@triton.jit
def _stacked(Q, K, V, Part, Lengths, SPLITS, pairs, kv_heads, group, CHUNK, positions, scale_log2,
             GP: tl.constexpr, S: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
             LAZY: tl.constexpr, TRIGGER: tl.constexpr):  # fmt: skip
    pdl.launch_dependents(TRIGGER)
    pid = tl.program_id(0)
    pair, split = (pid % pairs).to(tl.int64), pid // pairs
    b, kv = pair // kv_heads, pair % kv_heads
    ROWS: tl.constexpr = 16
    SW: tl.constexpr = S * BLOCK_D  # the stacked width: S blocks of the head's dimensions
    TILE: tl.constexpr = S * BLOCK_N
    rows, cols, j = tl.arange(0, ROWS), tl.arange(0, SW), tl.arange(0, BLOCK_N)
    stream, g = rows // GP, rows % GP
    block, d = cols // BLOCK_D, cols % BLOCK_D
    live = (g < group) & (stream < S)
    diag = stream[:, None] == block[None, :]
    q_rows = Q + (b * kv_heads * group + kv * group + g)[:, None] * BLOCK_D + d[None, :]
    q = tl.load(q_rows, mask=live[:, None] & diag, other=0.0)  # block-diagonal
    key_at = block[None, :] * BLOCK_N + j[:, None]  # (BLOCK_N, SW): the key of each element, from the tile's start
    score_at = stream[:, None] * BLOCK_N + j[None, :]  # (ROWS, BLOCK_N): the key each score is of
    offs = key_at * BLOCK_D + d[None, :]
    K = K + pair * positions * BLOCK_D
    V = V + pair * positions * BLOCK_D
    n = tl.load(Lengths + b).to(tl.int32)
    lo = split * CHUNK
    hi = tl.minimum(lo + CHUNK, n)
    whole = lo + tl.maximum(hi - lo, 0) // TILE * TILE
    m_i = tl.full((ROWS,), float("-inf"), tl.float32)
    l_i = tl.zeros((ROWS,), tl.float32)
    acc = tl.zeros((ROWS, SW), tl.float32)
    for start in range(lo, whole, TILE):
        m_i, l_i, acc = _tile(q, K + start * BLOCK_D, V + start * BLOCK_D, offs, start, hi, key_at, score_at, m_i,
                              l_i, acc, scale_log2, False, LAZY)  # fmt: skip
    if whole < hi:
        m_i, l_i, acc = _tile(q, K + whole * BLOCK_D, V + whole * BLOCK_D, offs, whole, hi, key_at, score_at, m_i,
                              l_i, acc, scale_log2, True, LAZY)  # fmt: skip
    # the diagonal blocks: row s * GP + g's output over stream s's keys
    out = tl.sum(tl.reshape(tl.where(diag, acc, 0.0), (ROWS, S, BLOCK_D)), axis=1)
    SR: tl.constexpr = ROWS // GP  # streams and the padding rows past them
    m2 = tl.reshape(tl.where(stream < S, m_i, float("-inf")), (SR, GP))
    l2 = tl.reshape(l_i, (SR, GP))
    top = tl.max(m2, axis=0)
    w = tl.where(m2 > float("-inf"), tl.exp2(m2 - tl.where(top == float("-inf"), 0.0, top)[None, :]), 0.0)
    o = tl.sum(w[:, :, None] * tl.reshape(out, (SR, GP, BLOCK_D)), axis=0)
    l_sum = tl.sum(w * l2, axis=0)
    heads, dims = tl.arange(0, GP), tl.arange(0, BLOCK_D)
    PartO, PartM, PartL = _partials(Part, SPLITS, pairs * group, BLOCK_D)
    part = (pair * group + heads) * SPLITS + split
    ok = heads < group
    tl.store(PartO + part[:, None] * BLOCK_D + dims[None, :], o, mask=ok[:, None])
    tl.store(PartM + part, top, mask=ok)
    tl.store(PartL + part, l_sum, mask=ok)


def stacked(q, k, v, lens, *, block_n, splits, warps, stages, lazy, streams=None, merge=True):
    batch, heads, _, d = q.shape
    kv_heads, positions = k.shape[1], k.shape[2]
    group, pairs = heads // kv_heads, batch * kv_heads
    gp = triton.next_power_of_2(group)
    s = streams or max(1, min(16 // gp, 256 // d))
    chunk = triton.cdiv(triton.cdiv(positions, s * block_n), splits) * s * block_n
    count = triton.cdiv(positions, chunk)
    part = torch.empty(batch * heads * count * (d + 2), device=q.device, dtype=torch.float32)
    on = overlaps_launches(q.device)
    _stacked[(pairs * count,)](
        q, k, v, part, lens, count, pairs, kv_heads, group, chunk, positions, 1.4426950408889634 / d**0.5, GP=gp,
        S=s, BLOCK_N=block_n, BLOCK_D=d, LAZY=lazy, TRIGGER=on and merge, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    o = torch.empty_like(q)
    if merge:
        merge_into(o, part, count)
    return o


def against_library(batch, n, rounds=4):
    """The fastest form here (one stream, 32-key tiles, 16 splits, one warp) and the library's kernel at its
    plan, timed in turns, `rounds` times each."""
    from experiments.grouped_variants import baseline
    from kernels import grouped_decode_attention

    (q, k, v, lens), want, time, sdpa = baseline(batch, n)
    kw = dict(streams=1, block_n=32, splits=16, warps=1, stages=3, lazy=True)
    for _ in range(rounds):
        here = time(lambda q, k, v, m: stacked(q, k, v, m, **kw))
        library = time(lambda q, k, v, m: grouped_decode_attention(q, k, v, m))
        print(f"  here {here:6.2f} us ({sdpa / here:.2f}x), the library {library:6.2f} us ({sdpa / library:.2f}x)")


def run(batch, n):
    from experiments.grouped_variants import baseline

    (q, k, v, lens), want, time, sdpa = baseline(batch, n)

    def sweep(configs):
        rows = []
        for kw in configs:
            try:
                err = (stacked(q, k, v, lens, **kw).float() - want).abs().max().item()
                bare = time(lambda q, k, v, m, kw=kw: stacked(q, k, v, m, **kw, merge=False))
                merged = time(lambda q, k, v, m, kw=kw: stacked(q, k, v, m, **kw))
            except Exception as e:  # a tile the shared memory or the registers cannot hold
                print(f"  {kw}: {type(e).__name__}")
                continue
            rows.append((merged, bare, err, kw))
        return sorted(rows, key=lambda r: r[0])

    configs = [
        dict(streams=s, block_n=bn, splits=sp, warps=w, stages=3, lazy=lazy)
        for s, bn, w in ((4, 32, 2), (4, 16, 2), (4, 32, 4), (1, 32, 1), (1, 64, 1), (1, 64, 4))
        for sp, lazy in itertools.product((16, 32), (False, True))
        if n // sp >= s * bn
    ]
    rows = sweep(configs)
    print("streams stacked (streams=1: one stream, today's tile with unmasked whole tiles): with the merge / without")
    for merged, bare, err, kw in rows[:24]:
        print(f"  {merged:6.2f} ({sdpa / merged:.2f}x) / {bare:6.2f} ({sdpa / bare:.2f}x)  error {err:.3g}  {kw}")


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("experiments/grouped_stacked.py")
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    args = sys.argv[1:]
    compare = args[:1] == ["--against-library"]
    for shape in args[compare:] or ["8x4096"]:
        (against_library if compare else run)(*map(int, shape.split("x")))
