"""Stages of one launch that wait for each other: a counter per stage, in device memory.

A kernel that runs dependent stages (kernels.ops.decode_layer.kernel: a whole transformer layer in one launch) cannot
lean on kernel boundaries to order them. After its share of a stage each program arrives: every thread's
stores are issued (a barrier of the program's threads), then one atomic increment of the stage's counter
releases them at GPU scope. Before a program reads what a stage wrote it waits until that counter holds
every program's arrival; the acquire that saw the last one makes all their stores visible to it, and its
loads come after (a barrier again, for the program's other threads).

Every program of such a launch must be resident at once, or a waiting program could hold the SM that a
program not yet started needs: the launcher starts at most one program per SM. The interpreter runs the
programs of a grid one after another, so there such a launch is one program.

The last program to arrive at the final counter sets every counter back to 0: no program waits on any by
then, and the next launch on the stream (or the next replay of a CUDA graph) finds zeros.
"""

import triton
import triton.language as tl


@triton.jit
def arrive(Sync, stage):
    tl.debug_barrier()  # every thread's stores of this stage come before the release
    tl.atomic_add(Sync + stage, 1, sem="release", scope="gpu")


@triton.jit
def wait(Sync, stage, arrivals):
    # Poll with plain loads from L2 (volatile: never from L1): polls as atomics would queue at the counter's
    # L2 slice behind, and ahead of, the very arrivals they wait for. Then one acquire, which reads the full
    # count and so synchronises with every arrival's release. (A fence.acq_rel after the poll instead of the
    # atomic, PTX's other acquire pattern, made the H200's decode step 4% slower.)
    while tl.load(Sync + stage, volatile=True) < arrivals:
        pass
    tl.atomic_add(Sync + stage, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()  # the program's loads come after the acquire


@triton.jit
def finish(Sync, STAGES: tl.constexpr, arrivals):
    """Arrive at counter STAGES, the last; the program that arrives last zeroes counters 0 to STAGES."""
    tl.debug_barrier()
    if tl.atomic_add(Sync + STAGES, 1, sem="acq_rel", scope="gpu") == arrivals - 1:
        for stage in tl.static_range(STAGES + 1):
            tl.store(Sync + stage, 0)


@triton.jit
def wait_count(Counter, count, Status, code, limit):
    """Wait until Counter holds at least `count` arrivals, as wait() does, but for at most `limit` polls: past
    them the program records `code` in Status unless a wait gave up before it (the first is the cause: the waits
    downstream of it may give up too) and carries on, so a fault is an error the host reads after the launch,
    never a hang. The acquire comes after the poll either way."""
    polls = 0
    seen = tl.load(Counter, volatile=True)
    while (seen < count) & (polls < limit):
        seen = tl.load(Counter, volatile=True)
        polls += 1
    if seen < count:
        tl.atomic_cas(Status, 0, code, sem="relaxed", scope="gpu")
    tl.atomic_add(Counter, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()
