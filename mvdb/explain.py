"""Why a document matched: MaxSim taken apart token by token (``db.explain(query, id)``).

MaxSim is a sum over the query's tokens of each one's best similarity among the document's
tokens. :func:`explain` returns, per query token, which document token that was (its position),
the similarity, and its share of the score; the similarities sum to the score. It reads the
document's stored tokens (``db.get``, int8 dequantized) and computes in float32 on the host, so it
works the same on every database-shaped class (one process, shards, a Ray cluster, the HTTP client).

With text: where the database has an encoder whose tokenizer gives character offsets (a Sentence
Transformers model) and the document's text is stored (``add_texts(..., store_text=True)``), each
match also names the matched words: ``doc_span`` (start, end characters in the stored text) and
``doc_text``; a query given as a str is encoded with the encoder and gets ``query_span`` /
``query_text`` the same way. Special tokens ([CLS], [SEP]) have no span. ``doc_spans`` lists every
span the document vector stands for: one token's, or in a database that pools its documents
(``mvdb.open(..., pool_factor=)``) each word of the pooled cluster, found by encoding the stored
text again and clustering it as it was clustered when stored; ``doc_span`` / ``doc_text`` are then
the first of them and the words joined by spaces.

:func:`explain_stored` takes a stored document as the query (what ``mvdb serve``'s ``/explain``
does with ``query_id``); its words come from its stored text.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from mvdb.encoders import TEXT_KEY, texts_arg
from mvdb.errors import InvalidInputError, InvalidTypeError


class TokenMatch(NamedTuple):
    query_token: int  # position in the query
    doc_token: int  # position of the best-matching token in the document
    similarity: float  # <q, d> of the two: this query token's term of the MaxSim sum
    share: float  # similarity / score (the shares sum to 1 where the score is not 0)
    doc_span: tuple | None = None  # (start, end) characters of the document token in its stored text
    doc_text: str | None = None  # the stored text there
    query_span: tuple | None = None  # the same for the query token, where the query was a str
    query_text: str | None = None
    doc_spans: list | None = None  # every (start, end) the document vector stands for (pooled: several)

    def as_dict(self) -> dict:
        """The fields by name (what the server and ``mvdb explain --json`` send)."""
        return self._asdict()


class Explanation(NamedTuple):
    id: object
    score: float  # MaxSim: the sum of the matches' similarities
    matches: list  # one TokenMatch per query token, in query order


def _query(query, dim: int | None) -> np.ndarray:
    # imported on use: the HTTP client imports this module, and need not load the storage layer
    from mvdb.engine.search import QUERY_MAX, out_of_range
    from mvdb.storage import validate

    query = validate.array(query, "query")
    if query.ndim != 2:
        raise InvalidInputError(f"query: expected one query [Lq, {dim}], got shape {tuple(query.shape)}")
    if query.shape[0] == 0:
        raise InvalidInputError("query: empty (0 tokens)")
    if dim is not None and query.shape[1] != dim:
        raise InvalidInputError(f"query: expected shape [Lq, {dim}], got {tuple(query.shape)}")
    q = query.astype(np.float32)
    bad = ~(np.abs(q) <= QUERY_MAX).all(axis=1)  # (NaN compares False)
    if bad.any():
        raise InvalidInputError(out_of_range(q[int(np.argmax(bad))], "query"))
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
    one query ([Lq, dim], or a str where the database has an encoder) against one stored
    document; UnknownIdError where the id is not stored."""
    dim = _dim(db)
    _one_id(doc_id, "doc_id")
    enc = getattr(db, "encoder", None)
    if isinstance(query, str):
        texts_arg(query, "query", single=True, queries=True)
        if enc is None:
            raise InvalidInputError("query: a str needs an encoder: open the database with mvdb.open(path, "
                                    "encoder=model), or pass the query's embeddings [Lq, dim]")
        q = _query(enc.encode([query], is_query=True)[0], dim)
        return _with_words(db, enc, q, doc_id, query, _spans(enc, query, q.shape[0], is_query=True))
    return _with_words(db, enc, _query(query, dim), doc_id, None, None)


def explain_stored(db, query_id, doc_id) -> Explanation:
    """:func:`explain` with a stored document as the query ("more like this"): its stored tokens
    against those of ``doc_id``. Where the database has an encoder that gives spans and the query
    document's text is stored, each match names the query's words too (``query_span`` /
    ``query_text``, in that stored text)."""
    dim = _dim(db)
    _one_id(query_id, "query_id")
    _one_id(doc_id, "doc_id")
    enc = getattr(db, "encoder", None)
    q = _query(_doc(db, query_id), dim)
    source = stored_text(db, query_id) if enc is not None else None
    return _with_words(db, enc, q, doc_id, source, _spans(enc, source, q.shape[0], is_query=False))


