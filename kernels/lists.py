"""Candidate scoring over IVF centroid lists of documents (the token index's first stage).

Every query token has probed ``P`` lists (best first) with gains ``g[t, 0] >= ... >= g[t, P-1]``.
A document row's approximate score for a query is the sum over the query's tokens of the gain
of the first (best) probed list of that token holding the row. ``credit_lists`` computes it for
a chunk of queries into a dense [queries, rows] float32 table:

- Triton (CUDA): one program per query walks its tokens and their lists in order. A per-query
  int16 marker holds the last token that credited each row, so a row found again in a worse list
  of the same token is skipped; a barrier after each block of list entries makes the block's
  writes visible to the next one. Rows within one list are distinct, so a block has no conflicts.
  Memory: 6 bytes per (query, row), no [tokens, rows] scratch.
- torch (CPU, and the reference): a [tokens, rows] scatter-amax scratch, summed per query.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mvdb.kernels.maxsim.fused import launch_guard


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
    a list). probes [Tq, P] int list ids, best first; gains [Tq, P] float, non-increasing along P;
    cu [Nq+1] token offsets of the queries (at most 32767 tokens each).
    """
    nq = cu.numel() - 1
    dev = probes.device
    use_triton = backend == "triton" or (backend == "auto" and dev.type == "cuda")
    if not use_triton:
        return _credit_lists_torch(list_offsets, list_rows, n_rows, probes, gains, cu)
    cu32 = cu.to(dev, torch.int32).contiguous()
    lens = cu32[1:] - cu32[:-1]
    if nq and int(lens.max()) > 32767:
        raise ValueError(f"credit_lists: queries of at most 32767 tokens, got {int(lens.max())}")
    score = torch.zeros(nq, n_rows, dtype=torch.float32, device=dev)
    mark = torch.full((nq, n_rows), -1, dtype=torch.int16, device=dev)
    if nq and n_rows:
        with launch_guard():
            _credit_lists_kernel[(nq,)](
                score, mark, n_rows, list_offsets.contiguous(), list_rows.contiguous(),
                probes.to(torch.int32).contiguous(), gains.float().contiguous(), cu32,
                P=probes.shape[1], BLOCK=1024, num_warps=4,
            )
    return score


def _credit_lists_torch(list_offsets, list_rows, n_rows, probes, gains, cu):
    dev = probes.device
    nq, p = cu.numel() - 1, probes.shape[1]
    cu_l = cu.long().tolist()
    t0, t1 = cu_l[0], cu_l[-1]
    starts = list_offsets[probes[t0:t1].long()]
    lens = (list_offsets[probes[t0:t1].long() + 1] - starts).flatten()
    ent = torch.repeat_interleave(torch.arange(lens.numel(), device=dev), lens)  # entry -> (token, probe)
    pos = torch.arange(ent.numel(), device=dev) - (lens.cumsum(0) - lens)[ent]
    rows = list_rows[starts.flatten()[ent] + pos].long()
    best = torch.zeros((t1 - t0) * n_rows, dtype=torch.float32, device=dev)
    best.scatter_reduce_(0, (ent // p) * n_rows + rows, gains[t0:t1].float().flatten()[ent], "amax")
    qid = torch.repeat_interleave(torch.arange(nq, device=dev), torch.tensor([cu_l[i + 1] - cu_l[i] for i in range(nq)], device=dev))
    return torch.zeros(nq, n_rows, dtype=torch.float32, device=dev).index_add_(0, qid, best.view(t1 - t0, n_rows))
