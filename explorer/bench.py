"""python -m explorer.bench ...: the command line of explorer.cli. From any other directory, run this file by its
path (python /path/to/repo/explorer/bench.py ...): it puts the repository on the import path itself.

On a machine without a CUDA GPU the kernels run in Triton's interpreter, which must be chosen before
triton is first imported: this entry point does that before it imports anything that imports triton.
"""

if __name__ == "__main__":
    import os
    import sys
    from pathlib import Path

    if not __package__:  # run as a file: the repository's packages, not this folder's modules, come first
        sys.path[0] = str(Path(__file__).resolve().parents[1])

    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from explorer.cli import main

    main()
