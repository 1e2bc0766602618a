"""The profiled device time of a decode step next to its graph replay, per rung and sampling mode.

    python scripts/profile_check.py

GPU only. A 6-layer GPT-2-small-wide model (vocabulary 4096), bf16, prompt 32, 24 new tokens: the
median replayed step (CUDA events around the replay and the pick), and the median over three profiled
steps of the summed per-operation device times (explorer.measure.profile) and launch times.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from explorer.measure.profile import profile_run  # noqa: E402
from explorer.model.generate import generate  # noqa: E402
from tests.test_graphs import random_model  # noqa: E402


def main():
    model = random_model("cuda", torch.bfloat16, n_positions=256, n_layer=6, n_embd=768, n_head=12, vocab=4096)
    prompt = list(range(1, 33))
    print("| rung | pick | replay ms | profiled device ms | profiled launch ms |\n|---|---|---:|---:|---:|")
    for fusion in ("epilogue", "decode", "overlap"):
        for temperature in (0.0, 0.8):
            m = model.with_fusion(fusion)
            kw = dict(max_new_tokens=24, eos_token_id=-1, temperature=temperature, seed=1)
            graphed = list(generate(m, prompt, graph=True, **kw))
            replay = sorted(s.latency_ms for s in graphed[4:])[len(graphed[4:]) // 2]
            prof = profile_run(m, [prompt], graphed, cache=True, samples=3)
            steps = prof[prof.phase == "decode"].groupby("step")[["kernel_ms", "launch_ms"]].sum()
            pick = "greedy, in the graph" if temperature == 0 else "sampled, after the replay"
            device, launch = steps.kernel_ms.median(), steps.launch_ms.median()
            print(f"| {fusion} | {pick} | {replay:.3f} | {device:.3f} | {launch:.3f} |", flush=True)


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("scripts/profile_check.py")
    main()
