"""Host code of differentiable MaxSim: the forward and backward launchers, the autograd Function
and the padded / varlen entry points (called by mvdb.kernels.maxsim.ops)."""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch
from mvdb.kernels.maxsim.runtime import _stream_handle, cdiv, interpreting, launch_kernel, pow2
from mvdb.kernels.maxsim.train.fused import (
    _bwd_cross_dd_kernel,
    _bwd_lowmem_dd_kernel,
    _bwd_lowmem_dq_kernel,
    _bwd_perdoc_dd_kernel,
    _bwd_unified_kernel,
    _fwd_argmax_grouped_kernel,
    _fwd_argmax_kernel,
    _hit_prep_kernel,
)
from mvdb.kernels.maxsim.train.naive import _project_rows
from mvdb.kernels.maxsim.train.policy import (
    CROSS_BLOCK,
    TUNE,
    _blocks,
    _splits,
    auto_key,
    choose_backward,
    grouped_queries,
    measured_backward,
)


def forward(q, q_off, d, d_off, n_q, n_k, lq_max, per_query, q_mask=None, d_mask=None, mask_zero=False,
            equal_lengths=False, normalize=False):
    """Scores [n_q, n_k] float32, the winners Arg [n_q, n_k, lq_max] int32 (token index into the
    packed d, -1 for masked query tokens and when no document token is valid) and, with
    ``normalize``, the clamped L2 norms of q's and d's rows (float32; else None)."""
    bdim, bq, bd = _blocks(q.shape[1], lq_max)
    out = torch.empty(n_q, n_k, dtype=torch.float32, device=q.device)
    # equal lengths: the kernels write every (pair, token) entry, -1 included (no fill launch)
    shape = (n_q, n_k, max(1, lq_max))
    arg = torch.empty(shape, dtype=torch.int32, device=q.device) if equal_lengths and lq_max > 0 else \
        torch.full(shape, -1, dtype=torch.int32, device=q.device)
    # norms from the tiles, inside the kernels (a norm pass before them makes the step much slower)
    nq = torch.ones(q.shape[0], dtype=torch.float32, device=q.device) if normalize else None
    nd = torch.ones(d.shape[0], dtype=torch.float32, device=q.device) if normalize else None
    upcast = interpreting() or q.dtype == torch.float32
    group = grouped_queries(lq_max, per_query, equal_lengths, n_q)
    common = dict(HAS_QMASK=q_mask is not None, HAS_DMASK=d_mask is not None, DIM=q.shape[1], BLOCK_DIM=bdim,
                  BLOCK_D=bd, UPCAST=upcast, IEEE=q.dtype == torch.float32, MASK_ZERO=mask_zero, NORM=normalize)
    # 2 stages for the grouped short-query kernel, 3 for the others (the faster of the sweep)
    stages = TUNE.get("fwd_stages", 2 if group > 1 else 3)
    qm = q_mask if q_mask is not None else q
    dm = d_mask if d_mask is not None else d
    if n_q and n_k and group > 1:
        rows = pow2(group * lq_max)
        launch_kernel(
            _fwd_argmax_grouped_kernel, (cdiv(n_q, group), n_k),
            (q, qm, d, dm, d_off, out, arg, nq if normalize else out, nd if normalize else out, n_q, n_k, lq_max),
            # 4 warps: a little faster than 8 on the ColBERT step
            dict(GROUP=group, BLOCK_Q=rows, num_warps=TUNE.get("fwd_warps", 4), num_stages=stages, **common),
        )
    elif n_q and n_k:
        launch_kernel(
            _fwd_argmax_kernel, (n_q, n_k),
            (q, qm, q_off, d, dm, d_off, out, arg, nq if normalize else out, nd if normalize else out, n_k,
             arg.shape[2]),
            dict(PER_QUERY=per_query, BLOCK_Q=bq, num_warps=TUNE.get("fwd_warps", 8 if bq >= 128 else 4),
                 num_stages=stages, **common),
        )
    return out, arg, nq, nd


