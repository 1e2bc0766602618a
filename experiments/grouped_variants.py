"""Where grouped decode attention's time goes at B=8: the one-launch kernel's loop in variants, each timed beside
SDPA (enable_gqa) and a read-only kernel over the same bytes, at SmolLM2's 9 query heads over 3 key/value heads.

    python -m experiments.grouped_variants [8x4096 1x4096]   (batch x keys)
    python -m experiments.grouped_variants --config 64,16,4,3 8x4096   (no sweep: that tiling and its neighbours)

Knobs: splits of any count (not only powers of two), warps, pipeline stages, K and V of a tile requested
together at the top of the loop (BOTH), the first tile requested before the length arrives (SPEC, masked by the
cache's size), and the merge four ways: today's (an acquire-release arrival; the last split merges), a merge
kernel launched under PDL behind the splits, a relaxed arrival before the partials' stores (the last split
then waits on a second counter for the others' stores, not for its own), and no counter at all (the last split
polls the partials, each slot its own flag); and FMA (the group's few query rows scored on the vector units, no
shared-memory staging for the tensor cores' dot). --config also tries one tile a split. Diagnostics that give
wrong answers, to split the time: NOLEN (the cache size as the length: no wait for the length), merge="none"
(partials stored, no arrival and no merge).
"""

import itertools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from experiments.read_floor import read
from kernels import arrival, grouped_decode_attention, pdl
from kernels.attn.decode import _partials
from kernels.attn.grouped import _merge_group
from kernels.attn.softmax import online_step
from kernels.config import overlaps_launches
from kernels.timing import device_time, rotated_inputs

HEADS, KV_HEADS, D = 9, 3, 64


