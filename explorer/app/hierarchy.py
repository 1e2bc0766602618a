"""The Memory hierarchy tab: HBM -> L2 -> SRAM -> compute with a run's numbers, kernel by kernel, and the
traffic models held against hardware counters as recorded on a GPU (assets/recorded/ncu_*.json), every
sentence under that table computed from its rows."""

from __future__ import annotations

import math

import pandas as pd

from .units import digits3, duration


def hierarchy_html(
    kernels: pd.DataFrame, peak_gbs: float | None, lessons: pd.DataFrame | None = None, counters: str = ""
) -> str:
    """The HBM -> L2 -> SRAM -> compute picture with this run's numbers: per kernel kind in one decode
    step, bytes the SMs request (tile re-reads included), bytes HBM sees (what the L2 lets through), the
    floor, the time the HBM bytes need at the measured bandwidth and, once profiled, the device time
    measured and the host time spent launching (over the profiled steps alone, so that bytes and times
    come from the same positions). `counters`: the recorded hardware-counter table, as HTML."""
    decode = kernels[kernels.phase == "decode"] if (kernels.phase == "decode").any() else kernels
    if decode.empty:
        return "<p>Generate to see where the bytes go.</p>" + counters
    profiled = decode[decode.step == decode.profiled_step] if "profiled_step" in decode else decode
    if not profiled.empty and profiled.kernel_ms.notna().any():
        decode = profiled
    steps = max(1, decode.step.nunique())
    measured = [c for c in ("kernel_ms", "launch_ms") if c in decode and decode[c].notna().any()]
    columns = ["modeled_mb", "hbm_mb", "floor_mb", "gflop", *measured]
    per_kind = decode.groupby("kind", sort=False)[columns].sum() / steps
    heads = ["kernel", "MB SM requests (tiles)", "MB HBM (modeled)", "MB floor", "MFLOP", "HBM bytes at peak bandwidth"]
    if "kernel_ms" in measured:
        heads.append("device time measured" if peak_gbs else "interpreter time")
    if "launch_ms" in measured:
        heads.append("host time launching it")
    rows = []
    for kind, r in per_kind.iterrows():
        at_peak = duration(r.hbm_mb * 1.048576 / peak_gbs) if peak_gbs else "n/a on CPU"  # MiB at GB/s, in ms
        cells = [kind, f"{r.modeled_mb:.3f}", f"{r.hbm_mb:.3f}", f"{r.floor_mb:.3f}", f"{r.gflop * 1e3:.2f}", at_peak]
        cells += [duration(r[c]) for c in measured]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    saved = ""
    if lessons is not None and not lessons.empty:
        pivot = lessons.pivot(index="lesson", columns="variant", values="mb")
        items = [
            f"<li>{lesson}: {row['unfused']:.2f} MB unfused → {row['fused (ours)']:.2f} MB fused "
            f"({_ratio(row['unfused'], row['fused (ours)'])})</li>"
            for lesson, row in pivot.iterrows()
        ]
        saved = "<p><b>Fusion at the prompt length</b>, one layer:</p><ul>" + "".join(items) + "</ul>"
    bw = f"{peak_gbs:.0f} GB/s measured" if peak_gbs else "CPU: no HBM here, the interpreter models it"
    launch = (
        "<p>Launching a kernel from Python costs the host more than most of these kernels cost the GPU: "
        "that is the time a CUDA graph replay removes.</p>"
        if "launch_ms" in measured
        else ""
    )
    where = f"averaged over the {steps} profiled decode steps" if measured else "averaged over the run's decode steps"
    return (
        '<div class="hierarchy"><p><b>HBM</b> (' + bw + ") ⟶ <b>L2</b> ⟶ <b>SRAM</b> (tiles, shared memory) ⟶ "
        "<b>registers / tensor cores</b>. Tiles decide how often the SMs request a byte (through "
        f"L1, from L2); the L2 decides how many of those requests reach HBM. Per decode step, {where}:</p>"
        "<table><tr>"
        + "".join(f"<th>{h}</th>" for h in heads)
        + "</tr>"
        + "".join(rows)
        + "</table>"
        + launch
        + saved
        + counters
        + "</div>"
    )


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.1f}x fewer bytes" if b > 0 and not math.isnan(a / b) else ""


def _l1(r, way: str) -> float:
    """A recorded row's L1 counter (requests through L1) for "read" or "write", NaN where none was recorded:
    kernels.ncu_check's own column, or for loads the L1 probe of the tiled kernels
    (ncu_l1_probe, experiments/README.md).
    A case whose loads take no L1 path (TMA) has 0 there."""
    value = getattr(r, f"counter_l1_{way}_mb", math.nan)
    if way == "read" and not (value is not None and pd.notna(value)):
        value = getattr(r, "probe_l1_requested_mb", math.nan)
    return value if value is not None and pd.notna(value) and value > 0 else math.nan


