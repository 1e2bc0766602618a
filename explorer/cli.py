"""The command line: the app's tables, printed.

python -m explorer.bench tiles --kernel attention --shape B=1,H=12,T=1024,D=64
python -m explorer.bench sequence --prompt-lengths 16 64 --new-tokens 32 --out seq.csv
python -m explorer.bench generate --prompt "def main(" --new-tokens 64 --profile
python -m explorer.bench generate --tiles attention:block_m=64,num_warps=4 decode_attention:autotune
python -m explorer.bench generate --fusion none epilogue decode overlap
python -m explorer.bench ladder --context 1000
"""

from __future__ import annotations

import argparse
import itertools
import math
from dataclasses import fields

import pandas as pd
import torch

from kernels.config import TileConfig

from .measure import launches, metrics
from .measure.ladder import ladder_rows
from .measure.profile import profile_run
from .measure.sweeps import GRIDS, sequence_sweep, tile_sweep
from .model.generate import generate
from .model.ops import DEFAULT_FUSION, FUSIONS, Tiles

CACHE_CHOICES = {"on": (True,), "off": (False,), "both": (True, False)}
GRAPH_CHOICES = {"auto": (None,), "on": (True,), "off": (False,), "both": (False, True)}


def _parse_shape(text: str | None) -> dict:
    if not text:
        return {}
    try:
        return {k.strip(): int(v) for k, v in (part.split("=") for part in text.split(","))}
    except ValueError:
        raise SystemExit(f"--shape {text!r}: expected KEY=INT pairs such as B=1,H=12,T=1024,D=64") from None


def _parse_grid(text: str | None) -> dict | None:
    if not text:
        return None
    try:
        return {k.strip(): [int(v) for v in vs.split(",")] for k, vs in (axis.split("=") for axis in text.split(";"))}
    except ValueError:
        raise SystemExit(f"--grid {text!r}: expected 'field=v1,v2;field=v1,v2'") from None


def parse_tiles(items: list[str] | None) -> Tiles:
    """["attention:block_m=64,block_n=32", "linear_decode:autotune"] -> Tiles; unnamed kernels keep
    their defaults."""
    names = [f.name for f in fields(Tiles)]
    chosen = {}
    for item in items or []:
        kernel, _, spec = item.partition(":")
        if kernel not in names or not spec:
            raise SystemExit(
                f"--tiles {item!r}: expected KERNEL:FIELD=INT,... or KERNEL:autotune, KERNEL one of {', '.join(names)}"
            )
        if spec == "autotune":
            chosen[kernel] = "autotune"
            continue
        try:
            values = {k.strip(): int(v) for k, v in (pair.split("=") for pair in spec.split(","))}
            chosen[kernel] = TileConfig(**values)
        except (ValueError, TypeError):
            allowed = ", ".join(f.name for f in fields(TileConfig))
            raise SystemExit(f"--tiles {item!r}: expected FIELD=INT pairs, FIELD one of {allowed}") from None
    return Tiles(**chosen)


