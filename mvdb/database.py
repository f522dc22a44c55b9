"""The database: a segment store, a token index, and the fused MaxSim rerank.

    db = mvdb.open("my.mvdb")
    ids = db.add(doc_embs)                  # list of [L_i, dim] arrays / tensors
    hits = db.search(q_embs, k=10)          # one query [Lq, dim] -> list[Hit]; a batch -> list[list[Hit]]
    hits = db.rerank(q_embs, candidate_ids) # exact MaxSim over stored documents

This module is the facade: arguments, locking and the public API. The work is in mvdb.engine:
the resident tokens (engine.resident), the token indexes (engine.flat, engine.ivf), the state a
search reads and how writes move it forward (engine.state), and the search pipeline
(engine.search).

Threads: one handle may be used from many threads. Searches (and every other read) run
concurrently, each on the state that was current when it started; writes (add, delete,
compact, refresh) are serialised with each other and publish a new state when done, so a search
never sees half a write. Only a rebuild (after ``compact()``, or following another process's
compaction) holds searches off while it reloads.
"""

from __future__ import annotations

import json
import threading

import numpy as np

from mvdb.engine.args import RESIDENCY, device_arg, ids_arg, search_args
from mvdb.engine.filters import allowed_rows
from mvdb.engine.inline import rerank
from mvdb.engine.progress import Progress
from mvdb.engine.rwlock import RWLock
from mvdb.engine.search import Hit, check_k, decode_keys, is_batch, prepare
from mvdb.engine.search import candidates as run_candidates
from mvdb.engine.search import rerank as run_rerank
from mvdb.engine.search import search as run_search
from mvdb.engine.state import Engine, resolve_config
from mvdb.errors import InvalidInputError, InvalidTypeError
from mvdb.storage import Store

__all__ = ["Database", "Hit", "rerank"]

