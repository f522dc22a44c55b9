"""Public MaxSim functions: validate, pick the backend, launch.

``backend="auto"`` runs the fused Triton kernel on CUDA tensors (and on CPU tensors when
``TRITON_INTERPRET=1``), and the chunked pure-torch reference otherwise.
"""

from __future__ import annotations

import torch

from mvdb.kernels.errors import InvalidInputError
from mvdb.kernels import _checks
from mvdb.kernels.maxsim import cpu, naive, train
from mvdb.kernels.maxsim.kernel import CSR_CAND, CSR_CROSS, PADDED_CROSS, PADDED_PER_QUERY
from mvdb.kernels.maxsim.launcher import Geometry, launch
from mvdb.kernels.maxsim.runtime import interpreting

BACKENDS = ("auto", "triton", "torch")


def _grad_mode(backward: str, normalize: bool, *tensors) -> bool:
    """Validate ``backward``; True when the call must be differentiable."""
    if backward not in train.BACKWARDS:
        raise InvalidInputError(f"backward: expected one of {train.BACKWARDS}, got {backward!r}")
    if not isinstance(normalize, bool):
        raise InvalidInputError(f"normalize: expected a bool, got {type(normalize).__name__}")
    if not torch.is_grad_enabled():
        return False
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.requires_grad:
            return True
    return False


def _prepare(q, d, normalize: bool, grad: bool, triton_ok: bool, d_name: str, d_scales, out):
    """Refuse what gradients cannot go through; L2-normalise when asked. Returns (q, d, fused):
    ``fused`` = the training kernels normalise inside (Triton, float documents); otherwise q and
    d come back normalised by torch (int8 documents are scored as stored)."""
    if grad:
        if d_scales is not None:
            raise InvalidInputError(f"{d_name}: gradients need float documents, got int8")
        if out is not None:
            raise InvalidInputError("out: not supported when computing gradients")
    fused = normalize and triton_ok and d.dtype != torch.int8
    if normalize and not fused:
        q = torch.nn.functional.normalize(q, dim=-1)
        d = d if d.dtype == torch.int8 else torch.nn.functional.normalize(d, dim=-1)
    return q, d, fused


def _use_triton(device: torch.device, backend: str) -> bool:
    if backend not in BACKENDS:
        raise InvalidInputError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    if backend == "torch":
        return False
    runnable = device.type == "cuda" or interpreting()
    if backend == "triton" and not runnable:
        raise InvalidInputError(
            f"backend: 'triton' needs CUDA tensors or TRITON_INTERPRET=1, got tensors on {device}"
        )
    return runnable


def _out(out: torch.Tensor | None, shape: tuple[int, int], device: torch.device) -> torch.Tensor:
    """The caller's output buffer (checked) or a fresh one."""
    if out is None:
        return torch.empty(shape, dtype=torch.float32, device=device)
    _checks.tensor("out", out, (2,), (torch.float32,))
    _checks.shape_match("out", out, shape)
    _checks.same_device(scores=torch.empty(0, device=device), out=out)
    if not out.is_contiguous():
        raise InvalidInputError("out: expected a contiguous tensor, got a strided view")
    return out


