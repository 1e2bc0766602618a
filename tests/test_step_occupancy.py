"""Where a run's kernels sit on a GPU's SMs (explorer.measure.occupancy, and the page's occupancy job): every Triton
launch of a prefill and a decode step, recorded rather than run and compiled for the GPU named, here on CPU."""

import json
import re

import pytest
import torch

from explorer.app import handlers, settings
from explorer.app.errors import UserError
from explorer.app.runner import InlineRunner
from explorer.measure import occupancy
from explorer.measure.ladder import launches_of, traced_step
from explorer.model.weights import BUNDLED_LLAMA, DEFAULT_MODEL, load_model
from kernels.occupancy import SMS, Resources
from kernels.occupancy import occupancy as occupancy_of
from tests.test_jobs import collect

SETTINGS = dict(dtype="float16", fusion="overlap", batch=2, prompt_tokens=17)


@pytest.fixture(scope="module", params=[DEFAULT_MODEL, BUNDLED_LLAMA])
def rows(request):
    return request.param, occupancy.run(120, dict(SETTINGS, model=request.param))["rows"]


def test_every_launch_of_a_prefill_and_a_decode_step_is_compiled_and_placed(rows):
    """Each row's programs per SM follow from its own compiled warps, registers and shared memory on sm_120."""
    _, got = rows
    assert {r["phase"] for r in got} == {"prefill", "decode"}
    for r in got:
        assert 1 <= r["registers"] <= 255 and r["warps"] in (1, 2, 4, 8, 16) and r["programs"] >= 1, r
        res = Resources(r["warps"], r["registers"], r["shared"])
        occ = occupancy_of(res, SMS[120], r["programs"], 188)
        assert (r["resident"], r["limiter"]) == (occ.resident, occ.limiter), r
        assert r["waves"] == pytest.approx(occ.waves, abs=1e-3)


def test_the_decode_steps_launches_are_those_the_ladder_counts(rows):
    """Counted another way: the ladder's model of what each of a traced decode step's operations launches (the
    embedding is PyTorch's gather, no Triton launch). On a GPU the step runs there, so its launches are recorded
    for that GPU's own architecture as well (how many a step makes follows its SM count)."""
    name, got = rows
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        got = occupancy.run(10 * major + minor, dict(SETTINGS, model=name))["rows"]
    model, _ = load_model(name, dtype=torch.float16, device="cuda" if torch.cuda.is_available() else "cpu")
    model = model.with_fusion(SETTINGS["fusion"])
    _, _, ops, _ = traced_step(model, context=SETTINGS["prompt_tokens"] + 1, batch=SETTINGS["batch"])
    triton = [op for op in ops if op.kernel not in ("embedding", "token_embedding")]
    assert sum(r["phase"] == "decode" for r in got) == sum(launches_of(op) for op in triton)


def _values(**changes):
    d = settings.defaults("cpu", {"dtype": "float32"})
    return {k: d[k] for k in settings.RUN} | {k: d.get(k, "") for k in settings.TILES} | changes


def test_the_page_shows_the_table_for_the_h200_and_says_what_it_is():
    job = handlers.make(handlers.Context(InlineRunner(), device="cpu"))["occupancy"]
    views = collect(job(_values(), handlers.NEW_STATE))
    shown = views[-1][0]
    assert shown.startswith("**Compiled for NVIDIA H200 (sm_90)** (on this CPU, not run")
    assert "| ln_1+attn.c_attn+kv write | decode_prefetch | 6 |" in shown and "*One decode step*" in shown
    assert "per SM (limit)" in shown and "The decode step makes 31 launches" in shown
    # each kernel's source as written, under the values it was compiled with
    assert "<details><summary><b>layer_norm</b><br><code>" in shown and "```python\ndef _layer_norm_kernel(" in shown
    assert "BLOCK_M=" in shown and "num_warps=" in shown
    # and the prefill's tiles pictured, the run's prompt being short at a prefill of 1024 tokens
    picture = views[-1][1]
    assert picture["visible"] is True and picture["__type__"] == "update"
    figure = json.loads(picture["value"].plot)
    assert [t["type"] for t in figure["data"]] == ["heatmap", "heatmap"]
    title = " ".join(re.sub("<[^>]+>", " ", figure["layout"]["title"]["text"]).split())
    assert "A prefill of 1024 tokens (the run's is shorter) at this page's tiles" in title


def test_the_torch_backend_is_refused_in_a_line_naming_the_choice():
    job = handlers.make(handlers.Context(InlineRunner(), device="cpu"))["occupancy"]
    with pytest.raises(Exception, match="pick triton"):
        collect(job(_values(backend="torch"), handlers.NEW_STATE))
    with pytest.raises(UserError, match="PyTorch's own kernels"):
        handlers.plan_occupancy(handlers.Context(InlineRunner(), device="cpu"), _values(backend="torch"), {})


def test_the_program_refuses_to_run_where_it_would_compile_nothing():
    import os
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "explorer.measure.occupancy", "--arch", "90"]
    done = subprocess.run(cmd, env=os.environ | {"TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "TRITON_INTERPRET unset" in done.stderr


def test_a_sweeps_config_is_placed_on_the_sms_of_the_gpu_compiled_for():
    """sweeps.placed, as the GPU's sweep recording calls it for each config, here compiled on CPU for the H200: a
    LayerNorm of 1000 rows at block_m=4 launches 250 programs, over 132 SMs at the programs per SM it reports."""
    import json
    import os
    import subprocess
    import sys

    code = (
        "import json, torch\n"
        "from explorer.measure import sweeps\n"
        "from kernels.config import TileConfig\n"
        "make, call, _ = sweeps._inputs('layer_norm', dict(M=1000, C=768), torch.float16, torch.device('cpu'))\n"
        "inputs = make()\n"
        "print(json.dumps(sweeps.placed(lambda: call(TileConfig(block_m=4, num_warps=4), *inputs), 90)))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"EXPLORER_CPU_STANDS_FOR": "90"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert 1 <= got["registers"] <= 255 and got["limiter"] in ("warps", "registers", "shared memory", "blocks")
    assert got["waves"] == pytest.approx(250 / (got["per_sm"] * 132), abs=1e-3)
