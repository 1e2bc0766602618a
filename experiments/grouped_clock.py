"""When does each program of grouped decode attention at B=8 get its keys, and when does it finish? The GPU's
global timer read inside the kernel, next to a plain read of the same bytes.

    python -m experiments.grouped_clock [8x4096]   (batch x keys)

SmolLM2's 9 query heads over 3 key/value heads, bf16. A plain read of K and V takes 7.8 µs at B=8 and 4096 keys,
grouped decode attention's splits without their merge 9.5-9.8, with all of a split's keys requested at once
(experiments.grouped_tiles) or in a loop (grouped_warps). Either the keys reach the attention kernel later than
they reach the read, or the work after they arrive is what costs. Each program here stamps %globaltimer when it
starts, when its keys and values are all in registers (one-tile splits: after a sum that needs every element;
loops: after the loop) and when its outputs are ready, with the SM it ran on. Each form is also timed (CUDA
graph, inputs rotated past L2) without stamps, without a merge and with the library's merge kernel
(grouped._grouped_merge under PDL) and, for today's loop, with a second launch that only waits and stores (what
the merge's launch costs alone), in the library's grid order (sequence and head fastest) and with the splits of
a head side by side, and the loop with every tile requested up front (stages = tiles + 1).
"""

import sys

import torch
import triton
import triton.language as tl

from experiments.grouped_variants import HEADS, KV_HEADS, D, baseline
from kernels import pdl
from kernels.attn.decode import _partials
from kernels.attn.grouped import _grouped_merge
from kernels.attn.softmax import online_step
from kernels.config import overlaps_launches
from kernels.ncu_check import l2_flush


@triton.jit
def _clock(after):
    """The global timer in ns, read once `after` (an int32) is known."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [after], dtype=tl.int64, is_pure=False,
                                     pack=1)  # fmt: skip


@triton.jit
def _sm(after):
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [after], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _stamp(Stamps, pid, t0, t1, t2, sm):
    tl.store(Stamps + pid * 4, t0)
    tl.store(Stamps + pid * 4 + 1, t1)
    tl.store(Stamps + pid * 4 + 2, t2)
    tl.store(Stamps + pid * 4 + 3, sm.to(tl.int64))


@triton.jit
def _read(K, V, Out, Stamps, n, BLOCK: tl.constexpr, STAMP: tl.constexpr):
    """experiments.read_floor's read, one block of K and one of V a program, stamped."""
    pid = tl.program_id(0)
    if STAMP:
        t0 = _clock(pid)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    k = tl.load(K + offs, mask=mask, other=0.0).to(tl.float32)
    total = tl.sum(k + tl.load(V + offs, mask=mask, other=0.0).to(tl.float32))
    tl.store(Out + pid, total)
    if STAMP:
        t1 = _clock(total.to(tl.int32, bitcast=True))
        _stamp(Stamps, pid, t0, t1, t1, _sm(pid))