def _longest_query(check: bool, given: int | None, q, cu_q, offsets: list, cand=None) -> int:
    """Validate the offsets (one sync) when ``check``, and return the longest query's length, or
    without ``check`` and ``given``: a length taken from the shapes alone, never from device
    memory (no sync): exact for one query, the mean length for a batch. The length only picks
    the launch config (the kernel loops over query blocks of any length), so an estimate costs
    no correctness."""
    if check:
        max_lq = _checks.value_checks(offsets, cand)[0]
        return given or max_lq
    if given is not None:
        return given
    nq = cu_q.numel() - 1
    return -(-q.shape[0] // nq) if nq > 0 else 0


def _contig(x: torch.Tensor | None) -> torch.Tensor | None:
    return None if x is None else x.contiguous()


def maxsim(
    Q: torch.Tensor,
    D: torch.Tensor,
    q_mask: torch.Tensor | None = None,
    d_mask: torch.Tensor | None = None,
    *,
    d_scales: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    backend: str = "auto",
    backward: str = "auto",
    normalize: bool = False,
) -> torch.Tensor:
    """MaxSim on padded batches, fp32 scores; differentiable in Q and D.

    Q [Lq, d] or [Nq, Lq, d]; D [Nd, Ld, d] -> [Nq, Nd] (cross product) or D [Nq, K, Ld, d] ->
    [Nq, K] (per-query candidates); a 2-D Q drops the leading Nq. Masks are bool, True = valid
    token: q_mask [Lq] / [Nq, Lq], d_mask = D's shape without d. int8 D needs ``d_scales`` (D's
    shape without d, float32) and is scored INT8 x INT8 with queries quantized per token.

    When Q or D requires grad, the forward saves each query token's winning document token
    (int32) and ``backward`` picks the backward: "unified" (fp32 atomics), "lowmem" (no atomics,
    bitwise reproducible), "auto". ``normalize=True`` scores the L2-normalised tokens (inside the
    Triton kernels for float documents, with the normalisation's Jacobian in the backward).
    """
    grad = _grad_mode(backward, normalize, Q, D)
    _checks.tensor("Q", Q, (2, 3), _checks.FLOAT_DTYPES)
    _checks.tensor("D", D, (3, 4), _checks.TOKEN_DTYPES)
    single = Q.dim() == 2
    if single:
        if q_mask is not None:
            _checks.mask("q_mask", q_mask, (Q.shape[0],))
            q_mask = q_mask[None]
        Q = Q[None]
    nq, lq, dim = Q.shape
    _checks.dim_match("D", D, dim)
    per_query = D.dim() == 4
    if per_query and D.shape[0] != nq:
        raise InvalidInputError(
            f"D: expected {nq} query rows for per-query candidates [Nq, K, Ld, d], got {D.shape[0]}"
        )
    _checks.mask("q_mask", q_mask, (nq, lq))
    _checks.mask("d_mask", d_mask, tuple(D.shape[:-1]))
    _checks.scales("D", D, d_scales, tuple(D.shape[:-1]))
    device = _checks.same_device(Q=Q, D=D, q_mask=q_mask, d_mask=d_mask, d_scales=d_scales)
    n_k, ld = D.shape[-3], D.shape[-2]
    if single and out is not None:
        _checks.tensor("out", out, (1,), (torch.float32,))
        _checks.shape_match("out", out, (n_k,))
        out = out[None]
    tri = _use_triton(device, backend)
    Q, D, fused_norm = _prepare(Q, D, normalize, grad, tri, "D", d_scales, out)
    if grad or fused_norm:
        if tri:
            res = train.padded(Q, D, q_mask, d_mask, backward, normalize=fused_norm)
        else:
            res = naive.maxsim_padded(Q, D, q_mask, d_mask)
        if out is not None:
            res = _out(out, (nq, n_k), device).copy_(res)
        return res[0] if single else res
    out = _out(out, (nq, n_k), device)
    if tri:
        layout = PADDED_PER_QUERY if per_query else PADDED_CROSS
        launch(out, Q.contiguous(), D.contiguous(), Geometry(layout, nq, n_k, lq, q_len=lq, d_len=ld),
               q_mask=_contig(q_mask), d_scales=_contig(d_scales), d_mask=_contig(d_mask))
    else:
        out.copy_(naive.maxsim_padded(Q, D, q_mask, d_mask, d_scales))
    return out[0] if single else out


def _packed(name: str, x, cu_name: str, cu, dim: int | None, dtypes) -> None:
    _checks.tensor(name, x, (2,), dtypes)
    _checks.tensor(cu_name, cu, (1,), (torch.int32,))
    if cu.numel() < 1:
        raise InvalidInputError(f"{cu_name}: expected at least one entry (n + 1 offsets), got 0")
    if dim is not None:
        _checks.dim_match(name, x, dim)


def maxsim_varlen(
    q: torch.Tensor,
    cu_q: torch.Tensor,
    d: torch.Tensor,
    cu_d: torch.Tensor,
    *,
    d_scales: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    check: bool = True,
    out: torch.Tensor | None = None,
    backend: str = "auto",
    backward: str = "auto",
    normalize: bool = False,
) -> torch.Tensor:
    """MaxSim of every packed query against every packed document -> [Nq, Nd] fp32.

    q [Tq, dim], d [Td, dim]; cu_q [Nq+1], cu_d [Nd+1] int32 cumulative lengths (FlashAttention
    convention). ``check=False`` skips the value checks of the offsets (one device sync) and
    then nothing reads device memory before the launch; ``max_seqlen_q`` (the longest query,
    optional) only guides the launch config. Differentiable in q and d (``backward``
    and ``normalize`` as in :func:`maxsim`).
    """
    grad = _grad_mode(backward, normalize, q, d)
    _packed("q", q, "cu_q", cu_q, None, _checks.FLOAT_DTYPES)
    _packed("d", d, "cu_d", cu_d, q.shape[1], _checks.TOKEN_DTYPES)
    _checks.scales("d", d, d_scales, (d.shape[0],))
    device = _checks.same_device(q=q, cu_q=cu_q, d=d, cu_d=cu_d, d_scales=d_scales)
    nq, nd = cu_q.numel() - 1, cu_d.numel() - 1
    estimated = not check and max_seqlen_q is None
    max_seqlen_q = _longest_query(
        check, max_seqlen_q, q, cu_q, [("cu_q", cu_q, q.shape[0]), ("cu_d", cu_d, d.shape[0])]
    )
    tri = _use_triton(device, backend)
    q, d, fused_norm = _prepare(q, d, normalize, grad, tri, "d", d_scales, out)
    if grad or fused_norm:
        if tri and estimated and nq > 1:  # the training kernels size their saved winners by it: exact
            max_seqlen_q = int((cu_q[1:] - cu_q[:-1]).max())
        res = train.varlen(q, cu_q, d, cu_d, max_seqlen_q, backward, fused_norm) if tri else \
            naive.maxsim_csr(q, cu_q, d, cu_d)
        return res if out is None else _out(out, (nq, nd), device).copy_(res)
    out = _out(out, (nq, nd), device)
    if tri:
        return launch(out, q.contiguous(), d.contiguous(), Geometry(CSR_CROSS, nq, nd, max_seqlen_q), cu_q=cu_q,
                      d_scales=_contig(d_scales), offsets=cu_d)
    if device.type == "cpu":
        return out.copy_(cpu.score_all(q, cu_q, d, cu_d, d_scales))
    return out.copy_(naive.maxsim_csr(q, cu_q, d, cu_d, None, d_scales))


def maxsim_candidates(
    q: torch.Tensor,
    cu_q: torch.Tensor,
    tokens: torch.Tensor,
    offsets: torch.Tensor,
    cand: torch.Tensor,
    scales: torch.Tensor | None = None,
    *,
    max_seqlen_q: int | None = None,
    check: bool = True,
    out: torch.Tensor | None = None,
    backend: str = "auto",
    starts: torch.Tensor | None = None,
    scale_starts: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rerank primitive: MaxSim of query i against documents cand[i, :] of a CSR store -> [Nq, K].

    tokens [T, dim] (fp16/bf16/fp32, or int8 with float32 ``scales [T]``), offsets [n_docs+1]
    int64, cand [Nq, K] int64 with -1 for padding (scores -inf). Documents are read in place:
    no padded copy of the candidates is made.

    ``tokens`` (and ``scales``) may be pinned host memory with everything else on a CUDA device:
    the kernel then reads them in place through unified addressing (no staging copy).

    Paged stores (Triton only): with ``starts`` [n_docs] int64, document j's tokens start at row
    ``starts[j]`` counted from ``tokens``' first row, which may lie in another allocation of the
    same device (a page), and ``offsets`` give only the lengths; int8 pages also need
    ``scale_starts`` (rows counted from ``scales``). Nothing can check that such rows are valid
    memory: this is for stores that manage their pages (mvdb.engine.resident).
    """
    _packed("q", q, "cu_q", cu_q, None, _checks.FLOAT_DTYPES)
    _checks.tensor("tokens", tokens, (2,), _checks.TOKEN_DTYPES)
    _checks.dim_match("tokens", tokens, q.shape[1])
    _checks.tensor("offsets", offsets, (1,), (torch.int64,))
    if offsets.numel() < 1:
        raise InvalidInputError("offsets: expected at least one entry (n_docs + 1 offsets), got 0")
    _checks.tensor("cand", cand, (2,), (torch.int64,))
    nq = cu_q.numel() - 1
    if cand.shape[0] != nq:
        raise InvalidInputError(f"cand: expected {nq} rows (one per query in cu_q), got {cand.shape[0]}")
    _checks.scales("tokens", tokens, scales, (tokens.shape[0],))
    # tokens (and scales) in pinned host memory are read in place by a CUDA launch (UVA)
    mapped = q.is_cuda and tokens.device.type == "cpu" and tokens.is_pinned() and \
        (scales is None or (scales.device.type == "cpu" and scales.is_pinned()))
    device = _checks.same_device(q=q, cu_q=cu_q, offsets=offsets, cand=cand,
                                 **({} if mapped else {"tokens": tokens, "scales": scales}))
    n_docs = offsets.numel() - 1
    max_seqlen_q = _longest_query(
        check, max_seqlen_q, q, cu_q, [("cu_q", cu_q, q.shape[0]), ("offsets", offsets, tokens.shape[0])],
        (cand, n_docs),
    )
    out = _out(out, (nq, cand.shape[1]), device)
    tri = _use_triton(device, backend)
    if starts is not None:
        _checks.tensor("starts", starts, (1,), (torch.int64,))
        _checks.shape_match("starts", starts, (n_docs,))
        _checks.same_device(**({"q": q} if mapped else {"tokens": tokens}), starts=starts, scale_starts=scale_starts)
        if (scales is None) != (scale_starts is None):
            raise InvalidInputError("scale_starts: expected it exactly when the tokens are int8 (with scales) and "
                                    f"starts are given, got scales={scales is not None}, "
                                    f"scale_starts={scale_starts is not None}")
        if scale_starts is not None:
            _checks.tensor("scale_starts", scale_starts, (1,), (torch.int64,))
            _checks.shape_match("scale_starts", scale_starts, (n_docs,))
        if not tri:
            raise InvalidInputError("starts: a paged store needs the Triton kernel (CUDA tensors, or TRITON_INTERPRET=1)")
    elif scale_starts is not None:
        raise InvalidInputError("scale_starts: given without starts")
    if tri:
        return launch(out, q.contiguous(), tokens.contiguous(), Geometry(CSR_CAND, nq, cand.shape[1], max_seqlen_q),
                      cu_q=cu_q, d_scales=_contig(scales), offsets=offsets, cand=cand.contiguous(),
                      starts=_contig(starts), scale_starts=_contig(scale_starts))
    if q.device.type == "cpu":
        return out.copy_(cpu.score_candidates(q, cu_q, tokens, offsets, cand, scales))
    return out.copy_(naive.maxsim_csr(q, cu_q, tokens, offsets, cand, scales))
