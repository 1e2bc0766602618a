"""Grouped decode attention's loop at B=8 two more ways: the keys as the dot's long side, and the cache read by TMA.

    python -m experiments.grouped_layouts [8x4096 1x4096]   (batch x keys)

SmolLM2's 9 query heads over 3 key/value heads, bf16. Today's kernel scores a group's few query rows (padded to
16) against a tile of keys, q (16 x D) . K^T, so the tile of keys is the dot's second operand. Here the tile
can also be the first, K (N x D) . q^T, which gives the tensor cores a tile N rows long (Hopper's warpgroup dot
wants 64) and the output is kept transposed (D x 16). Either way the tile of keys and values can be requested by
pointers (today's) or copied by the TMA unit from a descriptor of the cache (no addresses in registers; the
copy lands in shared memory where the dot reads it). Each form is timed without a merge (a diagnostic: wrong
answers), with today's merge (the last split to arrive) and with a merge kernel launched under PDL, beside SDPA
(enable_gqa), today's kernel and a read-only kernel over the same bytes.

The TMA forms load whole tiles: the rows past a split's last key come from the cache as they are and weigh
nothing in the softmax. That is right only for a cache whose unused rows hold finite numbers, as here.
"""

import torch
import triton
import triton.language as tl

from experiments.grouped_variants import _merge_kernel, _merged, baseline
from kernels import arrival, pdl
from kernels.attn.decode import _partials
from kernels.attn.kernel import LOG2E
from kernels.attn.softmax import online_step
from kernels.config import overlaps_launches


@triton.jit
def _layout_kernel(Q, K, V, KD, VD, Out, Lengths, Part, Counters, SPLITS, kv_heads, group, CHUNK, positions,
                   scale_log2, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_S: tl.constexpr, BLOCK_GM: tl.constexpr, KEYS_FIRST: tl.constexpr, TMA: tl.constexpr,
                   MERGE: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    if MERGE == 2:
        pdl.launch_dependents(PDL)
    pid = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    b, kv = pid // kv_heads, pid % kv_heads
    queries, dims, keys_n = tl.arange(0, BLOCK_G), tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_N)
    heads = kv * group + queries
    row0 = (b * kv_heads + kv) * positions  # the pair's first row in the cache seen as (rows, D)
    n = tl.load(Lengths + b).to(tl.int32)
    q = tl.load(Q + (b * kv_heads * group + heads[:, None]) * BLOCK_D + dims[None, :], mask=(queries < group)[:, None])
    lo = split * CHUNK
    hi = tl.minimum(lo + CHUNK, n)
    m_i = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_G,), tl.float32)
    if KEYS_FIRST:
        acc = tl.zeros((BLOCK_D, BLOCK_G), tl.float32)
        qt = tl.trans(q)
    else:
        acc = tl.zeros((BLOCK_G, BLOCK_D), tl.float32)
    for s in range(lo, hi, BLOCK_N):
        pos = s + keys_n
        inside = (pos < hi)[:, None]
        if TMA:
            k = KD.load([(row0 + s).to(tl.int32), 0])
        else:
            k = tl.load(K + (row0 + pos[:, None]) * BLOCK_D + dims[None, :], mask=inside, other=0.0)
        if KEYS_FIRST:
            scores = tl.where(inside, tl.dot(k, qt) * scale_log2, float("-inf"))  # (keys, queries)
            m_i, alpha, p, l_i = online_step(m_i, l_i, scores, 0)
        else:
            scores = tl.where((pos < hi)[None, :], tl.dot(q, tl.trans(k)) * scale_log2, float("-inf"))
            m_i, alpha, p, l_i = online_step(m_i, l_i, scores, 1)
        if TMA:
            v = VD.load([(row0 + s).to(tl.int32), 0])
        else:
            v = tl.load(V + (row0 + pos[:, None]) * BLOCK_D + dims[None, :], mask=inside, other=0.0)
        if KEYS_FIRST:
            acc = acc * alpha[None, :] + tl.dot(tl.trans(v), p.to(v.dtype))
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    if KEYS_FIRST:
        acc = tl.trans(acc)
    live = queries < group
    first = b * kv_heads * group + kv * group
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


MERGES = {"arrival": 0, "none": 1, "pdl": 2}


def layout(q, k, v, lens, *, block_n, splits, warps, stages, keys_first, tma, merge):
    from triton.tools.tensor_descriptor import TensorDescriptor

    batch, heads, _, d = q.shape
    kv_heads, positions = k.shape[1], k.shape[2]
    group = heads // kv_heads
    chunk = triton.cdiv(triton.cdiv(positions, block_n), splits) * block_n
    splits = triton.cdiv(positions, chunk)
    o = torch.empty_like(q)
    part = torch.empty(batch * heads * splits * (d + 2), device=q.device, dtype=torch.float32)
    counters = arrival.counters(q.device, batch * kv_heads)
    kd = vd = None
    if tma:
        kd = TensorDescriptor.from_tensor(k.view(-1, d), [block_n, d])
        vd = TensorDescriptor.from_tensor(v.view(-1, d), [block_n, d])
    pdl_on = overlaps_launches(q.device)
    sizes = dict(BLOCK_D=d, BLOCK_S=triton.next_power_of_2(splits), BLOCK_GM=triton.next_power_of_2(group))
    _layout_kernel[(batch * kv_heads, splits)](
        q, k, v, kd, vd, o, lens, part, counters, splits, kv_heads, group, chunk, positions, LOG2E / d**0.5,
        BLOCK_G=16, BLOCK_N=block_n, **sizes, KEYS_FIRST=keys_first, TMA=tma, MERGE=MERGES[merge], PDL=pdl_on,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    if merge == "pdl":
        _merge_kernel[(batch * kv_heads,)](o, part, splits, group, **sizes, PDL=pdl_on, launch_pdl=pdl_on)
    return o


def run(batch, n):
    (q, k, v, lens), want, time, sdpa = baseline(batch, n)
    tilings = (
        [(64, 16, 4, 3), (64, 16, 4, 4), (128, 8, 4, 3), (64, 8, 4, 3)]
        if batch >= 4
        else [(64, 32, 4, 3), (128, 16, 4, 2)]
    )
    print(
        "| tiling (keys a tile, splits, warps, stages) | keys first | TMA | no merge (a diagnostic) | arrival | PDL |"
    )
    print("|---|---|---|---:|---:|---:|")
    for block_n, splits, warps, stages in tilings:
        for keys_first in (False, True):
            for tma in (False, True):
                kw = dict(block_n=block_n, splits=splits, warps=warps, stages=stages, keys_first=keys_first, tma=tma)
                cells = []
                for merge in ("none", "arrival", "pdl"):
                    try:
                        got = layout(q, k, v, lens, **kw, merge=merge)
                        err = (got.float() - want).abs().max().item()
                        t = time(lambda q, k, v, m, kw=kw, g=merge: layout(q, k, v, m, **kw, merge=g))
                        wrong = merge != "none" and not err < 0.05
                        cells.append(f"{t:.2f} ({sdpa / t:.2f}x){f' WRONG {err:.3g}' if wrong else ''}")
                    except Exception as e:  # a tile the GPU cannot hold, or a form this Triton cannot build
                        cells.append(f"{type(e).__name__}: {str(e).splitlines()[0][:60] if str(e) else ''}")
                print(f"| {block_n}, {splits}, {warps}, {stages} | {keys_first} | {tma} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    import sys

    from kernels.timing import require_cuda

    require_cuda("experiments/grouped_layouts.py")
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    for shape in sys.argv[1:] or ["8x4096", "1x4096"]:
        run(*map(int, shape.split("x")))
