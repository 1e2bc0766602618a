"""Start the Triton Decoder Explorer: python app.py [--host H] [--port P] [--share] [--model NAME]

Flags fall back to environment variables (HOST, PORT, SHARE, EXPLORER_MODEL, QUEUE_SIZE), so the
same file serves a laptop (127.0.0.1), a Docker image and a Hugging Face Space (0.0.0.0). Without a
GPU the kernels run in Triton's interpreter, which must be chosen before triton is first imported.
"""

import argparse
import os


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
        default=env("EXPLORER_MODELS", "distilgpt2,gpt2"),
        help="comma-separated hub names or folders visitors may pick besides the bundled model",
    )
    parser.add_argument(
        "--allow-downloads",
        action="store_true",
        default=env("EXPLORER_ALLOW_DOWNLOADS", "") == "1",
        help="let a visitor's pick download a model this machine does not have",
    )
    parser.add_argument("--queue-size", type=int, default=int(env("QUEUE_SIZE", "32")), help="visitors who may wait")
    return parser.parse_args()


def main():
    args = parse_args()
    from explorer.app import gpu

    if gpu.zero_gpu():
        import spaces  # noqa: F401  before torch, which it patches for ZeroGPU (its documented order)

    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from explorer.app import actions, ui

    actions.set_default_model(args.model)
    actions.set_model_policy(args.models.split(","), args.allow_downloads)
    demo = ui.build()
    demo.queue(default_concurrency_limit=1, max_size=args.queue_size)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, theme=ui.THEME, css=ui.CSS,
                footer_links=["api", "gradio", "settings"])  # fmt: skip


if __name__ == "__main__":
    main()
