"""The command line: the app's tables, printed. Defaults follow the device: on CPU, where the kernels run in
Triton's interpreter, the app's CPU defaults (10 new tokens, a prompt length of 8, the ladder at context 16,
small sweep shapes), each command a minute or less; on a GPU, GPT-2-scale ones (64 new tokens, prompt
lengths 16 64 256, context 1000, real sweep shapes).

python -m explorer.bench generate --profile          # the app's default Generate, each kernel timed
python -m explorer.bench generate --fusion none overlap --cache on off
python -m explorer.bench generate --tiles attention:block_m=64,num_warps=4 decode_attention:autotune
python -m explorer.bench sequence --out seq.csv      # cache on and off, both backends, per prompt length
python -m explorer.bench tiles --kernel layer_norm   # every tile config of a grid at this device's shape
python -m explorer.bench ladder                      # one decode step per rung of the fusion ladder

The run's flags (--model, --prompt, --new-tokens, --temperature, ...) are the app's controls, made from
the same table (explorer.app.settings) and checked by the same rules.
"""

from __future__ import annotations

import argparse
import itertools
import math
from dataclasses import fields

import pandas as pd
import torch

from kernels.config import TileConfig

from .app import settings as table
from .app import validate
from .app.errors import UserError
from .measure import launches, metrics
from .measure.clock import timed
from .measure.ladder import ladder_rows
from .measure.profile import profile_run
from .measure.sweeps import GRIDS, sequence_sweep, tile_sweep
from .model.ops import Tiles

CACHE_CHOICES = {"on": True, "off": False}
GRAPH_CHOICES = {"auto": None, "on": True, "off": False}
# Fields a command line may give several values of, one run each: (the flag's choices, how a value reads).
MANY = {"backend": None, "fusion": None, "cache": CACHE_CHOICES, "cuda_graph": GRAPH_CHOICES}


def _parse_shape(text: str | None, default: dict) -> dict:
    """The sweep's shape: --shape read as the app reads its shape field (every size of the kernel once, digits
    only), or the default for this device."""
    if not text:
        return default
    try:
        return validate.shape("--shape", text, default)
    except UserError as e:
        raise SystemExit(f"error: {e}") from None


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


def _typed(field: table.Field):
    """The string a command line gives, as the type the field's check takes."""
    if field.kind == "whole":
        return int
    if field.kind == "number":
        return float
    return str


def add_run_flags(parser: argparse.ArgumentParser, device: str) -> None:
    """The run's flags, one per field of the app's table, with this device's defaults; a field a command
    may sweep (MANY) takes several values."""
    defaults = table.defaults(device, {"dtype": "bfloat16" if device == "cuda" else "float32"})
    for name in table.RUN:
        field = table.FIELDS[name]
        flag = "--" + name.replace("_", "-")
        if name in MANY:  # the default depends on the command: COMMAND_DEFAULTS
            choices = list(MANY[name] or field.choices)
            parser.add_argument(flag, nargs="+", choices=choices, help=f"{field.label} (one run each)")
        else:
            parser.add_argument(flag, type=_typed(field), default=defaults[name], help=field.label)


# What each command runs when a swept field is not given: generate runs as the app's Generate does; sequence
# crosses the cache and the backends, as the app's Compare does.
COMMAND_DEFAULTS = {
    "generate": dict(backend=["triton"], fusion=[table.FIELDS["fusion"].default], cache=["on"], cuda_graph=["auto"]),
    "sequence": dict(
        backend=["triton", "torch"], fusion=[table.FIELDS["fusion"].default], cache=["on", "off"], cuda_graph=["auto"]
    ),
}


def run_settings(args, device: str) -> dict:
    """The run's fields checked by the app's rules; the swept ones as lists of typed values."""
    dynamic = {"model": [args.model], "dtype": ["float32", "float16", "bfloat16"]}
    checked = {}
    try:
        for name in table.RUN:
            value = getattr(args, name)
            if value is None:
                value = COMMAND_DEFAULTS.get(args.sweep, COMMAND_DEFAULTS["generate"])[name]
            if name in MANY:
                checked[name] = [MANY[name][v] for v in value] if MANY[name] else value
            else:
                checked[name] = table.check(name, value, dynamic)
    except UserError as e:
        raise SystemExit(f"error: {e}") from None
    return checked