def backward(kind, grad, q, q_off, d, arg, n_q, n_k, need_dq=True, need_dd=True, norms=None, covered=False,
             per_query=False, q_mask=None):
    """(dQ, dD) for packed q [Tq, dim] and d [Td, dim], as the inputs' dtypes. ``norms``: (nq, nd)
    from a normalising forward. ``covered``: the padded layout (query i is rows [i * lq, (i + 1) *
    lq) of q with lq = arg.shape[2], and every document has the same number of rows), so dQ needs
    no zero fill and dD may take a sort-free path. dD needs no document offsets otherwise: the
    winners are token indices. ``per_query``: d holds one padded document per (query, k) pair, in
    pair order. ``q_mask``: the forward's query mask (flat, bool or nonzero = scored), if any:
    the rows behind it may hold anything, NaN included (used by the cross-product dD)."""
    bdim, bq, _ = _blocks(q.shape[1])
    g = grad.float().contiguous()
    lq_max = arg.shape[2]
    norm = norms is not None
    nq, nd = norms if norm else (q, d)
    dev = q.device
    if kind == "unified":
        dq = torch.zeros(q.shape, dtype=torch.float32, device=dev)
        dd = torch.zeros(d.shape, dtype=torch.float32, device=dev)
        if n_q and n_k:
            launch_kernel(_bwd_unified_kernel, (n_q, n_k), (q, q_off, d, arg, g, dq, dd, nq, nd, n_k, lq_max),
                          dict(DIM=q.shape[1], BLOCK_DIM=bdim, BLOCK_Q=bq, NORM=norm, num_warps=4))
        if norm:
            dq, dd = _project_rows(dq, q, nq), _project_rows(dd, d, nd)
        return dq.to(q.dtype) if need_dq else None, dd.to(d.dtype) if need_dd else None
    dq = dd = None
    work = n_q and n_k
    if need_dq:
        # few queries: split each query's pairs over programs, fp32 slices summed in a fixed order
        bq_dq = TUNE.get("dq_bq", bq)
        if "dq_bq" not in TUNE and not interpreting():
            # too few programs to fill the GPU: shorter query blocks first (cheaper), then slices
            # summed after (two more launches)
            while bq_dq > 8 and n_q * cdiv(lq_max, bq_dq) < 1024:
                bq_dq //= 2
        splits = TUNE.get("dq_splits") or _splits(n_q * cdiv(lq_max, bq_dq), n_k, q.numel() * 4,
                                                 min_steps=TUNE.get("dq_min_steps", 32))
        fill = torch.empty if covered and work else torch.zeros
        dq = fill(q.shape, dtype=q.dtype, device=dev) if splits == 1 else \
            fill((splits, *q.shape), dtype=torch.float32, device=dev)
        if work:
            launch_kernel(
                _bwd_lowmem_dq_kernel, (n_q, cdiv(lq_max, bq_dq), splits),
                (q, d, arg, g, q_off, dq, nq, nd, n_k, lq_max, cdiv(n_k, splits), q.numel()),
                dict(DIM=q.shape[1], BLOCK_DIM=bdim, BLOCK_Q=bq_dq, NORM=norm, num_warps=TUNE.get("dq_warps", 2)))
        if splits > 1:
            dq = dq.sum(0).to(q.dtype)
    if need_dd and per_query and covered and lq_max <= 128 and n_q * n_k and d.shape[0] % (n_q * n_k) == 0 \
            and TUNE.get("dd_perdoc", 1):
        # per-query documents: each document's hits are its own pair's winners (no sort)
        dd = torch.empty_like(d)
        if d.shape[0]:
            launch_kernel(
                _bwd_perdoc_dd_kernel, (n_q * n_k,),
                (q, q_off, d, arg, g, dd, nq, nd, n_k, lq_max, d.shape[0] // (n_q * n_k)),
                dict(NORM=norm, DIM=q.shape[1], BLOCK_DIM=bdim, BLOCK_T=max(16, pow2(lq_max)),
                     BLOCK_J=16 if interpreting() else TUNE.get("perdoc_bj", 64),
                     num_warps=TUNE.get("perdoc_warps", 4)))
    elif need_dd and covered and not per_query and not norm and lq_max <= 128 and n_q * n_k \
            and q.shape[0] == n_q * lq_max and d.shape[0] % n_k == 0 and TUNE.get("dd_cross", 1):
        # padded cross product: per document row block, the queries' picks in order (no sort)
        ld = d.shape[0] // n_k
        bj = 16 if interpreting() else TUNE.get("cross_bj", CROSS_BLOCK)
        dd = torch.empty_like(d)
        # the kernel reads every query row (not only those with a winner: that load would wait on
        # the winners'), so the rows a mask hides are zeroed in a copy (padding may hold NaN)
        q_rows = q if q_mask is None else torch.where(q_mask.bool()[:, None], q, 0)
        if d.shape[0]:
            launch_kernel(
                _bwd_cross_dd_kernel, (n_k, cdiv(ld, bj)), (q_rows, arg, g, dd, n_q, n_k, lq_max, ld),
                dict(DIM=q.shape[1], BLOCK_DIM=bdim, BLOCK_T=max(16, pow2(lq_max)), BLOCK_J=bj,
                     IEEE=q.dtype == torch.float32 or interpreting(),
                     num_warps=TUNE.get("cross_warps", 4), num_stages=TUNE.get("cross_stages", 3)))
    elif need_dd:
        # the hits sorted by the document token they picked (stable: a fixed summation order)
        keys, order = torch.sort(arg.view(-1), stable=True)
        n_slots = keys.numel()
        rows = torch.empty(n_slots, dtype=torch.int32, device=dev)
        weights = torch.empty(n_slots, dtype=torch.float32, device=dev)
        launch_kernel(_hit_prep_kernel, (cdiv(n_slots, 1024),),
                      (order, keys, q_off, g, nq, rows, weights, n_slots, n_k, lq_max), dict(NORM=norm, BLOCK=1024))
        # fewer hits than document tokens (per-query negatives): zero-fill, then write the rows hit
        sparse = n_slots < d.shape[0] // 2
        if sparse:  # per slot: where its token's hits end
            bounds = torch.searchsorted(keys, keys, right=True)
        else:  # per token: where its hits start
            bounds = torch.searchsorted(keys, torch.arange(d.shape[0] + 1, device=dev, dtype=keys.dtype))
        dd = torch.zeros_like(d) if sparse else torch.empty_like(d)
        if d.shape[0]:
            bj = 16 if interpreting() else TUNE.get("dd_bj", 128 if sparse else 32)  # the sweep's fastest
            launch_kernel(
                _bwd_lowmem_dd_kernel, (cdiv(n_slots if sparse else d.shape[0], bj),),
                (q, keys, bounds, rows, weights, d, dd, nd, d.shape[0], n_slots),
                dict(SPARSE=sparse, NORM=norm, DIM=q.shape[1], BLOCK_DIM=bdim, BLOCK_J=bj,
                     BLOCK_H=16 if interpreting() else TUNE.get("dd_bh", 128),
                     LIGHT=4 if interpreting() else TUNE.get("dd_light", 256), num_warps=TUNE.get("dd_warps", 4)),
            )
    return dq, dd


class _MaxSimFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, d, q_off, d_off, n_q, n_k, lq_max, per_query, q_mask, d_mask, kind, mask_zero=False,
                equal_lengths=False, normalize=False, auto=None, q_keep=None):
        out, arg, nq, nd = forward(q, q_off, d, d_off, n_q, n_k, lq_max, per_query, q_mask, d_mask, mask_zero,
                                   equal_lengths, normalize)
        # ``q_keep``: the caller's query mask as flat bool (True = scored), which the cross-product
        # dD needs to zero the rows it hides (saved, so an in-place change of it is caught)
        if normalize:
            ctx.save_for_backward(q, d, q_off, arg, q_keep, nq, nd)
        else:
            ctx.save_for_backward(q, d, q_off, arg, q_keep)
        # padded layouts (equal_lengths) tile q exactly; ``auto``: the shape bucket (policy.auto_key)
        # where ``kind`` is auto's static pick and the backward is to be measured
        ctx.meta = (n_q, n_k, kind, equal_lengths, per_query, auto)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, d, q_off, arg, q_keep, *norms = ctx.saved_tensors
        n_q, n_k, kind, covered, per_query, auto = ctx.meta
        need = ctx.needs_input_grad[0], ctx.needs_input_grad[1]

        def run(kind):
            return backward(kind, grad, q, q_off, d, arg, n_q, n_k, *need, tuple(norms) if norms else None, covered,
                            per_query, q_keep)

        if auto is None:
            dq, dd = run(kind)
        else:
            dq, dd = measured_backward(auto + need, run, kind, q.device)
        return dq, dd, None, None, None, None, None, None, None, None, None, None, None, None, None, None


