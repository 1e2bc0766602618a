"""Grouped decode attention's loop at B=8 in one or two warps a program, and what the loop costs without its maths.

    python -m experiments.grouped_warps [8x4096]        (batch x keys)
    python -m experiments.grouped_warps --ncu 8x4096    (one launch of each form, for ncu's sections)

SmolLM2's 9 query heads over 3 key/value heads, bf16, 4096 keys. In four warps a 64-key tile's scores are spread
over the warps along the keys, so each tile's row max and sum and the probabilities' trip to the second dot go
through shared memory and a barrier; in one warp they stay in the warp. The sweeps before timed 4 and 8 warps
only. Here the loop (grouped_variants' kernel) runs in 1 and 2 warps over key tiles, splits and stages, first
without a merge (a diagnostic: partials stored, no output), then the fastest loops with their merges. Two
diagnostics split the loop itself: the same grid and loop reading K and V into a sum (no dot, no softmax), and
with both dots but no softmax (wrong answers; times only).
"""

import itertools
import sys

import torch
import triton
import triton.language as tl

from experiments.grouped_variants import HEADS, KV_HEADS, D, baseline, variant
from experiments.read_floor import read
from kernels import grouped_decode_attention
from kernels.ncu_check import profile_between_flushes


@triton.jit
def _loop_only(Q, K, V, Out, Lengths, CHUNK, positions, kv_heads, group, BLOCK_G: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOTS: tl.constexpr):  # fmt: skip
    """The kernel's grid and loop over its split's keys: K and V loaded as the kernel loads them; with DOTS
    both dots run (q . K^T, then the raw scores . V), without DOTS the tiles are only summed."""
    pid = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    b, kv = pid // kv_heads, pid % kv_heads
    queries, dims, keys_n = tl.arange(0, BLOCK_G), tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_N)
    row = positions * BLOCK_D
    k_base = K + (b * kv_heads + kv) * row + dims[None, :]
    v_base = V + (b * kv_heads + kv) * row + dims[None, :]
    n = tl.load(Lengths + b).to(tl.int32)
    heads = kv * group + queries
    q = tl.load(Q + (b * kv_heads * group + heads[:, None]) * BLOCK_D + dims[None, :], mask=(queries < group)[:, None])
    lo = split * CHUNK
    hi = tl.minimum(lo + CHUNK, n)
    if DOTS:
        acc = tl.zeros((BLOCK_G, BLOCK_D), tl.float32)
    else:
        acc = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    for s in range(lo, hi, BLOCK_N):
        pos = s + keys_n
        inside = (pos < hi)[:, None]
        k = tl.load(k_base + pos[:, None] * BLOCK_D, mask=inside, other=0.0)
        v = tl.load(v_base + pos[:, None] * BLOCK_D, mask=inside, other=0.0)
        if DOTS:
            scores = tl.dot(q, tl.trans(k))
            acc += tl.dot(scores.to(v.dtype), v)
        else:
            acc += k.to(tl.float32) + v.to(tl.float32)
    tl.store(Out + pid * tl.num_programs(1) + split, tl.sum(tl.sum(acc, axis=1), axis=0))


def loop_only(q, k, v, lens, *, block_n, splits, warps, stages, dots):
    batch, heads, _, d = q.shape
    kv_heads, positions = k.shape[1], k.shape[2]
    chunk = triton.cdiv(triton.cdiv(positions, block_n), splits) * block_n
    splits = triton.cdiv(positions, chunk)
    out = torch.empty(batch * kv_heads * splits, device=q.device, dtype=torch.float32)
    _loop_only[(batch * kv_heads, splits)](
        q, k, v, out, lens, chunk, positions, kv_heads, heads // kv_heads, BLOCK_G=16, BLOCK_N=block_n, BLOCK_D=d,
        DOTS=dots, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out


TODAY = dict(block_n=64, splits=16, warps=4, stages=3)  # plan()'s tiling at B=8, 4096 keys


def run(batch, n):
    (q, k, v, lens), want, time, sdpa = baseline(batch, n)
    print("| form | µs | x SDPA |\n|---|---:|---:|")

    def row(name, fn):
        t = time(fn)
        print(f"| {name} | {t:.2f} | {sdpa / t:.2f} |")
        return t

    for dots in (False, True):
        label = "both dots, no softmax" if dots else "K and V summed, no dot"
        for kw in (TODAY, dict(TODAY, warps=1), dict(TODAY, warps=2)):
            row(f"loop only ({label}), {kw}", lambda q, k, v, m, kw=kw, d=dots: loop_only(q, k, v, m, **kw, dots=d))
    loops = []
    for block_n, splits, warps, stages in itertools.product((32, 64, 128), (8, 16, 32, 64), (1, 2, 4), (2, 3, 4)):
        if n // splits < block_n or (warps == 4 and (block_n, stages) != (64, 3)):
            continue
        kw = dict(block_n=block_n, splits=splits, warps=warps, stages=stages)
        try:
            t = time(lambda q, k, v, m, kw=kw: variant(q, k, v, m, **kw, merge="none"))
        except Exception as e:  # a tile the shared memory or registers cannot hold
            print(f"  {kw}: {type(e).__name__}")
            continue
        loops.append((t, kw))
    loops.sort(key=lambda r: r[0])
    print("\nthe loops without a merge (diagnostic), fastest 12:")
    for t, kw in loops[:12]:
        print(f"  {t:6.2f} us  {sdpa / t:.2f}x  {kw}")
    today = [r for r in loops if r[1] == TODAY]
    print(f"  today's tiling: {today[0][0]:.2f} us" if today else "")
    print("\nthe fastest loops with their merges:")
    for _, kw in loops[:6] + today:
        for merge in ("arrival", "pdl"):
            got = variant(q, k, v, lens, **kw, merge=merge)
            err = (got.float() - want).abs().max().item()
            t = time(lambda q, k, v, m, kw=kw, g=merge: variant(q, k, v, m, **kw, merge=g))
            print(f"  {t:6.2f} us  {sdpa / t:.2f}x  {merge:8s} {kw}  max error {err:.3g}")


def ncu(batch, n):
    """One launch of each form in the profiled range, each between L2 flushes (ncu_check's harness)."""
    q = torch.randn(batch, HEADS, 1, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(batch, KV_HEADS, n, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lens = torch.full((batch,), n, device="cuda", dtype=torch.int32)
    profile_between_flushes(
        [
            lambda: grouped_decode_attention(q, k, v, lens),
            lambda: variant(q, k, v, lens, **TODAY, merge="none"),
            lambda: variant(q, k, v, lens, **dict(TODAY, warps=1), merge="none"),
            lambda: loop_only(q, k, v, lens, **TODAY, dots=False),
            lambda: read(k, v, 8192, 1, 8),
        ]
    )


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("experiments/grouped_warps.py")
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    args = sys.argv[1:]
    profile = args[:1] == ["--ncu"]
    for shape in (args[1:] if profile else args) or ["8x4096"]:
        (ncu if profile else run)(*map(int, shape.split("x")))