def stored_text(db, doc_id) -> str | None:
    """The text ``add_texts(..., store_text=True)`` kept for ``doc_id`` (None where none was)."""
    meta = db.metadata([doc_id])[0]
    text = meta.get(TEXT_KEY) if isinstance(meta, dict) else None
    return text if isinstance(text, str) else None


def _dim(db) -> int:
    dim = db.dim
    if dim is None:
        raise InvalidInputError("explain: the database is empty (no document to explain)")
    return dim


def _one_id(doc_id, name: str) -> None:
    if isinstance(doc_id, (list, tuple, np.ndarray)):
        raise InvalidTypeError(f"{name}: expected one id (an int or a str), got {type(doc_id).__name__}")


def _doc(db, doc_id) -> np.ndarray:
    return np.asarray(db.get([doc_id])[0], dtype=np.float32)


def _spans(enc, text: str | None, n: int, is_query: bool) -> list | None:
    """The character spans of ``text``'s ``n`` vectors, or None (no text, no spans from the model,
    or not the stored vectors' tokens)."""
    if enc is None or text is None:
        return None
    spans = (enc.token_spans([text], is_query=is_query) or [None])[0]
    return spans if spans is not None and len(spans) == n else None


def _with_words(db, enc, q: np.ndarray, doc_id, q_source: str | None, q_spans) -> Explanation:
    """The explanation of ``doc_id`` for ``q``, with the matched words where the document's text
    is stored and the encoder gives spans (``doc_*``), and where the query's are known (``query_*``)."""
    doc = _doc(db, doc_id)
    out = explain_tokens(doc_id, q, doc)
    text = stored_text(db, doc_id) if enc is not None else None
    d_groups = _doc_spans(db, enc, text, doc)
    if d_groups is None and q_spans is None:
        return out

    def words(spans, i, source):
        span = spans[i] if spans is not None and 0 <= i < len(spans) else None
        return (span, source[span[0] : span[1]]) if span is not None else (None, None)

    matches = []
    for m in out.matches:
        group = d_groups[m.doc_token] if d_groups is not None and 0 <= m.doc_token < len(d_groups) else []
        d_span = group[0] if group else None
        d_text = " ".join(text[a:b] for a, b in group) if group else None
        q_span, q_text = words(q_spans, m.query_token, q_source)
        matches.append(TokenMatch(*m[:4], doc_span=d_span, doc_text=d_text, query_span=q_span, query_text=q_text,
                                  doc_spans=list(group) if group else None))
    return Explanation(out.id, out.score, matches)


def _doc_spans(db, enc, text: str | None, doc: np.ndarray) -> list | None:
    """For each of a stored document's vectors (``doc``), the spans of the words it stands for in
    its stored ``text`` (one, or a pooled cluster's); None where there are no spans, or where
    clustering the text again does not give back the stored vectors."""
    n = doc.shape[0]
    if enc is None or text is None:
        return None
    pooling = getattr(db, "pooling", None)
    if not pooling or pooling.get("pool_factor", 1) == 1:
        spans = _spans(enc, text, n, is_query=False)
        return None if spans is None else [[s] if s is not None else [] for s in spans]
    from mvdb.pooling import pool_packed

    # encoded again as add_texts encoded it (float16 for a float16 database), clustered the same way
    float16 = getattr(db, "_text_float16", lambda: False)()
    vecs, lengths = enc.encode_packed([text], is_query=False, dtype=np.float16 if float16 else np.float32)
    spans = _spans(enc, text, int(lengths[0]), is_query=False)
    if spans is None:
        return None
    pooled, _, groups = pool_packed(vecs, lengths, pooling, device="cpu", return_groups=True)
    if pooled.shape[0] != n or np.abs(pooled - doc).max() > 2e-2:
        return None  # not the stored vectors' clusters (another device's near tie, another model): no words
    out = [[] for _ in range(n)]
    for token, row in enumerate(groups[0]):
        if spans[token] is not None:
            out[int(row)].append(tuple(spans[token]))
    return [_merged(sorted(g)) for g in out]


def _merged(spans: list) -> list:
    """Spans that touch joined into one (the word pieces of a word: "com" + "##press")."""
    out = []
    for a, b in spans:
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out
