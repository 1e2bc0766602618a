"""Nucleus sampling and the repetition penalty against plain references, and the suggested settings against
the bundled model's habit of repeating itself."""

import math

import pytest
import torch

from explorer.measure.clock import timed
from explorer.model.generate import generate
from explorer.model.sampling import SUGGESTED, Sampler, nucleus, penalize, repeated_phrase, sample
from explorer.model.weights import load_model
from tests.test_graphs import random_model

PROMPTS = ["def fibonacci(n):", "class Config:", "import os\nimport sys\n\n\ndef main(", '"""Return the number of']


def reference_nucleus(probs: list[float], top_p: float) -> dict[int, float]:
    """{token: probability once renormalised} over the fewest most likely tokens whose probabilities reach top_p."""
    kept, mass = {}, 0.0
    for token in sorted(range(len(probs)), key=lambda t: -probs[t]):
        if mass >= top_p:
            break
        kept[token] = probs[token]
        mass += probs[token]
    return {t: p / mass for t, p in kept.items()}


# Probabilities in a scrambled order (the filter sorts and must put every logit back where it was), chosen so
# that no partial sum lies near a top_p tried: 0.4, 0.65, 0.8, 0.9, 0.96, 1.
PROBS = [0.06, 0.25, 0.04, 0.4, 0.1, 0.15]


@pytest.mark.parametrize("top_p", [0.3, 0.5, 0.7, 0.85, 0.95, 1.0])
def test_top_p_draws_only_the_nucleus_in_proportion(top_p):
    expected = reference_nucleus(PROBS, top_p)
    logits = torch.tensor(PROBS).log().repeat(4000, 1)  # 4000 draws from one call
    drawn = torch.cat([sample(logits, 1.0, 0, torch.Generator().manual_seed(seed), top_p=top_p) for seed in range(5)])
    assert set(drawn.tolist()) == set(expected)
    counts = torch.bincount(drawn, minlength=len(PROBS)).double() / len(drawn)
    for token, p in expected.items():
        assert counts[token].item() == pytest.approx(p, abs=0.02), (token, counts.tolist())


def test_top_p_after_top_k_renormalises_over_the_top_k():
    """top_k=3 keeps 0.4, 0.25, 0.15 (mass 0.8): renormalised 0.5, 0.3125, 0.1875, so top_p=0.75 keeps two."""
    logits = torch.tensor(PROBS).log().repeat(2000, 1)
    drawn = sample(logits, 1.0, 3, torch.Generator().manual_seed(0), top_p=0.75)
    assert set(drawn.tolist()) == {3, 1}


def test_nucleus_matches_transformers_top_p():
    from transformers.generation.logits_process import TopPLogitsWarper

    logits = torch.randn(8, 1000, generator=torch.Generator().manual_seed(0)) * 3
    for top_p in (0.1, 0.5, 0.9, 0.99):
        expected = TopPLogitsWarper(top_p)(None, logits.clone())
        torch.testing.assert_close(nucleus(logits, top_p), expected)


def test_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    logits = torch.tensor([[2.0, -1.0, 0.5, -3.0, 0.0], [2.0, -1.0, 0.5, -3.0, 0.0]])
    seen = torch.tensor([[True, True, False, False, True], [False, False, True, True, False]])
    expected = torch.tensor([[1.0, -2.0, 0.5, -3.0, 0.0], [2.0, -1.0, 0.25, -6.0, 0.0]])
    torch.testing.assert_close(penalize(logits, seen, 2.0), expected)
    assert logits[0, 0] == 2.0  # the logits themselves untouched: on a CUDA graph they are its output buffer


def test_penalty_matches_transformers():
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    g = torch.Generator().manual_seed(0)
    logits, ids = torch.randn(4, 50, generator=g), torch.randint(0, 50, (4, 12), generator=g)
    seen = torch.zeros(4, 50, dtype=torch.bool).scatter_(1, ids, True)
    expected = RepetitionPenaltyLogitsProcessor(1.3)(ids, logits.clone())
    torch.testing.assert_close(penalize(logits, seen, 1.3), expected)


def reference_penalised_greedy(model, prompt: list[int], n: int, penalty: float) -> list[int]:
    """The whole sequence through the model at every step, the penalty over the token list itself."""
    ids = list(prompt)
    for _ in range(n):
        logits = model(torch.tensor([ids]))[0, -1].double()
        for t in set(ids):
            logits[t] = logits[t] / penalty if logits[t] > 0 else logits[t] * penalty
        ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


@pytest.mark.parametrize("cache", [True, False])
def test_penalised_greedy_matches_a_plain_loop(cache):
    """Unequal prompts, so each sequence's mask of seen tokens, kept on the device, differs."""
    model = random_model(torch.device("cpu")).with_backend("torch")
    prompts = [[5, 6, 7, 5], list(range(1, 18)), [9]]
    kw = dict(max_new_tokens=20, eos_token_id=-1, cache=cache, repetition_penalty=1.5, warmup=False)
    steps = list(generate(model, prompts, **kw))
    for b, prompt in enumerate(prompts):
        assert [s.token_ids[b] for s in steps] == reference_penalised_greedy(model, prompt, 20, 1.5)


def tokens(model, prompt=(1, 2, 3), n=16, **kw):
    return [s.token_id for s in generate(model, list(prompt), max_new_tokens=n, eos_token_id=-1, warmup=False, **kw)]


