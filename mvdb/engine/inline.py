"""Rerank-only: exact MaxSim of a query against documents given inline, nothing stored."""

from __future__ import annotations

import numpy as np
import torch

from mvdb.engine.search import Hit, check_k, hits, prepare
from mvdb.errors import InvalidInputError, InvalidTypeError
from mvdb.kernels import maxsim_varlen
from mvdb.storage.packed import torch_ready
from mvdb.storage.validate import INT8_VALUE_MAX

__all__ = ["rerank"]


def _inline_tensor(x, where: str) -> torch.Tensor:
    """One inline array (numpy, torch, or nested lists of numbers) as a real-valued tensor."""
    if isinstance(x, torch.Tensor):
        if x.is_complex() or x.dtype == torch.bool:
            raise InvalidTypeError(f"{where}: expected a real-valued (float or int) tensor, got dtype {x.dtype}")
        return x.detach()
    if isinstance(x, (np.ndarray, list, tuple)):
        try:
            a = np.asarray(x)
        except ValueError as e:  # ragged nested lists
            raise InvalidInputError(f"{where}: expected a 2-D [L, dim] array, got a ragged sequence ({e})") from None
        if a.dtype.kind not in "fiu":
            raise InvalidTypeError(f"{where}: expected a real-valued (float or int) array, got dtype {a.dtype}")
        if a.dtype.kind != "f":
            a = a.astype(np.float64)  # torch lacks some numpy int dtypes (uint64); exact for any int32
        return torch.from_numpy(torch_ready(a))
    raise InvalidTypeError(f"{where}: expected a numpy array or torch tensor, got {type(x).__name__}")


def _finite_or_raise(x: torch.Tensor, i: int) -> None:
    """InvalidInputError naming document i when it holds NaN / Inf, values float32 cannot hold,
    or values beyond validate.INT8_VALUE_MAX (whose scores could overflow float32)."""
    if not bool(torch.isfinite(x).all()):
        raise InvalidInputError(f"document {i}: contains NaN or Inf")
    if not bool(torch.isfinite(x.to(torch.float32)).all()):
        raise InvalidInputError(f"document {i}: values beyond the float32 range")
    if not bool((x.abs() <= INT8_VALUE_MAX).all()):
        raise InvalidInputError(f"document {i}: values beyond +-{INT8_VALUE_MAX:.4g} (so that no score overflows "
                                f"float32); scale the embeddings")


def rerank(query, docs, k: int | None = None) -> list[Hit]:
    """Rerank-only: exact MaxSim of one query [Lq, dim] against documents given inline (not stored).

    Hit ids are positions in ``docs``.
    """
    if k is not None:
        check_k(k)
    expected = "docs: expected a non-empty list of [L, dim] arrays / tensors, or one [n, L, dim] array"
    if isinstance(docs, (np.ndarray, torch.Tensor)):
        if docs.ndim != 3:
            raise InvalidInputError(f"{expected}, got shape {tuple(docs.shape)}")
        docs = list(docs)
    elif not isinstance(docs, (list, tuple)):
        raise InvalidTypeError(f"{expected}, got {type(docs).__name__}")
    if not len(docs):
        raise InvalidInputError(f"{expected}, got an empty {type(docs).__name__}")
    q = _inline_tensor(query, "query")
    if q.dim() != 2:
        raise InvalidInputError(f"query: expected [Lq, dim], got shape {tuple(q.shape)}")
    dim = q.shape[1]
    device = q.device
    qs = prepare(q, dim, device)
    d_list = []
    for i, x in enumerate(docs):
        d = _inline_tensor(x, f"document {i}")
        if d.dim() != 2 or d.shape[1] != dim:
            raise InvalidInputError(f"document {i}: expected shape [L, {dim}], got {tuple(d.shape)}")
        if d.shape[0] == 0:
            raise InvalidInputError(f"document {i}: empty (0 tokens); every document needs at least one token")
        d_list.append(d)
    d = torch.cat([x.to(device, torch.float32) for x in d_list])
    cu_d = torch.zeros(len(d_list) + 1, dtype=torch.int64)
    cu_d[1:] = torch.tensor([x.shape[0] for x in d_list]).cumsum(0)
    # one reduction (NaN / Inf anywhere, or a value past the limit, makes it fail): the culprit is
    # looked for only then
    if d.numel() and not bool(d.abs().max() <= INT8_VALUE_MAX):
        for i, x in enumerate(d_list):
            _finite_or_raise(x, i)
    scores = maxsim_varlen(qs.q, qs.cu, d, cu_d.int().to(device), max_seqlen_q=qs.longest, check=False)
    rows = torch.arange(len(d_list), device=device)[None]
    return hits(scores, rows, np.arange(len(d_list)), k)[0]
