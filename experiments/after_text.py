"""Where a GPU Generate's seconds after its text go, the first time a length is met and the second: GPT-2
small's shape (random weights, bf16, overlap rung, CUDA graph), a 64-token run, then a 256-token run twice, each
followed by the steps the Generate job takes after its text (its launches counted, its profiling pass), each
timed, and the profiling pass pick by pick.

    python -m experiments.after_text
"""

import time

import torch

from explorer.app.lessons.base import _gpt2_shape
from explorer.measure.clock import timed
from explorer.measure.launches import decode_step_launches
from explorer.measure.profile import profile_run
from kernels.timing import require_cuda


def main() -> None:
    require_cuda("experiments/after_text.py")
    model = _gpt2_shape("cuda", torch.bfloat16).with_backend("triton").with_fusion("overlap")
    ids = torch.randint(0, 50257, (17,), generator=torch.Generator().manual_seed(0)).tolist()
    for n in (64, 256, 256, 256):
        t0 = time.perf_counter()
        steps = list(timed(model, ids, max_new_tokens=n, cache=True, graph=True, eos_token_id=-1))
        run = time.perf_counter() - t0
        positions = len(ids) + n
        t0 = time.perf_counter()
        decode_step_launches(model, [ids], cache=True, graph=None, positions=positions)
        counted = time.perf_counter() - t0
        stamps = [time.perf_counter()]

        def stamp(i, total, what, stamps=stamps):
            stamps.append(time.perf_counter())

        profile_run(model, [ids], steps, cache=True, samples=5, positions=positions, progress=stamp)
        picks = " ".join(f"{b - a:.3f}" for a, b in zip(stamps[1:], stamps[2:], strict=False))
        total = stamps[-1] - stamps[0]
        print(f"{n} tokens: run {run:.2f} s, launches counted {counted:.2f} s, profiling pass {total:.2f} s ({picks})")


if __name__ == "__main__":
    main()
