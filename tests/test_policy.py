"""The operator decides which models visitors may pick and whether a pick may download one; exports
do not pile up on the server."""

import os
import time

import pytest

from explorer.app import actions
from explorer.app.errors import UserError


@pytest.fixture
def policy(monkeypatch):
    monkeypatch.setattr(actions, "_POLICY", dict(actions._POLICY))
    # No network in the tests: every hub name is missing locally and the Hub is unreachable, or reachable.
    status = {}
    monkeypatch.setattr(actions, "model_status", lambda name: status.get(name, (True, "")))
    return status


def test_visitors_see_only_the_models_the_operator_offers(policy):
    actions.set_model_policy(["gpt2"], downloads=False)
    assert [value for _, value in actions.model_choices()] == ["bundled", "gpt2"]
    actions.set_model_policy(["gpt2", "gpt2-xl", ""], downloads=False)
    assert [value for _, value in actions.model_choices()] == ["bundled", "gpt2", "gpt2-xl"]


def test_a_model_missing_here_is_refused_unless_downloads_are_allowed(policy):
    policy["gpt2"] = (True, "downloads on first use")
    actions.set_model_policy(["gpt2"], downloads=False)
    labels = dict((value, label) for label, value in actions.model_choices())
    assert labels["gpt2"] == "gpt2 (unavailable: not on this server, and downloads are off)"
    with pytest.raises(UserError, match="not on this server and the operator has not allowed downloads"):
        actions.check_model("gpt2")
    actions.set_model_policy(["gpt2"], downloads=True)
    actions.check_model("gpt2")  # allowed now: it would download on first use
    policy["gpt2"] = (False, "the Hugging Face Hub is unreachable")
    with pytest.raises(UserError, match="cannot be used here: the Hugging Face Hub is unreachable"):
        actions.check_model("gpt2")


def test_old_exports_are_removed(tmp_path, monkeypatch):
    import pandas as pd

    monkeypatch.setattr(actions, "EXPORT_DIR", str(tmp_path))
    first = actions.export(pd.DataFrame({"a": [1]}), "steps", "csv")
    folder = os.path.dirname(first)
    old = time.time() - actions.EXPORT_MAX_AGE_S - 10
    os.utime(folder, (old, old))
    second = actions.export(pd.DataFrame({"a": [2]}), "steps", "json")
    assert not os.path.exists(folder) and os.path.exists(second)


def test_a_run_too_large_for_the_free_memory_is_refused_before_it_allocates(monkeypatch):
    from explorer.model.weights import load_model

    model, _ = load_model("bundled")
    actions.check_memory(model, batch=16, positions=1024, cache=True)  # 12 MB of cache: fits anywhere
    monkeypatch.setattr(actions, "free_memory_bytes", lambda: 20 << 20)  # a device with 20 MB free
    with pytest.raises(UserError, match=r"needs about \d+\.\d\d GB .* and the device has 0.02 GB free"):
        actions.check_memory(model, batch=16, positions=1024, cache=True)
    actions.check_memory(model, batch=1, positions=16, cache=True)  # a small run still fits