def _flat_mask(mask):
    """A mask as flat uint8 for the kernels (nonzero = valid): a bool mask (all the public checks
    admit) as a view, no launch (a strided one is copied once); another dtype converted."""
    if mask is None:
        return None
    flat = mask.reshape(-1)
    return flat.contiguous().view(torch.uint8) if flat.dtype == torch.bool else flat.to(torch.uint8).contiguous()


# The padded layout's row offsets, kept per (device, stream, n, step) on CUDA: a training step
# would otherwise spend two launches of its own on them. Never written after they are made. Not
# kept (nor read) while a CUDA graph is captured (the tensor would live in the graph's pool and
# an evicted one could be freed under it), while torch.compile traces, or in inference mode
# (an inference tensor cannot be saved for a later backward).
_STEPS: OrderedDict = OrderedDict()
_STEPS_MAX = 64
_STEPS_LOCK = threading.Lock()


def _arange_steps(n: int, step: int, dev) -> torch.Tensor:
    """[0, step, ..., n * step] int64 in one launch (not an arange and a multiply)."""
    if step == 0:
        return torch.zeros(n + 1, dtype=torch.int64, device=dev)
    return torch.arange(0, (n + 1) * step, step, device=dev, dtype=torch.int64)


def _steps(n: int, step: int, dev: torch.device) -> torch.Tensor:
    """[0, step, ..., n * step] int64, from the cache where it may be kept (above)."""
    if dev.type != "cuda" or torch.is_inference_mode_enabled() or torch.cuda.is_current_stream_capturing() \
            or torch.compiler.is_compiling():
        return _arange_steps(n, step, dev)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    key = (index, _stream_handle(index), n, step)
    with _STEPS_LOCK:
        hit = _STEPS.get(key)
        if hit is not None:
            _STEPS.move_to_end(key)
            return hit
    made = _arange_steps(n, step, dev)
    with _STEPS_LOCK:
        _STEPS[key] = made
        while len(_STEPS) > _STEPS_MAX:
            _STEPS.popitem(last=False)
    return made


