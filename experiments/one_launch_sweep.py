"""The rungs that run a layer or a whole step in one launch, on a GPU, each variant one whole decode step next to
the overlap rung: the persistent rung's launch (PDL or not), attention tiles and column tiles; the megakernel
rung's weights requested into L2 a layer ahead or not, its programs per SM (more than one weight slice in flight on
an SM) and its attention split (more items than programs).

    python -m experiments.one_launch_sweep [--rung persistent|megakernel] [--family gpt2|llama] [--context 1000]
        [--batch 1] [--only WORDS]

GPT-2 small's shape (or SmolLM2-135M's), random weights, bf16, `--batch` sequences (1), one decode step at `context`
keys, replayed from a CUDA graph (explorer.measure.ladder.rung_row: median of CUDA-event-timed replays). PDL does
not change what is computed: variants with the same tiles must give the same logits exactly (eager, from one replay,
and over 48 greedy steps replayed from a graph). Other attention or column tiles sum in another order; every variant
is also compared to the torch backend.
"""

import argparse

import torch

import kernels.ops.decode_layer.kernel as DL
import kernels.ops.decode_step as DS
from explorer.measure.ladder import random_cache, reset, rung_row
from explorer.model.graphs import DecodeGraph
from explorer.model.weights import config_from_hf, from_hf_state_dict

VARIANTS = {
    # name: (PDL, attention's key tile, items per program): a tile of 128 keys holds a split of 128 keys whole,
    # loaded before the wait for stage 0, where 64-key tiles loop after it
    "persistent": {
        "plain launch, attention loop": DL.Variant(False, 64, 1),
        "PDL, attention loop": DL.Variant(True, 64, 1),
        "plain launch, attention held": DL.Variant(False, 128, 1),
        "PDL, attention held (the default)": DL.Variant(True, 128, 1),
        "PDL, attention held, 2 column tiles per program": DL.Variant(True, 128, 2),
    },
    "megakernel": {
        "weights one task ahead, in registers (the default)": DS.Variant(l2_ahead=False),
        "and the next layer's requested into L2": DS.Variant(l2_ahead=True),
        # 253-255 registers a thread at 8 warps or 4: one program of 8 warps an SM, or two of 4 (sm_90, Triton 3.9)
        "two programs an SM, 4 warps each, half-width slices": DS.Variant(per_sm=2, warps=4),
        "attention keys split for about four items a program": DS.Variant(items=4),
        # from 5 rows on (--batch 5 or more; at fewer it is the default's kernel)
        "the projections' rows in one tl.dot of 16": DS.Variant(dot=True),
        # at batch 8 (sm_90, Triton 3.6) a quarter of the weights a task spills 384 bytes a thread at GPT-2's shape
        # against the default's 1040 (SmolLM2's 808 against 704)
        "a quarter of the weights a task, narrower column tiles": DS.Variant(narrow=4),
    },
}
VARIED = {"persistent": DL.varied, "megakernel": DS.varied}


def logits(model, rung, context, graph, batch=1):
    """One decode step's logits at `context` keys, eager or replayed from a CUDA graph."""
    m = model.with_fusion(rung) if rung != "torch" else model.with_backend("torch")
    cache = random_cache(m, batch, context, torch.Generator().manual_seed(1))
    ids = torch.arange(123, 123 + batch, device="cuda")
    if graph:
        g = DecodeGraph(m, cache)
        reset(cache, context)
        return g.step(ids).float().clone()
    return m.decode(ids, cache).float()


def steps(model, rung, context, batch=1, n=48):
    """n greedy steps replayed from one graph, from context - n on: (n, batch, vocab) logits."""
    m = model.with_fusion(rung)
    cache = random_cache(m, batch, context, torch.Generator().manual_seed(2))
    g = DecodeGraph(m, cache)
    reset(cache, context - n)
    ids, out = torch.arange(123, 123 + batch, device="cuda"), []
    for _ in range(n):
        logits = g.step(ids)
        out.append(logits.float().clone())
        ids = logits.argmax(-1)
    return torch.stack(out)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rung", choices=sorted(VARIANTS), default="megakernel")
    parser.add_argument("--family", choices=["gpt2", "llama"], default="gpt2", help="llama: the megakernel rung only")
    parser.add_argument("--context", type=int, default=1000)
    parser.add_argument("--replays", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1, help="sequences a step (1 to 16)")
    parser.add_argument("--only", help="comma-separated words: only the variants whose names hold one of them")
    args = parser.parse_args()
    from benchmarks.ladder import random_hf

    torch.manual_seed(0)
    hf, shape = random_hf(args.family)
    model = from_hf_state_dict(config_from_hf(hf.config), hf.state_dict(), device="cuda", dtype=torch.bfloat16)
    print(f"{shape}, bf16, batch {args.batch}, context {args.context}", flush=True)
    b = args.batch
    ref = logits(model, "torch", args.context, graph=False, batch=b)
    o = rung_row(model, "overlap", context=args.context, batch=b, replays=args.replays)
    print(f"overlap rung: {o['step_ms']:.3f} ms, {o['kernels']} kernels", flush=True)
    print(
        f"| {args.rung} rung | ms | kernels | vs overlap | same as the first (eager, graph, 48 steps) "
        "| max |Δ| vs torch |"
    )
    print("|---|---:|---:|---:|---|---:|")
    first = None
    words = args.only.split(",") if args.only else None
    for name, variant in VARIANTS[args.rung].items():
        if words and not any(w in name for w in words):
            continue
        try:
            with VARIED[args.rung](variant):
                r = rung_row(model, args.rung, context=args.context, batch=b, replays=args.replays)
                got = [logits(model, args.rung, args.context, g, batch=b) for g in (False, True)]
                got.append(steps(model, args.rung, args.context, batch=b))
                DS.check("cuda")
            first = first or got
            same = [torch.equal(a, b) for a, b in zip(got, first, strict=True)]
            diff = (got[1] - ref).abs().max().item()
            ratio = o["step_ms"] / r["step_ms"]
            print(f"| {name} | {r['step_ms']:.3f} | {r['kernels']} | {ratio:.2f}x | {same} | {diff:.3f} |", flush=True)
        except Exception as e:  # one failing variant must not hide the others' numbers
            print(f"| {name} | failed: {type(e).__name__}: {str(e)[:300]} |", flush=True)
    o = rung_row(model, "overlap", context=args.context, batch=b, replays=args.replays)
    print(
        f"\noverlap rung again: {o['step_ms']:.3f} ms; the overlap rung's logits against torch: max |Δ| "
        f"{(logits(model, 'overlap', args.context, True, batch=b) - ref).abs().max().item():.3f}"
    )
    print(f"{torch.cuda.get_device_name()} · torch {torch.__version__} · context {args.context}")


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("experiments/one_launch_sweep.py")
    main()
