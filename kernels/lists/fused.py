"""The Triton list-crediting kernel: programs take query tokens (see the package docstring)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def probed_list(probe_ptr, gain_ptr, list_off_ptr, t, j, P: tl.constexpr):
    """Token t's j-th probed list: (its gain, the list's first and end entry)."""
    return probed_part(probe_ptr, gain_ptr, list_off_ptr, t, j, P, 1, 1)


@triton.jit
def probed_part(probe_ptr, gain_ptr, bounds_ptr, t, j, P: tl.constexpr, stride, step):
    """Token t's j-th probed list: (its gain, the first and end entry of this program's part of
    it: the part ``tl.program_id(1)``)."""
    c = tl.load(probe_ptr + t * P + j).to(tl.int64)
    g = tl.load(gain_ptr + t * P + j)
    at = bounds_ptr + c * stride + tl.program_id(1) * step
    return g, tl.load(at), tl.load(at + step)


@triton.jit
def list_block(list_rows_ptr, e, b, BLOCK: tl.constexpr):
    """The rows (int64) of list entries e .. e + BLOCK - 1 and the mask of those before ``b``."""
    offs = e + tl.arange(0, BLOCK)
    m = offs < b
    return tl.load(list_rows_ptr + offs, mask=m, other=0).to(tl.int64), m


@triton.jit
def token_start(score_ptr, n_rows, qid_ptr, t_base, q_base, seen_ptr, seen_words):
    """Program i's token, its query's row of the score table and the program's bitmap."""
    i = tl.program_id(0)
    t = t_base + i
    return t, score_ptr + (tl.load(qid_ptr + t) - q_base).to(tl.int64) * n_rows, seen_ptr + i.to(tl.int64) * seen_words


@triton.jit
def _seg_or(k1, v1, k2, v2):
    """Segmented OR for a scan over (key, bits) pairs sorted by key: ORs within a run of equal keys."""
    return k2, v2 | tl.where(k1 == k2, v1, 0)


# t_base / q_base change every launch, n_rows / seen_words with every add, stride / step with the
# launch's parts (1, or 17 and
# 16 / parts): one compile for them all, not one per value that is 1 or divisible by 16
@triton.jit(do_not_specialize=["n_rows", "t_base", "q_base", "seen_words", "stride", "step"])
def _credit_tokens_kernel(
    score_ptr, n_rows,
    bounds_ptr, list_rows_ptr,
    probe_ptr, gain_ptr, qid_ptr,
    t_base, q_base,
    seen_ptr, seen_words,
    stride, step,
    P: tl.constexpr, BLOCK: tl.constexpr,
):
    """Program (i, p) credits token t_base + i into its query's row of the int32 score table,
    over the rows of part p (axis 1 of the grid: the parts split the rows into equal spans).

    ``bounds_ptr`` [nlist, stride] int64: entry s of list c is the first entry of the list whose
    row lies in span s or later (the list's offsets where stride is 1: one part, every row); part
    p reads bounds step * p and step * (p + 1). The parts of a token share its bitmap, each in its
    own words (a span is a multiple of 32 rows), so they need no ordering between them.

    It walks the token's probed lists best first. Its own bitmap (``seen_words`` int32 words, zero
    on entry) marks the rows a better list of this token already credited; a fresh row gets the
    list's fixed-point gain through an integer atomic add (exact, so the sum does not depend on
    the order tokens land in). Rows within a list are distinct and ascending, so the rows of a
    block that share a bitmap word are neighbours: a segmented OR scan gathers their bits and the
    last of them stores the word once (plain loads and stores; no atomics on the bitmap). The
    first list checks nothing (every row is new to the token), the last sets no bits (nothing
    reads them after), and a barrier after each block orders the bitmap between blocks. Within
    a block every lane loads its word before the run's last lane stores it: the scan exchanges
    values between the block's warps through shared memory behind a barrier (in one warp the load
    precedes the store in the same instruction stream).
    """
    t, srow, seen = token_start(score_ptr, n_rows, qid_ptr, t_base, q_base, seen_ptr, seen_words)
    for j in tl.static_range(P):
        g, a, b = probed_part(probe_ptr, gain_ptr, bounds_ptr, t, j, P, stride, step)
        for e in range(a, b, BLOCK):
            r, m = list_block(list_rows_ptr, e, b, BLOCK)
            word = r >> 5
            bit = tl.full([BLOCK], 1, tl.int32) << (r & 31).to(tl.int32)
            fresh = m
            if P > 1:  # a block of the first list may share a word with the list's previous block
                old = tl.load(seen + word, mask=m, other=0, cache_modifier=".cg")
            if j > 0:
                fresh = m & ((old & bit) == 0)
            tl.atomic_add(srow + r, tl.zeros([BLOCK], tl.int32) + g, mask=fresh, sem="relaxed")
            if j < P - 1:
                _, bits = tl.associative_scan((tl.where(m, word, 1 << 40), bit), 0, _seg_or)
                offs = e + tl.arange(0, BLOCK)
                inside = offs + 1 < tl.minimum(b, e + BLOCK)  # the next entry is in this block
                nxt = tl.load(list_rows_ptr + offs + 1, mask=inside, other=-1).to(tl.int64) >> 5
                tl.store(seen + word, bits | old, mask=m & (~inside | (nxt != word)))
            tl.debug_barrier()
