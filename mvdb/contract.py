"""The database API every database-shaped class states: :class:`DatabaseAPI`.

``Database`` (``mvdb.open(path)``), ``ShardedDatabase`` (``mvdb.open(path, devices=[...])``), the
Ray ``Cluster`` (``mvdb.shards.cluster``) and the HTTP ``Client`` (``mvdb.connect``) subclass it,
and ``tests/test_contract.py`` holds each to the same results and errors. Text methods
(``add_texts``, ``search_text``, ``add_encoded``: :class:`mvdb.text.TextMethods`) are not part of
the protocol; every class has them (the cluster and the client encode on the caller's side).
"""

from __future__ import annotations

from types import FunctionType
from typing import Protocol, runtime_checkable


@runtime_checkable
class DatabaseAPI(Protocol):
    """A multi-vector database: documents are [L, dim] token arrays under stable ids, searched by
    exact MaxSim among candidates from a token index."""

    @property
    def dim(self) -> int | None:
        """The token dimension (None before the first add)."""

    def add(self, docs, ids=None, metadata=None, sparse=None) -> list:
        """Store documents (a list of [L, dim] arrays) -> their ids (given, or new ints)."""

    def search(self, queries, k: int = 10, where=None, **options):
        """The k best documents by MaxSim: a list of ``Hit(id, score)`` for one query [Lq, dim],
        one such list per query for a batch. ``where``: a metadata filter; options:
        ``n_candidates``, ``nprobe``, ``k_tokens``, ``sparse``, ``n_sparse``, ``exact``."""

    def rerank(self, queries, candidate_ids, k: int | None = None):
        """Exact MaxSim of the queries against the given stored ids, best first."""

    def get(self, ids) -> list:
        """The stored token arrays of ``ids``."""

    def explain(self, query, doc_id):
        """Why ``doc_id`` scores what it does for one query: per query token, the best-matching
        document token, their similarity and its share of the score (an ``Explanation``)."""

    def metadata(self, ids) -> list:
        """The stored metadata of ``ids`` (None where none was given)."""

    def contains(self, ids):
        """A bool array: which of ``ids`` are stored."""

    def delete(self, ids) -> None:
        """Remove ``ids`` (all or none: an unknown id raises and removes nothing)."""

    def compact(self) -> int:
        """Rewrite the segments without deleted documents -> the documents kept."""

    def refresh(self) -> bool:
        """A reader sees what writers committed since it opened -> whether anything changed."""

    def verify(self):
        """Check every file against its checksum -> a report (``.ok``, ``.problems``)."""

    def stats(self) -> dict:
        """Counts, sizes, the index and the tier."""

    def close(self) -> None:
        """Release the database (and its writer lock)."""

    def __len__(self) -> int:
        """The live documents."""

    def __contains__(self, doc_id) -> bool:
        """Whether one id is stored."""

    def __enter__(self):
        """``with`` closes the database on exit."""

    def __exit__(self, *exc) -> None:
        """Closes the database."""


# the names the protocol's body defines, in its order (not typing's own additions)
MEMBERS = tuple(n for n, v in vars(DatabaseAPI).items()
                if isinstance(v, property) or (isinstance(v, FunctionType) and v.__qualname__.startswith("DatabaseAPI.")))
