"""Where a GPU Generate's profiling pass spends its time: each sampled step's untimed run (which compiles for the
length), its prefills that rebuild the cache, and the profiled step itself, op by op behind spins. GPT-2 small's
shape (random weights, bf16, overlap rung), a 256-token run with the CUDA graph, then its profiling pass four
times (the last two after the step's launches are counted, as the job counts them), each generate() inside it
timed by the host's clock, and the spins the profiled operations waited behind counted.

    python -m experiments.profile_parts
"""

import time
from collections import defaultdict

import torch

import explorer.measure.profile as profile
from explorer.app.lessons.base import _gpt2_shape
from explorer.measure.clock import timed
from explorer.measure.launches import decode_step_launches
from kernels.timing import require_cuda


def main() -> None:
    require_cuda("experiments/profile_parts.py")
    model = _gpt2_shape("cuda", torch.bfloat16).with_backend("triton").with_fusion("overlap")
    ids = torch.randint(0, 50257, (17,), generator=torch.Generator().manual_seed(0)).tolist()
    n = 256
    for _ in range(2):
        steps = list(timed(model, ids, max_new_tokens=n, cache=True, graph=True, eos_token_id=-1))
    positions = len(ids) + n
    spent = defaultdict(float)
    plain = profile.generate

    def counted(model, prompt, **kw):  # each generate() of the pass: untimed (no observer) or profiled
        kind = "profiled" if kw.get("observer") is not None else "untimed"
        t0 = time.perf_counter()
        for step in plain(model, prompt, **kw):
            spent[kind] += time.perf_counter() - t0
            yield step
            t0 = time.perf_counter()
        spent[kind] += time.perf_counter() - t0

    profile.generate = counted
    cycles = []
    sleep = torch.cuda._sleep

    def spin(c):
        cycles.append(c)
        sleep(c)

    torch.cuda._sleep = spin
    try:
        for i in range(4):
            if i >= 2:  # as the Generate job does: the step's launches counted (torch.profiler) first
                t0 = time.perf_counter()
                decode_step_launches(model, [ids], cache=True, graph=None, positions=positions)
                print(f"launches counted in {time.perf_counter() - t0:.3f} s")
            spent.clear()
            cycles.clear()
            t0 = time.perf_counter()
            rows = profile.profile_run(model, [ids], steps, cache=True, samples=6, positions=positions)
            total = time.perf_counter() - t0
            picks = rows.step.nunique()
            spins = f"{len(cycles)} spins, {sum(cycles) / 1.98e9 * 1e3:.1f} ms of them at 1.98 GHz"
            print(
                f"pass {i + 1}: {total:.3f} s for {picks} steps: untimed runs {spent['untimed']:.3f} s, profiled runs "
                f"{spent['profiled']:.3f} s ({spins}; largest {max(cycles)} cycles); step kernels "
                f"{rows.groupby('step').kernel_ms.sum().round(3).tolist()} ms"
            )
    finally:
        profile.generate, torch.cuda._sleep = plain, sleep


if __name__ == "__main__":
    main()
