"""Rows gathered by index into a packed device buffer (Triton): the exact rerank's read of its
candidates' tokens from pinned host memory (read in place through unified addressing, every row a
separate load in flight, so the link's bandwidth is reached whatever the documents' lengths)."""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from mvdb.kernels.errors import InvalidInputError
from mvdb.kernels.maxsim.runtime import interpreting, launch_guard

BLOCK_ROWS = 32


@triton.jit(do_not_specialize=["n"])  # rows of every size: one compile
def _gather_kernel(SRC, SRC_SCALES, IDX, SIDX, DST, DST_SCALES, n, DIM: tl.constexpr, BLOCK_DIM: tl.constexpr,
                   BLOCK_R: tl.constexpr, SCALES: tl.constexpr):
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = r < n
    src = tl.load(IDX + r, mask=ok, other=0)
    c = tl.arange(0, BLOCK_DIM)
    m = ok[:, None] & (c < DIM)[None, :]
    v = tl.load(SRC + src[:, None] * DIM + c[None, :], mask=m)
    tl.store(DST + r[:, None] * DIM + c[None, :], v, mask=m)
    if SCALES:
        s = tl.load(SRC_SCALES + tl.load(SIDX + r, mask=ok, other=0), mask=ok)
        tl.store(DST_SCALES + r, s, mask=ok)


def gather_rows(src: torch.Tensor, idx: torch.Tensor, scales: torch.Tensor | None = None,
                scale_idx: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``src[idx]`` (and ``scales[scale_idx]``, ``idx`` where None) on idx's device -> (rows [n, dim],
    scales [n] or None). ``src`` may be pinned host memory read from a CUDA device in place; rows of
    ``idx`` are counted from ``src``'s first row and may reach past it into other allocations of
    the same kind (a paged store's later pages): the caller owns those addresses."""
    dev, n, dim = idx.device, idx.numel(), src.shape[1]
    dst = torch.empty((n, dim), dtype=src.dtype, device=dev)
    dst_sc = torch.empty(n, dtype=torch.float32, device=dev) if scales is not None else None
    if dev.type != "cuda" and not interpreting():
        dst.copy_(src.index_select(0, idx.to(src.device)))
        if scales is not None:
            dst_sc.copy_(scales.index_select(0, (idx if scale_idx is None else scale_idx).to(scales.device)))
        return dst, dst_sc
    if dev.type == "cuda" and src.device.type == "cpu" and not src.is_pinned():
        raise InvalidInputError("src: expected pinned host memory or a tensor on idx's device, got pageable host "
                                "memory")
    if n:
        with launch_guard(), torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext():
            _gather_kernel[(triton.cdiv(n, BLOCK_ROWS),)](
                src, scales if scales is not None else dst, idx.contiguous(),
                (idx if scale_idx is None else scale_idx).contiguous(), dst, dst_sc if dst_sc is not None else dst, n,
                DIM=dim, BLOCK_DIM=triton.next_power_of_2(dim), BLOCK_R=BLOCK_ROWS, SCALES=scales is not None)
    return dst, dst_sc
