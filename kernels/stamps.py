"""When and where each program of a launch ran: the GPU's global timer at a program's first and last instruction,
and the SM it ran on, for the timeline of a decode step (explorer.measure.timeline).

Every kernel calls begin(Stamps) first and end(Stamps) last. Stamps is None unless kernels.launch.stamping() is
on, and a None argument is a compile-time constant: the calls vanish and the kernel compiles to the instructions
it has without them (kernels.ptx checks that for every launch). On, the launch is a variant compiled apart, handed
its slice of the stamping buffer: SLOT int64s per program, in the order of its program ids (x fastest).

The interpreter has neither a global timer nor SMs: stamping is for a GPU only.
"""

import triton
import triton.language as tl

SLOT = 3  # int64s a program writes: its start and end on the global timer (ns), and its SM


@triton.jit
def _slot(Stamps):
    """This program's SLOT entries of Stamps."""
    p = tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1) + tl.num_programs(1) * tl.program_id(2))
    return Stamps + p.to(tl.int64) * 3  # SLOT


@triton.jit
def _clock(like):
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [like], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def now():
    """The global timer (ns), as an int64 scalar: for stamps a kernel keeps of its own (a GPU's only)."""
    return _clock(tl.program_id(0))


@triton.jit
def begin(Stamps):
    """A program's start and its SM, where Stamps is given."""
    if Stamps is not None:
        at = _slot(Stamps)
        sm = tl.inline_asm_elementwise(
            "mov.u32 $0, %smid;", "=r,r", [tl.program_id(0)], dtype=tl.int32, is_pure=False, pack=1
        )
        tl.store(at, _clock(tl.program_id(0)))
        tl.store(at + 2, sm.to(tl.int64))


@triton.jit
def end(Stamps):
    """A program's end, where Stamps is given."""
    if Stamps is not None:
        tl.store(_slot(Stamps) + 1, _clock(tl.program_id(0)))
