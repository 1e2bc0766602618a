"""One step of the online softmax, written once for every attention kernel that walks keys tile by tile
(flash attention for the prefill; decode attention's loops, in both forms), a lazier step for loops whose
tiles are short next to their rescaling (grouped decode attention's), and the merge of split partials that
decode attention and grouped decode attention both end with."""

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


GROWTH = tl.constexpr(8.0)  # log2 units: lazy_step keeps a stale max until a row's max grows past it by more than this


@triton.jit
def lazy_step(m_i, l_i, acc, scores, scale_log2):
    """A tile of raw scores (rows of queries, each with at least one key in the tile) into the running max m_i
    (log2 units), sum l_i and output acc, which are rescaled only when some row's max grows by more than GROWTH:
    with the max left stale, every probability stays below 2^GROWTH, which fp32 sums and 16-bit dot inputs
    hold exactly as well. The scale is applied inside the exponent (one fused multiply-add an element). Returns
    the max, the tile's probabilities relative to it, the sum and the output so far."""
    top = tl.max(scores, axis=1) * scale_log2
    if tl.max((top > m_i + GROWTH).to(tl.int32), axis=0) > 0:  # the first tile always: m_i starts at -inf
        m_new = tl.maximum(m_i, top)
        alpha = tl.exp2(m_i - m_new)
        acc = acc * alpha[:, None]
        l_i = l_i * alpha
        m_i = m_new
    p = tl.exp2(scores * scale_log2 - m_i[:, None])
    return m_i, p, l_i + tl.sum(p, axis=1), acc


@triton.jit
def merge(m, sums, part, AXIS: tl.constexpr):
    """Split partials into normalised outputs: each split's unnormalised output weighed by exp2(its max - the
    largest max), over the weighed sums. AXIS 0: one head's splits, m and sums (splits,), part (splits, dim);
    AXIS 1: a row of heads each, (heads, splits) and (heads, splits, dim). Splits past a sequence's length are
    empty (max -inf) and weigh nothing. The caller loads the three tiles, so their loads go out together."""
    m_max = tl.max(m, axis=AXIS)
    if AXIS == 1:
        w = tl.where(m > float("-inf"), tl.exp2(m - m_max[:, None]), 0.0)
        l_sum = tl.sum(w * sums, axis=1)
        o = tl.sum(w[:, :, None] * part, axis=1) / tl.where(l_sum > 0, l_sum, 1.0)[:, None]
    else:
        w = tl.where(m > float("-inf"), tl.exp2(m - m_max), 0.0)
        l_sum = tl.sum(w * sums, axis=0)
        o = tl.sum(w[:, None] * part, axis=0) / tl.where(l_sum > 0, l_sum, 1.0)
    return o
