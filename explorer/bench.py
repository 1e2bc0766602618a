"""Sweeps over tiles, sequence lengths, cache on/off and backends, and the CLI that prints them.

    python -m explorer.bench tiles --kernel attention --shape B=1,H=12,T=1024,D=64
    python -m explorer.bench sequence --prompt-lengths 16 64 --new-tokens 32 --out seq.csv
    python -m explorer.bench generate --prompt "def main(" --new-tokens 64 --profile
    python -m explorer.bench generate --tiles attention:block_m=64,num_warps=4 decode_attention:autotune

Every sweep returns a tidy DataFrame (one row per observation) and reports progress while it runs.
Tile sweeps keep every config, the impossible ones with the reason, not only the winner.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import fields

import pandas as pd
import torch

import kernels
from kernels.attention import decode_traffic
from kernels.attention import traffic as attention_traffic
from kernels.config import TileConfig
from kernels.layer_norm import traffic as layer_norm_traffic
from kernels.linear import traffic as linear_traffic
from kernels.timing import device_ms

from . import metrics
from .generate import generate
from .ops import Tiles

Progress = Callable[[int, int, str], None]

# Grids the tile sweep walks by default (the UI and CLI can pass their own).
GRIDS = {
    "attention": dict(block_m=[16, 32, 64, 128], block_n=[16, 32, 64, 128], num_warps=[4, 8], num_stages=[1, 2, 3]),
    "decode_attention": dict(block_n=[16, 32, 64, 128, 256], split_k=[1, 4, 16, 64], num_warps=[2, 4]),
    "linear": dict(block_m=[16, 32, 64, 128], block_n=[32, 64, 128, 256], block_k=[32, 64], num_stages=[2, 3, 4]),
    "layer_norm": dict(block_m=[1, 2, 4, 8, 16], num_warps=[1, 2, 4, 8]),
}
DEFAULT_SHAPES = {
    "attention": dict(B=1, H=12, T=1024, D=64),
    "decode_attention": dict(B=1, H=12, T=8192, D=64),
    "linear": dict(M=1024, K=768, N=3072),
    "layer_norm": dict(M=4096, C=768),
}


def grid_configs(kernel: str, grid: dict | None = None) -> list[TileConfig]:
    grid = grid or GRIDS[kernel]
    names = list(grid)
    return [TileConfig(**dict(zip(names, values, strict=True))) for values in itertools.product(*grid.values())]


def _inputs(kernel: str, shape: dict, dtype, device):
    """Random inputs and a call(config) for one kernel at one shape, with its traffic model."""
    r = lambda *s: torch.randn(*s, device=device, dtype=dtype)
    item = torch.empty((), dtype=dtype).element_size()
    if kernel == "attention":
        B, H, T, D = (shape[k] for k in "BHTD")
        q, k, v = r(B, H, T, D), r(B, H, T, D), r(B, H, T, D)
        call = lambda c: kernels.attention(q, k, v, config=c)
        model = lambda c: attention_traffic(B, H, T, T, D, item, config=c, dtype=dtype, device=device)
    elif kernel == "decode_attention":
        B, H, T, D = (shape[k] for k in "BHTD")
        q, kc, vc = r(B, H, 1, D), r(B, H, T, D), r(B, H, T, D)
        lengths = torch.full((B,), T, device=device, dtype=torch.int32)
        call = lambda c: kernels.decode_attention(q, kc, vc, lengths, config=c)
        model = lambda c: decode_traffic([T] * B, H, T, D, item, config=c, dtype=dtype, device=device)
    elif kernel == "linear":
        M, K, N = (shape[k] for k in "MKN")
        x, w, b = r(M, K), r(N, K) / K**0.5, r(N)
        call = lambda c: kernels.linear(x, w, b, activation="gelu", config=c)
        model = lambda c: linear_traffic(M, N, K, item, activation="gelu", config=c, dtype=dtype, device=device)
    elif kernel == "layer_norm":
        M, C = shape["M"], shape["C"]
        x, res, w, b = r(M, C), r(M, C), r(C), r(C)
        call = lambda c: kernels.layer_norm(x, w, b, residual=res, config=c)
        model = lambda c: layer_norm_traffic(M, C, item, residual=True, config=c)
    else:
        raise ValueError(f"kernel {kernel!r} is not known (allowed: {', '.join(GRIDS)})")
    return call, model


def time_call(fn, device: torch.device, reps: int = 3) -> float:
    """Median ms of fn(): device time from CUDA-graph replays on a GPU (launch overhead out, since at
    small shapes it would swamp the differences between tiles); perf_counter on CPU."""
    if device.type == "cuda":
        return device_ms(fn, reps=20, samples=10)
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def tile_sweep(kernel: str, shape: dict | None = None, *, dtype=torch.float16, device="cpu", grid=None,
               progress: Progress | None = None) -> pd.DataFrame:  # fmt: skip
    """Time every config of the grid for one kernel and shape. Impossible configs stay in the result
    with valid=False and the reason."""
    device = torch.device(device)
    shape = {**DEFAULT_SHAPES[kernel], **(shape or {})}
    call, model = _inputs(kernel, shape, dtype, device)
    configs = grid_configs(kernel, grid)
    rows = []
    for i, cfg in enumerate(configs):
        if progress:
            progress(i, len(configs), f"{kernel} {cfg}")
        row = {f.name: getattr(cfg, f.name) for f in fields(cfg) if getattr(cfg, f.name) is not None}
        try:
            traffic = model(cfg)
            ms = time_call(lambda c=cfg: call(c), device)
        except ValueError as e:  # refused by validation, or out of resources when compiled
            rows.append(dict(row, valid=False, reason=str(e), ms=math.nan))
            continue
        except Exception as e:  # a config the compiler rejects in another way: recorded, the sweep goes on
            rows.append(
                dict(row, valid=False, reason=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}", ms=math.nan)
            )
            continue
        rows.append(dict(row, valid=True, reason="", ms=ms, modeled_mb=traffic.bytes / metrics.MB,
                         gbs=traffic.bytes / ms / 1e6, tflops=traffic.flops / ms / 1e9))  # fmt: skip
    if progress:
        progress(len(configs), len(configs), "done")
    out = pd.DataFrame(rows)
    out.insert(0, "kernel", kernel)
    out["shape"] = ",".join(f"{k}={v}" for k, v in shape.items())
    out["timer"] = "CUDA-graph replay median (device time)" if device.type == "cuda" else metrics.CPU_LABEL
    return out


def best_config(sweep: pd.DataFrame) -> TileConfig:
    """The fastest valid row of a tile sweep, as a TileConfig."""
    valid = sweep[sweep.valid]
    if valid.empty:
        raise ValueError("no valid config in this sweep")
    row = valid.loc[valid.ms.idxmin()]
    names = {f.name for f in fields(TileConfig)}
    return TileConfig(**{k: int(v) for k, v in row.items() if k in names and not pd.isna(v)})


def run_frame(steps, **labels) -> pd.DataFrame:
    """Steps of one generation as rows, with the run's settings as columns."""
    frame = metrics.step_frame(steps)
    for key, value in labels.items():
        frame.insert(0, key, value)
    return frame


