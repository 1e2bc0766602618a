"""The GPU time model (explorer/app/gpu_time.py): its fit against costs known in advance, the settings held
out of it kept out, the figures a visitor sees from it labelled as modeled, and the model against every
recorded setting it was not fitted on."""

import dataclasses
import importlib.util
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from explorer.app import counterpart, gpu_time, jobs, settings, views
from explorer.app.settings import RunSettings

ROOT = Path(__file__).resolve().parent.parent
RECORDED = sorted((ROOT / "assets" / "recorded").glob("matrix_*.json"))
MB = 1024 * 1024
NEVER = jobs.Control(lambda: False, float("inf"))

# the costs the synthetic recordings are made with: per launch on a rung in a mode, and per step
LAUNCH_MS = {
    ("torch", "eager"): 0.012,
    ("none", "eager"): 0.020,
    ("overlap", "eager"): 0.017,
    ("none", "graph"): 0.004,
    ("overlap", "graph"): 0.0015,
}
STEP_MS = {("eager", "prefill"): 0.30, ("eager", "decode"): 0.15, ("graph", "decode"): 0.05}
SAMPLE_MS = 0.6  # what drawing a token by top-p sampling adds to a step
DESCRIBED_MS = 0.009  # what an eager half-precision launch of the Triton backend adds (its tensor descriptors)
BANDWIDTH, TFLOPS = 4000.0, {"float32": 50.0, "float16": 700.0, "bfloat16": 700.0}


