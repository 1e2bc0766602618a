"""python -m explorer.bench ...: the command line of explorer.cli.

On a machine without a CUDA GPU the kernels run in Triton's interpreter, which must be chosen before
triton is first imported: this entry point does that before it imports anything that imports triton.
"""

if __name__ == "__main__":
    import os

    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from explorer.cli import main

    main()