def test_greedy_is_unchanged_and_keeps_its_in_graph_pick():
    model = random_model(torch.device("cpu")).with_backend("torch")
    greedy = tokens(model)
    assert tokens(model, top_p=1.0, repetition_penalty=1.0) == greedy
    assert tokens(model, top_p=0.5) == greedy  # top_p narrows what is drawn; greedy draws nothing
    assert tokens(model, repetition_penalty=3.0) != greedy
    kw = dict(batch=[[1, 2]], vocab=97, device="cpu", top_k=0, top_p=1.0, seed=0)
    # Only the plain argmax may be picked inside a CUDA graph (explorer.model.graphs, greedy=True).
    assert Sampler(temperature=0.0, penalty=1.0, **kw).greedy
    assert not Sampler(temperature=0.0, penalty=1.2, **kw).greedy
    assert not Sampler(temperature=0.8, penalty=1.0, **kw).greedy


def test_seeded_runs_repeat_and_seeds_differ():
    model = random_model(torch.device("cpu")).with_backend("torch")
    kw = dict(temperature=1.0, top_p=0.9, repetition_penalty=1.2)
    assert tokens(model, seed=3, **kw) == tokens(model, seed=3, **kw)
    assert len({tuple(tokens(model, seed=s, **kw)) for s in range(4)}) > 1


@pytest.mark.parametrize(
    "kw,message",
    [
        (dict(top_p=0.0), "top_p=0.0 must be greater than 0 and at most 1"),
        (dict(top_p=-0.5), "top_p=-0.5 must be greater than 0 and at most 1"),
        (dict(top_p=1.5), "top_p=1.5 must be greater than 0 and at most 1"),
        (dict(top_p=math.nan), "top_p=nan must be"),
        (dict(repetition_penalty=0.0), "repetition_penalty=0.0 must be a finite number greater than 0"),
        (dict(repetition_penalty=-1.2), "repetition_penalty=-1.2 must be a finite number greater than 0"),
        (dict(repetition_penalty=math.inf), "repetition_penalty=inf must be a finite number"),
    ],
)
def test_invalid_settings_name_the_value_and_the_range(kw, message):
    model = random_model(torch.device("cpu")).with_backend("torch")
    with pytest.raises(ValueError, match=message):
        next(generate(model, [1, 2], max_new_tokens=2, **kw))


@pytest.mark.parametrize(
    "text,expected",
    [
        ("facility of the facility of the facility", "facility of the"),
        ("a b c d\n    a  b\tc", "a b c"),  # any whitespace separates words
        ("x = 1\ny = 2\nz = 1", None),
        ("a a a a", "a a a"),  # overlapping: a loop of one word
        ("", None),
    ],
)
def test_repeated_phrase(text, expected):
    assert repeated_phrase(text) == expected


def test_repeated_phrase_counts_words():
    assert repeated_phrase("one two x one two", words=2) == "one two"
    assert repeated_phrase("one two x one two", words=3) is None


@pytest.fixture(scope="module")
def bundled():
    return load_model("bundled", backend="torch")


def continuation(model, tok, prompt, n, **kw):
    return "".join(
        s.text for s in generate(model, tok.encode(prompt), max_new_tokens=n, tokenizer=tok, warmup=False, **kw)
    )


def test_greedy_repeats_itself(bundled):
    """What the suggested settings are for: the README's example, decoded greedily, loops."""
    assert repeated_phrase(continuation(*bundled, "def fibonacci(n):", 32)) is not None


@pytest.mark.parametrize("prompt", PROMPTS)
def test_suggested_settings_do_not_repeat_a_phrase(bundled, prompt):
    """The four prompts at 32 and 64 new tokens, seeds 0 to 4; the README's example (32 tokens) and the app's
    default Generate (8 tokens on CPU, 64 on a GPU, seed 0) among them."""
    model, tok = bundled
    for seed in range(5):
        steps = list(
            generate(model, tok.encode(prompt), max_new_tokens=64, tokenizer=tok, seed=seed, warmup=False, **SUGGESTED)
        )
        for n in (8, 32, 64):  # a seeded run's first n tokens are the same whether it stops there or goes on
            text = "".join(s.text for s in steps[:n])
            assert repeated_phrase(text) is None, (seed, n, text)


def test_the_triton_backend_draws_the_same_tokens(bundled, device):
    """The app's default Generate on CPU runs the Triton kernels (in the interpreter) for 8 tokens: it draws
    what the PyTorch backend draws, so the test above holds for it too."""
    if device.type == "cuda":
        pytest.skip("the CPU default's check (the bundled model is loaded on the CPU here); on a GPU, test_model")
    model, tok = bundled
    kw = dict(max_new_tokens=8, seed=0, warmup=False, **SUGGESTED)
    triton = [s.token_id for s in generate(model.with_backend("triton"), tok.encode(PROMPTS[0]), **kw)]
    assert triton == [s.token_id for s in generate(model, tok.encode(PROMPTS[0]), **kw)]


@pytest.mark.gpu
@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy with a penalty", "sampled"])
def test_graph_replays_with_a_penalty_equal_eager_steps(temperature, device):
    """A penalised pick needs the seen tokens, so it runs after the replay and never inside it: a greedy graph
    captured on the same shape before is not lent to it, and its tokens are those of eager steps."""
    model = random_model(device, torch.float16)
    prompts = [[5, 6, 7], list(range(1, 18)), [9]]
    kw = dict(max_new_tokens=40, eos_token_id=-1, seed=3)
    list(generate(model, prompts, graph=True, **kw))  # a greedy graph, kept in the model's pool
    kw |= dict(temperature=temperature, top_p=0.9, repetition_penalty=1.5)
    eager = list(generate(model, prompts, graph=False, **kw))
    graphed = list(timed(model, prompts, graph=True, **kw))
    assert [s.graph for s in graphed] == [False] + [True] * 39 and graphed[1].warmup_ms > 0  # captured anew
    assert [s.token_ids for s in graphed] == [s.token_ids for s in eager]