class Database:
    """See the module docstring; create with :func:`mvdb.open`."""

    def __init__(self, path, *, dim=None, dtype=None, device="auto", read_only=False, index=None, nlist=None,
                 residency="auto", progress=None, checksums=True):
        self.device = device_arg(device)
        if residency not in RESIDENCY:
            raise InvalidInputError(f"residency: expected 'auto', 'device' or 'host', got {residency!r}")
        self.store = Store(path, dim=dim, dtype=dtype, read_only=read_only, checksums=checksums)
        try:
            config = resolve_config(self.store, index, nlist)
            self._engine = Engine(self.store, self.device, residency, config, Progress(progress))
        except BaseException:
            self.store.close()
            raise
        self._state = self._engine.state
        self._writer = threading.RLock()  # one write at a time in this process
        self._rw = RWLock()  # reads share it; publishing a state (and close) takes it alone
        self._behind = False  # the store committed a state this handle has not followed yet

    # ---- state

    def _read(self):
        """The current state, for a read that holds ``self._rw.read()``."""
        st = self._state
        if st is None:
            raise InvalidInputError(f"{self.store.path}: the database is closed")
        return st

    def _advance(self) -> None:
        """Move to the store's latest commit (the writer holds ``self._writer``). When that fails
        after the store committed (an I/O or memory error), searches go on over the previous state
        and the next write (or ``refresh()``) tries again before its own work."""
        self._behind = True
        self._follow()
        self._behind = False

    def _catch_up(self) -> None:
        if self._behind:
            self._advance()

    def _follow(self) -> None:
        snap = self.store.snapshot()
        st = self._state
        names = [s["name"] for s in snap.manifest["segments"]]
        incremental = st is not None and st.tokens is not None and snap.dim == st.dim and \
            names[: len(st.segment_names())] == st.segment_names()
        if incremental:
            new = self._engine.follow(snap)  # searches go on with the old state meanwhile
            with self._rw.write():
                self._state = new
            return
        with self._rw.write():  # a rebuild: let go of the old resident memory first
            self._state = None
            self._engine.release()
            self._state = self._engine.follow(snap)

    # ---- the public API

    @property
    def dim(self) -> int | None:
        return self.store.dim

    @property
    def load_seconds(self) -> float:
        return self._engine.load_seconds

    def __len__(self) -> int:
        with self._rw.read():
            return self._read().snap.n_live

    def __contains__(self, doc_id) -> bool:
        with self._rw.read():
            return bool(self._read().snap.contains([doc_id]).all())

    def contains(self, ids) -> np.ndarray:
        """Bool mask: which of ``ids`` are stored."""
        ids = ids_arg(ids)
        if isinstance(ids, (str, int, np.integer)):
            ids = [ids]
        with self._rw.read():
            return self._read().snap.contains(ids)

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        with self._writer, self._rw.write():
            self._state = None
            self._engine.release()
            self.store.close()

    def add(self, docs, ids=None, metadata=None, sparse=None) -> list:
        """Store documents ([L_i, dim] arrays / tensors) and index their tokens; returns their ids.
        ``sparse``: optional per-document sparse vectors ({term: weight} dicts or (terms, weights)
        pairs, e.g. BM25 or SPLADE weights) for the lexical channel of :meth:`search`.

        Incremental: the new tokens go into the resident pages and the index (IVF: assigned to
        the current centroids and persisted; retrained once the corpus has doubled since the
        centroids were trained).
        """
        with self._writer:
            self._catch_up()
            out = self.store.add(docs, ids=ids, metadata=metadata, sparse=sparse)
            self._advance()
        return out

    def delete(self, ids) -> None:
        ids = ids_arg(ids)
        with self._writer:
            self._catch_up()
            self.store.delete(ids)
            self._advance()

    def compact(self) -> int:
        """Rewrite segments holding deleted documents (their tokens leave the index); returns the
        number of segments rewritten."""
        with self._writer:
            self._catch_up()
            n = self.store.compact()
            if n:
                self._advance()
        return n

    def refresh(self) -> bool:
        """Follow commits made by another process (readers); True when something changed."""
        with self._writer:
            changed = self.store.refresh()
            if changed or self._behind:
                self._advance()
        return changed

    def get(self, ids) -> list[np.ndarray]:
        """Each document as a float32 [L, dim] array (int8 dequantized)."""
        ids = ids_arg(ids)
        with self._rw.read():
            snap = self._read().snap
            p = snap.gather(snap.rows(ids))
        tokens = p.tokens.astype(np.float32)
        if p.scales is not None:
            tokens *= p.scales[:, None]
        return [tokens[p.offsets[i] : p.offsets[i + 1]] for i in range(len(p.offsets) - 1)]

    def metadata(self, ids) -> list:
        ids = ids_arg(ids)
        with self._rw.read():
            snap = self._read().snap
            return [json.loads(v) for v in snap.metadata(snap.rows(ids))]

    def verify(self):
        return self.store.verify()

    def stats(self) -> dict:
        """Counts, residency and index figures of the current state (see the README)."""
        with self._rw.read():
            return dict(self._engine.stats(self._read()), path=self.store.path)

    def search(self, queries, k: int = 10, where=None, *, n_candidates: int | None = None,
               k_tokens: int | None = None, nprobe: int | None = None, sparse=None, n_sparse: int | None = None,
               exact: bool = False):
        """Top-k documents by exact MaxSim among the token index's candidates.

        ``where`` filters on metadata: {"lang": "en"} or {"lang": {"$in": ["en", "fr"]}}; when the
        candidates hold fewer than k matches but more exist, matching documents are scored exactly.
        ``sparse``: the queries' sparse vectors (one, or a list for a batch; the same forms as
        ``add``): the ``n_sparse`` documents (default 100) with the highest sparse dot product join
        the candidates before the exact MaxSim rerank. ``n_candidates``, ``nprobe`` (IVF) and
        ``k_tokens`` (flat) override the defaults of the candidate stage. ``exact=True`` skips it
        and scores every (matching) document: exhaustive MaxSim, slow, the ground truth for recall.
        """
        check_k(k)
        if not isinstance(exact, bool):
            raise InvalidTypeError(f"exact: expected a bool, got {type(exact).__name__}")
        search_args(where, n_candidates=n_candidates, k_tokens=k_tokens, nprobe=nprobe, n_sparse=n_sparse)
        with self._rw.read():
            st = self._read()
            if st.tokens is None or not st.snap.n_live:
                if st.dim:
                    qs = prepare(queries, st.dim, self.device)
                    return [] if qs.single else [[] for _ in range(qs.n)]
                return [[] for _ in range(len(queries))] if is_batch(queries) else []
            qs = prepare(queries, st.dim, self.device)
            out = run_search(st, qs, k, where, exact=exact, n_candidates=n_candidates, k_tokens=k_tokens,
                             nprobe=nprobe, sparse=sparse, n_sparse=n_sparse)
        return out[0] if qs.single else out

    def candidates(self, queries, k: int = 10, where=None, *, n_candidates: int | None = None,
                   k_tokens: int | None = None, nprobe: int | None = None, sparse=None, n_sparse: int | None = None):
        """The ids the exact stage of ``search`` (same arguments) would rerank, per query: for
        seeing why a document is or is not found, and for measuring candidate recall."""
        check_k(k)
        search_args(where, n_candidates=n_candidates, k_tokens=k_tokens, nprobe=nprobe, n_sparse=n_sparse)
        with self._rw.read():
            st = self._read()
            if st.tokens is None or not st.snap.n_live:
                return self.search(queries, k, where)
            qs = prepare(queries, st.dim, self.device)
            live = st.live if where is None else allowed_rows(st, where)
            cand = run_candidates(st, qs, k, live, n_candidates=n_candidates, k_tokens=k_tokens, nprobe=nprobe,
                                  sparse=sparse, n_sparse=n_sparse).cpu().numpy()
            keys = st.snap.row_keys()
        out = [decode_keys(keys[r[r >= 0]]) for r in cand]
        return out[0] if qs.single else out

    def rerank(self, queries, candidate_ids, k: int | None = None):
        """Exact MaxSim of each query against its own candidate ids (one list, or one per query)."""
        if k is not None:
            check_k(k)
        with self._rw.read():
            st = self._read()
            if st.dim is None or st.tokens is None:
                raise InvalidInputError(f"rerank: the database at {self.store.path} is empty (no documents to score)")
            qs = prepare(queries, st.dim, self.device)
            out = run_rerank(st, qs, candidate_ids, k)
        return out[0] if qs.single else out
