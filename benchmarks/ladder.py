"""The fusion ladder on a GPU, next to plain PyTorch and torch.compile, all in one run.

    python -m benchmarks.ladder [--family gpt2|llama] [--context 1000] [--batch 1] [--rungs overlap ...]
                                [--replays 200] [--no-compile]

GPT-2 small's shape (12 layers, width 768, vocabulary 50257), or with --family llama SmolLM2-135M's (30 layers,
width 576, 9 query heads over 3 key/value heads, SwiGLU 1536, vocabulary 49152), with random weights, bf16, batch 1, one
decode step at `context` keys with the cache holding random keys and values. With --batch B, B sequences each at
`context` keys; the PyTorch loop runs batch 1 only, so rows are then compared with our torch backend at batch B.
Every row is the same step captured in a CUDA graph and replayed; each replay is timed by CUDA events and the
cache position is put back to `context` between replays, outside the timed span (median reported). The step streams
about 250 MB of weights, four times the H200's L2, so back-to-back replays find little in L2.

Rows: our decoder on each rung of the fusion ladder (explorer.measure.ladder) and on its torch backend;
benchmarks/torch_loop.py's plain PyTorch step (F.layer_norm or F.rms_norm, matmuls, SDPA, index_copy_); the same step
compiled by torch.compile(mode="max-autotune-no-cudagraphs") and then captured. Kernels per step are
counted by torch.profiler over one replay.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file from any directory too

import argparse
import time

import torch

from benchmarks.torch_loop import LlamaGraphLoop, TorchGraphLoop
from explorer.measure.ladder import RUNGS, ladder_rows, replay_ms
from explorer.measure.launches import device_activity
from explorer.model.weights import config_from_hf, from_hf_state_dict


def time_loop(loop: TorchGraphLoop, context: int, replays: int) -> tuple[float, int]:
    """(median ms per replay, kernels in one replay) of the loop's captured step at position `context`."""
    loop.pos.fill_(context)
    loop._capture()
    loop.pos.fill_(context)
    kernels, _ = device_activity(loop.graph.replay)
    loop.pos.fill_(context)
    return replay_ms(loop.graph.replay, lambda: loop.pos.fill_(context), replays), kernels


def random_hf(family: str):
    """(a transformers model of the family's reference shape with random weights, the shape's name)."""
    import transformers as T

    if family == "llama":
        cfg = T.LlamaConfig(
            vocab_size=49152,
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            max_position_embeddings=2048,
            rms_norm_eps=1e-5,
            rope_theta=100000.0,
            tie_word_embeddings=True,
        )
        return T.LlamaForCausalLM(cfg).eval(), "SmolLM2-135M shape"
    return T.GPT2LMHeadModel(
        T.GPT2Config(n_layer=12, n_head=12, n_embd=768, n_positions=1024)
    ).eval(), "GPT-2 small shape"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", choices=["gpt2", "llama"], default="gpt2")
    parser.add_argument("--context", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=1, help="sequences a step (PyTorch's loop runs batch 1 only)")
    parser.add_argument("--rungs", nargs="+", choices=RUNGS, default=RUNGS, help="the ladder's rungs to measure")
    parser.add_argument("--replays", type=int, default=200)
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile (about a minute of compiling)")
    args = parser.parse_args()
    torch.manual_seed(0)
    hf, shape = random_hf(args.family)
    model = from_hf_state_dict(config_from_hf(hf.config), hf.state_dict(), device="cuda", dtype=torch.bfloat16)
    rows = []
    for row in ladder_rows(model, context=args.context, batch=args.batch, rungs=args.rungs, replays=args.replays):
        name = "ours, torch backend" if row["rung"] == "torch" else f"ours, fusion={row['rung']}"
        rows.append((name, row["step_ms"], row["kernels"], f"{row['hbm_mb']:.0f} / {row['l2_mb']:.0f}"))
        print(f"{name}: {row['step_ms']:.3f} ms", flush=True)
    if args.batch > 1:  # PyTorch's loop runs batch 1 only: against our torch backend at this batch, where measured
        base = next((ms for name, ms, *_ in rows if name == "ours, torch backend"), None)
        return table(rows, args, shape, base, "our torch backend")
    loop = (LlamaGraphLoop if args.family == "llama" else TorchGraphLoop)(hf, 1024, torch.bfloat16)
    for buf in (loop.k, loop.v):
        buf.copy_(torch.randn_like(buf))
    ms, kernels = time_loop(loop, args.context, args.replays)
    rows.append(("PyTorch, static cache, CUDA graph", ms, kernels, ""))
    base = ms
    if not args.no_compile:
        t0 = time.perf_counter()
        loop._step = torch.compile(loop._step, mode="max-autotune-no-cudagraphs")
        ms, kernels = time_loop(loop, args.context, args.replays)
        took = time.perf_counter() - t0
        rows.append(
            (f"torch.compile(max-autotune-no-cudagraphs) in a CUDA graph ({took:.0f} s to compile)", ms, kernels, "")
        )
    table(rows, args, shape, base, "PyTorch graph")


def table(rows, args, shape, base, against):
    """The rows as a table, each against `base` ms (`against` names it; None where it was not measured); at a
    batch of more than one, each step's ms per token too."""
    batch = args.batch
    print(f"\n{torch.cuda.get_device_name()} · bf16 · {shape} · batch {batch} · decode step at context {args.context}")
    print(f"median of {args.replays} CUDA-graph replays (CUDA events) · torch {torch.__version__}")
    per_token = (" ms per token |", "---:|") if batch > 1 else ("", "")
    print(
        f"\n| decode step | ms |{per_token[0]} kernels | MB HBM / SM requests (modeled) | vs {against} |"
        f"\n|---|---:|{per_token[1]}---:|---:|---:|"
    )
    for name, ms, kernels, mb in rows:
        token = f" {ms / batch:.4f} |" if batch > 1 else ""
        versus = f"{base / ms:.2f}x" if base else "-"
        print(f"| {name} | {ms:.3f} |{token} {kernels} | {mb} | {versus} |")


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("benchmarks/ladder.py")
    main()
