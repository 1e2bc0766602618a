"""Lesson 8: a 2019 block and a modern one. GPT-2's block and a Llama-family block of the same width, depth and
heads, run one after the other on the same kernels: what each of the four changes (RMSNorm, rotary positions,
SwiGLU, grouped-query heads) does to the bytes a decode step moves and to its time, from that run's numbers."""

from __future__ import annotations

import functools

import pandas as pd
import plotly.graph_objects as go
import torch

from ...measure import metrics
from ...measure.profile import profile_run
from ...model.gpt import GPT, GPTConfig
from ...model.llama import Llama, LlamaConfig
from .. import estimate as cost
from .. import models
from . import base

FAMILIES = ("GPT-2", "Llama")
KEYS = {"GPT-2": "gpt2", "Llama": "llama"}  # the facts' prefixes
# Both blocks on the rung where each part of the block is a launch of its own, booked under its own chart category:
# on the decode rungs the norms, rotary and the cache write ride inside the projections of either block.
FUSION = "epilogue"
# Each change, the chart categories it shows up in, and the block's two ways of doing that part.
CHANGES = (
    ("normalisation", ("layer_norm",), "LayerNorm", "RMSNorm"),
    ("positions", ("embedding", "rotary"), "a learned position row added to the token's", "rotary q and k"),
    ("feed-forward", ("ffn",), "GELU over 4C", "SwiGLU"),
    (
        "attention",
        ("qkv/out proj", "kv write", "decode attention"),
        "a key/value head per query head",
        "grouped-query heads",
    ),
)


def settings(size: str) -> dict:
    common = dict(backend="triton", cache=True)
    if size == "gpu":  # GPT-2 small's width and depth; the Llama block with a third as many key/value heads
        blocks = dict(width=768, layers=12, heads=12, kv_heads=4, vocab=50257)
        common |= dict(model=base.BLOCKS_GPU, dtype="bfloat16", prompt_tokens=1000, new_tokens=8, graph=True)
        return common | dict(blocks=blocks, samples=3)
    blocks = dict(width=192, layers=2, heads=6, kv_heads=2, vocab=4096)
    return common | dict(
        model=base.BLOCKS_CPU, blocks=blocks, dtype="float32", prompt_tokens=8, new_tokens=2, samples=1
    )