def _tma(r) -> bool:
    """Whether a recorded row's loads are TMA copies, which pass neither L1's counter nor the L2's texture path."""
    return str(getattr(r, "requests_counter", "")).endswith("(TMA)")


def _levels_of(r) -> list[tuple[str, str, float, float]]:
    """(level, the counter's level, model, counter) per level a row is judged at. The models count the bytes
    the SMs request: at L1's counter where the row has one, otherwise at the L2's, which then sees them
    (streaming kernels: nothing to merge). A TMA row's requests have no counter (NaN): HBM alone judges it."""
    out = []
    for way, level in (("read", "SM requests"), ("write", "SM stores")):
        l1 = _l1(r, way)
        at, counter = ("L1", l1) if pd.notna(l1) else ("L2", getattr(r, f"counter_l2_{way}_mb"))
        if _tma(r):
            at, counter = "no counter (TMA)", math.nan
        out.append((level, at, getattr(r, f"model_l2_{way}_mb"), counter))
    out += [("HBM read", "HBM", r.model_hbm_read_mb, r.counter_hbm_read_mb)]
    out += [("HBM write", "HBM", r.model_hbm_write_mb, r.counter_hbm_write_mb)]
    return out


def _size(mb: float) -> str:
    """Decimal megabytes, as the counter table has them, in KB below one MB: 4.06 KB, 742 KB, 1.05 MB."""
    kb = abs(mb) * 1e3
    return f"{digits3(kb)} KB" if kb < 1e3 else f"{digits3(abs(mb))} MB"


def _counter_checks(r) -> list[dict]:
    """One recorded row's levels, each judged as kernels.ncu_check judges it (within 15%, or apart by less
    than the noise), from the same model and counter numbers the table shows."""
    from kernels import ncu_check  # imports triton: only for the tab that shows counters

    checks = []
    for level, at, model, counter in _levels_of(r):
        noise_bytes = ncu_check.WRITE_NOISE_BYTES if level == "HBM write" else ncu_check.NOISE_BYTES
        pct, ok = ncu_check.diff(model * ncu_check.MB, counter * ncu_check.MB, noise_bytes)
        within = abs(pct) <= 100 * ncu_check.TOLERANCE
        if math.isnan(counter):  # nothing to judge against
            ok = within = True
        checks.append(
            dict(
                level=level,
                at=at,
                model=model,
                counter=counter,
                pct=pct,
                apart_mb=model - counter,
                noise_mb=noise_bytes / ncu_check.MB,
                ok=ok,
                within=within,
            )
        )
    return checks


def _pct(pct: float) -> str:
    return "0%" if round(pct) == 0 else f"{pct:+.0f}%"


def _levels(checks: list[dict]) -> str:
    return ", ".join(f"{c['level']} {_pct(c['pct'])}" for c in checks)


def _verdict(checks: list[dict]) -> str:
    """'within 15%'; or the levels over it; or, where a level is further apart in % but by fewer bytes than
    the noise, by how many."""
    over = [c for c in checks if not c["ok"]]
    if over:
        return f"over 15%: {_levels(over)}"
    noise = [c for c in checks if not c["within"]]
    if not noise:
        return "within 15%"
    return "within the noise: " + "; ".join(
        f"{c['level']} {_pct(c['pct'])} is {_size(c['apart_mb'])} apart, less than {_size(c['noise_mb'])}"
        for c in noise
    )


def counters_html(meta: dict, rows: pd.DataFrame) -> str:
    """The recorded model-vs-counter table: per case, both levels, modeled next to measured, and a verdict
    from the numbers in its row; under it, what the rows show, every number taken from them."""
    if rows.empty:
        return ""
    heads = [
        "kernel, shape",
        "SM requests: model / counter (MB)",
        "L2 reads: counter (MB)",
        "HBM read: model / counter (MB)",
        "HBM write: model / counter (MB)",
        "verdict",
    ]
    cells, judged = [], []
    for r in rows.itertuples():
        checks = {c["level"]: c for c in _counter_checks(r)}
        judged.append((r, checks))
        shown = lambda c: f"{digits3(c['model'])} / {digits3(c['counter'])} ({_pct(c['pct'])})"
        requests = checks["SM requests"]
        if _tma(r):
            requests_cell = (
                f"{digits3(requests['model'])} / no counter: TMA copies pass neither L1 nor the texture path"
            )
        else:
            requests_cell = shown(requests).replace(" (", f" at {requests['at']} (", 1)
        cells.append(
            [
                r.case,
                requests_cell,
                _l2_reads(r),
                shown(checks["HBM read"]),
                shown(checks["HBM write"]),
                _verdict(list(checks.values())),
            ]
        )
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in cells)
    return (
        f"<p><b>The models against hardware counters</b>, recorded on {meta.get('gpu', '?')} on "
        f"{str(meta.get('date', '?'))[:10]} (torch {meta.get('torch', '?')}, triton {meta.get('triton', '?')}, "
        f"{meta.get('dtype', '?')}; <code>{meta.get('command', 'python -m kernels.ncu_check')}</code>), caches "
        "flushed before each kernel:</p><table><tr>"
        + "".join(f"<th>{h}</th>" for h in heads)
        + "</tr>"
        + body
        + "</table><p>"
        + " ".join(_counter_findings(judged))
        + "</p>"
    )


