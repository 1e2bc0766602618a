"""One step of the online softmax, written once for every attention kernel that walks keys tile by tile
(flash attention for the prefill; decode attention's loops, in both forms)."""

import triton
import triton.language as tl


@triton.jit
def online_step(m_i, l_i, scores, AXIS: tl.constexpr):
    """A tile of scores (log2 units) into the running max m_i and sum l_i along AXIS (1 for rows of queries,
    0 for one query). Returns the new max, the factor alpha by which the sums and the output so far scale,
    the tile's probabilities relative to the new max, and the new sum."""
    m_new = tl.maximum(m_i, tl.max(scores, axis=AXIS))
    alpha = tl.exp2(m_i - m_new)
    if AXIS == 1:
        p = tl.exp2(scores - m_new[:, None])
    else:
        p = tl.exp2(scores - m_new)
    return m_new, alpha, p, l_i * alpha + tl.sum(p, axis=AXIS)
