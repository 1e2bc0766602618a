"""Start the Triton Decoder Explorer: python app.py [--host H] [--port P] [--share] [--model NAME]

Flags fall back to environment variables (HOST, PORT, SHARE, EXPLORER_MODEL, QUEUE_SIZE), so the
same file serves a laptop (127.0.0.1), a Docker image and a Hugging Face Space (0.0.0.0). Without a
GPU the kernels run in Triton's interpreter, which must be chosen before triton is first imported.

Before it serves, the app starts its job worker and warms what the default controls use (on a GPU:
compiles the kernels, captures the graph), logging the seconds of each stage, so the first click
waits only for its own tokens. The worker starts first and warms while this process imports Gradio.
Under ZeroGPU nothing may touch CUDA at start: the first GPU call compiles, and says so on the page.
"""

import argparse
import os
import time


def parse_args():
    env = os.environ.get
    parser = argparse.ArgumentParser(description="Triton Decoder Explorer")
    parser.add_argument("--host", default=env("HOST", env("GRADIO_SERVER_NAME", "127.0.0.1")))
    parser.add_argument("--port", type=int, default=int(env("PORT", env("GRADIO_SERVER_PORT", "7860"))))
    parser.add_argument(
        "--share", action="store_true", default=env("SHARE", "") == "1", help="a public gradio.live link"
    )
    parser.add_argument("--model", default=env("EXPLORER_MODEL", "bundled"), help="default model in the picker")
    parser.add_argument(
        "--models",
        default=env("EXPLORER_MODELS", "distilgpt2,gpt2,HuggingFaceTB/SmolLM2-135M"),
        help="comma-separated hub names or folders visitors may pick besides the bundled models",
    )
    parser.add_argument(
        "--allow-downloads",
        action="store_true",
        default=env("EXPLORER_ALLOW_DOWNLOADS", "") == "1",
        help="let a visitor's pick download a model this machine does not have",
    )
    parser.add_argument("--queue-size", type=int, default=int(env("QUEUE_SIZE", "32")), help="visitors who may wait")
    return parser.parse_args()


def triton_cache_dir() -> str:
    """Where Triton keeps the kernels it compiles, so that they outlive the process that compiled them (a
    restarted worker; on ZeroGPU, every GPU call is a fresh process forked from the server): the operator's
    TRITON_CACHE_DIR; else a Space's persistent storage (/data), which also outlives a restart; else Triton's own
    default in the home folder (~/.triton/cache), which a Space keeps until it restarts."""
    if os.environ.get("TRITON_CACHE_DIR"):
        return os.environ["TRITON_CACHE_DIR"]
    if os.path.isdir("/data") and os.access("/data", os.W_OK):
        return "/data/triton-cache"
    return os.path.join(os.path.expanduser("~"), ".triton", "cache")


def main():
    t0, started_at = time.monotonic(), time.time()  # the worker's helpers end in time to serve within a minute
    args = parse_args()
    from explorer.app.zerogpu import zero_gpu

    if zero_gpu():
        import spaces  # noqa: F401  before torch, which it patches for ZeroGPU (its documented order)
    os.environ["TRITON_CACHE_DIR"] = triton_cache_dir()
    print(f"Triton's cache of compiled kernels: {os.environ['TRITON_CACHE_DIR']}")
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from explorer.app import start

    worker = start.worker(log=print, started_at=started_at)  # first: it warms while the page's libraries import
    from explorer.app import serve

    demo, launch, _ = serve.app(args.model, args.models.split(","), args.allow_downloads, log=print, started=worker)
    print(f"ready to serve {time.monotonic() - t0:.1f} s after the start")
    demo.queue(default_concurrency_limit=1, max_size=args.queue_size)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, **launch)


if __name__ == "__main__":
    main()
