"""mvdb as a LangChain vector store: ``MvdbVectorStore(db, encoder=model)``.

    from mvdb.integrations.langchain import MvdbVectorStore
    store = MvdbVectorStore(mvdb.open("docs.mvdb"), encoder=model)
    store.add_texts(["a text", ...], metadatas=[{"lang": "en"}, ...], ids=["a", ...])
    store.similarity_search("a question", k=4, filter={"lang": "en"})
    retriever = store.as_retriever(search_kwargs={"k": 4, "filter": {"lang": "en"}})

Why the encoder is mvdb's and not a LangChain ``Embeddings``: ``Embeddings`` makes one vector per
text (``embed_documents -> list[list[float]]``), while late interaction keeps one vector per token
and scores with MaxSim. So the store takes a multi-vector encoder (an :class:`mvdb.Encoder`, a
Sentence Transformers or PyLate model, or a callable ``f(texts, is_query) -> [L_i, dim]`` each) and
encodes texts itself (``db.add_texts`` / ``db.search_text``); ``embeddings`` is None, and the
vector entry points (``similarity_search_by_vector``, MMR) are not offered.

- Texts are kept with their documents (``add_texts(store_text=True)``, metadata key ``"text"``, so
  a metadata dict may not hold another value there); a search gives back the stored text and the
  stored metadata less that key. Scores are MaxSim scores, higher is better, the ones
  ``db.search_text`` gives; relevance scores on [0, 1] are not defined for them.
- Ids: the id given is the id returned; uuid4 strings when none are given (over a database whose
  ids are ints, their decimal strings: ``"17"``). Adding an id already stored is refused (``mvdb.DuplicateIdError``) and
  stores nothing: ``delete`` it first to replace it. ``delete`` is all or nothing too (an unknown
  id raises ``mvdb.UnknownIdError``).
- ``filter=``: the Mongo-style dicts of Chroma / PGVector (``{"lang": "en"}``, ``{"n": {"$gte":
  2}}``, ``$eq $ne $gt $gte $lt $lte $in $nin $exists``, ``$between: [low, high]``, ``$and``,
  ``$or``, ``$not``) mapped to mvdb's ``where``; what mvdb cannot express (``$like``,
  ``$contains``, a callable, ...) is refused with an ``mvdb.InvalidInputError``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

try:
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings
    from langchain_core.vectorstores import VectorStore
except ImportError as e:  # pragma: no cover - the message says what to install
    raise ImportError(f'mvdb.integrations.langchain needs langchain-core: pip install "mvdb[langchain]" '
                      f'({e})') from None

from mvdb.errors import InvalidInputError, InvalidTypeError
from mvdb.integrations._text_store import TextStore, mongo_where

__all__ = ["MvdbVectorStore"]


def _encoder_arg(encoder):
    if isinstance(encoder, Embeddings):
        raise InvalidTypeError(f"encoder: expected a multi-vector encoder (an mvdb.Encoder, a Sentence Transformers "
                               f"or PyLate model, or a callable f(texts, is_query) -> one [tokens, dim] array per "
                               f"text), got the LangChain Embeddings {type(encoder).__name__}, which makes one vector "
                               f"per text")
    return encoder


class MvdbVectorStore(VectorStore):
    """A LangChain ``VectorStore`` over an mvdb database (``mvdb.open(...)`` or any database-shaped
    class with the text methods). ``encoder``: the multi-vector model of the texts (default: the
    one the database was opened with); see the module docstring for why it is not an
    ``Embeddings``."""

    def __init__(self, db, encoder=None):
        self._store = TextStore(db, _encoder_arg(encoder), "MvdbVectorStore")

    @property
    def db(self):
        """The mvdb database (``store.db.close()`` releases it)."""
        return self._store.db

    @property
    def encoder(self):
        """The :class:`mvdb.Encoder` that encodes documents and queries."""
        return self._store.encoder

    @property
    def embeddings(self) -> Embeddings | None:
        """None: the store encodes with a multi-vector :attr:`encoder`, not a single-vector ``Embeddings``."""
        return None

    # ---- writing

    def add_texts(self, texts: Iterable[str], metadatas: list[dict] | None = None, *, ids: list[str] | None = None,
                  **kwargs: Any) -> list[str]:
        """Encode and store ``texts`` in one commit -> their ids (the given ones, else new uuid4
        strings). ``metadatas``: a JSON dict (or None) per text. ``batch_size`` is accepted and
        ignored (the encoder batches); other keywords are an error."""
        kwargs.pop("batch_size", None)
        if kwargs:
            raise InvalidTypeError(f"add_texts: unexpected keywords {sorted(kwargs)}; expected metadatas= and ids=")
        if isinstance(texts, str):
            raise InvalidTypeError("texts: expected a list of str, got one str (wrap it in a list: [text])")
        texts = list(texts)
        if not texts:
            return []
        if metadatas is not None and not isinstance(metadatas, (list, tuple)):
            raise InvalidTypeError(f"metadatas: expected a list of dicts (one per text), got "
                                   f"{type(metadatas).__name__}")
        keys = self._store.new_keys(ids, len(texts))
        return self._store.add(texts, None if metadatas is None else list(metadatas), keys)

    def add_documents(self, documents: list[Document], **kwargs: Any) -> list[str]:
        """Store ``Document`` s: their ``page_content``, ``metadata`` and ``id`` (``ids=`` wins,
        as in LangChain)."""
        if not isinstance(documents, (list, tuple)):
            raise InvalidTypeError(f"documents: expected a list of Document, got {type(documents).__name__}")
        bad = [i for i, d in enumerate(documents) if not isinstance(d, Document)]
        if bad:
            raise InvalidTypeError(f"documents[{bad[0]}]: expected a Document, got {type(documents[bad[0]]).__name__}")
        ids = kwargs.pop("ids", None)
        if ids is None and any(d.id for d in documents):
            ids = [d.id or None for d in documents]
        return self.add_texts([d.page_content for d in documents], [d.metadata for d in documents], ids=ids, **kwargs)

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        """Remove the documents ``ids`` (all or none: an unknown id raises ``mvdb.UnknownIdError``
        and removes nothing) -> True. ``ids=None`` (everything, in LangChain) is refused: use
        ``db.delete`` on the database for that."""
        if kwargs:
            raise InvalidTypeError(f"delete: unexpected keywords {sorted(kwargs)}; expected ids=")
        if ids is None:
            raise InvalidInputError("delete: expected a list of ids, got None (deleting every document is not done "
                                    "through LangChain: call the database's own delete with its ids)")
        if isinstance(ids, (str, bytes)) or not isinstance(ids, (list, tuple)):
            raise InvalidTypeError(f"ids: expected a list of str, got {type(ids).__name__}")
        if not ids:
            return True
        self.db.delete(self._store.keys(list(ids), strict=True))
        return True

    # ---- reading

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The stored documents among ``ids`` (unknown ids are left out, as LangChain asks)."""
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
            raise InvalidTypeError(f"ids: expected a list of str, got {type(ids).__name__}")
        keys = self._store.present(self._store.keys(list(ids)))
        return [Document(id=i, page_content=text, metadata=meta) for i, text, meta in self._store.records(keys)]

    def similarity_search_with_score(self, query: str, k: int = 4, filter: dict | None = None,
                                     **kwargs: Any) -> list[tuple[Document, float]]:
        """The ``k`` best documents for ``query`` with their MaxSim scores (best first).
        ``filter``: a metadata filter (module docstring); keywords: mvdb's search options
        (``n_candidates``, ``nprobe``, ``k_tokens``, ``exact``)."""
        hits = self._store.search(query, k, mongo_where(filter), kwargs)
        records = self._store.records([h.id for h in hits])
        return [(Document(id=i, page_content=text, metadata=meta), float(h.score))
                for h, (i, text, meta) in zip(hits, records)]

    def similarity_search(self, query: str, k: int = 4, filter: dict | None = None, **kwargs: Any) -> list[Document]:
        """:meth:`similarity_search_with_score` without the scores."""
        return [doc for doc, _ in self.similarity_search_with_score(query, k, filter, **kwargs)]

    def _select_relevance_score_fn(self):
        raise NotImplementedError("MvdbVectorStore: MaxSim scores (a sum over query tokens) have no [0, 1] relevance "
                                  "scale; use similarity_search_with_score and compare the scores")

    # ---- construction

    @classmethod
    def from_texts(cls, texts: list[str], embedding, metadatas: list[dict] | None = None, *,
                   ids: list[str] | None = None, db=None, path=None, **open_options: Any) -> MvdbVectorStore:
        """A store over ``db`` (an open database), or over ``mvdb.open(path, encoder=embedding,
        **open_options)``, holding ``texts``. ``embedding``: the multi-vector encoder (LangChain's
        name for the argument; a single-vector ``Embeddings`` is refused)."""
        _encoder_arg(embedding)
        if (db is None) == (path is None):
            raise InvalidInputError("from_texts: expected db= (an open mvdb database) or path= (where to open one), "
                                    f"got {'both' if db is not None else 'neither'}")
        if db is None:
            import mvdb

            db = mvdb.open(path, encoder=embedding, **open_options)
        elif open_options:
            raise InvalidTypeError(f"from_texts: options {sorted(open_options)} are for mvdb.open (path=), not "
                                   f"an open db")
        try:
            store = cls(db, encoder=embedding)
            store.add_texts(texts, metadatas, ids=ids)
        except BaseException:
            if path is not None:
                db.close()  # the handle this call opened; nothing was stored
            raise
        return store