@functools.lru_cache(maxsize=2)
def pair(shape: tuple, device: str, dtype: torch.dtype) -> tuple[GPT, Llama]:
    """Random weights (N(0, 0.02), norms at one) of both blocks at one shape: GPT-2's FFN 4C wide, the Llama's
    SwiGLU 8C/3 (rounded to 64), so that both FFNs hold the same number of weights."""
    s = dict(shape)
    width, gen = s["width"], torch.Generator(device=device).manual_seed(0)
    common = dict(vocab_size=s["vocab"], n_positions=1024, n_embd=width, n_layer=s["layers"], n_head=s["heads"])
    gpt = GPT(GPTConfig(**common))
    llama = Llama(LlamaConfig(**common, n_kv_head=s["kv_heads"], ffn=-(-width * 8 // 3 // 64) * 64))
    return tuple(base.randomised(m.to(device=device, dtype=dtype), gen) for m in (gpt, llama))


def measure(s: dict) -> tuple[dict, dict]:
    """Each block's generation, its last decode step's modeled HBM bytes per category, and the device time of
    the decode step's kernels by category (profiled at a few positions)."""
    dtype = models.DTYPES[s["dtype"]]
    rows, step_rows, facts = [], [], {}
    for family, model in zip(FAMILIES, pair(tuple(s["blocks"].items()), str(models.device()), dtype), strict=True):
        model = model.with_backend(s["backend"]).with_fusion(FUSION)
        steps = base.generation(model, s)
        ids = base.prompt(model, s["prompt_tokens"])
        profiled = profile_run(model, [ids], steps, cache=True, backend=s["backend"], samples=s["samples"])
        decode = profiled[profiled.phase == "decode"]
        times = (decode.groupby("kind").kernel_ms.sum() / decode.step.nunique()).to_dict()
        last = steps[-1]
        for kind, t in metrics.step_traffic(last).items():
            rows.append(dict(family=family, kind=kind, hbm_mb=t.hbm_bytes / metrics.MB, kernel_ms=times.get(kind)))
        frame = metrics.step_frame(steps)[["step", "phase", "position", "latency_ms"]]
        step_rows.append(frame.assign(family=family))
        cfg, key, summary = model.config, KEYS[family], metrics.summary(steps)
        mlp = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".mlp." in n)
        facts |= {
            f"{key}_step_ms": summary["step_ms_p50"],
            f"{key}_kv_per_token": float(
                metrics.kv_bytes_per_token(cfg.n_layer, cfg.n_kv_head, cfg.head_dim, dtype.itemsize)
            ),
            f"{key}_ffn_weights_mb": mlp / metrics.MB,
            f"{key}_context": int(last.positions[0]),
            f"{key}_kv_heads": cfg.n_kv_head,
            f"{key}_operations": int(summary["operations_per_step"]),
        }
    facts |= {f"shape_{k}": v for k, v in s["blocks"].items()}
    return facts, {"bytes": pd.DataFrame(rows), "steps": pd.concat(step_rows, ignore_index=True)}


def _part(tables: dict, family: str, kinds) -> tuple[float, float]:
    """(HBM MB, device ms) of one family's decode step in these categories."""
    t = tables["bytes"]
    rows = t[(t.family == family) & t.kind.isin(kinds)]
    return float(rows.hbm_mb.sum()), float(rows.kernel_ms.fillna(0).sum())


def _facts(facts: dict, prefix: str) -> dict:
    """The facts under one prefix, without it: _facts(f, "gpt2")["step_ms"] is f["gpt2_step_ms"]."""
    return {k.removeprefix(prefix + "_"): v for k, v in facts.items() if k.startswith(prefix + "_")}


def kb(n: float) -> str:
    return f"{base.num(n / 1024)} KB"


def explain(r) -> str:
    f, tables = r.facts, r.tables
    g, m = (_facts(f, key) for key in ("gpt2", "llama"))
    sh = _facts(f, "shape")
    clock = "device time" if r.device != "CPU" else "interpreter time"
    lines = [
        f"Both blocks at width {sh['width']}, {sh['layers']} layers and {sh['heads']} query heads, one token decoded "
        f"after {g['context']} of context, each on the *{FUSION}* rung (the same kernels for both). Per decode "
        f"step, modeled HBM bytes and {clock} of the kernels:\n"
    ]
    deltas = {}
    t_ms = lambda t: base.ms(t) if t > 0 or r.device == "CPU" else "under the timer's floor"
    for change, kinds, before, after in CHANGES:
        (gb, gt), (mb_, mt) = _part(tables, "GPT-2", kinds), _part(tables, "Llama", kinds)
        deltas[change] = gb - mb_
        lines.append(
            f"- **{change}**: {before} → {after}: {base.mb(gb)} → **{base.mb(mb_)}**, {t_ms(gt)} → **{t_ms(mt)}**"
        )
    total_g = float(tables["bytes"][tables["bytes"].family == "GPT-2"].hbm_mb.sum())
    total_m = float(tables["bytes"][tables["bytes"].family == "Llama"].hbm_mb.sum())
    largest = max(deltas, key=lambda c: abs(deltas[c]))
    small = abs(deltas["normalisation"]) + abs(deltas["positions"])
    share = small / total_g
    lines.append(
        f"\nThe largest change is in **{largest}** ({base.mb(abs(deltas[largest]))} a step). With {sh['heads']} "
        f"query heads sharing {m['kv_heads']} key/value heads, each token's keys and values take "
        f"**{kb(m['kv_per_token'])}** against {kb(g['kv_per_token'])} "
        f"(**{g['kv_per_token'] / m['kv_per_token']:.0f}× less**): the cache, the projections that write it and "
        f"decode attention, which reads all of it every step, shrink together. The FFNs hold about the same weights "
        f"({base.mb(g['ffn_weights_mb'])} and {base.mb(m['ffn_weights_mb'])}: two matrices of 4C against three of "
        f"8C/3), so their bytes barely move; SwiGLU's gate and up run as one matmul with the gating in its "
        f"epilogue. RMSNorm and rotary together move the step by {base.mb(small)} "
        f"({base.pct(share)} of it): each reads and writes its rows once."
    )
    ops = f", in **{g['operations']} → {m['operations']} operations**" if "operations" in g else ""
    lines.append(
        f"\nIn all, **{base.mb(total_g)} → {base.mb(total_m)}** a step{ops}; the step took "
        f"**{base.ms(g['step_ms'])} → {base.ms(m['step_ms'])}** (median)."
    )
    if r.device != "CPU":
        rate = lambda mb, ms: base.num(mb / ms / 1e3)  # MB per ms is GB/s: in TB/s
        lines[-1] += (
            f" That is {rate(total_g, g['step_ms'])} → {rate(total_m, m['step_ms'])} TB/s of modeled traffic, far "
            "below what HBM delivers: where a step moves this few bytes, its time follows the kernels it launches as "
            "much as their bytes, and the fused rungs of *Fusion, the ladder* are how either block closes that gap."
        )
    if r.device == "CPU":
        lines.append(
            "\nHere each time is the Triton interpreter running the kernels' programs in Python: it follows the "
            "number of programs, not the bytes. The recorded GPU run beside this one shows the times the bytes set."
        )
    return "\n".join(lines)


def figure(r) -> go.Figure:
    t = r.tables["bytes"]
    order = t.groupby("kind").hbm_mb.max().sort_values().index
    fig = go.Figure()
    for family, color in zip(FAMILIES, ("#4c78a8", "#f58518"), strict=True):
        part = t[t.family == family].set_index("kind").reindex(order)
        fig.add_trace(go.Bar(y=list(order), x=part.hbm_mb, orientation="h", name=family, marker_color=color))
    fig.update_layout(barmode="group")
    fig.update_yaxes(ticklabelstandoff=10)
    return base.big(fig, "A decode step's bytes, by part of the block", r, "MB from HBM (modeled)", "")


# In the interpreter a pass of either small model costs about the same, whatever it computes: the LM head and the
# programs of a dozen kernels set its time, not its two layers (the profiling pass rebuilds its decode step on
# PyTorch's prefill, which costs next to nothing there).
CPU_PASS_S = 0.44


def estimate(s: dict) -> float:
    """Seconds for both families' runs and profiling passes: on CPU by passes, on a GPU by layer-steps."""
    if models.device().type == "cpu":
        # each family: its prefill and decode steps, then the profiling pass's prefill and one step per sample
        passes = 2 * (s["new_tokens"] + 2 * s["samples"])
        return CPU_PASS_S * passes * cost.cpu_speed() + cost.FIXED_S["cpu"]
    return base.generation_estimate(s, runs=(True, True), profiled=s["samples"] + 1)


def controls(s: dict) -> dict:
    """The Generate tab set to the Llama half of the job on the bundled Llama (its own shape, not the lesson's)."""
    return dict(model="bundled-llama", prompt_tokens=s["prompt_tokens"], new_tokens=s["new_tokens"], dtype=s["dtype"])


LESSON = base.Lesson(
    name="blocks",
    title="A 2019 block and a modern one",
    summary="GPT-2's block beside a Llama-family block of the same width: what RMSNorm, rotary, SwiGLU and "
    "grouped-query heads do to a decode step's bytes and time.",
    settings=settings,
    measure=measure,
    explain=explain,
    figure=figure,
    try_next=(
        "In Generate, pick the bundled Llama and watch the *KV cache growth* chart: its title says what one token "
        "of cache holds and why grouped heads make it smaller. Run Compare on both bundled models at one length."
    ),
    estimate=estimate,
    controls=controls,
)