def padded(Q, D, q_mask, d_mask, kind: str, mask_zero: bool = False, normalize: bool = False) -> torch.Tensor:
    """Differentiable MaxSim of padded Q [Nq, Lq, d] against D [Nd, Ld, d] or [Nq, K, Ld, d].
    ``mask_zero``: a masked document token counts as similarity 0 (PyLate's semantics) instead of
    being left out. ``normalize``: of the L2-normalised tokens, inside the kernels."""
    nq, lq, dim = Q.shape
    per_query = D.dim() == 4
    n_k, ld = D.shape[-3], D.shape[-2]
    n_docs = D.shape[0] * (D.shape[1] if per_query else 1)
    dev = Q.device
    q_off, d_off = _steps(nq, lq, dev), _steps(n_docs, ld, dev)
    # auto, in-batch: measured in the backward (the static rule where it cannot be). Per-query
    # negatives keep the static rule (lowmem): faster on every such shape, with no fp32 gradient
    # of every document to allocate. Empty batches have nothing to measure.
    auto = auto_key(dev, Q.dtype, dim, normalize, nq, n_k, lq, ld, q_mask is not None, d_mask is not None) \
        if kind == "auto" and not per_query and nq * n_k * lq * ld else None
    kind = choose_backward(kind, per_query, lq, ld, n_q=nq, n_k=n_k)
    # the in-batch dD (the sort-free cross-product path) zeroes the rows a query mask hides: it
    # gets the caller's bool mask (a view: one `where` in the backward, no conversion)
    q_keep = q_mask.reshape(-1) if q_mask is not None and not per_query and not normalize else None
    return _MaxSimFn.apply(Q.reshape(-1, dim).contiguous(), D.reshape(-1, dim).contiguous(), q_off, d_off, nq, n_k,
                           lq, per_query, _flat_mask(q_mask), _flat_mask(d_mask), kind, mask_zero, True, normalize,
                           auto, q_keep)


def varlen(q, cu_q, d, cu_d, max_seqlen_q: int, kind: str, normalize: bool = False) -> torch.Tensor:
    """Differentiable MaxSim of packed queries against packed documents (cross product)."""
    nq, nd = cu_q.numel() - 1, cu_d.numel() - 1
    kind = choose_backward(kind, False, max_seqlen_q, d.shape[0] / max(1, nd), padded=False,
                           n_hits=nq * nd * max_seqlen_q, doc_elems=d.numel())
    return _MaxSimFn.apply(q.contiguous(), d.contiguous(), cu_q.long(), cu_d.long(), nq, nd, max_seqlen_q, False,
                           None, None, kind, False, False, normalize)
