"""Every value an endpoint takes is checked before any work, and a refusal names the field, the value
and what is allowed; nothing is converted silently."""

import math

import gradio as gr
import pytest
import torch

from explorer.app import actions, ui, validate
from explorer.app.errors import UserError


@pytest.mark.parametrize(
    "check,value,message",
    [
        (
            lambda v: validate.whole("new tokens", v, 1, 64),
            1.5,
            "new tokens must be a whole number from 1 to 64, got 1.5",
        ),
        (lambda v: validate.whole("new tokens", v, 1, 64), "3", "got '3'"),
        (lambda v: validate.whole("new tokens", v, 1, 64), None, "got None"),
        (lambda v: validate.whole("new tokens", v, 1, 64), True, "got True"),
        (lambda v: validate.whole("new tokens", v, 1, 64), math.nan, "got nan"),
        (lambda v: validate.whole("new tokens", v, 1, 64), 65, "must be from 1 to 64, got 65"),
        (lambda v: validate.whole("seed", v, 0, validate.MAX_SEED), 2**64, "must be from 0 to"),
        (lambda v: validate.number("temperature", v, 0, 2), math.inf, "temperature must be a number from 0 to 2"),
        (lambda v: validate.number("temperature", v, 0, 2), -0.1, "must be from 0 to 2, got -0.1"),
        (lambda v: validate.flag("KV cache", v), "false", "KV cache must be true or false, got 'false'"),
        (lambda v: validate.flag("KV cache", v), 0, "got 0"),
        (
            lambda v: validate.choice("model", v, ["bundled", "gpt2"]),
            ["gpt2"],
            "model must be one of 'bundled', 'gpt2'",
        ),
        (
            lambda v: validate.choice("format", v, ["csv", "json"]),
            None,
            "format must be one of 'csv', 'json'; got None",
        ),
        (lambda v: validate.text("prompt", v, 10), "x" * 11, "prompt is 11 characters long; at most 10"),
        (lambda v: validate.text("prompt", v, 10), "a\ud800", "not valid Unicode text"),
        (lambda v: validate.text("prompt", v, 10), 5, "prompt must be text, got 5"),
    ],
)
def test_bad_values_are_refused_with_the_field_the_value_and_the_limit(check, value, message):
    with pytest.raises(UserError) as e:
        check(value)
    assert message in str(e.value)


def test_good_values_come_back_typed():
    assert validate.whole("n", 3.0, 1, 5) == 3 and isinstance(validate.whole("n", 3.0, 1, 5), int)
    assert validate.number("t", 1, 0, 2) == 1.0 and validate.flag("f", False) is False
    assert validate.choice("c", "csv", ["csv"]) == "csv" and validate.text("p", "héllo") == "héllo"


def _generate_args(**change):
    args = dict(
        model="bundled",
        prompt="x = 1",
        prompt_tokens=0,
        new_tokens=2,
        batch=1,
        dtype=actions.default_dtype(),
        backend="triton",
        fusion="decode",
        cache=True,
        cuda_graph=True,
        temperature=0.0,
        top_k=0,
        seed=0,
        overlay=True,
        state=ui.NEW_STATE,
    )
    args.update(change)
    tiles = ["default" if not name.endswith("autotune") else False for name in ui.TILE_NAMES]
    return list(args.values()), tiles


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(new_tokens=1.5), "new tokens must be a whole number"),
        (dict(cache="false"), "KV cache must be true or false"),
        (dict(model=["gpt2"]), "model must be one of"),
        (dict(temperature=math.nan), "temperature must be a number"),
        (dict(seed=2**70), "seed must be from 0 to"),
        (dict(prompt="p" * (validate.MAX_PROMPT_CHARS + 1)), "prompt is 20001 characters long"),
        (dict(batch=None), "batch must be a whole number"),
        (dict(overlay="yes"), "overlay previous run must be true or false"),
        (
            dict(fusion="fused"),
            "fusion must be one of 'none', 'epilogue', 'decode', 'overlap', 'persistent'; got 'fused'",
        ),
    ],
)
def test_generate_refuses_before_any_work(monkeypatch, change, message):
    monkeypatch.setattr(actions, "run_generation", lambda s: pytest.fail("ran with bad settings"))
    args, tiles = _generate_args(**change)
    with pytest.raises(gr.Error, match=message):
        list(ui.generate(*args, *tiles))


def test_a_tile_value_outside_the_controls_is_refused(monkeypatch):
    monkeypatch.setattr(actions, "run_generation", lambda s: pytest.fail("ran with bad tiles"))
    args, tiles = _generate_args()
    tiles[ui.TILE_NAMES.index("attention_block_m")] = "48"
    with pytest.raises(gr.Error, match="attention block_m must be one of 'default', '16'"):
        list(ui.generate(*args, *tiles))


def test_sweep_shapes_are_bounded_and_filled_from_this_devices_defaults(monkeypatch):
    dtype = actions.default_dtype()
    defaults = actions.DEFAULT_SHAPES if torch.cuda.is_available() else actions.CPU_SHAPES
    assert actions.sweep_shape("attention", {"H": 1}, dtype) == {**defaults["attention"], "H": 1}
    with pytest.raises(UserError, match=r"needs \d+ MB of inputs; a sweep here takes at most (4|1024) MB"):
        actions.sweep_shape("attention", dict(B=1, H=1, T=1_000_000, D=512), dtype)
    with pytest.raises(UserError, match="Shape sizes Q are not attention's; it takes B, H, T, D"):
        actions.sweep_shape("attention", {"Q": 3}, dtype)
    monkeypatch.setattr(actions.sweeps, "tile_sweep", lambda *a, **k: pytest.fail("swept a refused shape"))
    with pytest.raises(gr.Error, match="x must be one of"):
        list(ui.sweep("layer_norm", "M=8,C=64", dtype, "block_q", "num_warps", "ms", ui.NEW_STATE))


def test_compare_and_export_refuse_what_their_controls_could_not_send(monkeypatch):
    monkeypatch.setattr(actions, "run_compare", lambda *a, **k: pytest.fail("compared with bad lengths"))
    args, tiles = _generate_args()
    lengths = ", ".join(["8"] * (actions.MAX_COMPARE_LENGTHS + 1))
    with pytest.raises(gr.Error, match=f"at most {actions.MAX_COMPARE_LENGTHS} prompt lengths"):
        list(ui.compare(*args[:13], lengths, ui.NEW_STATE, *tiles))
    with pytest.raises(gr.Error, match="format must be one of 'csv', 'json'; got None"):
        ui.export("last run: steps", None, ui.NEW_STATE)
