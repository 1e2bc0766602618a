"""Every value an endpoint takes is checked before any work, and a refusal names the field, the value
(at most 80 characters of it) and what is allowed; nothing is converted silently."""

import math

import pytest

from explorer.app import settings, validate
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
    assert validate.lengths("lengths", "16, 64 256", 1, 1023, 6) == [16, 64, 256]
    assert validate.shape("shape", "B=1, H=12,T=1024,D=64", "BHTD") == dict(B=1, H=12, T=1024, D=64)


@pytest.mark.parametrize(
    "text,message",
    [
        ("٣", "digits 0-9"),  # an Arabic-Indic three: int() takes it, the page does not
        ("1_0", "digits 0-9"),
        ("+1", "digits 0-9"),
        ("-1", "digits 0-9"),
        ("1 ,, 1", "an empty item is not one"),
        ("8,", "an empty item is not one"),
        ("", "is empty"),
        ("8, 2000", "must each be from 1 to 1023, got 2000"),
        ("1 2 3 4 5 6 7", "at most 6 numbers"),
        ("eight", "'eight' is not one"),
    ],
)
def test_lengths_are_plain_numbers_or_refused(text, message):
    with pytest.raises(UserError, match=message):
        validate.lengths("prompt lengths", text, 1, 1023, 6)


@pytest.mark.parametrize(
    "text,message",
    [
        ("M=1_0,C=8", "digits 0-9"),
        ("M=٣,C=8", "digits 0-9"),
        ("M=4,M=8,C=8", "gives M twice"),
        ("", "must give every size of this kernel \\(M=...,C=...\\); missing M, C"),
        ("M=4", "missing C"),
        ("M=4,,C=8", "an empty item is not one"),
        ("M=4,Q=3,C=8", "Q is not a size of this kernel; it takes M, C"),
        ("M=0,C=8", "at least 1"),
        ("M 4, C=8", "'M 4' is not one"),
    ],
)
def test_shapes_name_every_size_once_or_are_refused(text, message):
    with pytest.raises(UserError, match=message):
        validate.shape("shape", text, ["M", "C"])


def test_a_refusal_echoes_at_most_80_characters_and_names_a_file_for_what_it_is():
    with pytest.raises(UserError) as e:
        validate.choice("model", "x" * 1_000_000, ["bundled"])
    assert len(str(e.value)) < 200 and "model must be one of 'bundled'" in str(e.value)
    file = {"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}}
    for check in (lambda v: validate.choice("dtype", v, ["float32"]), lambda v: validate.text("prompt", v)):
        with pytest.raises(UserError, match="got a file reference \\(this app takes no files\\)"):
            check(file)


def test_every_run_field_is_checked_by_the_table():
    dynamic = {"model": [("bundled", "bundled")], "dtype": ["float32"]}
    good = settings.defaults("cpu", {"dtype": "float32"})
    s = settings.parse(good, dynamic)
    assert s.model == "bundled" and s.new_tokens == good["new_tokens"] and s.tiles == settings.Tiles()
    for name, bad, message in [
        ("new_tokens", 1.5, "new tokens must be a whole number"),
        ("cache", "false", "KV cache must be true or false"),
        ("model", ["gpt2"], "model must be one of 'bundled'"),
        ("temperature", math.nan, "temperature \\(0: greedy\\) must be a number"),
        ("seed", 2**70, "seed must be from 0 to"),
        ("prompt", "p" * (validate.MAX_PROMPT_CHARS + 1), "prompt is 20001 characters long"),
        ("batch", None, "batch \\(copies of the prompt\\) must be a whole number"),
        (
            "fusion",
            "fused",
            "fusion \\(Triton backend\\) must be one of 'none', 'epilogue', 'decode', 'overlap', "
            "'persistent', 'megakernel'; got 'fused'",
        ),
        ("attention_block_m", "48", "attention block_m must be one of 'default', '16'"),
        ("linear_autotune", "yes", "linear autotune must be true or false"),
    ]:
        with pytest.raises(UserError, match=message):
            settings.parse(good | {name: bad}, dynamic)
