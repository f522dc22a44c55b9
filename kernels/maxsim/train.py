"""Differentiable MaxSim: a forward that saves the winning document token per (pair, query
token) as int32, and backwards that gather from it, so neither pass materialises the
query-token x doc-token similarity tensor.

Every layout is described by offsets: query i's tokens are ``q_off[i]:q_off[i+1]`` of a packed
[Tq, d] tensor; document ``doc`` is ``d_off[doc]:d_off[doc+1]`` of a packed [Td, d] tensor; pair
(i, k) scores query i against document k (cross product, every query against every document) or
against document i * K + k (per-query candidates). Padded batches are packed views with
``Lq`` / ``Ld`` tokens each and optional masks over the same token positions.

Backwards (``backward=``):
- ``"unified"``: one program per pair adds g * D[argmax] to dQ and g * Q to dD[argmax] with fp32
  atomics; fast, not bitwise reproducible, gradients accumulated in fp32.
- ``"lowmem"``: every gradient row is owned by one program (dQ rows by query, dD rows by
  document, a one-hot matmul over the queries that picked them): no atomics, gradients written
  in the input dtype, bitwise identical run to run.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mvdb.kernels.maxsim.fused import interpreting

BACKWARDS = ("auto", "unified", "lowmem")


@triton.jit
def _best_in_doc(q, D, DM, d_start, d_n, offs_c, c_ok,
                 DIM: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr, HAS_DMASK: tl.constexpr,
                 UPCAST: tl.constexpr, IEEE: tl.constexpr, MASK_ZERO: tl.constexpr):
    """Per query row of ``q`` [BLOCK_Q, BLOCK_DIM]: the best similarity over the document's valid
    tokens and its token index (-1 where none is valid, or where a masked token's 0 wins under
    MASK_ZERO, PyLate's multiply-by-mask). Ties go to the first token, as in torch's argmax."""
    offs_d = tl.arange(0, BLOCK_D)
    best = tl.full([BLOCK_Q], float("-inf"), dtype=tl.float32)
    arg = tl.full([BLOCK_Q], -1, dtype=tl.int64)
    n_masked = tl.zeros([1], dtype=tl.int32)
    for db in range(0, d_n, BLOCK_D):
        cols = db + offs_d
        ok = cols < d_n
        dt = tl.load(D + (d_start + cols)[None, :] * DIM + offs_c[:, None], mask=c_ok[:, None] & ok[None, :], other=0.0)
        if UPCAST:
            dt = dt.to(tl.float32)
        if HAS_DMASK:
            dm_ok = tl.load(DM + d_start + cols, mask=ok, other=0) != 0
            if MASK_ZERO:
                n_masked += tl.sum((ok & ~dm_ok).to(tl.int32), axis=0)
            ok = ok & dm_ok
        if IEEE:  # fp32 inputs: full-precision products (TF32 would move near-ties)
            s = tl.dot(q, dt, input_precision="ieee", out_dtype=tl.float32)
        else:
            s = tl.dot(q, dt, out_dtype=tl.float32)
        s = tl.where(ok[None, :], s, float("-inf"))
        m, idx = tl.max(s, axis=1, return_indices=True, return_indices_tie_break_left=True)
        better = m > best  # strictly: the first maximal token wins
        best = tl.where(better, m, best)
        arg = tl.where(better, d_start + db + idx.to(tl.int64), arg)
    if MASK_ZERO:
        zero_wins = (tl.sum(n_masked, axis=0) > 0) & (best < 0)
        best = tl.where(zero_wins, 0.0, best)
        arg = tl.where(zero_wins, -1, arg)
    return best, arg


@triton.jit
def _fwd_argmax_kernel(
    Q, QM, q_off, D, DM, d_off, Out, Arg,
    n_k, lq_max,
    PER_QUERY: tl.constexpr, HAS_QMASK: tl.constexpr, HAS_DMASK: tl.constexpr,
    DIM: tl.constexpr, BLOCK_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr,
    UPCAST: tl.constexpr, IEEE: tl.constexpr, MASK_ZERO: tl.constexpr,
):
    qi = tl.program_id(0)
    k = tl.program_id(1)
    doc = qi * n_k + k if PER_QUERY else k
    q_start = tl.load(q_off + qi)
    q_n = tl.load(q_off + qi + 1) - q_start
    d_start = tl.load(d_off + doc)
    d_n = tl.load(d_off + doc + 1) - d_start
    offs_q = tl.arange(0, BLOCK_Q)
    offs_c = tl.arange(0, BLOCK_DIM)
    c_ok = offs_c < DIM
    total = tl.zeros([1], dtype=tl.float32)
    pair = qi.to(tl.int64) * n_k + k
    for qb in range(0, q_n, BLOCK_Q):
        rows = qb + offs_q
        r_ok = rows < q_n
        q = tl.load(Q + (q_start + rows)[:, None] * DIM + offs_c[None, :], mask=r_ok[:, None] & c_ok[None, :], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        if HAS_QMASK:
            r_ok = r_ok & (tl.load(QM + q_start + rows, mask=r_ok, other=0) != 0)
        best, arg = _best_in_doc(q, D, DM, d_start, d_n, offs_c, c_ok, DIM, BLOCK_Q, BLOCK_D, HAS_DMASK, UPCAST, IEEE,
                                 MASK_ZERO)
        valid = r_ok & (best > float("-inf"))
        total += tl.sum(tl.where(valid, best, 0.0), axis=0)
        tl.store(Arg + pair * lq_max + rows, tl.where(valid, arg, -1).to(tl.int32), mask=rows < q_n)
    tl.store(Out + pair + tl.arange(0, 1), total)


@triton.jit
def _fwd_argmax_grouped_kernel(
    Q, QM, D, DM, d_off, Out, Arg,
    n_q, n_k, lq,
    GROUP: tl.constexpr, HAS_QMASK: tl.constexpr, HAS_DMASK: tl.constexpr,
    DIM: tl.constexpr, BLOCK_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr,
    UPCAST: tl.constexpr, IEEE: tl.constexpr, MASK_ZERO: tl.constexpr,
):
    """Cross product of short equal-length queries: GROUP queries (GROUP * lq <= BLOCK_Q rows)
    against one document per program, so each document tile is loaded once for the group."""
    g0 = tl.program_id(0) * GROUP
    k = tl.program_id(1)
    d_start = tl.load(d_off + k)
    d_n = tl.load(d_off + k + 1) - d_start
    rows = tl.arange(0, BLOCK_Q)
    qloc = rows // lq
    in_group = (qloc < GROUP) & (g0 + qloc < n_q)
    r_ok = in_group
    q_row = g0.to(tl.int64) * lq + rows
    offs_c = tl.arange(0, BLOCK_DIM)
    c_ok = offs_c < DIM
    q = tl.load(Q + q_row[:, None] * DIM + offs_c[None, :], mask=r_ok[:, None] & c_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    if HAS_QMASK:
        r_ok = r_ok & (tl.load(QM + q_row, mask=r_ok, other=0) != 0)
    best, arg = _best_in_doc(q, D, DM, d_start, d_n, offs_c, c_ok, DIM, BLOCK_Q, BLOCK_D, HAS_DMASK, UPCAST, IEEE,
                             MASK_ZERO)
    valid = r_ok & (best > float("-inf"))
    contrib = tl.where(valid, best, 0.0)
    pair = (g0 + qloc).to(tl.int64) * n_k + k
    tl.store(Arg + pair * lq + (rows - qloc * lq), tl.where(valid, arg, -1).to(tl.int32), mask=in_group)
    for g in tl.static_range(GROUP):
        tot = tl.sum(tl.where(qloc == g, contrib, 0.0), axis=0)
        if g0 + g < n_q:
            tl.store(Out + (g0 + g).to(tl.int64) * n_k + k, tot)


@triton.jit
def _bwd_unified_kernel(
    Q, q_off, D, Arg, G, dQ, dD, n_k, lq_max,
    DIM: tl.constexpr, BLOCK_DIM: tl.constexpr, BLOCK_Q: tl.constexpr,
):
    qi = tl.program_id(0)
    k = tl.program_id(1)
    pair = qi.to(tl.int64) * n_k + k
    g = tl.load(G + pair)
    q_start = tl.load(q_off + qi)
    q_n = tl.load(q_off + qi + 1) - q_start
    offs_q = tl.arange(0, BLOCK_Q)
    offs_c = tl.arange(0, BLOCK_DIM)
    c_ok = offs_c < DIM
    for qb in range(0, q_n, BLOCK_Q):
        rows = qb + offs_q
        a = tl.load(Arg + pair * lq_max + rows, mask=rows < q_n, other=-1).to(tl.int64)
        ok = a >= 0
        m2 = ok[:, None] & c_ok[None, :]
        d = tl.load(D + a[:, None] * DIM + offs_c[None, :], mask=m2, other=0.0).to(tl.float32)
        q = tl.load(Q + (q_start + rows)[:, None] * DIM + offs_c[None, :], mask=m2, other=0.0).to(tl.float32)
        tl.atomic_add(dQ + (q_start + rows)[:, None] * DIM + offs_c[None, :], g * d, mask=m2)
        tl.atomic_add(dD + a[:, None] * DIM + offs_c[None, :], g * q, mask=m2)


@triton.jit
def _bwd_lowmem_dq_kernel(
    D, Arg, G, q_off, dQ, n_k, lq_max, k_per_split, split_stride,
    DIM: tl.constexpr, BLOCK_DIM: tl.constexpr, BLOCK_Q: tl.constexpr,
):
    """dQ rows of query i, tokens [qb, qb + BLOCK_Q): sum over its pairs of g * D[argmax]; split
    ``sp`` takes pairs [sp * k_per_split, ...) and writes its own slice (summed after, in order)."""
    qi = tl.program_id(0)
    qb = tl.program_id(1) * BLOCK_Q
    sp = tl.program_id(2)
    dQ += sp.to(tl.int64) * split_stride
    q_start = tl.load(q_off + qi)
    q_n = tl.load(q_off + qi + 1) - q_start
    if qb < q_n:
        rows = qb + tl.arange(0, BLOCK_Q)
        r_ok = rows < q_n
        offs_c = tl.arange(0, BLOCK_DIM)
        c_ok = offs_c < DIM
        acc = tl.zeros([BLOCK_Q, BLOCK_DIM], dtype=tl.float32)
        for k in range(sp * k_per_split, tl.minimum(n_k, (sp + 1) * k_per_split)):
            pair = qi.to(tl.int64) * n_k + k
            g = tl.load(G + pair)
            a = tl.load(Arg + pair * lq_max + rows, mask=r_ok, other=-1).to(tl.int64)
            ok = (a >= 0)[:, None] & c_ok[None, :]
            acc += g * tl.load(D + a[:, None] * DIM + offs_c[None, :], mask=ok, other=0.0).to(tl.float32)
        tl.store(dQ + (q_start + rows)[:, None] * DIM + offs_c[None, :], acc.to(dQ.dtype.element_ty),
                 mask=r_ok[:, None] & c_ok[None, :])


@triton.jit
def _bwd_lowmem_dd_kernel(
    Q, q_off, d_off, Arg, G, dD, n_q, n_k, lq_max, q_per_split, split_stride,
    PER_QUERY: tl.constexpr, DIM: tl.constexpr, BLOCK_DIM: tl.constexpr, BLOCK_J: tl.constexpr,
    BLOCK_T: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
):
    """dD rows of document ``doc``, tokens [jb, jb + BLOCK_J): over the queries scoring it, the
    one-hot (argmax == token) matrix times the query tokens, times g."""
    doc = tl.program_id(0)
    jb = tl.program_id(1) * BLOCK_J
    sp = tl.program_id(2)
    dD += sp.to(tl.int64) * split_stride
    d_start = tl.load(d_off + doc)
    d_n = tl.load(d_off + doc + 1) - d_start
    if jb < d_n:
        js = jb + tl.arange(0, BLOCK_J)
        j_ok = js < d_n
        offs_t = tl.arange(0, BLOCK_T)
        offs_c = tl.arange(0, BLOCK_DIM)
        c_ok = offs_c < DIM
        acc = tl.zeros([BLOCK_J, BLOCK_DIM], dtype=tl.float32)
        if PER_QUERY:
            i0 = doc // n_k
            i1 = i0 + 1
        else:
            i0 = sp * q_per_split
            i1 = tl.minimum(n_q, (sp + 1) * q_per_split)
        for qi in range(i0, i1):
            if PER_QUERY:
                pair = (qi * n_k + doc % n_k).to(tl.int64)
            else:
                pair = (qi * n_k + doc).to(tl.int64)
            g = tl.load(G + pair)
            q_start = tl.load(q_off + qi)
            q_n = tl.load(q_off + qi + 1) - q_start
            for tb in range(0, q_n, BLOCK_T):
                ts = tb + offs_t
                t_ok = ts < q_n
                a = tl.load(Arg + pair * lq_max + ts, mask=t_ok, other=-1).to(tl.int64)
                q = tl.load(Q + (q_start + ts)[:, None] * DIM + offs_c[None, :], mask=t_ok[:, None] & c_ok[None, :],
                            other=0.0)
                if UPCAST:
                    q = q.to(tl.float32)
                hit = (a[None, :] == (d_start + js)[:, None]).to(q.dtype)  # [BJ, BT]
                if IEEE:
                    acc += g * tl.dot(hit, q, input_precision="ieee", out_dtype=tl.float32)
                else:
                    acc += g * tl.dot(hit, q, out_dtype=tl.float32)
        tl.store(dD + (d_start + js)[:, None] * DIM + offs_c[None, :], acc.to(dD.dtype.element_ty),
                 mask=j_ok[:, None] & c_ok[None, :])


def _blocks(dim: int, lq: int = 32) -> tuple[int, int, int]:
    """(BLOCK_DIM, BLOCK_Q, BLOCK_D): query blocks as long as the queries up to 128 (long queries
    are compute-bound and want big tiles; short ones are latency-bound)."""
    bdim = max(16, triton.next_power_of_2(dim))
    if interpreting():
        return bdim, 16, 16
    return bdim, min(128, max(32, triton.next_power_of_2(lq))), 64


def _splits(programs: int, loop: int, slice_bytes: int, budget: int = 256 << 20) -> int:
    """How many slices to split a lowmem reduction loop of ``loop`` steps into: enough programs to
    fill the GPU (about 1,024), at least 32 steps a slice, fp32 slices within ``budget`` bytes."""
    if interpreting():
        return 2 if loop >= 2 else 1  # exercise the split path in the CPU tests
    want = max(1, min(8, 1024 // max(1, programs), loop // 32, budget // max(1, slice_bytes)))
    return want


def grouped_queries(lq: int, per_query: bool, equal_lengths: bool, n_q: int) -> int:
    """Queries per program in the cross-product forward: short equal-length (padded) queries share
    each document tile (GROUP * lq <= 128 rows); 1 otherwise."""
    if per_query or not equal_lengths or lq == 0 or lq > 64 or n_q < 2:
        return 1
    return max(1, min(n_q, (16 if interpreting() else 128) // lq))


def forward(q, q_off, d, d_off, n_q, n_k, lq_max, per_query, q_mask=None, d_mask=None, mask_zero=False,
            equal_lengths=False):
    """Scores [n_q, n_k] float32 and the winners Arg [n_q, n_k, lq_max] int32 (token index into
    the packed d, -1 for masked query tokens and when no document token is valid)."""
    bdim, bq, bd = _blocks(q.shape[1], lq_max)
    out = torch.empty(n_q, n_k, dtype=torch.float32, device=q.device)
    arg = torch.full((n_q, n_k, max(1, lq_max)), -1, dtype=torch.int32, device=q.device)
    upcast = interpreting() or q.dtype == torch.float32
    group = grouped_queries(lq_max, per_query, equal_lengths, n_q)
    if n_q and n_k and group > 1:
        rows = triton.next_power_of_2(group * lq_max)
        _fwd_argmax_grouped_kernel[(triton.cdiv(n_q, group), n_k)](
            q, q_mask if q_mask is not None else q, d, d_mask if d_mask is not None else d, d_off, out, arg,
            n_q, n_k, lq_max, GROUP=group, HAS_QMASK=q_mask is not None, HAS_DMASK=d_mask is not None,
            DIM=q.shape[1], BLOCK_DIM=bdim, BLOCK_Q=rows, BLOCK_D=bd, UPCAST=upcast, IEEE=q.dtype == torch.float32,
            MASK_ZERO=mask_zero, num_warps=8 if rows >= 128 else 4, num_stages=3,
        )
    elif n_q and n_k:
        _fwd_argmax_kernel[(n_q, n_k)](
            q, q_mask if q_mask is not None else q, q_off, d, d_mask if d_mask is not None else d, d_off, out, arg,
            n_k, arg.shape[2], PER_QUERY=per_query, HAS_QMASK=q_mask is not None, HAS_DMASK=d_mask is not None,
            DIM=q.shape[1], BLOCK_DIM=bdim, BLOCK_Q=bq, BLOCK_D=bd, UPCAST=upcast, IEEE=q.dtype == torch.float32,
            MASK_ZERO=mask_zero, num_warps=8 if bq >= 128 else 4, num_stages=3,
        )
    return out, arg


def backward(kind, grad, q, q_off, d, d_off, arg, n_q, n_k, per_query, need_dq=True, need_dd=True):
    """(dQ, dD) for packed q [Tq, dim] and d [Td, dim], as the inputs' dtypes."""
    bdim, bq, _ = _blocks(q.shape[1])
    g = grad.float().contiguous()
    lq_max = arg.shape[2]
    if kind == "unified":
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dd = torch.zeros(d.shape, dtype=torch.float32, device=q.device)
        if n_q and n_k:
            _bwd_unified_kernel[(n_q, n_k)](q, q_off, d, arg, g, dq, dd, n_k, lq_max, DIM=q.shape[1], BLOCK_DIM=bdim,
                                            BLOCK_Q=bq, num_warps=4)
        return dq.to(q.dtype) if need_dq else None, dd.to(d.dtype) if need_dd else None
    dq = dd = None
    if need_dq:
        # few queries: split each query's pairs over programs, fp32 slices summed in a fixed order
        splits = _splits(n_q * triton.cdiv(lq_max, bq), n_k, q.numel() * 4)
        dq = torch.zeros_like(q) if splits == 1 else torch.zeros((splits, *q.shape), dtype=torch.float32, device=q.device)
        if n_q and n_k:
            _bwd_lowmem_dq_kernel[(n_q, triton.cdiv(lq_max, bq), splits)](
                d, arg, g, q_off, dq, n_k, lq_max, triton.cdiv(n_k, splits), q.numel(), DIM=q.shape[1],
                BLOCK_DIM=bdim, BLOCK_Q=bq, num_warps=4)
        if splits > 1:
            dq = dq.sum(0).to(q.dtype)
    if need_dd:
        n_docs = d_off.numel() - 1
        ld_max = int((d_off[1:] - d_off[:-1]).max()) if n_docs else 0
        bj = 16 if interpreting() else 64
        splits = 1 if per_query else _splits(n_docs * triton.cdiv(max(ld_max, 1), bj), n_q, d.numel() * 4)
        dd = torch.zeros_like(d) if splits == 1 else torch.zeros((splits, *d.shape), dtype=torch.float32, device=d.device)
        if n_q and n_k and ld_max:
            _bwd_lowmem_dd_kernel[(n_docs, triton.cdiv(ld_max, bj), splits)](
                q, q_off, d_off, arg, g, dd, n_q, n_k, lq_max, triton.cdiv(n_q, splits), d.numel(),
                PER_QUERY=per_query, DIM=q.shape[1], BLOCK_DIM=bdim,
                BLOCK_J=bj, BLOCK_T=16 if interpreting() else 32, UPCAST=interpreting() or q.dtype == torch.float32,
                IEEE=q.dtype == torch.float32, num_warps=4,
            )
        if splits > 1:
            dd = dd.sum(0).to(d.dtype)
    return dq, dd


class _MaxSimFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, d, q_off, d_off, n_q, n_k, lq_max, per_query, q_mask, d_mask, kind, mask_zero=False,
                equal_lengths=False):
        out, arg = forward(q, q_off, d, d_off, n_q, n_k, lq_max, per_query, q_mask, d_mask, mask_zero, equal_lengths)
        ctx.save_for_backward(q, d, q_off, d_off, arg)
        ctx.meta = (n_q, n_k, per_query, kind)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, d, q_off, d_off, arg = ctx.saved_tensors
        n_q, n_k, per_query, kind = ctx.meta
        dq, dd = backward(kind, grad, q, q_off, d, d_off, arg, n_q, n_k, per_query,
                          ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        return dq, dd, None, None, None, None, None, None, None, None, None, None, None


def choose_backward(kind: str, n_pairs: int, lq: int) -> str:
    """``auto``: lowmem. On the H100 (benchmarks/training.py) it was as fast or faster than
    unified on all three measured shapes (ColBERT in-batch 1.85 vs 2.84 ms, hard negatives 1.55
    vs 2.30, ColPali 7.35 vs 7.52) and it is deterministic; no shape measured so far favours
    unified, so ``auto`` does not switch yet."""
    return "lowmem" if kind == "auto" else kind


def _flat_mask(mask):
    return None if mask is None else mask.reshape(-1).to(torch.uint8).contiguous()


def padded(Q, D, q_mask, d_mask, kind: str, mask_zero: bool = False) -> torch.Tensor:
    """Differentiable MaxSim of padded Q [Nq, Lq, d] against D [Nd, Ld, d] or [Nq, K, Ld, d].
    ``mask_zero``: a masked document token counts as similarity 0 (PyLate's semantics) instead of
    being left out."""
    nq, lq, dim = Q.shape
    per_query = D.dim() == 4
    n_k, ld = D.shape[-3], D.shape[-2]
    n_docs = D.shape[0] * (D.shape[1] if per_query else 1)
    dev = Q.device
    q_off = torch.arange(nq + 1, device=dev, dtype=torch.int64) * lq
    d_off = torch.arange(n_docs + 1, device=dev, dtype=torch.int64) * ld
    kind = choose_backward(kind, nq * n_k, lq)
    return _MaxSimFn.apply(Q.reshape(-1, dim).contiguous(), D.reshape(-1, dim).contiguous(), q_off, d_off, nq, n_k,
                           lq, per_query, _flat_mask(q_mask), _flat_mask(d_mask), kind, mask_zero, True)


def varlen(q, cu_q, d, cu_d, max_seqlen_q: int, kind: str) -> torch.Tensor:
    """Differentiable MaxSim of packed queries against packed documents (cross product)."""
    nq, nd = cu_q.numel() - 1, cu_d.numel() - 1
    kind = choose_backward(kind, nq * nd, max_seqlen_q)
    return _MaxSimFn.apply(q.contiguous(), d.contiguous(), cu_q.long(), cu_d.long(), nq, nd, max_seqlen_q, False,
                           None, None, kind)
