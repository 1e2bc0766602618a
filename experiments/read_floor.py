"""How fast the bytes of decode attention can be read at all: the floor under any decode attention kernel.

    python -m experiments.read_floor [--keys 8192] [--batch 1] [--heads 12 --kv-heads 12] [--target 1.5]

GPU only. A kernel that only reads K and V (and sums them, so the loads stay) is timed the one way
(kernels.timing: CUDA-graph replays, inputs rotated past L2) over a sweep of tiles, next to SDPA and our
decode attention on the same shapes in the same run. Decode attention reads at least these bytes, so
no attention kernel timed this way can be faster than the fastest read. `--tiles` also times our one-launch
kernel over a sweep of tiles, those whose split is one key tile (held at once) among them. With fewer
`--kv-heads` than `--heads`, the cache holds the key/value heads and the kernels are grouped-query ones: SDPA
with enable_gqa, our grouped decode attention (and with --tiles its keys per tile and splits). `--target` is the
speed-up over SDPA asked for, which the fastest read says whether any kernel can reach.
"""

import argparse

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels import TileConfig, decode_attention, grouped_decode_attention, timing


@triton.jit
def _read_kernel(K, V, Out, n, BLOCK: tl.constexpr, PER_PROGRAM: tl.constexpr):
    """Program p reads PER_PROGRAM blocks of BLOCK elements of K and of V, and stores one sum."""
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    base = tl.program_id(0).to(tl.int64) * BLOCK * PER_PROGRAM
    for i in tl.static_range(PER_PROGRAM):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        acc += tl.load(K + offs, mask=mask, other=0.0).to(tl.float32)
        acc += tl.load(V + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Out + tl.program_id(0), tl.sum(acc, axis=0))


def read(k, v, block, per_program, warps):
    n = k.numel()
    grid = triton.cdiv(n, block * per_program)
    out = torch.empty(grid, device=k.device, dtype=torch.float32)
    _read_kernel[(grid,)](k, v, out, n, BLOCK=block, PER_PROGRAM=per_program, num_warps=warps)
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tiles", action="store_true", help="also sweep the one-launch kernel's tiles")
    parser.add_argument(
        "--pdl",
        action="store_true",
        help="also time the one-launch kernel under PDL, as the decode "
        "step launches it: each call may start reading K and V while the call before it finishes",
    )
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=None, help="key/value heads (default: as many as --heads)")
    parser.add_argument("--target", type=float, default=1.5, help="the speed-up over SDPA asked for")
    args = parser.parse_args()
    heads, head_dim, dt = args.heads, 64, torch.bfloat16
    kv_heads = args.kv_heads or heads
    b, n = args.batch, args.keys

    def make():
        q = torch.randn(b, heads, 1, head_dim, device="cuda", dtype=dt)
        k, v = (torch.randn(b, kv_heads, n, head_dim, device="cuda", dtype=dt) for _ in range(2))
        return q, k, v, torch.full((b,), n, device="cuda", dtype=torch.int32)

    kv_bytes = 2 * b * kv_heads * n * head_dim * 2
    sets = timing.rotated_inputs(make, bytes_per_set=kv_bytes)
    grouped = kv_heads < heads
    if grouped:
        rows = [
            ("SDPA (enable_gqa)", lambda q, k, v, lens: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)),
            ("ours, grouped", lambda q, k, v, lens: grouped_decode_attention(q, k, v, lens)),
        ]
        for block_n in (32, 64, 128, 256) if args.tiles else ():
            for splits in (4, 8, 16, 32, 64):
                if n // splits >= block_n:
                    name = f"ours, grouped: {block_n}-key tiles, {splits} splits"
                    fn = lambda q, k, v, lens, t=block_n, s=splits: grouped_decode_attention(
                        q, k, v, lens, block_n=t, split_k=s
                    )
                    rows.append((name, fn))
    else:
        rows = [
            ("SDPA", lambda q, k, v, lens: F.scaled_dot_product_attention(q, k, v)),
            ("ours, two launches", lambda q, k, v, lens: decode_attention(q, k, v, lens)),
            ("ours, one launch", lambda q, k, v, lens: decode_attention(q, k, v, lens, one_launch=True)),
        ]
    for block_n, warps in ((32, 2), (32, 4), (64, 4), (64, 8), (128, 4), (128, 8), (256, 8), (256, 16)):
        for splits in (16, 32, 64, 128, 256) if args.tiles and not grouped else ():
            if n // splits < block_n:
                continue
            cfg = TileConfig(block_n=block_n, split_k=splits, num_warps=warps)
            name = f"ours, one launch: {block_n}-key tiles, {splits} splits, {warps} warps"
            rows.append((name, lambda q, k, v, lens, c=cfg: decode_attention(q, k, v, lens, config=c, one_launch=True)))
    held = ((128, 64, 8), (64, 128, 4), (64, 128, 8), (32, 256, 2), (32, 256, 4))  # a split is one key tile
    for block_n, splits, warps in held if args.pdl and not grouped else ():
        cfg = TileConfig(block_n=block_n, split_k=splits, num_warps=warps)
        for pdl in (False, True):
            name = f"ours, one launch{', PDL' if pdl else ''}: {block_n}-key tiles, {splits} splits, {warps} warps"
            fn = lambda q, k, v, lens, c=cfg, p=pdl: decode_attention(q, k, v, lens, config=c, one_launch=True, pdl=p)
            rows.append((name, fn))
    for block in (1024, 2048, 4096, 8192):
        for per_program in (1, 2, 4):
            for warps in (4, 8):
                name = f"read only: {block} x {per_program} per program, {warps} warps"
                fn = lambda q, k, v, lens, c=(block, per_program, warps): read(k, v, *c)
                rows.append((name, fn))
    q, k, v, lens = sets[0]
    got = read(k, v, 2048, 2, 4).sum()
    want = k.float().sum() + v.float().sum()
    assert torch.allclose(got, want, rtol=1e-3, atol=1.0), (got, want)  # the reads are real
    shape = f"H={heads}" + (f" over {kv_heads} key/value heads" if grouped else "")
    print(f"B={b} {shape} keys={n} D={head_dim} bf16: {kv_bytes / 1e6:.1f} MB of K and V; {timing.COLD_REGIME}")
    print("| kernel | µs | TB/s |\n|---|---:|---:|")
    results = {}
    for name, fn in rows:
        t = timing.device_time(fn, sets, bytes_per_set=kv_bytes)
        results[name] = t.ms * 1e3
        print(f"| {name} | {t.ms * 1e3:.2f} | {kv_bytes / t.ms / 1e9:.2f} |", flush=True)
    sdpa = results[rows[0][0]]
    floor = min(v for k, v in results.items() if k.startswith("read only"))
    best = min((v, k) for k, v in results.items() if k.startswith("ours"))
    print(f"\nfastest of ours: {best[1]}, {best[0]:.2f} µs, {sdpa / best[0]:.2f}x SDPA")
    goal = sdpa / args.target
    print(f"\nSDPA {sdpa:.2f} µs; {args.target}x SDPA would be {goal:.2f} µs; the fastest read alone {floor:.2f} µs")
    print(f"fastest read / (SDPA / {args.target}) = {floor / goal:.2f} (above 1: the target is below the floor)")


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("experiments/read_floor.py")
    main()
