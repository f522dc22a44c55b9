"""The Triton list-crediting kernel: one program per query (see the package docstring)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _credit_lists_kernel(
    score_ptr, mark_ptr, n_rows,
    list_off_ptr, list_rows_ptr,
    probe_ptr, gain_ptr, cu_ptr,
    P: tl.constexpr, BLOCK: tl.constexpr,
):
    qi = tl.program_id(0)
    t0 = tl.load(cu_ptr + qi)
    t1 = tl.load(cu_ptr + qi + 1)
    srow = score_ptr + qi.to(tl.int64) * n_rows
    mrow = mark_ptr + qi.to(tl.int64) * n_rows
    for t in range(t0, t1):
        tag = (t - t0).to(tl.int16)
        for j in tl.static_range(P):
            c = tl.load(probe_ptr + t * P + j).to(tl.int64)
            g = tl.load(gain_ptr + t * P + j)
            a = tl.load(list_off_ptr + c)
            b = tl.load(list_off_ptr + c + 1)
            for e in range(a, b, BLOCK):
                offs = e + tl.arange(0, BLOCK)
                m = offs < b
                r = tl.load(list_rows_ptr + offs, mask=m, other=0).to(tl.int64)
                mk = tl.load(mrow + r, mask=m, other=0)
                upd = m & (mk != tag)
                s = tl.load(srow + r, mask=upd, other=0.0)
                tl.store(srow + r, s + g, mask=upd)
                tl.store(mrow + r, tl.zeros_like(mk) + tag, mask=upd)
                tl.debug_barrier()
