"""The Triton list-crediting kernel: one program per query (see the package docstring)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def probed_list(probe_ptr, gain_ptr, list_off_ptr, t, j, P: tl.constexpr):
    """Token t's j-th probed list: (its gain, the list's first and end entry)."""
    c = tl.load(probe_ptr + t * P + j).to(tl.int64)
    g = tl.load(gain_ptr + t * P + j)
    return g, tl.load(list_off_ptr + c), tl.load(list_off_ptr + c + 1)


@triton.jit
def list_block(list_rows_ptr, e, b, BLOCK: tl.constexpr):
    """The rows (int64) of list entries e .. e + BLOCK - 1 and the mask of those before ``b``."""
    offs = e + tl.arange(0, BLOCK)
    m = offs < b
    return tl.load(list_rows_ptr + offs, mask=m, other=0).to(tl.int64), m


@triton.jit
def _credit_lists_kernel(
    word_ptr, n_rows,
    list_off_ptr, list_rows_ptr,
    probe_ptr, gain_ptr, cu_ptr,
    P: tl.constexpr, BLOCK: tl.constexpr,
):
    """Per (query, row) one int64 word: the high 32 bits a marker (1 + the last token of the query
    that credited the row, 0 for none), the low 32 bits the float32 score, so an entry costs one
    random read and one write."""
    qi = tl.program_id(0)
    t0 = tl.load(cu_ptr + qi)
    t1 = tl.load(cu_ptr + qi + 1)
    wrow = word_ptr + qi.to(tl.int64) * n_rows
    for t in range(t0, t1):
        tag = (t - t0 + 1).to(tl.int64)
        for j in tl.static_range(P):
            g, a, b = probed_list(probe_ptr, gain_ptr, list_off_ptr, t, j, P)
            for e in range(a, b, BLOCK):
                r, m = list_block(list_rows_ptr, e, b, BLOCK)
                w = tl.load(wrow + r, mask=m, other=0)
                upd = m & ((w >> 32) != tag)
                s = (w & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True) + g
                tl.store(wrow + r, (tag << 32) | (s.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF), mask=upd)
                tl.debug_barrier()
