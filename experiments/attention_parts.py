"""Where one-launch decode attention's time goes at B=1: the read, the merge, the lengths.

    python -m experiments.attention_parts [--keys 8192] [--sweep]

GPU only. A stripped-down copy of kernels.ops.decode_attention.kernel's one-launch kernel (one sequence, contiguous
caches, no PDL) is timed the one way (kernels.timing: CUDA-graph replays, inputs rotated past L2) in parts,
next to SDPA and our kernel, all in one run:
- whole: partials, an acquire-release atomic per program, and the merge by the last arrival (as ours);
- no merge: each split stores its partial and stops (the output is left unwritten: a time, not an answer);
- relaxed atomic: the same arrival count without ordering (may merge stale partials: a time only);
- release atomic, and a fence in the last arrival only;
- lengths read from memory first (as ours does) rather than passed as an argument.
The difference between whole and no merge is what the merge costs; the fastest pure read of the same bytes
is `experiments/read_floor.py`'s. `--sweep` also times the whole kernel over key tiles, splits and warps, with V
loaded before or after the scores.
"""

import argparse

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels import decode_attention, timing

WHOLE, NO_MERGE, RELAXED, RELEASE = (tl.constexpr(i) for i in range(4))  # what the kernel runs after its partial
PARTS = {0: "whole", 1: "no merge", 2: "relaxed atomic", 3: "release atomic + fence"}


