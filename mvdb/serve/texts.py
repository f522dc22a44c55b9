"""The text calls of ``mvdb serve``: encoding queries with the server's model (``mvdb serve DB
--model NAME``) and explaining a match. They run where the database and its model are: in the
one server process, or, with ``--workers`` 2 or more, in the database process, to which a
worker's :class:`mvdb.serve.workers.RemoteDatabase` forwards them (:func:`run`).

An :class:`mvdb.Encoder` sets its model's token limit for the length of each call, so calls to
one model are made one at a time (a query is a few milliseconds of a model's time).
"""

from __future__ import annotations

import threading

from mvdb.errors import InvalidInputError
from mvdb.explain import explain, explain_stored, stored_text

_MODEL = threading.Lock()


def no_model(what: str) -> InvalidInputError:
    return InvalidInputError(f"{what}: a text query needs a model and this server has none: start it with "
                             f"'mvdb serve DB --model NAME' (e.g. --model minilm), or send the query's embeddings")


def encode_queries(db, texts: list[str]) -> list:
    """``texts`` (a list of str) encoded as queries with the database's model: float32 [Lq, dim] each."""
    enc = db.encoder
    if enc is None:
        raise no_model("search_text")
    with _MODEL:
        vecs = enc.encode(texts, is_query=True, progress=False)
    if db.dim is not None and enc.dim != db.dim:
        raise InvalidInputError(f"search_text: the server's model {enc.name} makes {enc.dim}-d vectors; the "
                                f"database holds {db.dim}-d ones")
    return vecs


def explanation(db, doc_id, query=None, query_id=None) -> dict:
    """``db.explain(query, doc_id)`` (``query``: a str or embeddings) or, with ``query_id``, the
    stored document ``query_id`` as the query (:func:`mvdb.explain.explain_stored`), as a map:
    ``id``, ``score``, ``matches`` (one map of TokenMatch's fields per query token) and ``text``
    (the stored texts of the document and of the query, where known)."""
    if query is not None and query_id is not None:
        raise InvalidInputError("explain: expected query (a text, or embeddings [Lq, dim]) or query_id (a stored "
                                "document's id), got both")
    if isinstance(query, str) and db.encoder is None:
        raise no_model("explain")
    with _MODEL:
        e = explain(db, query, doc_id) if query_id is None else explain_stored(db, query_id, doc_id)
    if query_id is not None:
        query_text = stored_text(db, query_id)
    else:
        query_text = query if isinstance(query, str) else None
    return {"id": e.id, "score": e.score, "matches": [m.as_dict() for m in e.matches],
            "text": {"doc": stored_text(db, doc_id), "query": query_text}}


CALLS = {"encode_queries": encode_queries, "explanation": explanation}


def run(db, name: str, *args, **kwargs):
    """The text call ``name`` on ``db``: here, or in the database process where ``db`` is a
    worker's view of it."""
    forward = getattr(type(db), "forward", None)
    if forward is not None:
        return forward(db, name, *args, **kwargs)
    return CALLS[name](db, *args, **kwargs)