def _tqdm_progress(title: str):
    from tqdm import tqdm

    bar = {}

    def progress(i, n, desc):
        if "bar" not in bar:
            bar["bar"] = tqdm(total=n, desc=title, unit="run", mininterval=1.0)
        bar["bar"].update(i - bar["bar"].n)
        if i >= n:
            bar["bar"].close()

    return progress


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m explorer.bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("sweep", choices=["tiles", "sequence", "generate", "ladder"])
    parser.add_argument("--model", default="bundled", help="'bundled', a hub name or a checkpoint folder")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--dtype", default=None, help="float32, float16 or bfloat16 (default: bf16 on GPU, fp32 on CPU)"
    )
    parser.add_argument("--kernel", default="attention", choices=list(GRIDS))
    parser.add_argument("--shape", help="tile sweep shape, e.g. B=1,H=12,T=1024,D=64 or M=1024,K=768,N=3072")
    parser.add_argument("--grid", help="tile sweep grid, e.g. 'block_m=64,128;block_n=32,64' (default: the full grid)")
    parser.add_argument("--prompt", default="def main(")
    parser.add_argument("--prompt-lengths", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--cache", choices=["on", "off", "both"], default="both")
    parser.add_argument("--backend", nargs="+", default=["triton", "torch"], choices=["triton", "torch"])
    parser.add_argument(
        "--tiles",
        nargs="+",
        metavar="KERNEL:SPEC",
        help="tiles for generate and sequence, e.g. attention:block_m=64,num_warps=4 "
        "linear_decode:autotune (others keep their defaults)",
    )
    parser.add_argument(
        "--graph",
        choices=["auto", "on", "off", "both"],
        default="auto",
        help="replay decode steps from a CUDA graph (auto: on a GPU with the cache on)",
    )
    parser.add_argument(
        "--fusion",
        nargs="+",
        default=[DEFAULT_FUSION],
        choices=list(FUSIONS),
        help=f"generate: rungs of the fusion ladder to run (default: {DEFAULT_FUSION})",
    )
    parser.add_argument(
        "--context", type=int, default=None, help="ladder: keys in the cache at the timed decode step (default: 1000)"
    )
    parser.add_argument("--profile", action="store_true", help="generate: also a profiling pass per kernel kind")
    parser.add_argument("--out", help="write the table as .csv or .json")
    args = parser.parse_args(argv)
    args.tiles = parse_tiles(args.tiles)
    try:
        _run(args)
    except ValueError as e:  # a tile config or length the kernels refuse says what and why
        raise SystemExit(f"error: {e}") from None


def _run(args):
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    peaks = metrics.device_peaks(str(device), dtype)
    print(peaks.label if peaks else metrics.CPU_LABEL)
    graphs = GRAPH_CHOICES[args.graph]
    if device.type != "cuda" and True in graphs:
        print("CUDA graphs need a GPU: every step runs eager")
        graphs = (False,)
    if args.sweep == "tiles":
        shape, grid = _parse_shape(args.shape), _parse_grid(args.grid)
        progress = _tqdm_progress(f"tile sweep {args.kernel}")
        table = tile_sweep(args.kernel, shape, dtype=dtype, device=device, grid=grid, progress=progress)
        if not table.valid.any():
            first = table.reason.iloc[0] if len(table) else "the grid is empty"
            raise SystemExit(f"error: none of the {len(table)} configs could run on this device; the first: {first}")
        print("timed by:", "; ".join(sorted(set(table.timer) - {""})))
        shown = table.sort_values("ms").drop(columns=["kernel", "shape", "timer"])
        shown["reason"] = shown.reason.str.replace(r"^.*? needs", "needs", regex=True).str.slice(0, 60)
    else:
        from .model.weights import load_model

        model, tok = load_model(args.model, device=device, dtype=dtype)
        if args.sweep == "ladder":
            table = shown = _ladder(model, args)
        elif args.sweep == "sequence":
            table = sequence_sweep(
                model,
                args.prompt_lengths,
                args.new_tokens,
                caches=CACHE_CHOICES[args.cache],
                backends=args.backend,
                graphs=graphs,
                tiles=args.tiles,
                progress=_tqdm_progress("sequence sweep"),
            )
            shown = table.groupby(["backend", "cache", "launch_mode", "prompt_tokens", "phase"], as_index=False).agg(
                steps=("step", "count"),
                ms_p50=("latency_ms", "median"),
                mb_per_step=("modeled_mb", "median"),
                last_step_ms=("latency_ms", "last"),
                kv_mb=("kv_used_mb", "max"),
            )
        else:
            table, shown = _generate_report(model, tok, args, peaks, graphs)
    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.max_rows", 200):
        print(shown.to_string(index=False))
    if args.out:
        print("wrote", metrics.export(table, args.out))


def _generate_report(model, tok, args, peaks, graphs):
    ids = tok.encode(args.prompt)
    frames, summaries = [], []
    for (name, backend, m), cache in itertools.product(_variants(model, args), CACHE_CHOICES[args.cache]):
        label = dict(backend=name, cache="on" if cache else "off")
        for graph in graphs:
            if graph and not cache:
                continue
            steps = list(
                generate(
                    m,
                    ids,
                    max_new_tokens=args.new_tokens,
                    cache=cache,
                    backend=backend,
                    tokenizer=tok,
                    graph=graph,
                    tiles=args.tiles,
                )
            )
            counted = None
            if model.device.type == "cuda":
                counted = launches.decode_step_launches(
                    m, ids, cache=cache, graph=graph, backend=backend, tiles=args.tiles
                )
            summaries.append(dict(**label, **metrics.summary(steps, peaks, counted)))
            how = "graph" if steps[-1].graph else "eager"
            print(f"[{name}, cache {label['cache']}, {how}] {args.prompt}{''.join(x.text for x in steps)!r}")
        if args.profile:
            prof = profile_run(m, [ids], steps, cache=cache, backend=backend, tiles=args.tiles)
            frames.append(prof.assign(**label))
    table = pd.DataFrame(summaries)
    if frames:
        per_kind = (
            pd.concat(frames)
            .groupby(["backend", "cache", "phase", "position", "kind"], as_index=False)[["kernel_ms", "launch_ms"]]
            .sum(min_count=1)
        )
        print(per_kind.to_string(index=False))
        print(step_budget(per_kind, table).to_string(index=False))
    return table, table


def _variants(model, args):
    """(label, backend, model) per run: the Triton backend once per chosen rung, the torch backend once."""
    for backend in args.backend:
        if backend == "torch":
            yield backend, backend, model
            continue
        for fusion in args.fusion:
            yield (backend if len(args.fusion) == 1 else f"{backend}/{fusion}"), backend, model.with_fusion(fusion)


def _ladder(model, args) -> pd.DataFrame:
    context = args.context if args.context is not None else min(1000, model.config.n_positions - 1)
    if model.device.type != "cuda":
        print("no GPU: kernels are not counted (launches_modeled says how many the operations make)")
    rows = []
    for row in ladder_rows(model, context=context):
        print(f"  {row['rung']}: {row['step_ms']:.3f} ms per step ({row['timer']})")
        rows.append(row)
    table = pd.DataFrame(rows)
    base = table.set_index("rung").step_ms.get("torch")
    if base:
        table["speedup_vs_torch"] = base / table.step_ms
    return table


def step_budget(per_kind: pd.DataFrame, summaries: pd.DataFrame) -> pd.DataFrame:
    """One decode step, per (backend, cache) at its first profiled position: the kernels' summed
    device time and launch time from the profiling pass, next to the measured step time (device
    clock, p50) eager and replayed from a CUDA graph."""
    decode = per_kind[per_kind.phase == "decode"]
    first = decode.groupby(["backend", "cache"]).position.transform("min")
    out = (
        decode[decode.position == first]
        .groupby(["backend", "cache", "position"], as_index=False)
        .agg(
            kernels_ms=("kernel_ms", "sum"),
            launching_ms=("launch_ms", lambda v: v.sum(min_count=1)),  # NaN where not measured (CPU)
        )
    )
    if "cuda_graph" not in summaries:
        return out
    for graph, column in ((False, "step_eager_ms"), (True, "step_graph_ms")):
        rows = summaries[summaries.cuda_graph == graph].set_index(["backend", "cache"]).step_ms_p50
        out[column] = [rows.get((b, c), math.nan) for b, c in zip(out.backend, out.cache, strict=True)]
    return out


if __name__ == "__main__":
    main()
