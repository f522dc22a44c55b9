"""The MaxSim kernel's host function: check what the public functions cannot, decide the query
split and where int8 queries are quantized, and launch (the autotuned config, or a fixed one)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from mvdb.kernels.maxsim import tuning
from mvdb.kernels.maxsim.kernel import CSR_CAND, _maxsim_fwd_kernel
from mvdb.kernels.maxsim.query_quant import (
    _GEN,
    QCACHE_PREFETCH,
    _query_cache,
    quantize_in_kernel,
    quantize_queries,
    share_in_kernel,
)
from mvdb.kernels.maxsim.runtime import (
    _NO_GUARD,
    _current_device,
    _keep_plan,
    interpreting,
    launch_guard,
    launch_kernel,
    pow2,
)
from mvdb.kernels.maxsim.tuning import (
    _BEST,
    _KEY,
    _TUNE_LOCK,
    _mean_doc_len,
    _tuned,
    autotuning,
    default_config,
    lq_bucket,
    pdl_ok,
    fits,
    query_chunks,
    store_winner,
    stored_winner,
)


class Geometry(NamedTuple):
    """What a launch covers: the document layout, the [n_q, n_k] output, the longest query and
    the padded lengths of the padded layouts."""

    layout: int  # kernel.PADDED_CROSS, PADDED_PER_QUERY, CSR_CROSS or CSR_CAND (or its int value)
    n_q: int
    n_k: int
    max_lq: int  # the longest query, or an estimate: it picks the config and the query split only
    q_len: int = 0  # padded query length (without cu_q)
    d_len: int = 0  # padded document length (PADDED_* layouts)


def launch(
    out: torch.Tensor,
    q: torch.Tensor,
    d: torch.Tensor,
    geometry: Geometry,
    *,
    q_mask: torch.Tensor | None = None,
    cu_q: torch.Tensor | None = None,
    d_scales: torch.Tensor | None = None,
    d_mask: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    cand: torch.Tensor | None = None,
    starts: torch.Tensor | None = None,
    scale_starts: torch.Tensor | None = None,
    config: dict | None = None,
) -> torch.Tensor:
    """Launch the kernel over an [n_q, n_k] output; arguments are already validated and contiguous.
    Query tokens ``q`` (padded [n_q, q_len, dim], or packed [Tq, dim] with ``cu_q``) and ``q_mask``;
    document tokens ``d`` with ``d_scales`` (int8) and ``d_mask`` (padded layouts); ``offsets``
    (CSR layouts) and ``cand`` (CSR_CAND) as in :func:`mvdb.kernels.maxsim_candidates`.
    ``starts`` / ``scale_starts`` (CSR_CAND only): a paged store's document rows (see PAGED).
    ``config`` (tests, benchmarks): launch with these BLOCK_Q/BLOCK_D/RUNMAX/num_warps/num_stages
    instead of the autotuned or default ones (and QUANT, to force where int8 queries are
    quantized; QCACHE, whether they are shared; QCHUNK, query rows per program, 0 for one program
    per pair, instead of :func:`tuning.query_chunks`' rule). INT8 documents: the query tokens are
    quantized by a kernel of their own before the launch, or, for launches of up to
    ``query_quant.QUANT_IN_KERNEL_WORK`` (:func:`query_quant.quantize_in_kernel`), inside it: by
    each program for its own block up to ``query_quant.SHARE_MIN_WORK``, above that by one program
    per query for all (QCACHE)."""
    n_q, n_k, max_lq = geometry.n_q, geometry.n_k, geometry.max_lq
    n = n_q * n_k
    layout = int(getattr(geometry.layout, "value", geometry.layout))
    if starts is not None and layout != int(CSR_CAND.value):
        raise ValueError("starts: only the candidate layout (CSR_CAND) reads a paged store")
    if n == 0:
        return out
    if n >= 2**31:
        raise ValueError(f"too many (query, document) pairs in one call: {n} (at most 2**31 - 1); split the batch")
    # no query is longer than all the query tokens: a generous max_seqlen_q adds no empty chunks
    lq = min(max_lq, q.shape[0] if cu_q is not None else geometry.q_len)
    forced = None if config is None else config.get("QCHUNK")  # benchmarks: force the split (0: off)
    if forced is None:
        chunks, rows = query_chunks(lq, _mean_doc_len(layout, d, offsets, geometry.d_len, starts)), tuning.QCHUNK_ROWS
    else:
        chunks, rows = (-(-lq // forced) if forced else 1), forced
    if chunks <= 1 or n * chunks >= 2**31:  # the split is a speed-up only: one program per pair instead
        chunks, rows = 1, 0
    other_gpu = out.is_cuda and out.device.index != _current_device()
    with torch.cuda.device(out.device) if other_gpu else _NO_GUARD:
        _launch(out, q, d, geometry, layout, config, chunks, rows, q_mask=q_mask, cu_q=cu_q, d_scales=d_scales,
                d_mask=d_mask, offsets=offsets, cand=cand, starts=starts, scale_starts=scale_starts)
    return out


def _launch(out, q, d, g: Geometry, layout: int, config, chunks: int, rows: int, *, q_mask, cu_q, d_scales, d_mask,
            offsets, cand, starts, scale_starts) -> None:
    n_q, n_k, max_lq = g.n_q, g.n_k, g.max_lq
    q_dtype = q.dtype  # the autotune key names the caller's query dtype
    dim = q.shape[-1]
    int8 = d.dtype == torch.int8
    q_scales = None
    config = dict(config) if config is not None else None
    forced = config.pop("QUANT", None) if config is not None else None
    shared = config.pop("QCACHE", None) if config is not None else None
    if config is not None:
        config.pop("QCHUNK", None)  # decided by launch: ``chunks`` programs of ``rows`` query rows per pair
    quant = int8 and (quantize_in_kernel(n_q * n_k, max_lq) if forced is None else bool(forced))
    qc = qcs = qflag = lock = None
    # shared where forced, or by default above SHARE_MIN_WORK; a chunk quantizes its own rows
    if quant and not rows and (shared or shared is None and share_in_kernel(n_q * n_k, max_lq)):
        qc, qcs, qflag, lock = _query_cache(q, n_q, force=bool(shared))
    # PDL only behind a quantization launch that runs (no rows: no launch to depend on)
    gdc = int8 and not quant and q.numel() > 0 and pdl_ok(q.device)
    into = None
    if int8 and not quant:
        # up to QCACHE_MAX_TOKENS query tokens the quantization launch writes into the stream's
        # buffer (no allocation: host time), under its lock together with the MaxSim launch, so
        # another thread's launches on the same stream cannot overwrite the rows in between; larger
        # batches get an allocation of their own, freed after the call (no large buffer is kept)
        c8, cs, _, lock = _query_cache(q, n_q)
        into = None if c8 is None else (c8, cs)
    part = out if not rows else torch.empty((chunks, n_q, n_k), dtype=torch.float32, device=out.device)
    meta = dict(
        LQ_BUCKET=lq_bucket(max_lq),
        DIM=dim,
        BLOCK_DIM=max(32, pow2(dim)),
        Q_VARLEN=cu_q is not None,
        D_LAYOUT=layout,
        HAS_QMASK=q_mask is not None,
        HAS_DMASK=d_mask is not None,
        INT8=int8,
        IEEE=d.dtype == torch.float32,
        # Triton's CPU interpreter computes bf16 x bf16 dots wrongly (triton 3.9): upcast there.
        UPCAST=d.dtype == torch.bfloat16 and interpreting(),
        PAGED=starts is not None,
        QUANT=quant,
        QCACHE=qc is not None,
        QCHUNK=rows,
        GDC=gdc,
        QPF=qc is not None and QCACHE_PREFETCH,
    )
    if gdc:
        meta["launch_pdl"] = True
    grid = (n_q * n_k * chunks,)
    # a shared buffer's launches draw their numbers and are enqueued in one order (under its lock)
    with lock if lock is not None else _NO_GUARD:
        if int8 and not quant:
            with launch_guard():
                q, q_scales = quantize_queries(q, gdc, into)
        gen = next(_GEN) if qc is not None else 0
        args = (
            q,
            q_scales,
            None if q_mask is None else q_mask.view(torch.uint8),
            cu_q,
            d,
            d_scales,
            None if d_mask is None else d_mask.view(torch.uint8),
            offsets,
            cand,
            starts,
            scale_starts,
            part,
            qc,
            qcs,
            qflag,
            n_q,
            n_k,
            g.q_len,
            g.d_len,
            gen,
            chunks,
        )
        if config is not None:
            with launch_guard():
                launch_kernel(_maxsim_fwd_kernel, grid, args, {**meta, **config})
        else:
            _run(grid, args, meta, out.device, q_dtype, d.dtype)
    if rows:
        torch.sum(part, 0, out=out.view(n_q, n_k))


# (autotuning, device, query dtype, document dtype, the launch's meta values) -> (the launch's
# constexprs and options: meta with its config, and their items): a launch whose config is known
# merges and lists them once (host time), not per call
_PLANS: dict[tuple, tuple[dict, tuple]] = {}
_PLANS_MAX = 256


def _run(grid, args, meta, device, q_dtype, d_dtype) -> None:
    tuned = autotuning()
    pkey = (tuned, device, q_dtype, d_dtype, *meta.values())
    plan = _PLANS.get(pkey)
    if plan is None:
        if tuned:
            key = (device, q_dtype, d_dtype, *(meta[k] for k in _KEY))
            best = _BEST.get(key)
            if best is None:
                with _TUNE_LOCK:
                    best = _BEST.get(key)
                    if best is None:
                        # a winner from disk or the shipped table, else autotune now (and store it)
                        best = stored_winner(device, q_dtype, d_dtype, meta)
                        if best is None:
                            _tuned[grid](*args, **meta)
                            best = _BEST[key] = _tuned.best_config.all_kwargs()
                            store_winner(device, q_dtype, d_dtype, meta, best)
                            return
                        _BEST[key] = best
        else:
            # (args[0], args[4]: the query and document tokens as the kernel gets them)
            best = default_config(meta["LQ_BUCKET"], lambda c: fits(c["BLOCK_Q"], c["BLOCK_D"], c["num_stages"],
                                                                    meta, args[0], args[4]))
        plan = _keep_plan(_PLANS, pkey, _PLANS_MAX, {**meta, **best})
    with launch_guard():
        launch_kernel(_maxsim_fwd_kernel, grid, args, *plan)
