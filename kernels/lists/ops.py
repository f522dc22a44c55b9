"""Public list scoring: :func:`credit_lists` (float scores) and :func:`credit_lists_fixed` (the
Triton kernel's fixed-point table, for callers that only rank)."""

from __future__ import annotations

import numpy as np
import torch

from mvdb.kernels.host import upload
from mvdb.kernels.lists.fused import _credit_tokens_kernel
from mvdb.kernels.lists.naive import _credit_lists_torch
from mvdb.kernels.maxsim.runtime import launch_guard

BITMAP_BYTES = 256 << 20  # the tokens' bitmaps of one launch (n_rows bits each); more tokens go in more launches
BLOCK = 2048
WARPS = 16


def fixed_gains(gains: torch.Tensor, cu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int32 gains, float64 scale): round(max(gain, 0) * scale) with one scale for the batch
    chosen so that no query's largest possible score (the sum of its tokens' largest gains)
    passes 0.99 * 2**31 (rounding adds at most half a unit per token). Stays on the device (no
    synchronisation)."""
    g = gains.double().clamp_min(0)
    cs = torch.zeros(g.shape[0] + 1, dtype=torch.float64, device=g.device)
    if g.shape[0] and g.shape[1]:
        cs[1:] = g.amax(dim=1).cumsum(0)  # (the first gain where they are non-increasing, as promised)
    cu = cu.to(g.device).long()
    top = (cs[cu[1:]] - cs[cu[:-1]]).max() if cu.numel() > 1 else cs.new_zeros(())
    scale = torch.clamp(0.99 * 2.0**31 / top.clamp_min(1e-30), max=2.0**30)
    return (g * scale).round_().to(torch.int32), scale


def token_queries(cu, n_tokens: int, device) -> torch.Tensor:
    """int32 [n_tokens]: each token of the queries with offsets ``cu`` (host ints) numbered by its
    query, counted from the first of them (tokens outside them 0): the ``qid`` of the kernels."""
    cu = np.asarray(list(cu), dtype=np.int64)
    qid = np.zeros(n_tokens, dtype=np.int32)
    qid[cu[0] : cu[-1]] = np.repeat(np.arange(len(cu) - 1, dtype=np.int32), np.diff(cu))
    return upload(torch.from_numpy(qid), device)  # built on the host, copied without waiting for the device


def credit_lists_fixed(
    list_offsets: torch.Tensor,
    list_rows: torch.Tensor,
    n_rows: int,
    probes: torch.Tensor,
    gains_fixed: torch.Tensor,
    cu,
    qid: torch.Tensor,
    q_base: int = 0,
    bitmap_bytes: int = BITMAP_BYTES,
    block: int = BLOCK,
    warps: int = WARPS,
    parts: int = 1,
    bounds: torch.Tensor | None = None,
) -> torch.Tensor:
    """The Triton kernel (CUDA or the interpreter): int32 [queries of cu, n_rows] scores in the
    fixed point of ``gains_fixed`` (see :func:`fixed_gains`).

    probes and gains_fixed [T, P] for every token of the batch; cu (host ints) the token offsets
    of this chunk's queries, qid [T] int32 each token's query in the batch (query ``q_base`` is
    the table's row 0). One program per token, each with an n_rows-bit bitmap: as many tokens per
    launch as ``bitmap_bytes`` holds. The lists' rows must be ascending within each list (as
    :class:`mvdb.engine.ivf.Lists` keeps them).

    ``parts`` > 1 splits each token's rows into that many spans, a program each (``parts`` times
    the programs, each walking about 1/parts of each probed list: few tokens, such as one query's,
    then still fill the GPU); it needs ``bounds``, :func:`list_bounds` with a multiple of
    ``parts`` spans. The table is the same for any ``parts``.
    """
    cu_l = cu.tolist() if isinstance(cu, torch.Tensor) else list(cu)
    nq, dev = max(0, len(cu_l) - 1), probes.device
    score = torch.zeros(nq, n_rows, dtype=torch.int32, device=dev)
    if nq == 0 or n_rows == 0 or cu_l[-1] == cu_l[0]:
        return score
    n_tok = cu_l[-1] - cu_l[0]
    words = (n_rows + 31) // 32
    per_launch = max(1, min(n_tok, bitmap_bytes // (4 * words)))
    seen = torch.empty(per_launch, words, dtype=torch.int32, device=dev)
    probes = probes.to(torch.int32).contiguous()
    gains_fixed, qid = gains_fixed.contiguous(), qid.contiguous()
    list_offsets, list_rows = list_offsets.contiguous(), list_rows.contiguous()
    if parts > 1:
        if bounds is None or (bounds.shape[1] - 1) % parts:
            raise ValueError(f"parts={parts}: expected list_bounds() with a multiple of {parts} spans, got "
                             f"{None if bounds is None else bounds.shape[1] - 1}")
        table, stride, step = bounds.contiguous(), bounds.shape[1], (bounds.shape[1] - 1) // parts
    else:
        table, stride, step = list_offsets, 1, 1
    with launch_guard():
        for a in range(cu_l[0], cu_l[-1], per_launch):
            n = min(cu_l[-1], a + per_launch) - a
            seen[:n].zero_()
            _credit_tokens_kernel[(n, parts)](
                score, n_rows, table, list_rows, probes, gains_fixed, qid,
                a, q_base, seen, words, stride, step, P=probes.shape[1], BLOCK=block, num_warps=warps,
            )
    return score


def list_bounds(list_offsets: torch.Tensor, list_rows: torch.Tensor, n_rows: int, spans: int,
                chunk: int = 1 << 24) -> torch.Tensor:
    """int64 [nlist, spans + 1]: where each list's entries enter each of ``spans`` equal spans of
    the rows (a multiple of 32 rows each, so that spans share no bitmap word): entry s is the
    first entry of the list whose row is at least s * span; entry 0 and entry ``spans`` are the
    list's own bounds. Rows must be ascending within each list. One pass over the entries, in
    chunks of ``chunk``."""
    dev = list_offsets.device
    nlist = list_offsets.numel() - 1
    span = max(32, -(-max(1, -(-n_rows // spans)) // 32) * 32)
    counts = torch.zeros(nlist * spans, dtype=torch.int64, device=dev)
    for a in range(0, list_rows.numel(), chunk):
        b = min(list_rows.numel(), a + chunk)
        pos = torch.arange(a, b, device=dev)
        which = torch.searchsorted(list_offsets, pos, right=True) - 1
        part = (list_rows[a:b].long() // span).clamp_max(spans - 1)
        counts += torch.bincount(which * spans + part, minlength=nlist * spans)
    out = torch.zeros(nlist, spans + 1, dtype=torch.int64, device=dev)
    out[:, 1:] = counts.view(nlist, spans).cumsum(1)
    return out + list_offsets[:-1, None].long()


def credit_lists(
    list_offsets: torch.Tensor,
    list_rows: torch.Tensor,
    n_rows: int,
    probes: torch.Tensor,
    gains: torch.Tensor,
    cu: torch.Tensor,
    backend: str = "auto",
) -> torch.Tensor:
    """Approximate scores [Nq, n_rows] float32 (0 where no probed list holds the row).

    list_offsets [nlist+1] int64 and list_rows [E] int32: the CSR of rows per list (distinct within
    a list). probes [Tq, P] int list ids, best first; gains [Tq, P] float, >= 0 and non-increasing
    along P; cu [Nq+1] token offsets of the queries. The Triton kernel sums in fixed point
    (resolution the largest query's score / 2**31), so its scores are the same on every run.
    """
    dev = probes.device
    use_triton = backend == "triton" or (backend == "auto" and dev.type == "cuda")
    if not use_triton:
        return _credit_lists_torch(list_offsets, list_rows, n_rows, probes, gains, cu)
    cu_l = cu.tolist()
    if len(cu_l) < 2:
        return torch.zeros(0, n_rows, dtype=torch.float32, device=dev)
    gq, scale = fixed_gains(gains, cu)
    fixed = credit_lists_fixed(list_offsets, list_rows, n_rows, probes, gq, cu_l, token_queries(cu_l, probes.shape[0], dev))
    return (fixed.double() / scale).float()