def _record_matrix():
    spec = importlib.util.spec_from_file_location("record_matrix", ROOT / "scripts" / "record_matrix.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_setting_of_the_matrix_is_one_the_gpu_it_is_recorded_on_accepts():
    """A setting the app refuses is a hole in the fit. Each Triton setting's tiles (the defaults, or the
    script's smaller ones) pass the app's own check before a run (jobs.generate.check_tiles) with the H200's
    limits at the bundled models' shapes, and the modeled bytes of the prompt's fused launches resolve too."""
    from types import SimpleNamespace

    import torch

    from explorer.app import models
    from explorer.app.jobs.generate import check_tiles
    from explorer.measure.metrics import fusion_lessons
    from explorer.model.weights import load_model

    from .ops.limits import H200

    loaded = {}
    checked = 0
    for s in _record_matrix().matrix():
        if s.backend != "triton":
            continue
        model, tok = loaded.setdefault(s.model, load_model(s.model))
        dtype = getattr(torch, s.dtype)
        ids = models.prompt_ids(tok, s.prompt, s.prompt_tokens, model.config.n_positions)
        on_gpu = SimpleNamespace(
            config=model.config, device=H200, dtype=dtype, family=model.family, transformer=model.transformer
        )
        check_tiles(on_gpu, s.tiles, s.batch, len(ids), len(ids) + s.new_tokens)
        fusion_lessons(model.config, len(ids), dtype.itemsize, s.tiles, dtype=dtype, device=H200)
        checked += 1
    assert checked == 144


def test_of_two_runs_of_a_setting_the_faster_is_kept_and_the_slower_named():
    rm = _record_matrix()

    def run(decode_ms, tag, prefill_ms=9.0):
        steps = pd.DataFrame(
            {"step": range(6), "phase": ["prefill", *["decode"] * 5], "latency_ms": [prefill_ms, *decode_ms]}
        )
        return {"steps": steps, "kernels": tag, "summary": {"step_ms_p50": float(np.median(decode_ms)), "tag": tag}}

    row = {"index": 7, "key": {"settings": {}}, "cuda_graph": False, **run([3.0, 3.1, 2.9, 3.2, 3.0], "first")}
    row["summary"]["first_run_decode_ms"] = 4.0
    kept = rm.faster(row, run([5.0, 5.1, 4.9, 1.0, 5.2], "again"))  # one fast step does not make a faster run
    assert kept["kernels"] == "first" and kept["summary"]["other_run_decode_ms"] == 5.0
    kept = rm.faster(row, run([2.0, 2.1, 1.9, 9.0, 2.2], "again"))
    assert kept["kernels"] == "again" and kept["summary"]["tag"] == "again" and kept["index"] == 7
    assert kept["summary"]["other_run_decode_ms"] == 3.0 and kept["summary"]["first_run_decode_ms"] == 4.0
    assert kept["summary"]["runs"] == 2
    third = rm.faster(kept, run([2.5, 2.6, 2.4, 2.5, 2.5], "third"))  # slower than the kept, faster than the first
    assert third["kernels"] == "again" and third["summary"]["runs"] == 3
    assert third["summary"]["other_run_decode_ms"] == 3.0  # the slowest of the runs not kept
    fourth = rm.faster(third, run([1.5, 1.6, 1.4, 1.5, 1.5], "fourth"))
    assert fourth["kernels"] == "fourth" and fourth["summary"]["other_run_decode_ms"] == 3.0
    assert fourth["summary"]["runs"] == 4 and fourth["summary"]["first_run_decode_ms"] == 4.0
    assert rm.faster(row, {"refused": "out of memory"}) is row
    # each phase from the run that was faster at it: the decode steps of one, the prefill of another
    mixed = rm.faster(fourth, run([3.0, 3.0, 3.0, 3.0, 3.0], "fifth", prefill_ms=6.0))
    assert mixed["kernels"] == "fourth" and mixed["steps"].latency_ms.tolist() == [6.0, 1.5, 1.6, 1.4, 1.5, 1.5]
    assert mixed["steps"].step.tolist() == list(range(6)) and mixed["summary"]["other_run_prefill_ms"] == 9.0
    assert mixed["summary"]["other_run_decode_ms"] == 3.0 and mixed["summary"]["runs"] == 5
    slow = rm.faster(mixed, run([1.0, 1.0, 1.0, 1.0, 1.0], "sixth", prefill_ms=12.0))
    assert slow["kernels"] == "sixth" and slow["steps"].latency_ms.tolist() == [6.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert slow["summary"]["other_run_prefill_ms"] == 12.0


def _exact_nnls(x, y):
    """The nonnegative least-squares answer by trying every set of coefficients pinned at zero."""
    best, best_r = None, math.inf
    n = x.shape[1]
    for free in itertools.product([False, True], repeat=n):
        free = np.array(free)
        coef = np.zeros(n)
        if free.any():
            coef[free] = np.linalg.lstsq(x[:, free], y, rcond=None)[0]
        if (coef >= -1e-12).all() and (r := float(np.sum((x @ coef - y) ** 2))) < best_r - 1e-12:
            best, best_r = coef, r
    return best


@pytest.mark.parametrize("seed", range(12))
def test_nonnegative_least_squares_equals_the_exhaustive_answer(seed):
    rng = np.random.default_rng(seed)
    rows, cols = rng.integers(4, 14), rng.integers(1, 6)
    x = rng.normal(size=(rows, cols))
    y = rng.normal(size=rows) + (x @ rng.normal(size=cols) if seed % 2 else 0.0)  # some with no binding bound
    got = gpu_time._nonnegative_least_squares(x, y)
    assert (got >= 0).all()
    np.testing.assert_allclose(got, _exact_nnls(x, y), atol=1e-9)


def _described(rung, mode, half) -> bool:
    """Whether a launch makes tensor descriptors on the host: written out here, apart from the model's code."""
    return half and mode == "eager" and rung != "torch"


def _point(rng, rung, mode, phase, half=False):
    roof, launches = float(rng.uniform(0.01, 2.0)), float(rng.integers(10, 200))
    ms = roof + launches * (LAUNCH_MS[(rung, mode)] + DESCRIBED_MS * _described(rung, mode, half))
    ms += STEP_MS[(mode, phase)]
    return gpu_time.Point(rung, mode, phase, roof, launches, ms, half=half)


def test_the_fit_finds_the_costs_the_times_were_made_with():
    rng = np.random.default_rng(0)
    train = []
    for (rung, mode), (mode2, phase), half in itertools.product(LAUNCH_MS, STEP_MS, (False, True)):
        if mode == mode2:
            train += [_point(rng, rung, mode, phase, half) for _ in range(3)]
    model = gpu_time.fit(train, BANDWIDTH, TFLOPS)
    for key, ms in LAUNCH_MS.items():
        assert model.per_launch_ms[key] == pytest.approx(ms, rel=1e-9), key
    for key, ms in STEP_MS.items():
        assert model.per_step_ms[key] == pytest.approx(ms, rel=1e-9), key
    assert model.per_described_ms == pytest.approx(DESCRIBED_MS, rel=1e-9)
    for p in train:
        assert model.step_ms(p) == pytest.approx(p.measured_ms, rel=1e-9)


def _tables(rng, cache: bool, operations: int, tokens: int = 4):
    """A run's steps and kernels frames as the Generate job writes them, with random bytes and FLOPs."""
    steps, kernels = [], []
    for step in range(tokens):
        phase = "prefill" if step == 0 else "decode"
        ops = operations + (20 if phase == "prefill" else 0)
        steps.append(dict(step=step, phase=phase, operations=ops, batch=1, latency_ms=math.nan))
        for kind in ("linear", "attention", "layer_norm"):
            kernels.append(dict(step=step, phase=phase, kind=kind, hbm_mb=rng.uniform(1, 400), gflop=rng.uniform(0, 3)))
    return pd.DataFrame(steps), pd.DataFrame(kernels)


def _true_ms(steps, kernels, rung, cache, graph, dtype, sampled):
    """What the synthetic GPU takes: written out here, apart from the model's code."""
    out = []
    for row in steps.itertuples():
        roof = 0.0
        for k in kernels[kernels.step == row.step].itertuples():
            roof += max(k.hbm_mb * MB / (BANDWIDTH * 1e9), k.gflop * 1e9 / (TFLOPS[dtype] * 1e12)) * 1e3
        mode = "graph" if row.phase == "decode" and cache and graph else "eager"
        launch = LAUNCH_MS[(rung, mode)] + DESCRIBED_MS * _described(rung, mode, dtype != "float32")
        out.append(roof + row.operations * launch + STEP_MS[(mode, row.phase)] + SAMPLE_MS * sampled)
    return out


def _settings_of(i: int) -> tuple[RunSettings, bool]:
    """The i-th synthetic setting: a rung of LAUNCH_MS's and a dtype, the cache and the graph box."""
    rung = ("torch", "none", "overlap")[i % 3]
    dtype = ("float32", "float16", "bfloat16")[(i // 3) % 3]
    cache = rung == "overlap" or i % 2 == 0
    graph = rung != "torch" and cache
    backend = "torch" if rung == "torch" else "triton"
    fusion = "overlap" if rung == "torch" else rung
    temperature = 0.0 if i % 4 < 2 else 0.8
    s = RunSettings(
        dtype=dtype,
        backend=backend,
        fusion=fusion,
        cache=cache,
        new_tokens=4 + i,
        cuda_graph=graph,
        temperature=temperature,
    )
    return s, graph


def _write_matrix(folder: Path, n: int = 30, noise: float = 0.0, held_out_scale: float = 1.0) -> dict:
    rng = np.random.default_rng(1)
    held_out = sorted(rng.choice(n, n // 3, replace=False).tolist())
    rows = []
    for i in range(n):
        s, graph = _settings_of(i)
        steps, kernels = _tables(rng, s.cache, operations=int(rng.integers(20, 160)))
        rung = gpu_time.rung_of(dataclasses.asdict(s))
        ms = np.array(_true_ms(steps, kernels, rung, s.cache, graph, s.dtype, s.temperature > 0))
        ms *= 1 + noise * rng.uniform(-1, 1, size=len(ms))
        if i in held_out:
            ms *= held_out_scale
        steps["latency_ms"] = ms
        summary = {"step_ms_p50": float(np.median(ms[1:])), "achieved_gbs": 1234.0}
        key = {"settings": counterpart.settings_key(s)}
        rows.append(
            {"index": i, "key": key, "cuda_graph": graph, "steps": steps, "kernels": kernels, "summary": summary}
        )
    meta = dict(gpu="Test GPU", date="2026-12-05T00:00:00+00:00", bandwidth_gbs=BANDWIDTH, tflops=TFLOPS)
    meta |= dict(settings=n, held_out=held_out, not_run=[])
    gpu_time.save(folder / "matrix_test.json", meta, rows)
    return {"held_out": held_out, "rows": rows}


def test_a_matrix_saved_and_read_back_fits_the_costs_it_was_made_with(tmp_path):
    """The recording keeps five significant digits of each time, so the costs come back to about that."""
    _write_matrix(tmp_path)
    model = gpu_time.model(tmp_path)
    assert set(model.per_launch_ms) == set(LAUNCH_MS) and set(model.per_step_ms) == set(STEP_MS)
    for key, ms in model.per_launch_ms.items():
        assert ms == pytest.approx(LAUNCH_MS[key], rel=1e-3), key
    for key, ms in model.per_step_ms.items():
        assert ms == pytest.approx(STEP_MS[key], rel=1e-3), key
    assert model.per_sample_ms == pytest.approx(SAMPLE_MS, rel=1e-3)
    assert model.per_described_ms == pytest.approx(DESCRIBED_MS, rel=1e-3)
    assert model.held_out == 10 and model.held_out_error == pytest.approx(1.0, abs=1e-4)
    assert "within 1.00x of 10 recorded settings held out of the fit" in model.label()


def test_the_settings_held_out_never_move_the_fit(tmp_path):
    """Each held-out recording made 3x slower: the fitted costs stay as they were; the error says 3x."""
    plain, slowed = tmp_path / "plain", tmp_path / "slowed"
    plain.mkdir(), slowed.mkdir()
    _write_matrix(plain, noise=0.1)
    _write_matrix(slowed, noise=0.1, held_out_scale=3.0)
    a, b = gpu_time.model(plain), gpu_time.model(slowed)
    assert a.per_launch_ms == b.per_launch_ms and a.per_step_ms == b.per_step_ms
    assert a.held_out_error < 1.25 and b.held_out_error > 2.5


@pytest.fixture(scope="module")
def cpu_run():
    d = settings.defaults("cpu", {"dtype": "float32"})
    s = RunSettings(prompt=d["prompt"], new_tokens=3, dtype="float32")
    last = {}
    for update in jobs.JOBS["generate"]({"settings": s}, NEVER):
        last |= update
    return s, last["state"]


def test_a_recorded_setting_is_shown_as_recorded_and_any_other_as_modeled(tmp_path, cpu_run):
    made = _write_matrix(tmp_path)
    s, state = cpu_run
    steps, kernels = state["steps"], state["kernels"]
    # a setting in the recording: its own steps and summary, labelled recorded
    row = made["rows"][4]
    recorded = _settings_of(4)[0]
    got = counterpart.for_generate(recorded, steps, kernels, folder=tmp_path)
    assert got.recorded and "recorded 2026-12-05: the same job" in got.label
    np.testing.assert_allclose(got.tables["steps"].latency_ms, row["steps"].latency_ms, rtol=1e-4)  # 5 digits kept
    assert got.summary["achieved_gbs"] == 1234.0
    # any other: the model's times for this run's steps, labelled with the held-out error, no bandwidth
    got = counterpart.for_generate(s, steps, kernels, folder=tmp_path)
    model = gpu_time.model(tmp_path)
    assert not got.recorded and got.label == model.label()
    rung, mode = gpu_time.rung_of(dataclasses.asdict(s)), "graph"
    decode = got.tables["steps"][got.tables["steps"].phase == "decode"]
    for row in decode.itertuples():
        roof = sum(
            max(k.hbm_mb * MB / (BANDWIDTH * 1e9), k.gflop * 1e9 / (TFLOPS["float32"] * 1e12)) * 1e3
            for k in kernels[kernels.step == row.step].itertuples()
        )
        launch = model.per_launch_ms.get((rung, mode), max(model.per_launch_ms.values()))
        step = model.per_step_ms[(mode, "decode")] + model.per_sample_ms * (s.temperature > 0)
        assert row.latency_ms == pytest.approx(roof + row.operations * launch + step)
    assert got.tables["steps"].achieved_gbs.isna().all()
    row = next(r for r in views.summary_markdown(state["summary"], gpu=got).splitlines() if "achieved bandwidth" in r)
    assert row.split("|")[2].strip() == "n/a: needs a measured time (this one is modeled)", row


def test_before_a_matrix_the_model_fitted_on_the_default_jobs_holds_within_1_5x_of_every_lesson_step():
    """The shipped H200 recordings: fitted on the default jobs' steps (bundled GPT-2, fp32), held against the
    lessons' decode steps (GPT-2 small's shape and a Llama block, bf16, eager and replayed), which it never saw:
    each within 1.5x, and the label says how far."""
    from explorer.app.lessons import blocks, recorded

    assert gpu_time.BLOCKS_RUNG == blocks.FUSION
    rec = counterpart.latest()
    model = counterpart.time_model(rec)
    lessons = recorded.latest().results
    held = gpu_time.lesson_points(lessons, rec.meta["bandwidth_gbs"], model.tflops["bfloat16"])
    assert len(held) == 6 and {p.mode for p in held} == {"eager", "graph"}
    for p in held:
        assert gpu_time.factor(model.step_ms(p), p.measured_ms) <= 1.5, (p, model.step_ms(p))
    assert f"within {model.held_out_error:.2f}x of 6 recorded lesson steps" in model.label()
    # held out means unseen: the lessons' times made 4x slower move no fitted cost
    slowed = [dataclasses.replace(p, measured_ms=4 * p.measured_ms) for p in held]
    again = gpu_time.from_jobs(rec.meta, rec.jobs, model.tflops, slowed)
    assert again.per_launch_ms == model.per_launch_ms and again.per_step_ms == model.per_step_ms
    assert again.held_out_error > 2.5


def test_on_cpu_the_cache_off_gpu_step_is_modeled_slower_than_the_recorded_cache_on_one():
    """The KV cache unticked on a CPU: the GPU side is the model's (not a bytes-only floor 120x under the
    recorded cache-on step): launched eagerly, each step costs more than the cache-on step's graph replay."""
    d = settings.defaults("cpu", {"dtype": "float32"})
    s = RunSettings(prompt=d["prompt"], new_tokens=3, dtype="float32", cache=False)
    last = {}
    for update in jobs.JOBS["generate"]({"settings": s}, NEVER):
        last |= update
    state = last["state"]
    gpu = counterpart.for_generate(s, state["steps"], state["kernels"])
    assert not gpu.recorded and gpu.label == counterpart.time_model(counterpart.latest()).label()
    recorded = counterpart.latest().jobs["generate"]["summary"]["step_ms_p50"]
    decode = gpu.tables["steps"][gpu.tables["steps"].phase == "decode"].latency_ms
    assert decode.min() > recorded, (decode.tolist(), recorded)


@pytest.mark.parametrize("path", RECORDED, ids=[p.name for p in RECORDED])
def test_the_model_is_within_1_5x_of_every_recorded_setting_held_out_of_its_fit(path):
    """The recorded matrix (scripts/record_matrix.py on the GPU): the third held out is the one the script
    draws, the model never saw it, and every held-out step kind is within 1.5x of the model."""
    data = json.loads(path.read_text())
    assert data["held_out"] == _record_matrix().held_out(data["settings"])
    m = gpu_time.matrix(path.parent)
    model = gpu_time.model(path.parent)
    held = m.ran(held_out=True)
    assert len(held) >= data["settings"] // 3 - len(data["not_run"]) and model.held_out == len(held)
    for row in held:
        for p in m.points(row):
            assert gpu_time.factor(model.step_ms(p), p.measured_ms) <= 1.5, (row["key"], p, model.step_ms(p))
