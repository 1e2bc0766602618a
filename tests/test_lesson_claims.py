"""Every lesson's words, as its explanation formats them from the shipped GPU recording, are true of that
recording's numbers: a curve said to climb does climb, a run said to be faster is, and where the point of a
lesson does not show at the recorded size the text says why and where it would."""

import re

import pytest
import torch

from explorer.app import lessons
from explorer.app.lessons import kv_cache, recorded


@pytest.fixture(scope="module")
def rec():
    found = recorded.latest()
    assert found is not None, "no lesson recording is shipped in assets/recorded/"
    return found


def told(rec, name: str) -> tuple[dict, str]:
    r = rec.results[name]
    return r.facts, lessons.LESSONS[name].explain(r)


def number_before(text: str, words: str) -> float:
    """The number written just before `words` ("18.9× faster" -> 18.9), thousands' commas allowed."""
    found = re.search(r"([\d,]+(?:\.\d+)?)×?\**\s*" + re.escape(words), text)
    assert found, f"{words!r} not in the text"
    return float(found.group(1).replace(",", ""))


# Lessons newer than the shipped recording, until `python scripts/record_lessons.py --lessons NAME --into
# assets/recorded/lessons_h200.json` records them on a GPU: beside their interpreter run the page says plainly that
# the recording has none.
NOT_YET_RECORDED: set[str] = set()


def test_every_lesson_is_recorded_and_explained(rec):
    assert set(rec.results) == set(lessons.LESSONS) - NOT_YET_RECORDED
    for name in rec.results:
        assert told(rec, name)[1].strip()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the recorded view is shown without a GPU")
def test_a_lesson_newer_than_the_recording_says_it_has_none(rec):
    for name in NOT_YET_RECORDED:
        text, figure = lessons.recorded_view(name)
        assert figure is None and f"has no lesson {name!r}: it was made before the lesson existed" in text


def test_the_kv_cache_lesson_says_climbs_only_where_the_cache_off_steps_climb(rec):
    f, text = told(rec, "kv-cache")
    steps_climb = f["off_late_ms"] > kv_cache.CLIMBS * f["off_early_ms"]
    kernels_climb = f["off_last_kernel_ms"] > kv_cache.CLIMBS * f["off_first_kernel_ms"]
    assert ("climbed with the context" in text) == (steps_climb and kernels_climb)
    assert f["off_last_gflop"] > 10 * f["off_first_gflop"]  # the work does grow: what the text says of it
    if not kernels_climb:
        # The crossover, from the recording's own numbers: where the growth per position would add the first
        # position's whole time, beyond the positions recorded (else the steps would have climbed).
        growth = (f["off_last_kernel_ms"] - f["off_first_kernel_ms"]) / (f["profiled_last"] - f["profiled_first"])
        double = f["profiled_first"] + f["off_first_kernel_ms"] / growth
        assert double > f["profiled_last"]
        assert number_before(text, "positions**") == pytest.approx(double, rel=0.01)
    if not steps_climb:
        assert "launches, not the recomputation, set its time" in text
    headline = lessons.LESSONS["kv-cache"].summary
    assert "climbs without it" not in headline  # the summary says the work grows; the time only past a point


def test_the_cuda_graph_lesson_calls_the_graph_faster_only_where_it_is(rec):
    f, text = told(rec, "cuda-graphs")
    if f["graph_ms"] < f["eager_ms"]:
        assert number_before(text, "faster") == pytest.approx(f["eager_ms"] / f["graph_ms"], rel=0.01)
        assert "slower" not in text
    else:
        assert "× slower" in text and "× faster" not in text


def test_the_prefill_lesson_calls_a_prompt_token_cheaper_only_where_it_is(rec):
    f, text = told(rec, "prefill-decode")
    ratio = f["decode_ms"] / f["prefill_per_token_ms"]
    if ratio >= 1:
        assert number_before(text, "cheaper") == pytest.approx(ratio, rel=0.01)
    else:
        assert number_before(text, "dearer") == pytest.approx(1 / ratio, rel=0.01)
    ridge = f["peak_tflops"] * 1e3 / f["peak_gbs"]
    side = "above" if f["prefill_intensity"] > ridge else "below"
    assert f"the prefill sits {side} it" in text and f["decode_intensity"] < ridge  # "decode far below"


