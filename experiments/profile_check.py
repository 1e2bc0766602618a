"""The profiled device time of a decode step next to its graph replay, per rung and sampling mode.

    python -m experiments.profile_check

GPU only. A 6-layer GPT-2-small-wide model (vocabulary 4096), bf16, prompt 32, 24 new tokens: the
median replayed step (CUDA events around the replay and the pick), and the median over three profiled
steps of the summed per-operation device times (explorer.measure.profile) and launch times.
"""

import torch

from explorer.measure.clock import timed
from explorer.measure.profile import profile_run
from explorer.model.weights import config_from_hf, from_hf_state_dict


def main():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(7)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=6, n_head=12, n_embd=768, n_positions=256, vocab_size=4096)).eval()
    model = from_hf_state_dict(config_from_hf(hf.config), hf.state_dict(), device="cuda", dtype=torch.bfloat16)
    prompt = list(range(1, 33))
    print("| rung | pick | replay ms | profiled device ms | profiled launch ms |\n|---|---|---:|---:|---:|")
    for fusion in ("epilogue", "decode", "overlap"):
        for temperature in (0.0, 0.8):
            m = model.with_fusion(fusion)
            kw = dict(max_new_tokens=24, eos_token_id=-1, temperature=temperature, seed=1)
            graphed = list(timed(m, prompt, graph=True, **kw))
            replay = sorted(s.latency_ms for s in graphed[4:])[len(graphed[4:]) // 2]
            prof = profile_run(m, [prompt], graphed, cache=True, samples=3)
            steps = prof[prof.phase == "decode"].groupby("step")[["kernel_ms", "launch_ms"]].sum()
            pick = "greedy, in the graph" if temperature == 0 else "sampled, after the replay"
            device, launch = steps.kernel_ms.median(), steps.launch_ms.median()
            print(f"| {fusion} | {pick} | {replay:.3f} | {device:.3f} | {launch:.3f} |", flush=True)


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("experiments/profile_check.py")
    main()