def main(argv=None):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    parser = argparse.ArgumentParser(
        prog="python -m explorer.bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("sweep", choices=["tiles", "sequence", "generate", "ladder"])
    parser.add_argument("--device", default=device)
    add_run_flags(parser, device)
    parser.add_argument("--kernel", default="attention", choices=list(GRIDS))
    parser.add_argument("--shape", help="tile sweep shape, e.g. B=1,H=12,T=1024,D=64 (default: this device's)")
    parser.add_argument("--grid", help="tile sweep grid, e.g. 'block_m=64,128;block_n=32,64' (default: the full grid)")
    default_lengths = [int(n) for n in table.FIELDS["lengths"].default_for(device).replace(",", " ").split()]
    parser.add_argument("--prompt-lengths", type=int, nargs="+", default=default_lengths)
    parser.add_argument(
        "--tiles",
        nargs="+",
        metavar="KERNEL:SPEC",
        help="tiles for generate and sequence, e.g. attention:block_m=64,num_warps=4 "
        "linear_decode:autotune (others keep their defaults)",
    )
    parser.add_argument("--context", type=int, help="ladder: keys in the cache at the timed decode step")
    parser.add_argument("--profile", action="store_true", help="generate: also each kernel's time, per kind")
    parser.add_argument("--out", help="write the table as .csv or .json")
    args = parser.parse_args(argv)
    args.tiles = parse_tiles(args.tiles)
    args.run = run_settings(args, torch.device(args.device).type)
    try:
        _run(args)
    except ValueError as e:  # a tile config or length the kernels refuse says what and why
        raise SystemExit(f"error: {e}") from None


def _run(args):
    device = torch.device(args.device)
    r = args.run
    dtype = getattr(torch, r["dtype"])
    peaks = metrics.device_peaks(str(device), dtype)
    print(peaks.label if peaks else metrics.CPU_LABEL)
    graphs = tuple(r["cuda_graph"])
    if device.type != "cuda" and True in graphs:
        print("CUDA graphs need a GPU: every step runs eager")
        graphs = (False,)
    if args.sweep == "tiles":
        shape = _parse_shape(args.shape, table.SWEEP_SHAPES[device.type][args.kernel])
        progress = _tqdm_progress(f"tile sweep {args.kernel}")
        grid = _parse_grid(args.grid)
        frame = tile_sweep(args.kernel, shape, dtype=dtype, device=device, grid=grid, progress=progress)
        if not frame.valid.any():
            first = frame.reason.iloc[0] if len(frame) else "the grid is empty"
            raise SystemExit(f"error: none of the {len(frame)} configs could run on this device; the first: {first}")
        print("timed by:", "; ".join(sorted(set(frame.timer) - {""})))
        shown = frame.sort_values("ms").drop(columns=["kernel", "shape", "timer"])
        shown["reason"] = shown.reason.str.replace(r"^.*? needs", "needs", regex=True).str.slice(0, 60)
    else:
        from .model.weights import load_model

        model, tok = load_model(r["model"], device=device, dtype=dtype)
        if args.sweep == "ladder":
            frame = shown = _ladder(model, args)
        elif args.sweep == "sequence":
            frame = sequence_sweep(
                model,
                args.prompt_lengths,
                r["new_tokens"],
                caches=tuple(r["cache"]),
                backends=tuple(r["backend"]),
                graphs=graphs,
                tiles=args.tiles,
                progress=_tqdm_progress("sequence sweep"),
            )
            shown = frame.groupby(["backend", "cache", "launch_mode", "prompt_tokens", "phase"], as_index=False).agg(
                steps=("step", "count"),
                ms_p50=("latency_ms", "median"),
                mb_per_step=("modeled_mb", "median"),
                last_step_ms=("latency_ms", "last"),
                kv_mb=("kv_used_mb", "max"),
            )
        else:
            frame, shown = _generate_report(model, tok, args, peaks, graphs)
    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.max_rows", 200):
        print(shown.to_string(index=False))
    if args.out:
        print("wrote", metrics.export(frame, args.out))


def _generate_report(model, tok, args, peaks, graphs):
    from .app.models import prompt_ids

    r = args.run
    ids = [prompt_ids(tok, r["prompt"], r["prompt_tokens"], model.config.n_positions)] * r["batch"]
    sampling = {k: r[k] for k in ("temperature", "top_k", "top_p", "repetition_penalty", "seed")}
    frames, summaries = [], []
    for (name, backend, m), cache in itertools.product(_variants(model, args), r["cache"]):
        label = dict(backend=name, cache="on" if cache else "off")
        for graph in graphs:
            if graph and not cache:
                continue
            kw = dict(cache=cache, backend=backend, graph=graph, tiles=args.tiles)
            steps = list(timed(m, ids, max_new_tokens=r["new_tokens"], tokenizer=tok, **kw, **sampling))
            counted = None
            if model.device.type == "cuda":
                counted = launches.decode_step_launches(m, ids, **kw)
            summaries.append(dict(**label, **metrics.summary(steps, peaks, counted)))
            how = "graph" if steps[-1].graph else "eager"
            print(f"[{name}, cache {label['cache']}, {how}] {r['prompt']}{''.join(x.text for x in steps)!r}")
        if args.profile:
            prof = profile_run(m, ids, steps, cache=cache, backend=backend, tiles=args.tiles)
            frames.append(prof.assign(**label))
    frame = pd.DataFrame(summaries)
    if frames:
        per_kind = (
            pd.concat(frames)
            .groupby(["backend", "cache", "phase", "position", "kind"], as_index=False)[["kernel_ms", "launch_ms"]]
            .sum(min_count=1)
        )
        print(per_kind.to_string(index=False))
        print(step_budget(per_kind, frame).to_string(index=False))
    return frame, frame


def _variants(model, args):
    """(label, backend, model) per run: the Triton backend once per chosen rung, the torch backend once."""
    fusions = args.run["fusion"]
    for backend in args.run["backend"]:
        if backend == "torch":
            yield backend, backend, model
            continue
        for fusion in fusions:
            yield (backend if len(fusions) == 1 else f"{backend}/{fusion}"), backend, model.with_fusion(fusion)


def _ladder(model, args) -> pd.DataFrame:
    default = 1000 if model.device.type == "cuda" else 16  # the app's ladder (explorer.app.jobs.compare)
    context = args.context if args.context is not None else min(default, model.config.n_positions - 1)
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
