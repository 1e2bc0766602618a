"""Grouped decode attention at B=8 with every split one key tile, requested at once, and a merge kernel spread wide.

    python -m experiments.grouped_tiles [8x4096 1x4096]   (batch x keys)

SmolLM2's 9 query heads over 3 key/value heads, bf16. experiments.grouped_warps found that today's grid and
loop only reading K and V (no dot, no softmax) already take 9.5 µs at B=8 and 4096 keys, where a plain read of
the same bytes takes 7.8: the loop's structure, not its maths, is where the time goes. A read issues all its
loads at once, in many programs. Here each program is one split of one key tile whose keys and values are
requested together, masked by the cache's size (so they do not wait for the length), in 768-3072 programs.
With that many splits the last split to arrive would read too many partials alone (an arrival merge at 64
splits took 18.5 µs), so the partials are merged by a second kernel launched under PDL: one program per pair
(grouped_variants' merge), or one per query head and slice of the head's dimensions (the wide merge).
"""

import sys

import torch
import triton
import triton.language as tl

from experiments.grouped_variants import _merge_kernel, baseline
from kernels import pdl
from kernels.attn.decode import _partials
from kernels.config import overlaps_launches


@triton.jit
def _tile_split(Q, K, V, Part, Lengths, kv_heads, group, positions, scale_log2, BLOCK_G: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    pdl.launch_dependents(PDL)  # the merge behind may start now; it waits there for every split
    pid = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    b, kv = pid // kv_heads, pid % kv_heads
    queries, dims, keys_n = tl.arange(0, BLOCK_G), tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_N)
    row = positions * BLOCK_D
    pos = split * BLOCK_N + keys_n
    inside = (pos < positions)[:, None]
    k = tl.load(K + (b * kv_heads + kv) * row + pos[:, None] * BLOCK_D + dims[None, :], mask=inside, other=0.0)
    v = tl.load(V + (b * kv_heads + kv) * row + pos[:, None] * BLOCK_D + dims[None, :], mask=inside, other=0.0)
    n = tl.load(Lengths + b).to(tl.int32)
    heads = kv * group + queries
    live = queries < group
    q = tl.load(Q + (b * kv_heads * group + heads[:, None]) * BLOCK_D + dims[None, :], mask=live[:, None], other=0.0)
    seen = (pos < n)[None, :]
    scores = tl.where(seen, tl.dot(q, tl.trans(k)) * scale_log2, float("-inf"))
    m = tl.max(scores, axis=1)
    p = tl.where(seen, tl.exp2(scores - m[:, None]), 0.0)  # a split past the length: max -inf, sum 0
    l_i = tl.sum(p, axis=1)
    acc = tl.dot(p.to(v.dtype), v)
    SPLITS = tl.num_programs(1)
    PartO, PartM, PartL = _partials(Part, SPLITS, tl.num_programs(0) * group, BLOCK_D)
    part = (b * kv_heads * group + heads) * SPLITS + split
    tl.store(PartO + part[:, None] * BLOCK_D + dims[None, :], acc, mask=live[:, None])
    tl.store(PartM + part, m, mask=live)
    tl.store(PartL + part, l_i, mask=live)


@triton.jit
def _wide_merge(Out, Part, SPLITS, BH, BLOCK_S: tl.constexpr, BLOCK_DM: tl.constexpr, BLOCK_D: tl.constexpr,
                PDL: tl.constexpr):  # fmt: skip
    """One program per (sequence, query head) and slice of BLOCK_DM of its dimensions."""
    pdl.wait(PDL)
    bh = tl.program_id(0).to(tl.int64)
    dims = tl.program_id(1) * BLOCK_DM + tl.arange(0, BLOCK_DM)
    splits = tl.arange(0, BLOCK_S)
    ok = splits < SPLITS
    PartO, PartM, PartL = _partials(Part, SPLITS, BH, BLOCK_D)
    at = bh * SPLITS + splits
    m = tl.load(PartM + at, mask=ok, other=float("-inf"))
    sums = tl.load(PartL + at, mask=ok, other=0.0)
    part = tl.load(PartO + at[:, None] * BLOCK_D + dims[None, :], mask=ok[:, None], other=0.0)
    m_max = tl.max(m, axis=0)
    w = tl.where(m > float("-inf"), tl.exp2(m - m_max), 0.0)
    l_sum = tl.sum(w * sums, axis=0)
    o = tl.sum(w[:, None] * part, axis=0) / tl.where(l_sum > 0, l_sum, 1.0)
    tl.store(Out + bh * BLOCK_D + dims, o.to(Out.dtype.element_ty))


