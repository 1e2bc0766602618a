"""The overlap rung on a GPU: tile rules for decode_linear's prefetch form, each with and without PDL.

    python -m experiments.overlap_sweep [--context 1000] [--replays 100]

GPT-2 small's shape, random weights, bf16, batch 1, one decode step at `context` keys, replayed from a
CUDA graph (explorer.measure.ladder.rung_row: median of CUDA-event-timed replays). Each rule replaces
decode_linear's default tiles for the run. For every rule the step's logits under "overlap" must equal
those under "decode" exactly (PDL changes when kernels start, not what they compute), eager and replayed,
and stay within bf16's margin of the torch backend's.
"""

import argparse

import torch

import kernels.attn.decode_tiles as attn  # the defaults resolve_decode_config reads
import kernels.matmul.decode_tiles as fl
from explorer.measure.ladder import random_cache, reset, rung_row
from explorer.model.graphs import DecodeGraph
from explorer.model.weights import config_from_hf, from_hf_state_dict
from kernels import TileConfig
from kernels.config import cdiv, device_limits, next_pow2, overlaps_launches

DEFAULT = fl.default_config


def loop_rule(rows, n, k, dtype, device):  # the fourth run's defaults: the K loop, 32-column tiles
    sms = device_limits(device).num_sms
    if cdiv(n, 128) >= 2 * sms:
        return TileConfig(block_m=16, block_n=128, block_k=64, split_k=1, num_warps=4, num_stages=3)
    split_k = fl.prev_pow2(max(1, min(cdiv(3 * sms // 2, cdiv(n, 32)), k // 64)))
    block_k = min(256, max(64, fl.prev_pow2(cdiv(k, split_k) // 2)))
    return TileConfig(block_m=16, block_n=32, block_k=block_k, split_k=split_k, num_warps=4, num_stages=3)


def prefetch_rule(block_n=16, slice_max=768, warps=4, per_sm=1, lm_head_prefetch=False):
    def rule(rows, n, k, dtype, device):
        sms = device_limits(device).num_sms
        if cdiv(n, 128) >= 2 * sms and not lm_head_prefetch:
            return TileConfig(block_m=16, block_n=128, block_k=64, split_k=1, num_warps=4, num_stages=3)
        wanted = cdiv(per_sm * sms, cdiv(n, block_n))  # per_sm=0: split only where the slice is too long
        split_k = max(fl.prev_pow2(max(1, min(wanted, k // 128))), cdiv(k, slice_max))
        split_k = next_pow2(split_k)
        block_k = max(fl.PREFETCH_BLOCK_K, next_pow2(cdiv(k, split_k)))
        return TileConfig(block_m=16, block_n=block_n, block_k=block_k, split_k=split_k, num_warps=warps, num_stages=1)

    return rule


RULES = {
    "default": DEFAULT,
    "loop (4th run)": loop_rule,
    "n16 s768 w8": prefetch_rule(warps=8),
    "n8 s768 w4": prefetch_rule(block_n=8),
    "n16 s768 w4 nosplit": prefetch_rule(per_sm=0),
    "n8 s768 w4 nosplit": prefetch_rule(block_n=8, per_sm=0),
    "n8 s1536 w8 nosplit": prefetch_rule(block_n=8, slice_max=1536, warps=8, per_sm=0),
    "n8 s3072 w8 nosplit": prefetch_rule(block_n=8, slice_max=3072, warps=8, per_sm=0),
    "n16 s768 w4 +lm": prefetch_rule(lm_head_prefetch=True),
    "n16 s768 w4": prefetch_rule(),
}
ATTENTION = {  # decode attention's (block_n, split_k, num_warps) at 1001 keys, B=1, H=12; None: its default
    "default": None,
    "32x32 w2": (32, 32, 2),
    "32x32 w4": (32, 32, 4),
    "64x16 w2": (64, 16, 2),
    "128x8 w4": (128, 8, 4),
}


def attention_rule(tiles):
    """Decode attention's tile rule for (block_n, split_k, num_warps), or its default for None."""
    if tiles is None:
        return attn.default_decode_config
    return lambda bh, n, device: TileConfig(block_n=tiles[0], split_k=tiles[1], num_warps=tiles[2], num_stages=1)


def logits(model, rung, context, graph):
    m = model.with_fusion(rung) if rung != "torch" else model.with_backend("torch")
    cache = random_cache(m, 1, context, torch.Generator().manual_seed(1))
    ids = torch.tensor([123], device="cuda")
    if graph:
        g = DecodeGraph(m, cache)
        reset(cache, context)
        return g.step(ids).float().clone()
    return m.decode(ids, cache).float()


def steps(model, rung, context, n=48):
    """n greedy steps replayed from one graph, from context - n on: (n, vocab) logits."""
    m = model.with_fusion(rung)
    cache = random_cache(m, 1, context, torch.Generator().manual_seed(2))
    g = DecodeGraph(m, cache)
    reset(cache, context - n)
    ids, out = torch.tensor([123], device="cuda"), []
    for _ in range(n):
        logits = g.step(ids)
        out.append(logits.float().clone())
        ids = logits.argmax(-1)
    return torch.stack(out)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--context", type=int, default=1000)
    parser.add_argument("--replays", type=int, default=100)
    parser.add_argument("--rules", default=",".join(RULES))
    parser.add_argument("--attention", default=",".join(ATTENTION), help="tried with the last rule")
    args = parser.parse_args()
    from transformers import GPT2Config, GPT2LMHeadModel

    print("PDL available:", overlaps_launches("cuda"), flush=True)
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=12, n_head=12, n_embd=768, n_positions=1024)).eval()
    model = from_hf_state_dict(config_from_hf(hf.config), hf.state_dict(), device="cuda", dtype=torch.bfloat16)
    ref = logits(model, "torch", args.context, graph=False)
    print("| rule | decode ms | overlap ms | kernels | same as decode (eager, graph, 48 steps) | max |Δ| vs torch |")
    print("|---|---:|---:|---:|---|---:|")
    runs = [(name, "default") for name in args.rules.split(",")]
    runs += [(args.rules.split(",")[-1], a) for a in args.attention.split(",") if a != "default"]
    for name, a in runs:
        label = name if a == "default" else f"{name}, attention {a}"
        try:
            with fl.ruled_by(RULES[name]), attn.ruled_by(attention_rule(ATTENTION[a])):
                measure(model, label, args, ref)
        except Exception as e:  # one failing rule must not hide the others' numbers
            print(f"| {label} | failed: {type(e).__name__}: {str(e)[:300]} |", flush=True)
    print(f"\n{torch.cuda.get_device_name()} · torch {torch.__version__} · context {args.context}")


def measure(model, label, args, ref):
    """One row of the table: both rungs under the tile rules in force, and the overlap rung's logits against the
    PyTorch backend's (ref)."""
    d = rung_row(model, "decode", context=args.context, replays=args.replays)
    o = rung_row(model, "overlap", context=args.context, replays=args.replays)
    same = [
        torch.equal(logits(model, "decode", args.context, g), logits(model, "overlap", args.context, g))
        for g in (False, True)
    ]
    same.append(torch.equal(steps(model, "decode", args.context), steps(model, "overlap", args.context)))
    diff = (logits(model, "overlap", args.context, True) - ref).abs().max().item()
    print(f"| {label} | {d['step_ms']:.3f} | {o['step_ms']:.3f} | {o['kernels']} | {same} | {diff:.3f} |", flush=True)


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("experiments/overlap_sweep.py")
    main()
