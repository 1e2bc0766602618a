"""The operator decides which models visitors may pick and whether a pick may download one; exports
do not pile up on the server; a run too large for the free memory is refused before it allocates."""

import errno
import os
import time

import pandas as pd
import pytest

from explorer.app import exports, models
from explorer.app.errors import UserError


def status_of(known: dict):
    """What model_status says of each name: no network in the tests, so every answer is given here."""
    return lambda name: known.get(name, (True, ""))


def test_visitors_see_only_the_models_the_operator_offers():
    policy = models.Policy("bundled", ["gpt2"])
    assert [value for _, value in policy.choices(status_of({}))] == ["bundled", "bundled-llama", "gpt2"]
    policy = models.Policy("bundled", ["gpt2", "gpt2-xl", ""])
    assert [value for _, value in policy.choices(status_of({}))] == ["bundled", "bundled-llama", "gpt2", "gpt2-xl"]


def test_the_picker_says_each_models_family_and_shape(tmp_path):
    from transformers import LlamaConfig

    LlamaConfig(hidden_size=96, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2).save_pretrained(
        tmp_path
    )
    policy = models.Policy("bundled", ["gpt2", "HuggingFaceTB/SmolLM2-135M", str(tmp_path)])
    labels = dict((value, label) for label, value in policy.choices(status_of({})))
    assert labels["gpt2"] == "gpt2 · GPT-2 · 12 × 768"
    assert labels["HuggingFaceTB/SmolLM2-135M"] == "SmolLM2-135M · Llama · 30 × 576, 9/3 heads"
    assert labels[str(tmp_path)].endswith("Llama · 3 × 96, 6/2 heads")  # read from the folder's config.json
    assert "GPT-2" in labels["bundled"] and "Llama" in labels["bundled-llama"]


def test_a_model_missing_here_is_refused_unless_downloads_are_allowed():
    status = status_of({"gpt2": (True, "downloads on first use")})
    policy = models.Policy("bundled", ["gpt2"], downloads=False)
    labels = dict((value, label) for label, value in policy.choices(status))
    assert labels["gpt2"] == "gpt2 · GPT-2 · 12 × 768 (unavailable: not on this server, and downloads are off)"
    with pytest.raises(UserError, match="not on this server and the operator has not allowed downloads"):
        policy.check("gpt2", status)
    models.Policy("bundled", ["gpt2"], downloads=True).check("gpt2", status)  # allowed: it downloads on first use
    unreachable = status_of({"gpt2": (False, "the Hugging Face Hub is unreachable")})
    with pytest.raises(UserError, match="cannot be used here: the Hugging Face Hub is unreachable"):
        models.Policy("bundled", ["gpt2"], downloads=True).check("gpt2", unreachable)


def test_old_exports_are_removed(tmp_path):
    first = exports.export(pd.DataFrame({"a": [1]}), "steps", "csv", folder=str(tmp_path))
    folder = os.path.dirname(first)
    old = time.time() - exports.MAX_AGE_S - 10
    os.utime(folder, (old, old))
    second = exports.export(pd.DataFrame({"a": [2]}), "steps", "json", folder=str(tmp_path))
    assert not os.path.exists(folder) and os.path.exists(second)


def test_an_export_that_cannot_be_written_says_why_without_a_path(tmp_path, monkeypatch):
    frame = pd.DataFrame({"a": [1]})
    blocked = tmp_path / "exports"
    blocked.write_text("a file where the folder should be")
    with pytest.raises(UserError) as e:
        exports.export(frame, "steps", "csv", folder=str(blocked))
    assert str(e.value) == (
        "The export could not be written: the server's exports folder cannot be written. Nothing you made is lost: "
        "your results stay on the page; try again later."
    )

    def full(frame, path):
        with open(path, "w") as f:
            f.write("a,")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr(exports.metrics, "export", full)
    folder = tmp_path / "fine"
    with pytest.raises(UserError, match=r"^The export could not be written: the server's disk is full\. Nothing") as e:
        exports.export(frame, "steps", "json", folder=str(folder))
    assert str(tmp_path) not in str(e.value)
    assert os.listdir(folder) == []  # the half-written file is not left to be served


def test_a_run_too_large_for_the_free_memory_is_refused_before_it_allocates():
    from explorer.model.weights import load_model

    model, _ = load_model("bundled")
    models.check_memory(model, batch=16, positions=1024, cache=True)  # 12 MB of cache: fits anywhere
    with pytest.raises(UserError, match=r"needs about \d+\.\d\d GB .* and the device has 0.02 GB free"):
        models.check_memory(model, batch=16, positions=1024, cache=True, free=20 << 20)  # 20 MB free
    models.check_memory(model, batch=1, positions=16, cache=True, free=20 << 20)  # a small run still fits
