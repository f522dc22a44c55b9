"""Why a document matched: MaxSim taken apart token by token (``db.explain(query, id)``).

MaxSim is a sum over the query's tokens of each one's best similarity among the document's
tokens. :func:`explain` returns, per query token, which document token that was (its position),
the similarity, and its share of the score; the similarities sum to the score. It reads the
document's stored tokens (``db.get``, int8 dequantized) and computes in float32 on the host, so it
works the same on every database-shaped class (one process, shards, a Ray cluster, the HTTP client).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from mvdb.errors import InvalidInputError, InvalidTypeError


class TokenMatch(NamedTuple):
    query_token: int  # position in the query
    doc_token: int  # position of the best-matching token in the document
    similarity: float  # <q, d> of the two: this query token's term of the MaxSim sum
    share: float  # similarity / score (the shares sum to 1 where the score is not 0)


class Explanation(NamedTuple):
    id: object
    score: float  # MaxSim: the sum of the matches' similarities
    matches: list  # one TokenMatch per query token, in query order


def _query(query, dim: int | None) -> np.ndarray:
    # imported on use: the HTTP client imports this module, and need not load the storage layer
    from mvdb.storage import validate

    query = validate.array(query, "query")
    if query.ndim != 2:
        raise InvalidInputError(f"query: expected one query [Lq, {dim}], got shape {tuple(query.shape)}")
    if query.shape[0] == 0:
        raise InvalidInputError("query: empty (0 tokens)")
    if dim is not None and query.shape[1] != dim:
        raise InvalidInputError(f"query: expected shape [Lq, {dim}], got {tuple(query.shape)}")
    q = query.astype(np.float32)
    if not np.isfinite(q).all():
        raise InvalidInputError("query: contains NaN or Inf")
    return q


def explain_tokens(doc_id, query: np.ndarray, doc: np.ndarray) -> Explanation:
    """The explanation of ``doc`` [L, dim] for ``query`` [Lq, dim] (float32 arrays)."""
    if doc.shape[0] == 0:  # nothing to match: every query token's term is 0
        return Explanation(doc_id, 0.0, [TokenMatch(i, -1, 0.0, 0.0) for i in range(query.shape[0])])
    sim = query @ doc.T  # [Lq, L]
    pos = sim.argmax(axis=1)
    best = sim[np.arange(sim.shape[0]), pos].astype(np.float64)
    score = float(best.sum())
    share = best / score if score != 0 else np.zeros_like(best)
    matches = [TokenMatch(i, int(p), float(s), float(f)) for i, (p, s, f) in enumerate(zip(pos, best, share))]
    return Explanation(doc_id, score, matches)


class ExplainMethods:
    """``explain`` for a database-shaped class that has ``dim`` and ``get``."""

    def explain(self, query, doc_id) -> Explanation:
        """Why ``doc_id`` scores what it does for ``query`` ([Lq, dim]): per query token, the
        best-matching document token, their similarity and its share of the MaxSim score."""
        return explain(self, query, doc_id)


def explain(db, query, doc_id) -> Explanation:
    """``db.explain(query, doc_id)`` of any database-shaped class (it needs ``dim`` and ``get``):
    one query [Lq, dim] against one stored document; UnknownIdError where the id is not stored."""
    dim = db.dim
    if dim is None:
        raise InvalidInputError("explain: the database is empty (no document to explain)")
    q = _query(query, dim)
    if isinstance(doc_id, (list, tuple, np.ndarray)):
        raise InvalidTypeError(f"doc_id: expected one id (an int or a str), got {type(doc_id).__name__}")
    doc = np.asarray(db.get([doc_id])[0], dtype=np.float32)
    return explain_tokens(doc_id, q, doc)
