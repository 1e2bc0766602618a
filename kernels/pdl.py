"""Programmatic dependent launch (Hopper on): a kernel that starts before the one ahead of it has finished.

On a stream, a kernel normally starts only once the kernel before it has completed and its writes are
visible: the GPU drains, then ramps up again, once per launch, even inside a CUDA graph. A kernel launched
with launch_pdl=True may start as soon as every program of the kernel before it has called
launch_dependents (or finished). Until it calls wait() it may only read what no earlier kernel writes
(weights, biases); wait() returns once the kernel before it has completed with all its writes visible, and
since that kernel waited for its own predecessor before finishing, everything earlier is visible too.

So a decode-step projection calls launch_dependents() first, loads its weight slice, calls wait(), and only
then reads the activations: the weights stream in while the previous kernel finishes.

PDL is a constexpr: with PDL=False (the interpreter, GPUs before sm_90, the other rungs) neither call emits
anything and the kernel runs as it always did.
"""

import triton
import triton.language as tl

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # a Triton without grid-dependency control: config.overlaps_launches keeps PDL off
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def launch_dependents(PDL: tl.constexpr):
    if PDL:
        gdc_launch_dependents()


@triton.jit
def wait(PDL: tl.constexpr):
    if PDL:
        gdc_wait()