@triton.jit
def _splits(Q, K, V, Part, Lengths, Stamps, SPLITS, pairs, kv_heads, group, CHUNK, positions, scale_log2,
            BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, ONE_TILE: tl.constexpr,
            SPLIT_FIRST: tl.constexpr, STAMP: tl.constexpr, TRIGGER: tl.constexpr):  # fmt: skip
    """grouped._grouped_decode_kernel's splits (partials only), in a 1-D grid of either order, stamped."""
    pdl.launch_dependents(TRIGGER)
    pid = tl.program_id(0)
    if STAMP:
        t0 = _clock(pid)
    if SPLIT_FIRST:
        pair, split = pid // SPLITS, pid % SPLITS
    else:
        pair, split = pid % pairs, pid // pairs
    pair = pair.to(tl.int64)
    b, kv = pair // kv_heads, pair % kv_heads
    queries, dims, keys_n = tl.arange(0, BLOCK_G), tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_N)
    heads = kv * group + queries
    live = queries < group
    row = positions * BLOCK_D
    k_base = K + pair * row + dims[None, :]
    v_base = V + pair * row + dims[None, :]
    lo = split * CHUNK
    if ONE_TILE:
        pos = lo + keys_n
        inside = (pos < positions)[:, None]
        k = tl.load(k_base + pos[:, None] * BLOCK_D, mask=inside, other=0.0)
        v = tl.load(v_base + pos[:, None] * BLOCK_D, mask=inside, other=0.0)
        if STAMP:
            arrived = tl.sum(tl.sum(k.to(tl.float32) + v.to(tl.float32), axis=1), axis=0)
            t1 = _clock(arrived.to(tl.int32, bitcast=True))
        n = tl.load(Lengths + b).to(tl.int32)
        q = tl.load(Q + (b * kv_heads * group + heads[:, None]) * BLOCK_D + dims[None, :], mask=live[:, None])
        seen = (pos < n)[None, :]
        scores = tl.where(seen, tl.dot(q, tl.trans(k)) * scale_log2, float("-inf"))
        m_i = tl.max(scores, axis=1)
        p = tl.where(seen, tl.exp2(scores - m_i[:, None]), 0.0)
        l_i = tl.sum(p, axis=1)
        acc = tl.dot(p.to(v.dtype), v)
    else:
        n = tl.load(Lengths + b).to(tl.int32)
        q = tl.load(Q + (b * kv_heads * group + heads[:, None]) * BLOCK_D + dims[None, :], mask=live[:, None])
        hi = tl.minimum(lo + CHUNK, n)
        m_i = tl.full((BLOCK_G,), float("-inf"), tl.float32)
        l_i = tl.zeros((BLOCK_G,), tl.float32)
        acc = tl.zeros((BLOCK_G, BLOCK_D), tl.float32)
        for start in range(lo, hi, BLOCK_N):
            pos = start + keys_n
            kv_mask = (pos < hi)[:, None]
            k = tl.load(k_base + pos[:, None] * BLOCK_D, mask=kv_mask, other=0.0)
            scores = tl.dot(q, tl.trans(k)) * scale_log2
            scores = tl.where((pos < hi)[None, :], scores, float("-inf"))
            m_i, alpha, p, l_i = online_step(m_i, l_i, scores, 1)
            v = tl.load(v_base + pos[:, None] * BLOCK_D, mask=kv_mask, other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        if STAMP:
            t1 = _clock(tl.sum(l_i, axis=0).to(tl.int32, bitcast=True))
    PartO, PartM, PartL = _partials(Part, SPLITS, pairs * group, BLOCK_D)
    part = (pair * group + queries) * SPLITS + split
    tl.store(PartO + part[:, None] * BLOCK_D + dims[None, :], acc, mask=live[:, None])
    tl.store(PartM + part, m_i, mask=live)
    tl.store(PartL + part, l_i, mask=live)
    if STAMP:
        t2 = _clock(tl.sum(tl.sum(acc, axis=1), axis=0).to(tl.int32, bitcast=True))
        _stamp(Stamps, pid, t0, t1, t2, _sm(pid))


@triton.jit
def _launch_only(out, PDL: tl.constexpr):
    """The merge's second launch without its work: the wait, then one store a program."""
    pdl.wait(PDL)
    tl.store(out + tl.program_id(0), 0.0)


def read(k, v, stamps=None, block=8192):
    n = k.numel()
    grid = triton.cdiv(n, block)
    out = torch.empty(grid, device=k.device, dtype=torch.float32)
    _read[(grid,)](k, v, out, stamps, n, BLOCK=block, STAMP=stamps is not None, num_warps=8)
    return out


def splits(q, k, v, lens, *, block_n, chunk, warps, stages, split_first, merge, stamps=None):
    batch, heads, _, d = q.shape
    kv_heads, positions = k.shape[1], k.shape[2]
    group, pairs = heads // kv_heads, batch * kv_heads
    count = triton.cdiv(positions, chunk)
    part = torch.empty(batch * heads * count * (d + 2), device=q.device, dtype=torch.float32)
    on = overlaps_launches(q.device)
    _splits[(pairs * count,)](
        q, k, v, part, lens, stamps, count, pairs, kv_heads, group, chunk, positions, 1.4426950408889634 / d**0.5,
        BLOCK_G=16, BLOCK_N=block_n, BLOCK_D=d, ONE_TILE=chunk == block_n, SPLIT_FIRST=split_first,
        STAMP=stamps is not None, TRIGGER=on and bool(merge), num_warps=warps, num_stages=stages,
    )  # fmt: skip
    o = torch.empty_like(q)
    if merge == "launch only":
        _launch_only[(batch * heads * (d // 16),)](o, PDL=on, num_warps=1, launch_pdl=on)
    elif merge:
        merge_into(o, part, count)
    return o


def merge_into(o, part, count):
    """The library's merge kernel over `count` splits' partials into o (B, H, 1, D), under PDL where there is."""
    batch, heads, _, d = o.shape
    on, so = overlaps_launches(o.device), o.stride()
    _grouped_merge[(batch * heads, d // 16)](
        (o, so[0], so[1], so[3]), part, count, heads, HEAD_DIM=d, BLOCK_S=triton.next_power_of_2(count), BLOCK_DM=16,
        BLOCK_D=d, PDL=on, TRIGGER=False, num_warps=1, launch_pdl=on,
    )  # fmt: skip


def clocked(call, programs: int, label: str, runs: int = 5) -> None:
    """Stamps of `runs` launches, each after an L2 flush; prints the median run's, in µs from the first start."""
    flush = l2_flush(torch.device("cuda"))
    stamps = torch.zeros(programs * 4, device="cuda", dtype=torch.int64)
    call(stamps)
    summaries = []
    for _ in range(runs):
        flush()
        torch.cuda.synchronize()
        call(stamps)
        torch.cuda.synchronize()
        s = stamps.view(programs, 4).cpu()
        t = (s[:, :3] - s[:, 0].min()).double() / 1e3
        count = torch.bincount(s[:, 3])
        crowd = count[s[:, 3]].double()  # programs on each program's SM
        summaries.append((t[:, 2].max().item(), t, count.max().item(), crowd))
    span, t, per_sm, crowd = sorted(summaries, key=lambda r: r[0])[runs // 2]
    q = lambda a, p: torch.quantile(a, p / 100).item()
    print(f"  {label}: last start {t[:, 0].max():5.2f}  keys in p10/p50/p90/max {q(t[:, 1], 10):5.2f} "
          f"{q(t[:, 1], 50):5.2f} {q(t[:, 1], 90):5.2f} {t[:, 1].max():5.2f}  outputs ready max {span:5.2f}  "
          f"after the keys p50/max {q(t[:, 2] - t[:, 1], 50):5.2f} {(t[:, 2] - t[:, 1]).max():5.2f}  "
          f"programs/SM {per_sm}")  # fmt: skip
    last = torch.argsort(t[:, 2])[-len(t) // 10 :]  # the latest tenth to finish
    print(f"    the latest tenth: on SMs of {crowd[last].mean():.2f} programs (all: {crowd.mean():.2f}), launched "
          f"at position {last.double().mean() / len(t):.2f} of the grid on average (all: 0.50)")  # fmt: skip


FORMS = {
    "loop 64x4 16 splits, 4 warps, 3 stages": dict(block_n=64, chunk=256, warps=4, stages=3),
    "loop 64x4 16 splits, 4 warps, 5 stages (all tiles up front)": dict(block_n=64, chunk=256, warps=4, stages=5),
    "loop 64x2 32 splits, 4 warps, 3 stages": dict(block_n=64, chunk=128, warps=4, stages=3),
    "loop 64x6 11 splits (2 programs an SM), 4 warps, 3 stages": dict(block_n=64, chunk=384, warps=4, stages=3),
    "loop 128x2 16 splits, 8 warps, 3 stages": dict(block_n=128, chunk=256, warps=8, stages=3),
    "one tile of 64, 1 warp": dict(block_n=64, chunk=64, warps=1, stages=1),
    "one tile of 128, 4 warps": dict(block_n=128, chunk=128, warps=4, stages=1),
}


def run(batch, n):
    (q, k, v, lens), want, time, sdpa = baseline(batch, n)
    pairs = batch * KV_HEADS
    print("device time (µs, x SDPA) without a merge / with the merge kernel; then one launch's stamps (µs)")
    print(f"  read, 8192 elements of K and V a program in 8 warps: {time(lambda q, k, v, m: read(k, v)):.2f}")
    clocked(lambda st: read(k, v, st), k.numel() // 8192, "read")
    for name, form in FORMS.items():
        for split_first in (False, True):
            kw = dict(form, split_first=split_first)
            err = (splits(q, k, v, lens, **kw, merge=True).float() - want).abs().max().item()
            bare = time(lambda q, k, v, m, kw=kw: splits(q, k, v, m, **kw, merge=False))
            merged = time(lambda q, k, v, m, kw=kw: splits(q, k, v, m, **kw, merge=True))
            label = f"{name}, {'splits' if split_first else 'heads'} side by side"
            print(f"{label}: {bare:.2f} ({sdpa / bare:.2f}x) / {merged:.2f} ({sdpa / merged:.2f}x), error {err:.3g}")
            programs = pairs * triton.cdiv(n, form["chunk"])
            clocked(lambda st, kw=kw: splits(q, k, v, lens, **kw, merge=False, stamps=st), programs, "stamps")
            if name == next(iter(FORMS)) and not split_first:
                alone = time(lambda q, k, v, m, kw=kw: splits(q, k, v, m, **kw, merge="launch only"))
                print(f"  the same with a second launch that only waits and stores: {alone:.2f}")


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("experiments/grouped_clock.py")
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, HEADS, KV_HEADS, D)
    for shape in sys.argv[1:] or ["8x4096"]:
        run(*map(int, shape.split("x")))
