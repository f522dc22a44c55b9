"""The Triton Ward kernel: one program a set, every merge of it in one launch. The distance
matrix lives in global memory (each merge rewrites a row and a column); the nearest column of
each row, the cluster sizes and each point's cluster stay in registers."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _ward_kernel(dist_ptr, near_ptr, near_at_ptr, n_ptr, k_ptr, rep_ptr, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    n = tl.load(n_ptr + r)
    k = tl.load(k_ptr + r)
    base = dist_ptr + r * BLOCK * BLOCK
    pos = tl.arange(0, BLOCK)
    near = tl.load(near_ptr + r * BLOCK + pos)
    near_at = tl.load(near_at_ptr + r * BLOCK + pos)
    size = tl.where(pos < n, 1.0, 0.0).to(tl.float64)
    rep = pos
    inf = float("inf")
    for _ in range(0, n - k):
        m = tl.min(near, 0)
        i = tl.argmin(near, 0, tie_break_left=True)
        j = tl.sum(tl.where(pos == i, near_at, 0), 0)
        a = tl.minimum(i, j)  # c joins a
        c = tl.maximum(i, j)
        da = tl.load(base + a * BLOCK + pos)
        dc = tl.load(base + c * BLOCK + pos)
        na = tl.sum(tl.where(pos == a, size, 0.0), 0)
        nc = tl.sum(tl.where(pos == c, size, 0.0), 0)
        t = 1.0 / (na + nc + size)  # SciPy's Ward update, in its order of operations
        new = tl.sqrt(tl.maximum((size + na) * t * da * da + (size + nc) * t * dc * dc - size * t * m * m, 0.0))
        new = tl.where((da == inf) | (dc == inf), inf, new)  # merged-away or padding, a and c
        tl.debug_barrier()  # rows a and c read by every thread before they are rewritten
        tl.store(base + a * BLOCK + pos, new)
        tl.store(base + pos * BLOCK + a, new)
        tl.store(base + c * BLOCK + pos, tl.full([BLOCK], inf, tl.float64))
        tl.store(base + pos * BLOCK + c, tl.full([BLOCK], inf, tl.float64))
        size = tl.where(pos == a, na + nc, tl.where(pos == c, 0.0, size))
        rep = tl.where(rep == c, a, rep)
        # a row whose nearest was a or c looks again; the others compare their old nearest with
        # their new distance to a; row a's nearest is in ``new``
        stale = ((near_at == a) | (near_at == c)) & (pos != a) & (size > 0)
        closer = new < near
        near = tl.where(closer, new, near)
        near_at = tl.where(closer, a, near_at)
        near = tl.where(pos == a, tl.min(new, 0), tl.where(pos == c, inf, near))
        near_at = tl.where(pos == a, tl.argmin(new, 0, tie_break_left=True), near_at)
        tl.debug_barrier()  # the new row and column seen by the rows looked at again
        todo = tl.sum(stale.to(tl.int32), 0)
        for _s in range(0, todo):
            s = tl.argmax(stale.to(tl.int32), 0, tie_break_left=True)
            row = tl.load(base + s * BLOCK + pos)
            near = tl.where(pos == s, tl.min(row, 0), near)
            near_at = tl.where(pos == s, tl.argmin(row, 0, tie_break_left=True), near_at)
            stale = stale & (pos != s)
    tl.store(rep_ptr + r * BLOCK + pos, rep)
