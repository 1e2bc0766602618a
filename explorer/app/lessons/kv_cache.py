"""Lesson 3: the KV cache on and off. With it, each step feeds one token and reads the keys and values
of the others from the cache; without it, each step recomputes the whole sequence, so the time per token
climbs with the length (O(n) per token, O(n^2) over a generation)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from ...measure import metrics
from . import base


def settings(size: str) -> dict:
    if size == "gpu":
        return dict(
            model=base.GPT2_SHAPE, dtype="bfloat16", backend="triton", prompt_tokens=16, new_tokens=768, graph=True
        )
    # The interpreter's time per step is set by running every kernel program in Python, which hides the
    # recomputation: on CPU the lesson runs the PyTorch backend, whose time is arithmetic.
    return dict(model="bundled", dtype="float32", backend="torch", prompt_tokens=16, new_tokens=96)


def measure(s: dict) -> tuple[dict, dict]:
    model = base.model(s)
    frames, facts = [], {}
    for cache in (True, False):
        # A CUDA graph needs the cache: every cache-off step has a new shape.
        steps = base.generation(model, s, cache=cache, graph=s.get("graph", False) and cache)
        frame = metrics.step_frame(steps)[
            ["step", "phase", "position", "context_tokens", "latency_ms", "modeled_gflop"]
        ]
        frame = frame.rename(columns={"modeled_gflop": "gflop"})
        frame.insert(0, "cache", "on" if cache else "off")
        frames.append(frame)
        decode = frame[frame.phase == "decode"]
        early, late = base.ends(decode.latency_ms)
        key = "on" if cache else "off"
        facts |= {
            f"{key}_early_ms": early,
            f"{key}_late_ms": late,
            f"{key}_total_ms": float(frame.latency_ms.sum()),
            f"{key}_first_gflop": float(decode.gflop.iloc[0]),
            f"{key}_last_gflop": float(decode.gflop.iloc[-1]),
            f"{key}_last_context": int(decode.context_tokens.iloc[-1]),
        }
        if cache:
            summary = metrics.summary(steps)
            facts["kv_mb"] = summary["kv_cache_mb"]
            facts["graph"] = bool(summary["cuda_graph"])
    facts["first_position"], facts["last_position"] = int(decode.position.iloc[0]), int(decode.position.iloc[-1])
    facts["tokens"] = s["new_tokens"]
    return facts, {"steps": pd.concat(frames, ignore_index=True)}


def explain(r) -> str:
    f = r.facts
    graph = " (each step replayed from a CUDA graph)" if f.get("graph") else ""
    return (
        f"Both runs generated {f['tokens']} tokens after the same {r.settings['prompt_tokens']}-token prompt. "
        f"**With the cache**{graph}, a step fed one token and read the other keys and values from the cache: "
        f"{base.num(f['on_first_gflop'] * 1e3)} MFLOP a step, and its time went from "
        f"**{base.ms(f['on_early_ms'])}** near position {f['first_position']} to **{base.ms(f['on_late_ms'])}** "
        f"near {f['last_position']} (medians of the first and last eighth of the steps). **Without it**, every "
        f"step ran the whole sequence again, {f['off_last_context']} tokens by the end: its work grew from "
        f"{base.num(f['off_first_gflop'] * 1e3)} to {base.num(f['off_last_gflop'] * 1e3)} MFLOP a step, and its "
        f"time from **{base.ms(f['off_early_ms'])}** to **{base.ms(f['off_late_ms'])}**.\n\n"
        f"Over the whole generation that is {base.ms(f['on_total_ms'])} with the cache and "
        f"{base.ms(f['off_total_ms'])} without, **{base.num(f['off_total_ms'] / f['on_total_ms'])}× longer**, "
        f"and the gap widens with every token: O(n) work per token without the cache, O(1) with it (plus a "
        f"read of the cache that grows by one position a step). The price is memory: the cache held "
        f"**{base.mb(f['kv_mb'])}** of keys and values at the end."
    )


def figure(r) -> go.Figure:
    steps = r.tables["steps"]
    fig = go.Figure()
    for cache, color in (("on", "#4c78a8"), ("off", "#e45756")):
        part = steps[(steps.cache == cache) & (steps.phase == "decode")]
        fig.add_trace(
            go.Scatter(x=part.position, y=part.latency_ms, mode="lines", name=f"KV cache {cache}", line_color=color)
        )
    fig.update_yaxes(rangemode="tozero")
    return base.big(fig, "Time per token, KV cache on and off", r, "sequence position", "ms per token")


LESSON = base.Lesson(
    name="kv-cache",
    title="The KV cache on and off",
    summary="Run with the cache and without: per-token time stays flat with it and climbs without it.",
    settings=settings,
    measure=measure,
    explain=explain,
    figure=figure,
    try_next=(
        "In *Compare*, give several prompt lengths (e.g. 8, 64, 256): cache off starts higher for longer prompts. "
        "In Generate, untick *KV cache* and watch the *Tokens recomputed per step* chart replace the cache's growth."
    ),
    estimate=lambda s: base.generation_estimate(s, runs=(True, False)),
    controls=lambda s: base.generate_controls(s) | {"cache": False},
)
