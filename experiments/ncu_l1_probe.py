"""Where the tiled kernels' re-reads stop: L1 or L2. For the cases whose L2 counter sits below the
model's count of loads issued, ncu's L1 metrics (global loads and cp.async, requested and hit) tell
whether the L1 served the difference. Run on a GPU:

    ncu --cache-control all --profile-from-start off --metrics regex:l1tex__t_sectors_pipe_lsu_mem_global_op_.*
        --csv python -m experiments.ncu_l1_probe
"""

import torch

from kernels.ncu_check import CASES, make_call

NAMES = ("linear M=1024 768->3072 +GELU", "attention causal B1 H12 T1024 D64", "attention causal B4 H12 T4096 D64")


def main():
    calls = [make_call(case, torch.bfloat16, torch.device("cuda")) for case in CASES if case.name in NAMES]
    for call in calls:  # compile outside the profiled range
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("experiments/ncu_l1_probe.py")
    main()
