"""The estimate shown before a job: grows with the job, labelled as an estimate, timed by the last run on
this device once there is one, and the measure by which a job is admitted or refused."""

import dataclasses

import pytest
import torch

import kernels.ops.decode_attention.tiles
from explorer.app import estimate, settings
from tests.serve import fresh_estimates


@pytest.fixture(autouse=True)
def fresh():
    with fresh_estimates():
        yield


def test_cost_grows_with_the_job():
    steps = lambda **kw: estimate.layer_steps(**{"model": "bundled", "prompt": 8, "new_tokens": 8, "cache": True} | kw)
    assert steps(new_tokens=64) > 4 * steps(new_tokens=8)
    assert steps(cache=False, new_tokens=64) > steps(new_tokens=64)  # every cache-off step runs the whole sequence
    # twice the layers, three times the width: in the interpreter a layer's matrices cost as the width squared
    wider = estimate.interpreter_width(768) / estimate.interpreter_width(256)
    assert 3 < wider < 9 and steps(model="gpt2") == pytest.approx(2 * wider * steps())
    assert steps(model="gpt2", device="cuda") == pytest.approx(2 * steps(device="cuda"))  # a GPU: the layers
    assert steps(profiled=3) > steps(device="cuda") > steps()  # a GPU compiles in a warm-up run first
    # A GPU's profiling pass: each profiled step, with the cache, costs the same per layer at any length (its
    # rebuilt prefill is PyTorch's, its step runs operation by operation at the host's pace).
    profiling = lambda **kw: steps(profiled=6, device="cuda", **kw) - steps(device="cuda", **kw)
    assert profiling() == pytest.approx(6 * estimate.PROFILED_STEP * 6)  # 6 steps of the bundled model's 6 layers
    assert profiling(model="gpt2") == pytest.approx(2 * profiling()) == pytest.approx(2 * profiling(new_tokens=500))
    assert profiling(new_tokens=3) == pytest.approx(3 / 6 * profiling())  # a 3-token run profiles 3 steps


