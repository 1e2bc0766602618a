"""How each step's next tokens are picked from its logits, on the device.

Greedy (temperature 0) takes the argmax. Sampling divides the logits by the temperature, keeps the top k
tokens and then the nucleus (the fewest most likely tokens whose probabilities reach top_p, Holtzman et al.
2019), and draws from what is left. The repetition penalty (CTRL, Keskar et al. 2019) comes first: the logit
of every token the sequence already holds, prompt included, is divided by the penalty when positive and
multiplied by it when negative, so either way it drops. A small model decoded greedily repeats itself
("facility of the facility of the ..."); `repeated_phrase` is the check that the suggested settings, SUGGESTED,
were chosen by.
"""

from __future__ import annotations

import math

import torch

# Generation settings whose continuations of the bundled model read as Python without repeating a phrase of
# three words: chosen by experiments/sampling.py, which reports the settings it tried.
SUGGESTED = dict(temperature=0.8, top_k=0, top_p=0.9, repetition_penalty=1.3)


def check(top_p: float, repetition_penalty: float) -> None:
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} must be greater than 0 and at most 1 (1 keeps every token)")
    if not 0 < repetition_penalty < math.inf:
        raise ValueError(
            f"repetition_penalty={repetition_penalty} must be a finite number greater than 0 "
            "(1 is off, above 1 discourages repeats)"
        )


def penalize(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """logits (B, vocab), seen (B, vocab) bool: the tokens each sequence holds -> penalised float logits."""
    logits = logits.float()
    lowered = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, lowered, logits)


def nucleus(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """logits (B, vocab) -> the same with every token outside the nucleus at -inf."""
    ordered, order = logits.sort(dim=-1, descending=True)
    probs = ordered.softmax(dim=-1)
    # A token stays while the tokens more likely than it hold less than top_p, so the most likely always stays.
    outside = probs.cumsum(dim=-1) - probs >= top_p
    ordered = ordered.masked_fill(outside, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, ordered)


def sample(
    logits: torch.Tensor,
    temperature: float,
    top_k: int,
    generator: torch.Generator | None,
    *,
    top_p: float = 1.0,
    penalty: float = 1.0,
    seen: torch.Tensor | None = None,
) -> torch.Tensor:
    """logits (B, vocab) -> token ids (B,). temperature 0 is greedy; seen is needed when penalty is not 1.
    The logits are never written: on a CUDA graph they are the buffer the next replay writes."""
    if penalty != 1:
        logits = penalize(logits, seen, penalty)
    if temperature <= 0:
        return logits.argmax(dim=-1)  # the same pick in the logits' own dtype: no float copy needed
    logits = logits.float() / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1:
        logits = nucleus(logits, top_p)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


class Sampler:
    """sample() for one generation, with what it keeps between steps: the random generator, and for the
    repetition penalty the tokens each sequence holds so far as a (B, vocab) mask on the device, updated
    there with every pick. The host never reads the tokens for it, so on a GPU the next step is queued
    before this one's tokens reach the host (see explorer.model.generate)."""

    def __init__(self, batch: list[list[int]], vocab: int, device, *, temperature, top_k, top_p, penalty, seed):
        self.temperature, self.top_k, self.top_p, self.penalty = temperature, top_k, top_p, penalty
        self.generator = torch.Generator(device=device).manual_seed(seed) if temperature > 0 else None
        self.seen = None
        if penalty != 1:
            self.seen = torch.zeros(len(batch), vocab, dtype=torch.bool, device=device)
            for b, prompt in enumerate(batch):
                self.seen[b, prompt] = True

    @property
    def greedy(self) -> bool:
        """The plain argmax, which a CUDA graph may pick inside its replay."""
        return self.temperature <= 0 and self.penalty == 1

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        ids = sample(
            logits, self.temperature, self.top_k, self.generator, top_p=self.top_p, penalty=self.penalty, seen=self.seen
        )
        if self.seen is not None:
            self.seen.scatter_(1, ids[:, None], True)
        return ids


def repeated_phrase(text: str, words: int = 3) -> str | None:
    """The first phrase of `words` whitespace-separated words that occurs twice in text, else None."""
    tokens = text.split()
    seen = set()
    for i in range(len(tokens) - words + 1):
        phrase = " ".join(tokens[i : i + words])
        if phrase in seen:
            return phrase
        seen.add(phrase)
    return None
