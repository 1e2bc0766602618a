"""The bundled models (GPT-2, the default, and a Llama-family one on the same tokenizer) load with no network,
write the text transformers writes, and the tokenizer round-trips."""

from pathlib import Path

import pytest
import torch

from explorer.model.generate import generate
from explorer.model.weights import BUNDLED, BUNDLED_LLAMA, DEFAULT_MODEL, load_model, resolve_name

TEXTS = ["def f(x):\n    return x ** 2  # square\n", "The quick brown fox.\tTabs, ümlauts — and 日本語 🙂\r\n", ""]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.mark.parametrize("name", [DEFAULT_MODEL, BUNDLED_LLAMA])
def test_bundled_files_are_small_and_present(name):
    folder = Path(resolve_name(name))
    files = {p.name: p.stat().st_size for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(files)
    assert sum(files.values()) <= 15 * 1024 * 1024
    assert (folder / "tokenizer.json").read_bytes() == (BUNDLED / "tokenizer.json").read_bytes()  # one tokenizer


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_round_trips(text):
    _, tok = load_model("bundled")
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("name", [DEFAULT_MODEL, BUNDLED_LLAMA])
def test_bundled_model_generates_the_same_text_as_transformers(device, name):
    from transformers import AutoModelForCausalLM

    model, tok = load_model(name, device=device)
    assert model.family == ("Llama" if name == BUNDLED_LLAMA else "GPT-2")
    prompt = tok.encode("def parse_args(")
    new = 8
    steps = list(generate(model, prompt, max_new_tokens=new, tokenizer=tok))
    hf = AutoModelForCausalLM.from_pretrained(resolve_name(name), dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    expected = hf.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False, pad_token_id=tok.eos_token_id
    )[0, len(prompt) :].tolist()
    assert [s.token_id for s in steps] == expected[: len(steps)]
    text = "".join(s.text for s in steps)
    # Readable: mostly letters, spaces and code punctuation, not byte noise.
    assert len(text) >= new and sum(c.isascii() and (c.isprintable() or c in "\n\t") for c in text) / len(text) > 0.95