@triton.jit
def _parts_kernel(
    Q,
    K,
    V,
    Lengths,
    Part,
    Counters,
    Out,
    N,
    SPLITS,
    CHUNK,
    scale,
    D: tl.constexpr,
    TILE: tl.constexpr,
    BLOCK_S: tl.constexpr,
    EARLY_V: tl.constexpr,
    PART: tl.constexpr,
    LOAD_LENGTH: tl.constexpr,
):
    h = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    dims = tl.arange(0, D)
    K += h * N * D
    V += h * N * D
    length = tl.load(Lengths).to(tl.int32) if LOAD_LENGTH else N
    lo = s * CHUNK
    hi = tl.minimum(lo + CHUNK, length)
    q = tl.load(Q + h * D + dims).to(tl.float32) * scale
    m_i = tl.full((), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((), dtype=tl.float32)
    acc = tl.zeros((D,), dtype=tl.float32)
    for start in range(lo, hi, TILE):
        cols = start + tl.arange(0, TILE)
        rows = cols[:, None] * D + dims[None, :]
        k = tl.load(K + rows, mask=(cols < hi)[:, None], other=0.0)
        if EARLY_V:
            v = tl.load(V + rows, mask=(cols < hi)[:, None], other=0.0)
        qk = tl.where(cols < hi, tl.sum(q[None, :] * k.to(tl.float32), axis=1), float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        if not EARLY_V:
            v = tl.load(V + rows, mask=(cols < hi)[:, None], other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
        m_i = m_new
    part_m = Part + tl.num_programs(0) * SPLITS * D
    part_l = part_m + tl.num_programs(0) * SPLITS
    tl.store(Part + (h * SPLITS + s) * D + dims, acc)
    tl.store(part_m + h * SPLITS + s, m_i)
    tl.store(part_l + h * SPLITS + s, l_i)
    if PART != NO_MERGE:
        tl.debug_barrier()
        if PART == RELAXED:
            arrived = tl.atomic_add(Counters + h, 1, sem="relaxed", scope="gpu")
        elif PART == RELEASE:
            arrived = tl.atomic_add(Counters + h, 1, sem="release", scope="gpu")
        else:
            arrived = tl.atomic_add(Counters + h, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLITS - 1:
            if PART == RELEASE:
                tl.inline_asm_elementwise(
                    "fence.acq_rel.gpu; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1
                )
            splits = tl.arange(0, BLOCK_S)
            m = tl.load(part_m + h * SPLITS + splits, mask=splits < SPLITS, other=float("-inf"))
            w = tl.where(m > float("-inf"), tl.exp2(m - tl.max(m, axis=0)), 0.0)
            l_sum = tl.sum(w * tl.load(part_l + h * SPLITS + splits, mask=splits < SPLITS, other=0.0), axis=0)
            partials = tl.load(
                Part + (h * SPLITS + splits)[:, None] * D + dims[None, :], mask=(splits < SPLITS)[:, None], other=0.0
            )
            tl.store(Out + h * D + dims, (tl.sum(w[:, None] * partials, axis=0) / l_sum).to(Out.dtype.element_ty))
            tl.store(Counters + h, 0)


def attend(q, k, v, lengths, part, counters, *, chunk, tile, warps, early_v=False, part_kind=0, load_length=True):
    heads, n, d = k.shape[1], k.shape[2], k.shape[3]
    splits = triton.cdiv(n, chunk)
    out = torch.full_like(q, float("nan"))  # an element left unwritten shows
    _parts_kernel[(heads, splits)](
        q,
        k,
        v,
        lengths,
        part,
        counters,
        out,
        n,
        splits,
        chunk,
        1.4426950408889634 / d**0.5,
        D=d,
        TILE=tile,
        BLOCK_S=max(2, triton.next_power_of_2(splits)),
        EARLY_V=early_v,
        PART=part_kind,
        LOAD_LENGTH=load_length,
        num_warps=warps,
        num_stages=1,
    )
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=8192)
    parser.add_argument("--sweep", action="store_true", help="also sweep the whole kernel's tiles")
    args = parser.parse_args()
    heads, d, n, dt = 12, 64, args.keys, torch.bfloat16

    def make():
        q = torch.randn(1, heads, 1, d, device="cuda", dtype=dt)
        k, v = (torch.randn(1, heads, n, d, device="cuda", dtype=dt) for _ in range(2))
        return q, k, v, torch.full((1,), n, device="cuda", dtype=torch.int32)

    kv_bytes = 2 * heads * n * d * 2
    sets = timing.rotated_inputs(make, bytes_per_set=kv_bytes)
    part = torch.empty(heads * 1024 * (d + 2), device="cuda", dtype=torch.float32)
    counters = torch.zeros(heads, device="cuda", dtype=torch.int32)
    ours = lambda q, k, v, n: decode_attention(q, k, v, n, one_launch=True)
    rows = [
        ("SDPA", lambda q, k, v, n: F.scaled_dot_product_attention(q, k, v), True),
        ("ours, one launch (default tiles)", ours, True),
    ]
    tilings = ((128, 128, 2), (64, 64, 1), (64, 64, 2), (128, 64, 2))  # (keys per split, key tile, warps)
    for chunk, tile, warps in tilings:
        tiles = dict(chunk=chunk, tile=tile, warps=warps)
        for kind, what in PARTS.items():
            fn = lambda q, k, v, n, t=tiles, p=kind: attend(q, k, v, n, part, counters, **t, part_kind=p)
            rows.append((f"{chunk} keys per split in {tile}-key tiles, {warps} warps: {what}", fn, kind == 0))
        fn = lambda q, k, v, n, t=tiles: attend(q, k, v, n, part, counters, **t, load_length=False)
        rows.append(
            (f"{chunk} keys per split in {tile}-key tiles, {warps} warps: whole, length as an argument", fn, True)
        )
    sweep = (
        (128, 128, 4),
        (64, 128, 2),
        (64, 128, 4),
        (32, 128, 2),
        (32, 64, 2),
        (32, 32, 1),
        (64, 256, 4),
        (128, 256, 4),
        (128, 512, 8),
    )
    for tile, chunk, warps in sweep if args.sweep else ():
        for early in (False, True):
            t = dict(chunk=chunk, tile=tile, warps=warps, early_v=early)
            name = f"{chunk} keys per split in {tile}-key tiles, {warps} warps, V {'with K' if early else 'after'}"
            rows.append((name, lambda q, k, v, n, t=t: attend(q, k, v, n, part, counters, **t), True))
    q, k, v, lens = sets[0]
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    print(f"B=1 H={heads} keys={n} D={d} bf16: {kv_bytes / 1e6:.1f} MB of K and V; {timing.COLD_REGIME}")
    print("| kernel | µs | TB/s | max error |\n|---|---:|---:|---:|")
    times = {}
    for name, fn, answers in rows:
        err = (fn(q, k, v, lens).float() - ref).abs().max().item()
        if answers and not err < 2e-2:
            raise AssertionError(f"{name}: max error {err} against SDPA in fp32")
        times[name] = timing.device_time(fn, sets, bytes_per_set=kv_bytes).ms * 1e3
        shown = f"{err:.4f}" if answers else "(not an answer)"
        print(f"| {name} | {times[name]:.2f} | {kv_bytes / times[name] / 1e6:.2f} | {shown} |", flush=True)
    print(f"\nSDPA {times['SDPA']:.2f} µs; 1.5x SDPA would be {times['SDPA'] / 1.5:.2f} µs")
    for chunk, tile, warps in tilings:
        head = f"{chunk} keys per split in {tile}-key tiles, {warps} warps: "
        whole, alone = times[head + "whole"], times[head + "no merge"]
        print(f"{head}the merge costs {whole - alone:.2f} µs of {whole:.2f}; without it {alone:.2f} µs")


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("experiments/attention_parts.py")
    main()