@triton.jit
def _variant(Q, K, V, Out, Lengths, Part, Counters, SPLITS, kv_heads, group, CHUNK, positions, scale_log2,
             BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
             BLOCK_GM: tl.constexpr, BOTH: tl.constexpr, SPEC: tl.constexpr, NOLEN: tl.constexpr,
             MERGE: tl.constexpr, PDL: tl.constexpr, FMA: tl.constexpr = False):  # fmt: skip
    if MERGE == 2:  # the merge kernel behind this one may start now and wait there
        pdl.launch_dependents(PDL)
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
        if FMA:  # the group's few rows on the vector units: no shared-memory staging for the tensor cores
            scores = tl.sum(q.to(tl.float32)[:, None, :] * k.to(tl.float32)[None, :, :], axis=2) * scale_log2
        else:
            scores = tl.dot(q, tl.trans(k)) * scale_log2
        scores = tl.where((pos < hi)[None, :], scores, float("-inf"))
        m_i, alpha, p, l_i = online_step(m_i, l_i, scores, 1)
        if not BOTH:
            v = tl.load(v_base + pos[:, None] * BLOCK_D, mask=kv_mask, other=0.0)
        if FMA:
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    live = queries < group
    first = b * kv_heads * group + kv * group
    if MERGE == 3:  # arrive first (relaxed): the last to arrive need not wait for its own stores to land
        arrived = tl.atomic_add(Counters + pid, 1, sem="relaxed", scope="gpu")
    PartO, PartM, PartL = _partials(Part, SPLITS, tl.num_programs(0) * group, BLOCK_D)
    part = (first + queries) * SPLITS + split
    tl.store(PartO + part[:, None] * BLOCK_D + dims[None, :], acc, mask=live[:, None])
    tl.store(PartM + part, m_i, mask=live)
    tl.store(PartL + part, l_i, mask=live)
    if MERGE == 0:
        tl.debug_barrier()
        arrived = tl.atomic_add(Counters + pid, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLITS - 1:
            _merged(Out, PartO, PartM, PartL, Counters + pid, first, group, SPLITS, BLOCK_GM, BLOCK_S, BLOCK_D)
    if MERGE == 3:
        tl.debug_barrier()
        Stored = Counters + tl.num_programs(0) + pid
        if arrived != SPLITS - 1:
            tl.atomic_add(Stored, 1, sem="release", scope="gpu")
        else:  # every other split has arrived, so it is running and will store: wait for those stores
            stored = tl.atomic_add(Stored, 0, sem="acquire", scope="gpu")
            while stored < SPLITS - 1:
                stored = tl.atomic_add(Stored, 0, sem="acquire", scope="gpu")
            tl.store(Stored, 0)
            _merged(Out, PartO, PartM, PartL, Counters + pid, first, group, SPLITS, BLOCK_GM, BLOCK_S, BLOCK_D)
    if MERGE == 4 and split == SPLITS - 1:
        _polled(Out, PartO, PartM, PartL, first, group, SPLITS, BLOCK_GM, BLOCK_S, BLOCK_D)


EMPTY = tl.constexpr(0x7FBADBAD)  # a NaN no arithmetic makes: a partial's slot not yet written


@triton.jit
def _polled(Out, PartO, PartM, PartL, first, group, SPLITS, BLOCK_GM: tl.constexpr, BLOCK_S: tl.constexpr,
            BLOCK_D: tl.constexpr):  # fmt: skip
    """MERGE == 4: the last split (the last to start) reads its group's partials until no slot holds EMPTY
    (each element is its own flag, so no counter and no fence: the last store to land is seen one round trip
    later), merges them and marks every slot EMPTY again for the next launch."""
    g, splits, dims = tl.arange(0, BLOCK_GM), tl.arange(0, BLOCK_S), tl.arange(0, BLOCK_D)
    at = (first + g)[:, None] * SPLITS + splits[None, :]
    ok = (g < group)[:, None] & (splits < SPLITS)[None, :]
    at3, ok3 = at[:, :, None] * BLOCK_D + dims[None, None, :], ok[:, :, None]
    Mi = PartM.to(tl.pointer_type(tl.int32), bitcast=True)
    Li = PartL.to(tl.pointer_type(tl.int32), bitcast=True)
    Oi = PartO.to(tl.pointer_type(tl.int32), bitcast=True)
    mb = tl.load(Mi + at, mask=ok, other=0, volatile=True)
    lb = tl.load(Li + at, mask=ok, other=0, volatile=True)
    ob = tl.load(Oi + at3, mask=ok3, other=0, volatile=True)
    pending = tl.sum((mb == EMPTY).to(tl.int32)) + tl.sum((lb == EMPTY).to(tl.int32))
    pending += tl.sum(tl.sum((ob == EMPTY).to(tl.int32), axis=2))
    while pending > 0:
        mb = tl.load(Mi + at, mask=ok, other=0, volatile=True)
        lb = tl.load(Li + at, mask=ok, other=0, volatile=True)
        ob = tl.load(Oi + at3, mask=ok3, other=0, volatile=True)
        pending = tl.sum((mb == EMPTY).to(tl.int32)) + tl.sum((lb == EMPTY).to(tl.int32))
        pending += tl.sum(tl.sum((ob == EMPTY).to(tl.int32), axis=2))
    m = tl.where(ok, mb.to(tl.float32, bitcast=True), float("-inf"))
    sums = lb.to(tl.float32, bitcast=True)
    part = ob.to(tl.float32, bitcast=True)
    m_max = tl.max(m, axis=1)
    w = tl.where(m > float("-inf"), tl.exp2(m - m_max[:, None]), 0.0)
    l_sum = tl.sum(w * sums, axis=1)
    o = tl.sum(w[:, :, None] * part, axis=1) / tl.where(l_sum > 0, l_sum, 1.0)[:, None]
    rows = Out + (first + g)[:, None] * BLOCK_D + dims[None, :]
    tl.store(rows, o.to(Out.dtype.element_ty), mask=(g < group)[:, None])
    empty = tl.full((BLOCK_GM, BLOCK_S), EMPTY, tl.int32)
    tl.store(Mi + at, empty, mask=ok)
    tl.store(Li + at, empty, mask=ok)
    tl.store(Oi + at3, tl.full((BLOCK_GM, BLOCK_S, BLOCK_D), EMPTY, tl.int32), mask=ok3)


@triton.jit
def _merged(Out, PartO, PartM, PartL, Counter, first, group, SPLITS, BLOCK_GM: tl.constexpr, BLOCK_S: tl.constexpr,
            BLOCK_D: tl.constexpr):  # fmt: skip
    """The last split's merge of its group's partials into their outputs; its counter set back to 0."""
    o = _merge_group(PartO, PartM, PartL, first, group, SPLITS, BLOCK_GM, BLOCK_S, BLOCK_D)
    g, dims = tl.arange(0, BLOCK_GM), tl.arange(0, BLOCK_D)
    rows = Out + (first + g)[:, None] * BLOCK_D + dims[None, :]
    tl.store(rows, o.to(Out.dtype.element_ty), mask=(g < group)[:, None])
    tl.store(Counter, 0)


@triton.jit
def _merge_kernel(Out, Part, SPLITS, group, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_GM: tl.constexpr,
                  PDL: tl.constexpr):  # fmt: skip
    """MERGE == 2: one program per (sequence, key/value head) merges its group's partials, launched under PDL
    behind the split kernel (its wait returns once every split has finished and its stores are visible)."""
    pdl.wait(PDL)
    first = tl.program_id(0).to(tl.int64) * group
    PartO, PartM, PartL = _partials(Part, SPLITS, tl.num_programs(0) * group, BLOCK_D)
    o = _merge_group(PartO, PartM, PartL, first, group, SPLITS, BLOCK_GM, BLOCK_S, BLOCK_D)
    g, dims = tl.arange(0, BLOCK_GM), tl.arange(0, BLOCK_D)
    rows = Out + (first + g)[:, None] * BLOCK_D + dims[None, :]
    tl.store(rows, o.to(Out.dtype.element_ty), mask=(g < group)[:, None])


MERGES = {"arrival": 0, "none": 1, "pdl": 2, "relaxed": 3, "polled": 4}  # "none": no output (a diagnostic)


_empty = {}  # the polled merge's partials, by size


def variant(
    q, k, v, lens, *, block_n, splits, warps, stages, both=False, spec=False, nolen=False, merge="arrival", fma=False
):
    batch, heads, _, d = q.shape
    kv_heads, positions = k.shape[1], k.shape[2]
    group = heads // kv_heads
    chunk = triton.cdiv(triton.cdiv(positions, block_n), splits) * block_n
    splits = triton.cdiv(positions, chunk)
    o = torch.empty_like(q)
    size = batch * heads * splits * (d + 2)
    if merge == "polled":  # slots EMPTY before the first launch; each launch's merge leaves them so
        if _empty.get(size) is None:
            _empty[size] = torch.full((size,), EMPTY.value, device=q.device, dtype=torch.int32).view(torch.float32)
        part = _empty[size]
    else:
        part = torch.empty(size, device=q.device, dtype=torch.float32)
    counters = arrival.counters(q.device, 2 * batch * kv_heads)
    pdl_on = overlaps_launches(q.device)
    sizes = dict(BLOCK_D=d, BLOCK_S=triton.next_power_of_2(splits), BLOCK_GM=triton.next_power_of_2(group))
    _variant[(batch * kv_heads, splits)](
        q, k, v, o, lens, part, counters, splits, kv_heads, group, chunk, positions, 1.4426950408889634 / d**0.5,
        BLOCK_G=sizes["BLOCK_GM"] if fma else 16, BLOCK_N=block_n, **sizes, BOTH=both, SPEC=spec and not fma,
        NOLEN=nolen, MERGE=MERGES[merge], PDL=pdl_on, FMA=fma, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    if merge == "pdl":
        _merge_kernel[(batch * kv_heads,)](o, part, splits, group, **sizes, PDL=pdl_on, launch_pdl=pdl_on)
    return o


def baseline(batch, n):
    """Random inputs rotated past L2, SDPA's answer, a timer in µs over those inputs, and SDPA's time; prints SDPA,
    today's kernel and the fastest pure read of the same bytes. Returns (inputs, want, time, sdpa)."""

    def make():
        q = torch.randn(batch, HEADS, 1, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(batch, KV_HEADS, n, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        return q, k, v, torch.full((batch,), n, device="cuda", dtype=torch.int32)

    kv_bytes = 4 * batch * KV_HEADS * n * D
    sets = rotated_inputs(make, bytes_per_set=kv_bytes)
    q, k, v, _ = sets[0]
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
    time = lambda fn: device_time(fn, sets, bytes_per_set=kv_bytes).ms * 1e3
    sdpa = time(lambda q, k, v, n: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    ours = time(lambda q, k, v, n: grouped_decode_attention(q, k, v, n))
    floor = min(time(lambda q, k, v, n, c=c: read(k, v, *c)) for c in ((2048, 2, 4), (4096, 2, 8), (8192, 1, 8)))
    print(f"\nB={batch} keys={n}: SDPA {sdpa:.2f} us, ours today {ours:.2f} us ({sdpa / ours:.2f}x)", end="")
    print(f", read only {floor:.2f}")
    return sets[0], want, time, sdpa


def run(batch, n, config=None):
    (q, k, v, lens), want, time, sdpa = baseline(batch, n)
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
    if config:  # the merges of a given tiling (block_n, splits, warps, stages) and its neighbours' splits
        block_n, splits, warps, stages = config
        tiling = dict(block_n=block_n, splits=splits, warps=warps, stages=stages)
        near = [dict(tiling, splits=s) for s in (splits // 2, splits, 2 * splits)]
        near += [dict(tiling, warps=w, fma=True) for w in (4, 8)]  # the group's rows on the vector units
        near += [dict(tiling, block_n=n // splits, warps=w, stages=2) for w in (4, 8)]  # each split one tile
        rows = sweep(near)
    else:
        rows = sweep(shapes)
    neighbours = list(itertools.product((2, 3, 4), (False, True), (False, True)))
    more = [] if config else [dict(r[1], stages=st, both=b, spec=sp) for r in rows[:4] for st, b, sp in neighbours]
    if more:
        rows = sweep([m for m in more if not (m["block_n"] == 128 and m["stages"] == 4)] + [r[1] for r in rows[:8]])
    for t, kw in rows[:12]:
        print(f"  {t:7.2f} us  {sdpa / t:5.2f}x SDPA  {kw}")
    best = rows[0][1]
    for kw in [r[1] for r in rows[:3]] if config else [best]:
        for merge in ("pdl", "relaxed", "polled"):  # other merges, checked against SDPA first
            err = (variant(q, k, v, lens, **kw, merge=merge).float() - want).abs().max().item()
            t = time(lambda q, k, v, m, g=merge, kw=kw: variant(q, k, v, m, **kw, merge=g))
            print(f"  {kw} with the {merge} merge: {t:.2f} us, {sdpa / t:.2f}x SDPA (max error {err:.3g})")
    t = time(lambda q, k, v, m: variant(q, k, v, m, **best, nolen=True))
    print(f"  best with nolen: {t:.2f} us (diagnostic)")
    t = time(lambda q, k, v, m: variant(q, k, v, m, **best, merge="none"))
    print(f"  best with no merge: {t:.2f} us (diagnostic)")
    t = time(lambda q, k, v, m: variant(q, k, v, m, **best, nolen=True, merge="none"))
    print(f"  best with nolen and no merge: {t:.2f} us (diagnostic)")


if __name__ == "__main__":
    import sys

    from kernels.timing import require_cuda

    require_cuda("experiments/grouped_variants.py")
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    args, config = sys.argv[1:], None
    if args[:1] == ["--config"]:
        config, args = tuple(map(int, args[1].split(","))), args[2:]
    for shape in args or ["8x4096", "1x4096"]:
        run(*map(int, shape.split("x")), config=config)