def test_the_fusion_lesson_says_each_rung_gains_what_it_gained(rec):
    f, text = told(rec, "fusion")
    assert f["none_launches"] > f["epilogue_launches"] > f["decode_launches"]  # fewer launches, rung by rung
    assert number_before(text, "the speed of the unfused step") == pytest.approx(f["none_ms"] / f["decode_ms"], 0.01)
    assert ("Fewer launches did not make it faster" in text) == (f["persistent_ms"] > f["overlap_ms"])
    assert f["none_hbm_mb"] >= f["decode_hbm_mb"]  # "the bytes saved are few": saved, and few
    assert f["none_hbm_mb"] - f["decode_hbm_mb"] < 0.05 * f["none_hbm_mb"]


def test_the_tiling_lesson_names_the_fastest_and_slowest_tiles_by_their_times(rec):
    f, text = told(rec, "tiling")
    assert f["fast_us"] <= f["slow_us"]
    assert f"fastest was **{f['fast_tile']}" in text and f"slowest {f['slow_tile']}" in text
    assert f["small_mb"] > f["large_mb"] >= f["floor_mb"]  # larger tiles re-read less


def test_the_memory_lessons_rates_stay_under_the_measured_ceiling(rec):
    f, _ = told(rec, "memory")
    assert f["achieved_gbs"] <= f["peak_gbs"] and f["intensity"] < f["peak_tflops"] * 1e3 / f["peak_gbs"]
    f, _ = told(rec, "decode-step")
    assert f["kernel_ms"] < f["step_ms"]  # the kernels alone take less than the step as it ran


def test_compares_gpu_table_says_why_the_cache_off_ran_as_fast_only_where_it_did():
    """Compare's recorded GPU run beside a CPU's: the note names each backend whose cache-off steps ran as fast as
    its cache-on ones (medians, launched one by one), with those times, and says why; no other backend."""
    import explorer.app.jobs  # noqa: F401  (counterpart is imported through the jobs, as the app does)
    from explorer.app import counterpart

    rec = counterpart.latest()
    table = rec.jobs["compare"]["tables"]["compare"]
    note = counterpart.cache_note(table, rec.meta["gpu"])
    eager = table[(table.phase == "decode") & (table.launch_mode == "eager")]
    medians = eager.groupby(["backend", "cache"]).latency_ms.median()
    for backend in ("torch", "triton"):
        off, on = medians[backend]["off"], medians[backend]["on"]
        named = f"{backend}: {off:.2f} ms off against {on:.2f} on" in note
        assert named == (off <= on), backend
    assert not note or "KV-cache lesson" in note


def test_the_sms_lesson_names_its_fastest_variant_and_the_launches_where_the_residency_held(rec):
    if "sms" in NOT_YET_RECORDED:
        pytest.skip("the SMs lesson is not recorded on a GPU yet")
    f, text = told(rec, "sms")
    variants = f["variants"]
    best = min(variants, key=lambda v: v["step_ms"])
    worst = max(variants, key=lambda v: v["step_ms"])
    said = re.search(r"The fastest, (.+?), was ([\d.]+)x as fast as (.+?)\. ", text)
    assert said and said.group(1) == best["variant"] and said.group(3) == worst["variant"]
    assert float(said.group(2)) == pytest.approx(worst["step_ms"] / best["step_ms"], abs=0.006)
    held, launches = sum(v["residency_held"] for v in variants), sum(v["launches"] for v in variants)
    assert f"in **{held} of {launches} launches**" in text
    for v in variants:
        assert 0 <= v["idle"] < 1 and v["step_ms"] <= v["stamped_ms"] * 1.5
    first, wide = variants[0], variants[1]
    assert f"**{wide['short_grids']} of its {wide['launches']} launches** (against {first['short_grids']})" in text
    assert first["big_resident"] >= 1
    fewer = wide["big_programs"] < first["big_programs"]
    assert ("Wider tiles mean fewer, larger programs." in text) == fewer
    assert ("so here the tiles are narrower: more, smaller programs." in text) == (not fewer)
