"""Where one decode step's host time goes, on a GPU: python -m experiments.decode_overhead [STEPS]

GPT-2-small-shaped random weights, bf16, cache on. Prints the step's wall time, the device time of the
same step replayed from a CUDA graph, and the Python functions that cost the most host time (cProfile).
"""

import cProfile
import pstats
import sys
import time

import torch

from explorer.model.cache import KVCache
from explorer.model.weights import config_from_hf, from_hf_state_dict


def main(steps: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=12, n_head=12, n_embd=768, n_positions=1024)).eval()
    model = from_hf_state_dict(config_from_hf(hf.config), hf.state_dict(), device="cuda", dtype=torch.bfloat16)
    prompt = torch.randint(0, 50257, (1, 32), device="cuda")
    for backend in ("triton", "torch"):
        kv = KVCache.for_model(model, 1, 1024)
        model.prefill(prompt, kv, [32], backend=backend)
        ids = torch.randint(0, 50257, (1,), device="cuda")
        for _ in range(3):
            model.decode(ids, kv, backend=backend)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            model.decode(ids, kv, backend=backend)
        torch.cuda.synchronize()
        eager = (time.perf_counter() - t0) / steps * 1e3
        t0 = time.perf_counter()
        for _ in range(steps):
            model.decode(ids, kv, backend=backend)
        host = (time.perf_counter() - t0) / steps * 1e3  # enqueue time only
        torch.cuda.synchronize()
        # The same step in a CUDA graph: device time only. Lengths advance inside the graph, as in decode.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            model.decode(ids, kv, backend=backend)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            logits = model.decode(ids, kv, backend=backend)
        ref = model.decode(ids, kv, backend=backend)  # eager, one position further
        kv.lengths.sub_(1)
        graph.replay()
        torch.cuda.synchronize()
        err = (logits.float() - ref.float()).abs().max().item()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        replay = start.elapsed_time(end) / steps
        print(
            f"{backend}: eager step {eager:.3f} ms (host enqueue {host:.3f} ms), graph replay {replay:.3f} ms, "
            f"graph vs eager max |diff| {err:.3g}"
        )
        if backend == "triton":
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(steps):
                model.decode(ids, kv, backend=backend)
            prof.disable()
            torch.cuda.synchronize()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("experiments/decode_overhead.py")
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 50)