def sequence_sweep(model, prompt_lengths, new_tokens: int, *, caches=(True, False), backends=("triton", "torch"),
                   tiles: Tiles | None = None, seed: int = 0, progress: Progress | None = None,
                   graphs=(None,)):  # fmt: skip
    """Per-step latency and modeled bytes for every (backend, cache, prompt length): cache on grows
    O(n) per token in bytes read, cache off O(n^2) in recomputation. `graphs` holds generate's graph
    choices to run (None: CUDA graphs wherever they apply); a graph with the cache off is skipped."""
    runs = [
        (backend, cache, graph, length)
        for backend, cache, graph, length in itertools.product(backends, caches, graphs, prompt_lengths)
        if cache or not graph
    ]
    gen = torch.Generator().manual_seed(seed)
    frames = []
    for i, (backend, cache, graph, length) in enumerate(runs):
        if progress:
            progress(i, len(runs), f"{backend}, cache {'on' if cache else 'off'}, prompt {length}")
        prompt = torch.randint(0, model.config.vocab_size, (length,), generator=gen).tolist()
        steps = list(generate(model, prompt, max_new_tokens=new_tokens, cache=cache, backend=backend, tiles=tiles,
                              eos_token_id=-1, graph=graph))  # fmt: skip
        mode = "CUDA graph" if any(s.graph for s in steps) else "eager"
        frames.append(run_frame(steps, backend=backend, cache="on" if cache else "off", launch_mode=mode,
                                prompt_tokens=length))  # fmt: skip
    if progress:
        progress(len(runs), len(runs), "done")
    return pd.concat(frames, ignore_index=True)


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
            raise SystemExit(f"--tiles {item!r}: expected KERNEL:FIELD=INT,... or KERNEL:autotune, "
                             f"KERNEL one of {', '.join(names)}")  # fmt: skip
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
    parser = argparse.ArgumentParser(prog="python -m explorer.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("sweep", choices=["tiles", "sequence", "generate"])
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
    parser.add_argument("--tiles", nargs="+", metavar="KERNEL:SPEC",
                        help="tiles for generate and sequence, e.g. attention:block_m=64,num_warps=4 "
                             "linear_decode:autotune (others keep their defaults)")  # fmt: skip
    parser.add_argument("--graph", choices=["auto", "on", "off", "both"], default="auto",
                        help="replay decode steps from a CUDA graph (auto: on a GPU with the cache on)")  # fmt: skip
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
        shown = table.sort_values("ms").drop(columns=["kernel", "shape", "timer"])
        shown["reason"] = shown.reason.str.replace(r"^.*? needs", "needs", regex=True).str.slice(0, 60)
    else:
        from .weights import load_model

        model, tok = load_model(args.model, device=device, dtype=dtype)
        if args.sweep == "sequence":
            table = sequence_sweep(model, args.prompt_lengths, args.new_tokens, caches=CACHE_CHOICES[args.cache],
                                   backends=args.backend, graphs=graphs, tiles=args.tiles,
                                   progress=_tqdm_progress("sequence sweep"))  # fmt: skip
            shown = table.groupby(["backend", "cache", "launch_mode", "prompt_tokens", "phase"], as_index=False).agg(
                steps=("step", "count"), ms_p50=("latency_ms", "median"), mb_per_step=("modeled_mb", "median"),
                last_step_ms=("latency_ms", "last"), kv_mb=("kv_used_mb", "max"))  # fmt: skip
        else:
            table, shown = _generate_report(model, tok, args, peaks, graphs)
    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.max_rows", 200):
        print(shown.to_string(index=False))
    if args.out:
        print("wrote", metrics.export(table, args.out))


def _generate_report(model, tok, args, peaks, graphs):
    ids = tok.encode(args.prompt)
    frames, summaries = [], []
    for backend, cache in itertools.product(args.backend, CACHE_CHOICES[args.cache]):
        label = dict(backend=backend, cache="on" if cache else "off")
        for graph in graphs:
            if graph and not cache:
                continue
            steps = list(generate(model, ids, max_new_tokens=args.new_tokens, cache=cache, backend=backend,
                                  tokenizer=tok, graph=graph, tiles=args.tiles))  # fmt: skip
            summaries.append(dict(**label, **metrics.summary(steps, peaks)))
            how = "graph" if steps[-1].graph else "eager"
            print(f"[{backend}, cache {label['cache']}, {how}] {args.prompt}{''.join(x.text for x in steps)!r}")
        if args.profile:
            prof = list(generate(model, ids, max_new_tokens=min(8, args.new_tokens), cache=cache, backend=backend,
                                 profile=True, warmup=False, tiles=args.tiles))  # fmt: skip
            frames.append(metrics.kernel_frame(prof).assign(**label))
    table = pd.DataFrame(summaries)
    if frames:
        per_kind = (
            pd.concat(frames)
            .groupby(["backend", "cache", "phase", "kind"], as_index=False)[["kernel_ms", "launch_ms", "modeled_mb"]]
            .median()
        )
        print(per_kind.to_string(index=False))
        print(step_budget(per_kind, table).to_string(index=False))
    return table, table


def step_budget(per_kind: pd.DataFrame, summaries: pd.DataFrame) -> pd.DataFrame:
    """One decode step, per (backend, cache): the kernels' summed device time and launch time from the
    profiling pass, next to the measured step time eager and replayed from a CUDA graph."""
    decode = per_kind[per_kind.phase == "decode"]
    out = decode.groupby(["backend", "cache"], as_index=False).agg(
        kernels_ms=("kernel_ms", "sum"),
        launching_ms=("launch_ms", lambda v: v.sum(min_count=1)),  # NaN where not measured (CPU)
        modeled_mb=("modeled_mb", "sum"),
    )
    if "cuda_graph" not in summaries:
        return out
    for graph, column in ((False, "step_eager_ms"), (True, "step_graph_ms")):
        rows = summaries[summaries.cuda_graph == graph].set_index(["backend", "cache"]).ms_per_token_p50
        out[column] = [rows.get((b, c), math.nan) for b, c in zip(out.backend, out.cache, strict=True)]
    return out


if __name__ == "__main__":
    main()
