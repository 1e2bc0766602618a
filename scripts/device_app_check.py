"""Drive the app on a GPU machine the way a visitor's client would: python scripts/device_app_check.py [TOKENS]

Launches the app in-process (compiled kernels, bf16), then generates through its /generate endpoint
with the bundled model and with random weights of GPT-2 small's shape (12 layers, width 768, the
bundled tokenizer's 4096-token vocabulary), printing the summary the UI shows for each. Then the other
GPU endpoints: a tile sweep (and a second one cancelled after its first config, followed by a request
that must start at once), a compare and the fusion ladder.
"""

import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def gpt2_shaped(folder: Path) -> str:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=12, n_head=12, n_embd=768, n_positions=1024, vocab_size=4096, bos_token_id=0,
                     eos_token_id=0)  # fmt: skip
    GPT2LMHeadModel(cfg).save_pretrained(folder)
    bundled = Path(__file__).resolve().parent.parent / "assets" / "tiny-gpt2"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(bundled / name, folder / name)
    return str(folder)


def main(new_tokens: int):
    from gradio_client import Client

    from explorer.app import actions
    from tests.serve import running_app

    random_model = gpt2_shaped(Path("/tmp/gpt2-shaped"))
    actions.set_default_model(random_model)  # puts the folder in the picker's choices
    print(actions.header())
    with running_app() as url:
        client = Client(url, verbose=False)
        for model in ("bundled", random_model):
            for cache, graph in (
                ((True, True),) if os.environ.get("GRAPH_ONLY") else ((True, True), (True, False), (False, False))
            ):
                t0 = time.perf_counter()
                out = client.predict(model=model, prompt="def fibonacci(n):", new_tokens=new_tokens, cache=cache,
                                     cuda_graph=graph, api_name="/generate")  # fmt: skip
                wall = time.perf_counter() - t0
                how = f"cache {'on' if cache else 'off'}, {'CUDA graph' if graph else 'eager'}"
                print(f"\n### {model}, {how}: {new_tokens} new tokens, {wall:.1f} s end to end")
                print(out[1])
                print("text:", repr(out[0][:200]))
        other_endpoints(client)


def other_endpoints(client):
    sweep = dict(kernel="linear", shape="M=64,K=768,N=3072", dtype="bfloat16", x="block_m", y="block_n", value="ms")
    t0 = time.perf_counter()
    heat, table, best, *_ = client.predict(**sweep, api_name="/sweep")
    print(f"\n### sweep, {time.perf_counter() - t0:.1f} s: {best}")
    job = client.submit(**(sweep | dict(shape="M=1024,K=768,N=3072")), api_name="/sweep")
    while not job.outputs():  # the first config's row
        time.sleep(0.05)
    job.cancel()
    t0 = time.perf_counter()
    client.predict(model="bundled", prompt="x", new_tokens=2, api_name="/generate")
    waited = time.perf_counter() - t0
    print(f"### a sweep cancelled after {len(job.outputs())} update(s); the next request answered in {waited:.1f} s")
    t0 = time.perf_counter()
    _, _, table, *_ = client.predict(model="bundled", new_tokens=16, lengths="16,128", api_name="/compare")
    print(f"\n### compare, {time.perf_counter() - t0:.1f} s:\n{table}")
    t0 = time.perf_counter()
    _, ladder, *_ = client.predict(model="bundled", dtype="bfloat16", batch=1, api_name="/ladder")
    print(f"\n### ladder (bundled model), {time.perf_counter() - t0:.1f} s:\n{ladder}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 128)
