"""The sparse (lexical) candidate channel: documents may carry sparse vectors (BM25, SPLADE);
a query's sparse vector adds the documents with the highest sparse dot product to the token
index's candidates. An inverted index (per term: rows and weights) is built on the device once
per state and cached with it; a query touches only its own terms' postings."""

from __future__ import annotations

import numpy as np
import torch

from mvdb.errors import InvalidInputError
from mvdb.storage.validate import sparse as validate_sparse


def _postings(state) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(term_ptr [vocab + 1], rows, weights) on the device, term-major, rows ascending per term."""
    post = state.cache.get("sparse")
    if post is None:
        n = state.n_rows
        off, terms, weights = state.snap.sparse(np.arange(n)) if n else (
            np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.float32))
        vocab = int(terms.max()) + 1 if terms.size else 0
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(off))
        order = np.argsort(terms, kind="stable")
        ptr = np.zeros(vocab + 1, dtype=np.int64)
        np.cumsum(np.bincount(terms, minlength=vocab), out=ptr[1:])
        dev = state.live.device
        post = tuple(torch.from_numpy(x).to(dev) for x in (ptr, rows[order], weights[order].astype(np.float32)))
        state.cache["sparse"] = post
    return post


def query_sparse(sparse, n_queries: int):
    """Check the queries' sparse vectors (a list, one per query) -> (offsets, terms, weights)."""
    if not isinstance(sparse, (list, tuple)) or len(sparse) != n_queries:
        got = type(sparse).__name__ + (f" of {len(sparse)}" if isinstance(sparse, (list, tuple)) else "")
        raise InvalidInputError(f"sparse: expected a list of {n_queries} query sparse vectors (one per query), got {got}")
    return validate_sparse(list(sparse), n_queries)


def sparse_candidates(state, sparse, n_queries: int, live: torch.Tensor, n: int) -> torch.Tensor:
    """Rows with the highest sparse dot product per query [n_queries, n] (-1 where fewer live
    rows share a term with the query)."""
    q_off, q_terms, q_weights = query_sparse(sparse, n_queries)
    ptr, post_rows, post_w = _postings(state)
    dev = live.device
    n_rows = state.n_rows
    out = torch.full((n_queries, n), -1, dtype=torch.int64, device=dev)
    n = min(n, n_rows)
    if not n or ptr.numel() <= 1:
        return out
    vocab = ptr.numel() - 1
    q_idx = np.repeat(np.arange(n_queries), np.diff(q_off))
    known = q_terms < vocab  # terms no document holds score nothing
    q_idx, q_terms, q_weights = (torch.from_numpy(x[known]).to(dev) for x in (q_idx, q_terms, q_weights))
    chunk = max(1, (1 << 27) // max(1, n_rows))  # queries per dense [chunk, rows] score table
    for c0 in range(0, n_queries, chunk):
        sel = (q_idx >= c0) & (q_idx < c0 + chunk)
        qi, t, qw = q_idx[sel] - c0, q_terms[sel].long(), q_weights[sel]
        start, length = ptr[t], ptr[t + 1] - ptr[t]
        total = int(length.sum())
        scores = torch.zeros(min(chunk, n_queries - c0), n_rows, dtype=torch.float32, device=dev)
        if total:
            rep = torch.repeat_interleave(torch.arange(t.numel(), device=dev), length, output_size=total)
            first = torch.cumsum(length, 0) - length  # where each posting list starts in the expansion
            pos = start[rep] + torch.arange(total, device=dev) - first[rep]
            scores.index_put_((qi[rep], post_rows[pos]), post_w[pos] * qw[rep], accumulate=True)
        scores = scores.masked_fill(~live[None, :] | (scores <= 0), float("-inf"))
        top = scores.topk(n, dim=1)
        out[c0 : c0 + scores.shape[0], :n] = torch.where(torch.isfinite(top.values), top.indices, -1)
    return out
