"""Which sampling settings keep the bundled model from repeating itself.

Greedy decoding of the bundled 6M-parameter model loops ("facility of the facility of the ..."). For each
setting this runs the four prompts at 32 and 64 new tokens with seeds 0..4 on the PyTorch backend and counts
the runs whose continuation holds a phrase of three words twice (explorer.model.sampling.repeated_phrase).

    PYTHONPATH=. python -m experiments.sampling [--seeds N] [--only ROW ...] [--samples]

Run on 2026-12-01 (CPU, torch backend): runs with a repeated phrase, out of 40 (160 with --seeds 20, 320 with
--seeds 40). Greedy repeats in half the runs; sampling alone (any temperature, top-k or top-p) in 5 to 13 of
40; a penalty of 1.1 in 1 to 8; 1.2 in at most 1 of 40 but up to 7 of 160 at temperature 0.7-0.8. Greedy with a
penalty of 1.2 repeats in none and reads best, but writes the same text for every seed (and at 1.3 repeats
again). SUGGESTED, temperature 0.8, top_p 0.9, penalty 1.3: 0/40, 0/160, 0/320; so does top_k 50 with top_p
0.95, which reads a little less like Python; 1.0/0.9/1.2 repeats once in 320 and reads least like it.
"""

from __future__ import annotations

import argparse

import torch

from explorer.model.generate import generate
from explorer.model.sampling import SUGGESTED, repeated_phrase
from explorer.model.weights import load_model

PROMPTS = ["def fibonacci(n):", "class Config:", "import os\nimport sys\n\n\ndef main(", '"""Return the number of']
LENGTHS = [32, 64]
SETTINGS = [  # (temperature, top_k, top_p, repetition_penalty)
    (0.0, 0, 1.0, 1.0),
    (0.0, 0, 1.0, 1.2),
    (0.0, 0, 1.0, 1.3),
    (0.7, 0, 1.0, 1.0),
    (0.8, 0, 1.0, 1.0),
    (1.0, 0, 1.0, 1.0),
    (0.8, 50, 1.0, 1.0),
    (0.8, 0, 0.95, 1.0),
    (0.8, 0, 0.9, 1.0),
    (1.0, 0, 0.9, 1.0),
    (0.7, 0, 0.9, 1.1),
    (0.7, 0, 0.95, 1.1),
    (0.8, 0, 0.9, 1.1),
    (0.8, 0, 0.95, 1.1),
    (0.8, 50, 0.95, 1.1),
    (0.7, 0, 0.9, 1.2),
    (0.8, 0, 0.9, 1.2),
    (0.8, 0, 0.95, 1.2),
    (0.7, 50, 0.95, 1.2),
    (0.8, 50, 0.95, 1.2),
    (1.0, 50, 0.95, 1.2),
    (1.0, 0, 0.9, 1.2),
    (0.7, 0, 0.9, 1.3),
    (0.7, 0, 0.95, 1.3),
    (0.8, 0, 0.9, 1.3),
    (0.8, 0, 0.95, 1.3),
    (0.8, 50, 0.95, 1.3),
]


def continuations(model, tok, prompt: str, seed: int, **kw) -> dict[int, str]:
    """{n: the text of the first n new tokens} for each of LENGTHS, from one run (a seeded run's first 32
    tokens are the same whether it goes on to 64 or not)."""
    steps = list(
        generate(model, tok.encode(prompt), max_new_tokens=max(LENGTHS), tokenizer=tok, warmup=False, seed=seed, **kw)
    )
    return {n: "".join(s.text for s in steps[:n]) for n in LENGTHS}


def runs(model, tok, seeds, temperature, top_k, top_p, repetition_penalty):
    """(prompt, n, seed, continuation) for every prompt, length and seed."""
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty)
    for prompt in PROMPTS:
        for seed in seeds if temperature > 0 else seeds[:1]:  # greedy draws nothing: one run stands for every seed
            for n, text in continuations(model, tok, prompt, seed, **kw).items():
                for s in seeds if temperature <= 0 else [seed]:
                    yield prompt, n, s, text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", action="store_true", help="print SUGGESTED's continuations, seed 0")
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 (default 5)")
    parser.add_argument("--only", type=int, nargs="*", help="the SETTINGS rows to run, by index")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tok = load_model("bundled", backend="torch")
    if args.samples:
        for prompt in PROMPTS:
            text = continuations(model, tok, prompt, seed=0, **SUGGESTED)[max(LENGTHS)]
            print(f"--- {prompt!r}, {max(LENGTHS)} tokens, seed 0\n{prompt}{text}")
        return
    print("| temperature | top_k | top_p | repetition_penalty | runs with a repeated phrase | first seen |")
    print("| --- | --- | --- | --- | --- | --- |")
    seeds = list(range(args.seeds))
    for setting in [SETTINGS[i] for i in args.only] if args.only else SETTINGS:
        results = list(runs(model, tok, seeds, *setting))
        repeats = [(p, n, s, r) for p, n, s, t in results if (r := repeated_phrase(t))]
        first = f"{repeats[0][0]!r} {repeats[0][1]} seed {repeats[0][2]}: {repeats[0][3]!r}" if repeats else ""
        print(f"| {' | '.join(map(str, setting))} | {len(repeats)}/{len(results)} | {first} |", flush=True)


if __name__ == "__main__":
    main()
