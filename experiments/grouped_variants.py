"""Where grouped decode attention's time goes at B=8: the one-launch kernel's loop in variants, each timed beside
SDPA (enable_gqa) and a read-only kernel over the same bytes, at SmolLM2's 9 query heads over 3 key/value heads.

    python -m experiments.grouped_variants [8x4096 1x4096]   (batch x keys)

Knobs: splits of any count (not only powers of two), warps, pipeline stages, K and V of a tile requested
together at the top of the loop (BOTH), the first tile requested before the length arrives (SPEC, masked by the
cache's size). Diagnostics that give wrong answers, to split the time: NOLEN (the cache size as the length: no
wait for the length), NOMERGE (partials stored, no arrival and no merge).
"""

import itertools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from experiments.read_floor import read
from kernels import arrival, grouped_decode_attention
from kernels.attn.decode import _partials
from kernels.attn.grouped import _merge_group
from kernels.attn.softmax import online_step
from kernels.timing import device_time, rotated_inputs

HEADS, KV_HEADS, D = 9, 3, 64


@triton.jit
def _variant(Q, K, V, Out, Lengths, Part, Counters, SPLITS, kv_heads, group, CHUNK, positions, scale_log2,
             BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
             BLOCK_GM: tl.constexpr, BOTH: tl.constexpr, SPEC: tl.constexpr, NOLEN: tl.constexpr,
             NOMERGE: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    b, kv = pid // kv_heads, pid % kv_heads
    queries, dims, keys_n = tl.arange(0, BLOCK_G), tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_N)
    heads = kv * group + queries
    q_mask = (queries < group)[:, None]
    row = positions * BLOCK_D
    k_base = K + (b * kv_heads + kv) * row + dims[None, :]
    v_base = V + (b * kv_heads + kv) * row + dims[None, :]
    lo = split * CHUNK
    m_i = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), tl.float32)
    start = lo
    if SPEC:
        pos = lo + keys_n
        inside = (pos < positions)[:, None]
        k0 = tl.load(k_base + pos[:, None] * BLOCK_D, mask=inside, other=0.0)
        v0 = tl.load(v_base + pos[:, None] * BLOCK_D, mask=inside, other=0.0)
    if NOLEN:
        n = positions
    else:
        n = tl.load(Lengths + b).to(tl.int32)
    q = tl.load(Q + (b * kv_heads * group + heads[:, None]) * BLOCK_D + dims[None, :], mask=q_mask, other=0.0)
    hi = tl.minimum(lo + CHUNK, n)
    if SPEC:
        pos = lo + keys_n
        scores = tl.dot(q, tl.trans(k0)) * scale_log2
        scores = tl.where((pos < hi)[None, :], scores, float("-inf"))
        m_i = tl.max(scores, axis=1)
        p = tl.where((pos < hi)[None, :], tl.exp2(scores - m_i[:, None]), 0.0)
        l_i = tl.sum(p, axis=1)
        acc = tl.dot(p.to(v0.dtype), v0)
        start = lo + BLOCK_N
    for s in range(start, hi, BLOCK_N):
        pos = s + keys_n
        kv_mask = (pos < hi)[:, None]
        k = tl.load(k_base + pos[:, None] * BLOCK_D, mask=kv_mask, other=0.0)
        if BOTH:
            v = tl.load(v_base + pos[:, None] * BLOCK_D, mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k)) * scale_log2
        scores = tl.where((pos < hi)[None, :], scores, float("-inf"))
        m_i, alpha, p, l_i = online_step(m_i, l_i, scores, 1)
        if not BOTH:
            v = tl.load(v_base + pos[:, None] * BLOCK_D, mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    live = queries < group
    first = b * kv_heads * group + kv * group
    PartO, PartM, PartL = _partials(Part, SPLITS, tl.num_programs(0) * group, BLOCK_D)
    part = (first + queries) * SPLITS + split
    tl.store(PartO + part[:, None] * BLOCK_D + dims[None, :], acc, mask=live[:, None])
    tl.store(PartM + part, m_i, mask=live)
    tl.store(PartL + part, l_i, mask=live)
    if not NOMERGE:
        tl.debug_barrier()
        arrived = tl.atomic_add(Counters + pid, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLITS - 1:
            o = _merge_group(PartO, PartM, PartL, first, group, SPLITS, BLOCK_GM, BLOCK_S, BLOCK_D)
            g = tl.arange(0, BLOCK_GM)
            rows = Out + (b * kv_heads * group + kv * group + g)[:, None] * BLOCK_D + dims[None, :]
            tl.store(rows, o.to(Out.dtype.element_ty), mask=(g < group)[:, None])
            tl.store(Counters + pid, 0)


def variant(q, k, v, lens, *, block_n, splits, warps, stages, both=False, spec=False, nolen=False, nomerge=False):
    batch, heads, _, d = q.shape
    kv_heads, positions = k.shape[1], k.shape[2]
    group = heads // kv_heads
    chunk = triton.cdiv(triton.cdiv(positions, block_n), splits) * block_n
    splits = triton.cdiv(positions, chunk)
    o = torch.empty_like(q)
    part = torch.empty(batch * heads * splits * (d + 2), device=q.device, dtype=torch.float32)
    counters = arrival.counters(q.device, batch * kv_heads)
    _variant[(batch * kv_heads, splits)](
        q, k, v, o, lens, part, counters, splits, kv_heads, group, chunk, positions, 1.4426950408889634 / d**0.5,
        BLOCK_G=16, BLOCK_N=block_n, BLOCK_D=d, BLOCK_S=triton.next_power_of_2(splits),
        BLOCK_GM=triton.next_power_of_2(group), BOTH=both, SPEC=spec, NOLEN=nolen, NOMERGE=nomerge,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return o


def run(batch, n):
    def make():
        q = torch.randn(batch, HEADS, 1, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(batch, KV_HEADS, n, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        return q, k, v, torch.full((batch,), n, device="cuda", dtype=torch.int32)

    kv_bytes = 4 * batch * KV_HEADS * n * D
    sets = rotated_inputs(make, bytes_per_set=kv_bytes)
    q, k, v, lens = sets[0]
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
    time = lambda fn: device_time(fn, sets, bytes_per_set=kv_bytes).ms * 1e3
    sdpa = time(lambda q, k, v, n: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    ours = time(lambda q, k, v, n: grouped_decode_attention(q, k, v, n))
    floor = min(time(lambda q, k, v, n, c=c: read(k, v, *c)) for c in ((2048, 2, 4), (4096, 2, 8), (8192, 1, 8)))
    print(f"\nB={batch} keys={n}: SDPA {sdpa:.2f} us, ours today {ours:.2f} us ({sdpa / ours:.2f}x)", end="")
    print(f", read only {floor:.2f}")
    pairs = batch * KV_HEADS
    split_choices = sorted({s for s in (4, 8, 11, 16, 22, 32, 44) if s * pairs <= 2048 and n // s >= 32})

    def sweep(configs):
        rows = []
        for kw in configs:
            try:
                got = variant(q, k, v, lens, **kw)
                err = (got.float() - want).abs().max().item()
                if err > 0.05:
                    print(f"  WRONG {kw}: max error {err:.3g}")
                    continue
                rows.append((time(lambda q, k, v, m, kw=kw: variant(q, k, v, m, **kw)), kw))
            except Exception as e:  # a tile the shared memory cannot hold
                print(f"  {kw}: {type(e).__name__}")
        return sorted(rows, key=lambda r: r[0])

    shapes = [
        dict(block_n=b, splits=s, warps=w, stages=3)
        for b, s, w in itertools.product((32, 64, 128), split_choices, (4, 8))
        if n // s >= b
    ]
    rows = sweep(shapes)
    more = [
        dict(r[1], stages=st, both=both, spec=spec)
        for r in rows[:4]
        for st, both, spec in itertools.product((2, 3, 4), (False, True), (False, True))
    ]
    rows = sweep([m for m in more if not (m["block_n"] == 128 and m["stages"] == 4)] + [r[1] for r in rows[:8]])
    for t, kw in rows[:12]:
        print(f"  {t:7.2f} us  {sdpa / t:5.2f}x SDPA  {kw}")
    best = rows[0][1]
    for diag in ("nolen", "nomerge"):
        t = time(lambda q, k, v, m, d=diag: variant(q, k, v, m, **best, **{d: True}))
        print(f"  best with {diag}: {t:.2f} us (diagnostic)")
    t = time(lambda q, k, v, m: variant(q, k, v, m, **best, nolen=True, nomerge=True))
    print(f"  best with nolen and nomerge: {t:.2f} us (diagnostic)")


if __name__ == "__main__":
    import sys

    from kernels.timing import require_cuda

    require_cuda("experiments/grouped_variants.py")
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    for shape in sys.argv[1:] or ["8x4096", "1x4096"]:
        run(*map(int, shape.split("x")))