def _l2_reads(r) -> str:
    """What the L2 counted. Beside it the models' figure only where it is within 15% of it: the models count
    what the SMs request, and where the L2 sees fewer (merged misses) their figure is not an L2 figure."""
    from kernels import ncu_check

    model, counter = r.model_l2_read_mb, r.counter_l2_read_mb
    if _tma(r):
        return f"{digits3(counter)} (the texture path's loads, without the TMA copies)"
    pct, _ = ncu_check.diff(model * ncu_check.MB, counter * ncu_check.MB)
    if abs(pct) <= 100 * ncu_check.TOLERANCE:
        return f"{digits3(counter)} (requests {_pct(pct)})"
    return f"{digits3(counter)} ({100 * (1 - counter / model):.0f}% fewer than requested)"


def _counter_findings(judged: list) -> list[str]:
    """Sentences on what the judged rows show: which agree, how closely HBM reads and writes do, and what
    the L1 probe says of the tiled kernels' L2 loads."""
    out = []
    over = [(r.case, [c for c in checks.values() if not c["ok"]]) for r, checks in judged]
    over = [(case, failed) for case, failed in over if failed]
    n = len(judged)
    if not over:
        out.append(f"All {n} cases agree at every level, within 15% or within the noise.")
    else:
        which = "; ".join(f"{case} ({_levels(failed)})" for case, failed in over)
        out.append(
            f"{n - len(over)} of {n} cases agree at every level, within 15% or within the noise. Over 15%: {which}."
        )
    reads = [(r, checks["HBM read"]) for r, checks in judged]
    noise = reads[0][1]["noise_mb"]
    big = [abs(c["pct"]) for r, c in reads if r.counter_hbm_read_mb >= noise]  # cases above the noise itself
    if big:
        out.append(f"HBM reads agree within {max(big):.1f}% in every case that reads more than {_size(noise)}.")
    r, worst = max(reads, key=lambda rc: abs(rc[1]["pct"]))
    if not big or abs(worst["pct"]) > max(big):
        out.append(
            f"The largest HBM read difference shown, {_pct(worst['pct'])} ({r.case}), is "
            f"{_size(worst['apart_mb'])}: in a case that small the flush's leftovers and sector rounding dominate."
        )
    r, write = max(((r, checks["HBM write"]) for r, checks in judged), key=lambda rc: abs(rc[1]["apart_mb"]))
    out.append(
        "HBM writes are counted when the L2 evicts them, so a case's counter can carry an earlier case's "
        f"write-back: the largest write difference is {_size(write['apart_mb'])} ({r.case}), "
        + (f"within the {_size(write['noise_mb'])} allowed for it." if write["ok"] else "beyond what the noise allows.")
    )
    # The rows whose L2 sees fewer bytes than the SMs request, by more than the tolerance: what L1 says of them.
    merged = [r for r, c in judged if c["SM requests"]["at"] == "L1" and r.counter_l2_read_mb < 0.85 * _l1(r, "read")]
    if merged:
        counted = max(abs(_l1(r, "read") / r.model_l2_read_mb - 1) for r in merged)
        hits = [getattr(r, "probe_l1_hit_mb", math.nan) for r in merged]
        hit = sum(hits) / sum(_l1(r, "read") for r in merged) if all(pd.notna(h) for h in hits) else None
        fewer = [100 * (1 - r.counter_l2_read_mb / _l1(r, "read")) for r in merged]
        out.append(
            f"For {', '.join(r.case for r in merged)} the SMs request from L1 "
            + ("exactly" if counted < 0.005 else f"within {100 * counted:.0f}% of")
            + " the bytes the model counts (tile re-reads and per-program loads included)"
            + ("" if hit is None else ", none of them hit" if hit == 0 else f", {hit:.0%} of them hit")
            + f", and the L2 sees {_span(fewer)}% fewer: a load that hits in L1 (a weight every program of an SM "
            "reads) or a miss to a sector already in flight (tiles) never reaches L2 on its own. So the models' "
            "figure is what the SMs request, and an L2 figure is shown only where the L2 counted it."
        )
    return out


def _span(values: list[float]) -> str:
    """'6-42', or '6' where they round alike."""
    lo, hi = f"{min(values):.0f}", f"{max(values):.0f}"
    return lo if lo == hi else f"{lo}-{hi}"