def tiles(q, k, v, lens, *, block_n, warps, merge="wide", block_dm=16, merge_warps=4):
    batch, heads, _, d = q.shape
    kv_heads, positions = k.shape[1], k.shape[2]
    group, pairs = heads // kv_heads, batch * kv_heads
    splits = triton.cdiv(positions, block_n)
    o = torch.empty_like(q)
    part = torch.empty(batch * heads * splits * (d + 2), device=q.device, dtype=torch.float32)
    on = overlaps_launches(q.device)
    _tile_split[(pairs, splits)](
        q, k, v, part, lens, kv_heads, group, positions, 1.4426950408889634 / d**0.5, BLOCK_G=16, BLOCK_N=block_n,
        BLOCK_D=d, PDL=on and merge != "none", num_warps=warps, num_stages=1,
    )  # fmt: skip
    block_s = triton.next_power_of_2(splits)
    if merge == "wide":
        _wide_merge[(batch * heads, d // block_dm)](
            o, part, splits, batch * heads, BLOCK_S=block_s, BLOCK_DM=block_dm, BLOCK_D=d, PDL=on, launch_pdl=on,
            num_warps=merge_warps,
        )  # fmt: skip
    elif merge == "pair":
        gm = triton.next_power_of_2(group)
        _merge_kernel[(pairs,)](o, part, splits, group, BLOCK_D=d, BLOCK_S=block_s, BLOCK_GM=gm, PDL=on, launch_pdl=on)
    return o


def run(batch, n):
    (q, k, v, lens), want, time, sdpa = baseline(batch, n)
    rows = []
    for block_n in (32, 64, 128):
        for warps in (1, 2, 4, 8):
            if block_n * 64 // (warps * 32) > 128:  # K and V of a tile past 128 registers a thread
                continue
            kw = dict(block_n=block_n, warps=warps)
            try:
                rows.append((time(lambda q, k, v, m, kw=kw: tiles(q, k, v, m, **kw, merge="none")), kw))
            except Exception as e:
                print(f"  {kw}: {type(e).__name__}")
    rows.sort(key=lambda r: r[0])
    print("one tile a split, no merge (diagnostic):")
    for t, kw in rows:
        print(f"  {t:6.2f} us  {sdpa / t:.2f}x  {kw}")
    print("with a merge:")
    results = []
    for _, kw in rows[:4]:
        merges = [dict(merge="pair")]
        merges += [dict(merge="wide", block_dm=dm, merge_warps=w) for dm in (8, 16, 32, 64) for w in (1, 2, 4)]
        for mk in merges:
            got = tiles(q, k, v, lens, **kw, **mk)
            err = (got.float() - want).abs().max().item()
            t = time(lambda q, k, v, m, kw=kw, mk=mk: tiles(q, k, v, m, **kw, **mk))
            results.append((t, kw, mk, err))
    results.sort(key=lambda r: r[0])
    for t, kw, mk, err in results[:16]:
        print(f"  {t:6.2f} us  {sdpa / t:.2f}x  {kw} {mk}  max error {err:.3g}")


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("experiments/grouped_tiles.py")
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    for shape in sys.argv[1:] or ["8x4096", "1x4096"]:
        run(*map(int, shape.split("x")))
