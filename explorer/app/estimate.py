"""How long a job will take, said before it starts: a small cost model, labelled as an estimate.

Cost is counted in layer-steps: one layer of one step over a few tokens of a model 256 wide. A step over
more tokens (a prefill; every step with the cache off) counts 1 + tokens / 64 of them, and a wider model
width / 256 times as many: the interpreter runs one program per tile, and tiles are 64 rows or so.
Seconds per layer-step come from the last job on this device and backend when there was one, else from
a conservative constant. It is rough (good to a factor of two), and says so.
"""

from __future__ import annotations

import threading

# Conservative seconds per layer-step (measured on a 2-core CI machine: the interpreter takes 0.13 s for
# one layer of the bundled model's decode step, PyTorch on CPU 0.3 ms; a GPU's eager launches about 0.1
# ms) and seconds to compile Triton's kernels before a GPU job.
RATES = {("cpu", "triton"): 0.2, ("cpu", "torch"): 0.001, ("cuda", "triton"): 0.0005, ("cuda", "torch"): 0.0005}
COMPILE_S = {"cpu": 0.0, "cuda": 30.0}
TOKENS_PER_UNIT = 64
# (layers, width) of the models the app offers; others count as GPT-2 small.
SHAPES = {"bundled": (6, 256), "distilgpt2": (6, 768), "gpt2": (12, 768), "gpt2-shape": (12, 768)}
SHAPES |= {"gpt2-medium": (24, 1024), "gpt2-large": (36, 1280), "gpt2-xl": (48, 1600)}

_measured: dict[tuple[str, str], float] = {}  # the device's speed, not a visitor's data: shared
_compiled: set[str] = set()  # device types whose kernels a job has compiled in this process
_lock = threading.Lock()


def layer_steps(
    model: str, prompt: int, new_tokens: int, cache: bool, batch: int = 1, profiled: int = 0, warmup: bool = True
) -> float:
    """Layer-steps of one generation: its warm-up (a prefill and a decode step), prefill and decode steps,
    and `profiled` steps of a profiling pass after it (each rebuilt from a prefill)."""
    layers, width = SHAPES.get(model, SHAPES["gpt2"])

    def step(tokens: int) -> float:
        return 1 + batch * tokens / TOKENS_PER_UNIT

    decode = [step(1 if cache else prompt + i) for i in range(1, new_tokens + 1)]
    steps = step(prompt) + sum(decode[:-1]) + profiled * (step(prompt + new_tokens) + 1)
    if warmup:
        steps += step(prompt) + decode[0]
    return steps * layers * width / 256


def seconds(device: str, backend: str, units: float, compile: bool = True) -> float:
    """Seconds for `units` layer-steps; with `compile`, Triton's compilation before the first GPU job too."""
    rate = _measured.get((device, backend), RATES[(device, backend)])
    return units * rate + (COMPILE_S[device] if compile and device not in _compiled else 0.0)


def record(device: str, backend: str, units: float, wall_s: float) -> None:
    """A finished job's speed, for the next estimate on this device and backend."""
    if units > 0 and wall_s > 0:
        with _lock:
            _measured[(device, backend)] = wall_s / units
            _compiled.add(device)


def source(device: str, backends) -> str:
    measured = all((device, b) in _measured for b in backends)
    return "from the last run here" if measured else "a conservative guess until a run here is timed"


def note(total_s: float, device: str, backends=("triton",)) -> str:
    """'Estimate: about 40 s on this CPU (...)', or under a second."""
    where = "this CPU" if device == "cpu" else "this GPU"
    if total_s < 1:
        return f"*Estimate: under a second on {where}.*"
    shown = f"{total_s:.0f} s" if total_s < 120 else f"{total_s / 60:.0f} min"
    return f"*Estimate: about {shown} on {where} ({source(device, backends)}).*"


def profiled_steps(device: str) -> int:
    """Steps Generate's profiling pass times after a run (actions.run_generation: the prefill and 2 or 5
    decode positions)."""
    return 3 if device == "cpu" else 6


def generation_note(
    model: str, prompt: int, new_tokens: int, cache: bool, batch: int, backend: str, device: str
) -> str:
    units = layer_steps(model, prompt, new_tokens, cache, batch, profiled=profiled_steps(device))
    return note(seconds(device, backend, units), device, [backend])


def compare_note(model: str, lengths: list[int], new_tokens: int, graphs: bool, device: str) -> str:
    """Compare runs both backends, the cache on and off, each cache-on run twice with graphs, per length."""
    total = 0.0
    for backend in ("triton", "torch"):
        for cache, runs in ((True, 2 if graphs else 1), (False, 1)):
            units = sum(layer_steps(model, n, new_tokens, cache) for n in lengths) * runs
            total += seconds(device, backend, units, compile=False)
    return note(total + seconds(device, "triton", 0), device, ["triton", "torch"])