def test_every_offered_model_is_counted_at_its_own_shape():
    """The shapes the estimate counts are the checkpoints' own (the bundled ones' config.json, the hub names'
    table in the picker), not GPT-2 small's for a model it does not know."""
    import json
    from pathlib import Path

    from explorer.app import models
    from explorer.model.weights import resolve_name

    for name in ("bundled", "bundled-llama"):
        cfg = json.loads((Path(resolve_name(name)) / "config.json").read_text())
        shape = (cfg.get("n_layer") or cfg["num_hidden_layers"], cfg.get("n_embd") or cfg["hidden_size"])
        assert estimate.SHAPES[name] == shape, name
    for name, label in models.HUB_SHAPES.items():
        layers, width = estimate.SHAPES[name]
        assert f"{layers} × {width}" in label, name
    cfg = json.loads((Path(resolve_name("bundled-llama")) / "config.json").read_text())  # the decode kernel's key
    heads = (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"] // cfg["num_attention_heads"])
    assert estimate.ATTENTION_HEADS["bundled-llama"] == heads


def test_the_note_says_it_is_an_estimate_and_where_its_rate_comes_from():
    units = estimate.layer_steps("bundled", 8, 200, True)
    note = estimate.note(estimate.seconds("cpu", "triton", units), "cpu")
    assert note.startswith("*Estimate: about ") and "on this CPU (before any run here: a rough guess" in note
    key = ("the settings' key",)
    estimate.record("cpu", "triton", units, wall_s=estimate.FIXED_S["cpu"] + units * 0.01, key=key)
    assert estimate.seconds("cpu", "triton", units, key) == pytest.approx(estimate.FIXED_S["cpu"] + units * 0.01)
    assert "from the last runs of these settings here" in estimate.note(10, "cpu", key=key)
    assert "from runs of other settings here, scaled to these" in estimate.note(10, "cpu", key=("others",))
    assert estimate.note(0.2, "cpu") == "*Estimate: under a second on this CPU.*"
    # A few seconds in tenths (a whole second would be a third of 3 s), a whole number as one, longer in seconds.
    assert [estimate.shown(x) for x in (1.46, 3.0, 9.2, 41.4, 600)] == ["1.5 s", "3 s", "9.2 s", "41 s", "10 min"]
    # A run whose steps cost less than its fixed part says nothing of the rate: two PyTorch tokens that
    # took 2.5 s on a busy machine leave a 1000-token run's steps as they were; the fixed part moves halfway
    # to what the short run took beyond its steps, and no further than FIXED_RANGE allows.
    short, long = (estimate.layer_steps("bundled", 1, n, True) for n in (2, 1000))
    steps = estimate.seconds("cpu", "torch", long) - estimate.fixed_s("cpu")
    rate = estimate.RATES[("cpu", "torch")]
    estimate.record("cpu", "torch", short, wall_s=1.0)
    assert estimate.seconds("cpu", "torch", long) - estimate.fixed_s("cpu") == pytest.approx(steps)
    assert estimate.fixed_s("cpu") == pytest.approx((estimate.FIXED_S["cpu"] + 1.0 - short * rate) / 2)
    for _ in range(20):
        estimate.record("cpu", "torch", short, wall_s=100.0)
    assert estimate.fixed_s("cpu") == pytest.approx(estimate.FIXED_RANGE[1] * estimate.FIXED_S["cpu"])
    assert estimate.seconds("cpu", "torch", long) - estimate.fixed_s("cpu") == pytest.approx(steps)
    assert "min on this GPU" in estimate.note(600, "cuda")


def test_generate_and_compare_notes_follow_their_controls():
    s = lambda **kw: settings.RunSettings(**{"prompt": "def f(x):", "new_tokens": 8} | kw)
    note = lambda **kw: estimate.generation_note(s(**kw), "cpu")
    seconds = lambda text: float(text.split("about ")[1].split(" ")[0])
    assert note().startswith("*Estimate: about ")
    assert "min on this CPU" in note(new_tokens=2000, prompt_tokens=1000)
    assert seconds(note(new_tokens=100)) > 3 * seconds(note(new_tokens=8))
    assert estimate.compare_note(s(), [8], "cpu") != estimate.compare_note(s(), [8, 64, 256], "cpu")


def test_a_sweep_is_costed_by_the_programs_it_runs():
    small = estimate.sweep_s("layer_norm", {"M": 8, "C": 64}, "cpu")
    huge = estimate.sweep_s("layer_norm", {"M": 349525, "C": 1}, "cpu")  # a few MB, hundreds of thousands of programs
    assert small < 10 < 600 < huge
    with pytest.raises(estimate.UserError, match="a sweep here takes at most 4 MB"):
        estimate.check_sweep_inputs("attention", dict(B=1, H=1, T=1_000_000, D=512), 4, "cpu")


def test_compare_lengths_must_fit_the_models_positions():
    estimate.check_lengths("bundled", [8, 1000], 24)
    with pytest.raises(estimate.UserError, match="need 1048 positions; the model has 1024"):
        estimate.check_lengths("bundled", [8, 1000], 48)


def test_a_kind_of_work_compiles_once_on_a_gpu_and_never_on_a_cpu():
    """Triton compiles for each kind of work, model and bucket of lengths the first time it meets them: the
    estimate counts that once, and the worker's warm-up or a finished job marks it done. So with the steps after
    a GPU Generate's text: the first run at its settings and length counts its launches and meets new prefills."""
    bundled = settings.RunSettings(prompt="def f(x):", new_tokens=8)
    compile_s = estimate.COMPILE_S["cuda"]
    profile = compile_s["profile"]
    first = estimate.generation_seconds(bundled, "cuda")
    estimate.compiled("cuda", estimate.generation_keys(bundled))
    model_and_length = compile_s["model"] + compile_s["prefill"] + compile_s["generate"]
    assert first - estimate.generation_seconds(bundled, "cuda") == pytest.approx(model_and_length + profile)
    # Another model compiles its decoder and its prefill anew, and its decode attention where its plan differs
    # (GPT-2 small's 12 heads split the bundled model's 11 positions as the bundled model's 4 heads do);
    # another dtype or fusion level its decoder, its prefill and its decode attention; a run whose cache takes
    # another tile plan its decode attention only, a longer prompt (past 128 rows) its prefill too; a run of
    # a length with the same plan compiles nothing.
    model_and_prefill = compile_s["model"] + compile_s["prefill"]
    for other, cost in (
        (dict(model="gpt2"), model_and_prefill),
        (dict(model="HuggingFaceTB/SmolLM2-135M"), model_and_length),  # grouped heads: a kernel of their own
        (dict(dtype="float16"), model_and_length),
        (dict(fusion="none"), model_and_length),
        (dict(new_tokens=200), compile_s["generate"]),
        (dict(prompt_tokens=200), compile_s["prefill"] + compile_s["generate"]),
        (dict(cache=False), compile_s["cache off"]),  # passes over every token so far: no decode attention
    ):
        s = settings.RunSettings(**{"prompt": "def f(x):", "new_tokens": 8} | other)
        assert estimate.compile_s("cuda", estimate.generation_keys(s)) == pytest.approx(cost + profile), other
    shorter = settings.RunSettings(prompt="def f(x):", new_tokens=12)  # 3 + 12 positions: one 32-key tile, as 3 + 8
    assert estimate.compile_s("cuda", estimate.generation_keys(shorter)) == pytest.approx(profile)
    estimate.compiled("cuda", estimate.generation_keys(shorter))
    assert estimate.compile_s("cuda", estimate.generation_keys(shorter)) == 0  # the same run again
    # The key is the kernel's plan, computed by the kernels' own tile rules for the H200: a cache of 11 and one
    # of 15 positions plan alike; one of 203 splits into several 32-key tiles.
    plan = lambda n: kernels.ops.decode_attention.tiles.launch_plan(None, 4, n, 64, torch.bfloat16, estimate.PLANNED_ON)
    assert plan(11)[:2] == plan(15)[:2] and plan(11)[2] == 1 and plan(203)[2] > 1
    # Compare: each of its lengths' plans once for the cached run, each bucket once for the cache-off runs, and
    # the prefill of each bucket of its prompts' rows.
    keys = estimate.compare_keys(bundled, [4, 7, 200])  # 11 and 15 positions (planned as above) and 208
    want = compile_s["generate"] + 2 * compile_s["cache off"] + compile_s["prefill"]  # 200 rows: past 128
    assert estimate.compile_s("cuda", keys) == pytest.approx(want)
    assert estimate.ladder_seconds(bundled, "cuda") > compile_s["ladder"]
    # PyTorch compiles nothing of ours (its run is still counted and profiled), and the interpreter compiles nothing.
    torch_run = settings.RunSettings(prompt="def f(x):", new_tokens=500, backend="torch")
    assert estimate.compile_s("cuda", estimate.generation_keys(torch_run)) == pytest.approx(profile)
    assert estimate.compile_s("cpu", keys) == 0 == estimate.compile_s("cpu", estimate.generation_keys(torch_run))


def test_a_sweep_compiles_each_config_once_on_a_gpu():
    shape = {"M": 64, "C": 256}
    configs = len(estimate.sweep_configs("layer_norm"))
    first = estimate.sweep_s("layer_norm", shape, "cuda", "bfloat16")
    estimate.compiled("cuda", estimate.sweep_compiles("layer_norm", shape, "bfloat16"))
    again = estimate.sweep_s("layer_norm", shape, "cuda", "bfloat16")
    assert first - again == pytest.approx(configs * estimate.COMPILE_S["cuda"]["sweep"])
    # Another dtype or shape compiles anew; the interpreter never does.
    assert estimate.sweep_s("layer_norm", shape, "cuda", "float16") == pytest.approx(first)
    assert estimate.sweep_s("layer_norm", {"M": 64, "C": 512}, "cuda", "bfloat16") > again
    assert estimate.compile_s("cpu", estimate.sweep_compiles("layer_norm", shape, "float32")) == 0


def test_a_lesson_on_a_gpu_is_estimated_from_its_recording(tmp_path):
    """On a GPU a lesson's estimate is its recorded run: the first run's seconds (its own kernels compiled)
    until it has run in this server, then the run's again; with no recording, the modeled seconds."""
    import dataclasses

    from explorer.app import lessons
    from explorer.app.lessons import recorded

    rec = recorded.latest()
    result = dataclasses.replace(rec.results["kv-cache"], kernels=())  # a recording that names no kernels
    result = dataclasses.replace(result, first_s=result.seconds + 20.0)
    recorded.save(tmp_path / "lessons_h200.json", rec.meta, {"kv-cache": result})
    served = lessons.SERVED_S  # the figures' way through the server, on top of the recorded job
    assert lessons.estimate("kv-cache", size_="gpu", folder=tmp_path) == pytest.approx(result.seconds + 20.0 + served)
    estimate.compiled("cuda", lessons.compiles("kv-cache"))
    assert lessons.estimate("kv-cache", size_="gpu", folder=tmp_path) == pytest.approx(result.seconds + served)
    lesson = lessons.LESSONS["kv-cache"]
    modeled = lesson.estimate(lesson.settings("gpu"))
    assert lessons.estimate("kv-cache", size_="gpu", folder=tmp_path / "none") == pytest.approx(modeled + served)


def test_a_lesson_counts_only_the_kernels_its_recording_compiled_that_are_not_compiled_yet(tmp_path):
    """A recording that names the kernel specializations its first run compiled: each not yet compiled in the
    worker adds an equal share of that run's compilation, whatever ran before (a Generate of the same shape
    compiles most of the memory lesson's kernels)."""
    import dataclasses

    from explorer.app import lessons
    from explorer.app.lessons import recorded

    rec = recorded.latest()
    result = dataclasses.replace(
        rec.results["memory"], seconds=1.0, first_s=21.0, kernels=("a", "b", "c", "d"), rebuilt_s=None, compile_s={}
    )  # a recording without the kernels' compile times or the run with its models built anew
    recorded.save(tmp_path / "lessons_h200.json", rec.meta, {"memory": result})
    on_gpu = dict(size_="gpu", folder=tmp_path)
    served = lessons.SERVED_S  # the figures' way through the server, on top of the recorded job
    assert lessons.estimate("memory", **on_gpu) == pytest.approx(21.0 + served)
    assert lessons.estimate("memory", {"a", "b", "x"}, **on_gpu) == pytest.approx(11.0 + served)
    assert lessons.estimate("memory", {"a", "b", "c", "d"}, **on_gpu) == pytest.approx(1.0 + served)
    # once the lesson has run in this server its kernels are compiled, whatever names the recording gives them
    # (names from before a kernel's specialisation changed are never compiled again)
    estimate.compiled("cuda", lessons.compiles("memory", "gpu"))
    assert lessons.estimate("memory", {"x"}, **on_gpu) == pytest.approx(1.0 + served)


def test_a_lesson_counts_its_setup_until_its_model_is_built_and_each_missing_kernel_by_its_compile_time(tmp_path):
    """A recording with the lesson's run with its models built anew (rebuilt_s) and each kernel's compilation
    timed (compile_s): the setup counts until a lesson on the same model has run in this server, whatever is
    compiled; each kernel not yet compiled adds its own seconds, not an equal share of the first run (which also
    built launchers into an empty cache, as a server's warm-up does once)."""
    import dataclasses

    from explorer.app import lessons
    from explorer.app.lessons import recorded

    rec = recorded.latest()
    times = {"a": 0.5, "b": 3.0, "c": 0.25}
    result = dataclasses.replace(
        rec.results["memory"], seconds=1.0, first_s=9.0, rebuilt_s=1.5, kernels=tuple(times), compile_s=times
    )
    recorded.save(tmp_path / "lessons_h200.json", rec.meta, {"memory": result})
    on_gpu = dict(size_="gpu", folder=tmp_path)
    served = lessons.SERVED_S
    assert lessons.estimate("memory", **on_gpu) == pytest.approx(served + 1.5 + 3.75)
    assert lessons.estimate("memory", {"b", "x"}, **on_gpu) == pytest.approx(served + 1.5 + 0.75)
    assert lessons.estimate("memory", set(times), **on_gpu) == pytest.approx(served + 1.5)
    estimate.compiled("cuda", lessons.compiles("blocks", "gpu"))  # a lesson on another model has run here
    assert lessons.estimate("memory", set(times), **on_gpu) == pytest.approx(served + 1.5)
    estimate.compiled("cuda", lessons.compiles("decode-step", "gpu"))  # one on memory's model: it is built
    assert lessons.estimate("memory", set(times), **on_gpu) == pytest.approx(served + 1.0)
    assert lessons.estimate("memory", {"b"}, **on_gpu) == pytest.approx(served + 1.0 + 0.75)
    untimed = dataclasses.replace(result, compile_s={})  # an equal share of what the first run added
    recorded.save(tmp_path / "lessons_h200.json", rec.meta, {"memory": untimed})
    assert lessons.estimate("memory", {"b"}, **on_gpu) == pytest.approx(served + 1.0 + (9.0 - 1.5) * 2 / 3)
    quick = dataclasses.replace(result, first_s=0.5, rebuilt_s=0.75)  # a first run read faster than the warm one
    recorded.save(tmp_path / "lessons_h200.json", rec.meta, {"memory": quick})
    estimate._compiled.clear()  # the lesson not yet run here: its setup, none, is never below the warm run
    assert lessons.estimate("memory", set(times), **on_gpu) == pytest.approx(served + 1.0)


def test_compile_times_names_each_compiled_specialization_as_compiled_does(monkeypatch):
    """kernels.compiled.compile_times times each call of Triton's JIT compile inside the block, by the name
    kernels.compiled gives the specialization it makes, and adds its first launch's setup (the launcher built,
    the binary loaded); outside the block, compiles go untimed."""
    import sys
    import time
    import types

    from triton.compiler.compiler import CompiledKernel
    from triton.runtime.jit import JITFunction

    from kernels.compiled import compile_times, compiled

    caches = {0: ({}, None, None, None)}

    def fake_compile(self, key, *args, **kwargs):  # what Triton's compile leaves: the specialization cached
        time.sleep(0.02 if key == "slow" else 0.0)
        self.device_caches[0][0][key] = types.SimpleNamespace(key=key)

    def fake_handles(kernel):  # a first launch: a new signature's launcher takes long to build
        time.sleep(0.05 if kernel.key == "new launcher" else 0.0)

    monkeypatch.setattr(JITFunction, "_do_compile", fake_compile, raising=False)
    monkeypatch.setattr(CompiledKernel, "_init_handles", fake_handles)
    fake = types.ModuleType("kernels.fake")
    monkeypatch.setitem(sys.modules, "kernels.fake", fake)

    class Kernel:
        __module__, __name__ = "kernels.fake", "_kernel"
        device_caches = caches

    fake._kernel = Kernel()
    with compile_times() as took:
        for key in ("slow", "quick", "new launcher"):
            JITFunction._do_compile(fake._kernel, key, "signature", 0)
            CompiledKernel._init_handles(caches[0][0][key])
    JITFunction._do_compile(fake._kernel, "after", "signature", 0)
    assert JITFunction._do_compile is fake_compile and CompiledKernel._init_handles is fake_handles  # put back
    assert len(took) == 3 and set(took) < compiled([fake])
    assert sorted(took.values())[0] < 0.02 <= sorted(took.values())[1] < 0.05 <= sorted(took.values())[2]


def test_compiled_kernels_are_named_alike_in_any_process_and_none_under_the_interpreter():
    """kernels.compiled names each cached specialization by its kernel and key; the interpreter caches none."""
    import os
    import types

    from kernels.compiled import compiled

    before = compiled()  # on a GPU, whatever this worker has compiled so far
    if os.environ.get("TRITON_INTERPRET") == "1":
        assert before == set()  # the interpreter: nothing compiled, whatever ran
    fake = types.ModuleType("kernels.fake")

    class Kernel:  # what a compiled triton.jit function holds: per device, a cache of specializations
        __module__, __name__ = "kernels.fake", "_kernel"
        device_caches = {0: ({"key-1": object(), "key-2": object()}, None, None, None)}

    fake._kernel = Kernel()
    first = compiled([fake])
    assert len(first) == 2 and compiled([fake]) == first  # stable names, one per specialization


def test_forget_drops_every_compiled_specialization_but_those_kept_and_every_bound_launch():
    """A recording meets each lesson's kernels as a server fresh from its warm-up would: kernels.compiled.forget
    drops what was compiled since (the warm-up's kept) and the launches kernels.launch bound to them."""
    import types

    from kernels import launch
    from kernels.compiled import compiled, forget

    fake = types.ModuleType("kernels.fake")

    class Kernel:
        __module__, __name__ = "kernels.fake", "_kernel"
        device_caches = {0: ({"key-1": object(), "key-2": object(), "key-3": object()}, None, None, None)}

    fake._kernel = Kernel()
    names = compiled([fake])
    keep = set(sorted(names)[:1])
    wrapper = launch.fast(fake._kernel)
    wrapper.bound = {("a signature",): "a bound launch"}
    try:
        assert forget(keep, [fake]) == 2
        assert compiled([fake]) == keep and len(Kernel.device_caches[0][0]) == 1
        assert wrapper.bound == {}  # its next launch goes through the kernel, which compiles what was dropped
        assert forget(keep, [fake]) == 0
    finally:
        launch._wrappers.pop(fake._kernel, None)


def test_costs_counted_in_the_reference_machines_seconds_follow_this_cpus_speed(monkeypatch):
    """A sweep's programs and the lessons priced in seconds (tiling's configs, blocks' passes) were timed on the
    2-core machine RATES names: a CPU whose last Generate ran at twice that rate doubles them too. A lesson's
    estimate follows the machine it runs on, so on a GPU machine the lessons are asked as on a CPU one."""
    from explorer.app import lessons, models

    monkeypatch.setattr(models, "device", lambda: torch.device("cpu"))

    shape = {"M": 64, "C": 256}
    fixed = estimate.FIXED_S["cpu"]
    sweep = lambda: estimate.sweep_s("layer_norm", shape, "cpu") - fixed
    lesson = lambda name: lessons.LESSONS[name].estimate(lessons.LESSONS[name].settings("cpu"))
    before = sweep(), lesson("tiling"), lesson("blocks") - fixed
    units = 500
    for key in ("one setting", "another", "a third"):  # the machine's speed, once three settings agree on it
        estimate.record("cpu", "triton", units, wall_s=fixed + units * 2 * estimate.RATES[("cpu", "triton")], key=key)
    assert estimate.cpu_speed() == pytest.approx(2)
    after = sweep(), lesson("tiling"), lesson("blocks") - fixed
    assert after == pytest.approx(tuple(2 * b for b in before))


def test_a_generate_that_overlays_the_last_run_counts_its_charts_in_the_note_and_the_admission():
    """On a GPU a Generate whose charts overlay the previous run's takes longer: the note under the button and
    the estimate the job is admitted by count it when the overlay is on and there is a run to overlay."""
    from explorer.app import handlers, models

    ctx = handlers.Context(runner=None, device="cuda")
    values = settings.defaults("cpu", {"dtype": models.default_dtype()}) | dict(new_tokens=900)
    notes = {
        (overlay, ran): handlers.generate_estimate(ctx, values | dict(overlay=overlay, state={"steps": ran}))
        for overlay in (True, False)
        for ran in ("a previous run's steps", None)
    }
    assert notes[True, None] == notes[False, None] == notes[False, "a previous run's steps"]
    assert notes[True, "a previous run's steps"] != notes[True, None]
    s = settings.RunSettings(prompt="def f(x):", new_tokens=900)
    added = estimate.generation_seconds(s, "cuda", overlaid=True) - estimate.generation_seconds(s, "cuda")
    assert added == pytest.approx(estimate.OVERLAY_S["cuda"]) and estimate.OVERLAY_S["cpu"] == 0


def test_one_slow_run_moves_no_other_settings_rate_and_the_median_of_a_settings_runs_holds():
    """Rates are kept per setting (estimate.rate_key) as the median of its last runs: a run 50 times slower
    than usual (an odd setting the estimate mis-counted, or a busy machine) moves neither another setting's
    rate nor the rate of settings never run here; among one setting's runs, one outlier moves nothing."""
    prior = estimate.RATES[("cpu", "triton")]
    usual, odd = ("default tiles",), ("tiny tiles",)
    units = 1000
    took = lambda rate: estimate.fixed_s("cpu") + units * rate
    for _ in range(3):
        estimate.record("cpu", "triton", units, took(0.5 * prior), key=usual)
    estimate.record("cpu", "triton", units, took(50 * prior), key=odd)
    assert estimate.rate("cpu", "triton", usual) == pytest.approx(0.5 * prior)
    assert estimate.rate("cpu", "triton", odd) == pytest.approx(50 * prior)
    assert estimate.rate("cpu", "triton", ("never run",)) == pytest.approx(prior)  # nor the generic rate
    estimate.record("cpu", "triton", units, took(40 * prior), key=usual)  # one slow run among four of them
    assert estimate.rate("cpu", "triton", usual) == pytest.approx(0.5 * prior)
    for _ in range(estimate.RECENT):  # the machine itself became slower: the setting's last runs say so
        estimate.record("cpu", "triton", units, took(2 * prior), key=usual)
    assert estimate.rate("cpu", "triton", usual) == pytest.approx(2 * prior)


def test_smaller_tiles_cost_more_in_the_interpreter():
    """On CPU every program and loop step of a kernel runs in Python: decode-linear tiles of 16 x 32 make a
    decode step of the bundled model about 60 times the default's (timed: 50-64 s against 0.9-1.2 s a step on
    the 2-core machine), and each halving of a tile costs more. A GPU's estimate does not follow the tiles."""
    from explorer.model.ops import Tiles
    from kernels import TileConfig

    def seconds(device="cpu", **tiles):
        s = settings.RunSettings(model="bundled", prompt_tokens=8, new_tokens=50, tiles=Tiles(**tiles))
        return estimate.generation_seconds(s, device) - estimate.fixed_s(device)

    base = seconds()
    sizes = [(256, 256), (64, 64), (32, 32), (16, 32)]
    costs = [seconds(linear_decode=TileConfig(block_n=n, block_k=k)) for n, k in sizes]
    assert costs == sorted(costs) and base < costs[1]
    assert 20 < costs[-1] / base < 120
    assert seconds(decode_attention=TileConfig(block_n=16, split_k=8)) > base  # 58 positions: more programs
    assert seconds("cuda", linear_decode=TileConfig(block_n=16, block_k=32)) == pytest.approx(seconds("cuda"))
    run = lambda batch: settings.RunSettings(model="bundled", prompt_tokens=8, new_tokens=50, batch=batch)
    assert estimate.generation_seconds(run(4), "cpu") > 2 * estimate.generation_seconds(run(1), "cpu")  # timed: 2.5x


def test_a_run_whose_first_steps_say_it_will_overrun_the_budget_stops_naming_the_control():
    """After its first decode steps, a Generate whose steps project past the time left stops, and says what the
    run would take and which control makes it cheaper; one that fits goes on."""
    from types import SimpleNamespace

    from explorer.app.jobs.generate import overrun
    from explorer.model.ops import Tiles
    from kernels import TileConfig

    s = settings.RunSettings(new_tokens=200, tiles=Tiles(linear_decode=TileConfig(block_n=16, block_k=32)))
    step = lambda phase, ms: SimpleNamespace(phase=phase, latency_ms=ms)
    steps = [step("prefill", 30_000), step("decode", 54_000)]
    assert overrun(s, steps, left_s=520) is None  # one decode step: it may still be warming up
    steps.append(step("decode", 54_000))
    why = overrun(s, steps, left_s=460)
    assert why.startswith("after 3 of 200 tokens: at 54 s a token this run would take about ")
    assert "past the 10 min budget" in why and "decode-linear tiles (block N × block K)" in why
    assert "fewer new tokens" in why
    fast = [step("prefill", 300), step("decode", 100), step("decode", 120)]
    assert overrun(s, fast, left_s=590) is None  # 197 tokens at 0.11 s fit the time left
    assert "KV cache on" in overrun(settings.RunSettings(new_tokens=200, cache=False), steps, left_s=100)


@pytest.mark.skipif(torch.cuda.is_available(), reason="prices the interpreter's launches, made on CPU tensors")
@pytest.mark.parametrize("split_k", [1, 2, 4])
def test_the_tile_kernels_cost_for_decode_shaped_rows_is_its_launches_programs_and_steps(monkeypatch, split_k):
    """Below the decode rungs a batch's decode-shaped rows take the tile kernel, at small tiles one program per 16
    columns, split along K where asked: interpreter_cost prices the launches the kernel makes, their programs
    (from the grids it launches) and each program's K steps (from its K slice), and the sum of the splits'
    partials a launch of its own."""
    from explorer.app import interpreter_cost
    from kernels import TileConfig, launch, linear
    from kernels.config import cdiv

    launched = []  # (kernel, programs, K steps of each program)
    real = launch._Fast.launch

    def counting(self, grid, args, kwargs):
        name, programs = self.fn.__name__, int(torch.tensor(grid).prod())
        if name == "_linear_kernel":
            launched.append((name, programs, cdiv(args[7], kwargs["BLOCK_K"])))  # K, one program's whole row
        elif name == "_linear_split_k_kernel":
            k, k_per_split = args[5], args[6]  # the last split walks what is left of K
            steps = sum(cdiv(min(k_per_split, k - s * k_per_split), kwargs["BLOCK_K"]) for s in range(grid[1]))
            launched.append((name, programs, steps / grid[1]))
        else:
            launched.append((name, programs, 0))
        return real(self, grid, args, kwargs)

    monkeypatch.setattr(launch._Fast, "launch", counting)
    rows, out_f, in_f = 3, 96, 224  # 7 K steps: the last split shorter
    tiles = TileConfig(block_m=16, block_n=16, block_k=32, split_k=split_k)
    x, w = torch.randn(rows, in_f, dtype=torch.float16), torch.randn(out_f, in_f, dtype=torch.float16)
    torch.testing.assert_close(linear(x, w, config=tiles), (x.float() @ w.float().T).half(), atol=0.1, rtol=0.02)
    per = interpreter_cost
    want = 0.0
    for name, programs, steps in launched:
        kind = "other" if name == "_split_k_reduce_kernel" else "linear"
        want += per.LAUNCH_MS + programs * (per.PROGRAM_MS[kind] + steps * per.STEP_MS.get(kind, 0.0))
    assert len(launched) == (1 if split_k == 1 else 2)
    assert interpreter_cost.linear_ms(tiles, rows, out_f, in_f, torch.float16) == pytest.approx(want)


def test_a_decode_step_off_the_decode_rungs_costs_against_the_reference_what_it_was_timed_at():
    """The reference step (the decode rung, one sequence) runs each projection in one program of the prefetch
    form and decode attention in one launch; the epilogue rung at 3 sequences runs the tile kernel, at linear_decode
    block_n 16 one program per 16 columns (the LM head 256 of them). Timed every operation in the run, the bundled
    model on the 2-core machine (2026-12-04): 0.46 s a reference step, 6.2 s at block_n 16 (13.5x), 1.24 s at the
    default tiles (2.7x); the bundled Llama's reference step 0.37 s. A cost model that priced the prefetch form and
    decode attention at twice their time read these 6.2x and 1.4x, and the estimates 2.5x short."""
    from explorer.app import interpreter_cost
    from explorer.model.ops import Tiles
    from kernels import TileConfig

    run = lambda **kw: settings.RunSettings(**dict(model="bundled", dtype="float16", prompt_tokens=7) | kw)
    factor = lambda s: interpreter_cost.decode_factor(s, torch.float16, 9)
    small = factor(run(fusion="epilogue", batch=3, tiles=Tiles(linear_decode=TileConfig(block_n=16))))
    default = factor(run(fusion="epilogue", batch=3))
    assert 13.5 / 1.3 < small < 13.5 * 1.3 and 2.7 / 1.3 < default < 2.7 * 1.3
    # Each model's reference step counts as its layers at their width (model_scale): the Llama's as 0.37 / 0.46.
    llama = estimate.model_scale("bundled-llama", "cpu") / estimate.model_scale("bundled", "cpu")
    assert 0.37 / 0.46 / 1.3 < llama < 0.37 / 0.46 * 1.3


def test_the_one_launch_rungs_tiles_are_their_own_so_a_visitors_decode_tiles_do_not_move_their_estimate():
    """The megakernel rung's step and the persistent rung's GPT-2 blocks choose their own tiles (explorer.model.ops:
    no config reaches them); the persistent rung's LM head, and every other rung, launch the visitor's. A draw of
    benchmarks/estimates.py (the bundled Llama on the megakernel rung, linear_decode block_n 16) was estimated at
    26.8 s and took 6.3 s, its decode steps priced as if at block_n 16."""
    from explorer.app import interpreter_cost
    from explorer.model.ops import Tiles
    from kernels import TileConfig

    small = Tiles(linear_decode=TileConfig(block_n=16), decode_attention=TileConfig(block_n=16, split_k=4))
    for model in ("bundled", "bundled-llama"):
        run = lambda **kw: settings.RunSettings(**dict(model=model, prompt_tokens=7) | kw)  # noqa: B023
        factor = lambda s: interpreter_cost.decode_factor(s, torch.float32, 40)
        assert factor(run(fusion="megakernel", tiles=small)) == factor(run(fusion="megakernel"))
        assert factor(run(fusion="overlap", tiles=small)) > 3 * factor(run(fusion="overlap"))
        overlap = factor(run(fusion="overlap", tiles=small)) / factor(run(fusion="overlap"))
        persistent = factor(run(fusion="persistent", tiles=small)) / factor(run(fusion="persistent"))
        if model == "bundled":  # its blocks keep their tiles, its head takes the visitor's: dearer, by less
            assert 1 < persistent < overlap
        else:  # a Llama runs the persistent rung as overlap
            assert persistent == pytest.approx(overlap)
        # past 16 sequences the megakernel rung runs as the decode rung, the visitor's tiles and all
        assert factor(run(fusion="megakernel", batch=17, tiles=small)) > factor(run(fusion="megakernel", batch=17))


def test_a_model_in_a_folder_is_estimated_by_its_own_config_not_as_gpt2_small(tmp_path):
    """--models takes folders. A folder's sizes come from its config.json, and agree with the tables for the same
    model: the bundled checkpoints' folders, and SmolLM2-135M's config (transformers' own, written here). Before,
    every folder counted as GPT-2 small: a SmolLM2-shaped folder's cache-off Generate was estimated at 2.1 s and took
    6.4 s once compiled (H100, 2026-12-07)."""
    from transformers import GPT2Config, LlamaConfig

    from explorer.model.weights import resolve_name

    for name in ("bundled", "bundled-llama"):
        assert estimate.model_sizes(resolve_name(name)) == estimate.model_sizes(name), name
    smol = tmp_path / "smollm2-shape"
    LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=2048,
    ).save_pretrained(smol)  # fmt: skip
    wide = tmp_path / "gpt2-medium-shape"
    GPT2Config(n_layer=24, n_embd=1024, n_head=16).save_pretrained(wide)
    pairs = ((str(smol), "HuggingFaceTB/SmolLM2-135M"), (str(wide), "gpt2-medium"))
    for folder, name in pairs:
        assert estimate.model_sizes(folder) == estimate.model_sizes(name), name
        for device in ("cpu", "cuda"):
            d = settings.defaults(device, {})
            for cache in (True, False):
                at = settings.RunSettings(prompt=d["prompt"], new_tokens=64, cache=cache, model=folder)
                named = settings.RunSettings(prompt=d["prompt"], new_tokens=64, cache=cache, model=name)
                units = estimate.generation_units(at, device)
                assert units == pytest.approx(estimate.generation_units(named, device)), (name, device, cache)
                assert units > 1.5 * estimate.generation_units(dataclasses.replace(at, model="gpt2"), device), (
                    name,
                    cache,
                )
    assert estimate.model_sizes(str(tmp_path / "no-such-folder")) == estimate.model_sizes("gpt2")
