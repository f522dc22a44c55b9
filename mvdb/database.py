"""The database: a segment store, a token index, and the fused MaxSim rerank.

    db = mvdb.open("my.mvdb")
    ids = db.add(doc_embs)                  # list of [L_i, dim] arrays / tensors
    hits = db.search(q_embs, k=10)          # one query [Lq, dim] -> list[Hit]; a batch -> list[list[Hit]]
    hits = db.rerank(q_embs, candidate_ids) # exact MaxSim over stored documents
    db = mvdb.open("my.mvdb", encoder=model)  # text in, text out (mvdb.text): add_texts, search_text

This module is the facade: argument checks and the public API. The work is in mvdb.engine: the
resident tokens (engine.resident), the token indexes (engine.flat, engine.ivf), the state a search
reads and how writes move it forward (engine.state, engine.published), and the search pipeline
(engine.search).

Threads: one handle may be used from many threads. Reads run concurrently, each on the state that
was current when it started; writes (add, delete, compact, refresh) are serialised and publish a
new state when done, so a search never sees half a write (mvdb.engine.published).
"""

from __future__ import annotations

import gc

import numpy as np
import torch

from mvdb.contract import DatabaseAPI
from mvdb.encoders import as_encoder
from mvdb.engine.args import device_arg, ids_arg, open_args, search_args
from mvdb.engine.filters import allowed_rows
from mvdb.engine.inline import rerank
from mvdb.engine.progress import Progress
from mvdb.engine.published import Published
from mvdb.engine.search import Hit, check_k, decode_keys, empty_answer, prepare
from mvdb.engine.search import candidates as run_candidates
from mvdb.engine.search import rerank as run_rerank
from mvdb.engine.search import search as run_search
from mvdb.engine.state import Engine, resolve_config
from mvdb.errors import InvalidInputError, InvalidTypeError
from mvdb.explain import ExplainMethods
from mvdb.pooling import POOLING_KEY, pool_checked, pooling_arg, resolve_open, resolve_pooling, with_pooling
from mvdb.storage import Store
from mvdb.text import TextMethods, check_encoder, recorded_encoder
from mvdb.warm import SOURCE_DOCS, WARM_BATCHES, check_query_tokens, check_stop, default_query_tokens, warm

__all__ = ["Database", "Hit", "rerank"]


class Database(TextMethods, ExplainMethods, DatabaseAPI):
    """See the module docstring; create with :func:`mvdb.open`. ``encoder``: the model of
    ``add_texts`` / ``search_text`` (:mod:`mvdb.text`), None for embeddings only."""

    _pools = True

    def __init__(self, path, *, dim=None, dtype=None, device="auto", read_only=False, index=None, nlist=None,
                 residency="auto", progress=None, checksums=True, encoder=None, max_gpu_bytes=None, code_bits=None,
                 pool_factor=None, pool_protected=None, prerank="auto"):
        asked = pooling_arg(pool_factor, pool_protected)
        path = open_args(path, dim=dim, dtype=dtype, index=index, nlist=nlist, residency=residency,
                         read_only=read_only, checksums=checksums, progress=progress, max_gpu_bytes=max_gpu_bytes,
                         code_bits=code_bits, prerank=prerank)
        self.device = device_arg(device)
        self.encoder = as_encoder(encoder)
        self.store = Store(path, dim=dim, dtype=dtype, read_only=read_only, checksums=checksums)
        try:
            check_encoder(self.encoder, recorded_encoder([self.store]), self.store.path, self.store.snapshot().n_live)
            self._open_pooling(asked, read_only)
            config = resolve_config(self.store, index, nlist)
            self._engine = Engine(self.store, self.device, residency, config, Progress(progress), max_gpu_bytes,
                                  code_bits, prerank)
        except BaseException:
            self.store.close()
            self.store.discard_new()  # a new database this open created: no trace left
            raise
        self._pub = Published(self._engine, self.store)
        if self.device.type == "cuda":
            # The full collection of the heap that a process's imports (torch, triton, faiss) have
            # made due: run here, at open, it does not fall on the first large batch of hits, where
            # it costs a GPU search pass a large share of its time (benchmarks/first_query.py).
            gc.collect()

    def _open_pooling(self, asked: dict | None, read_only: bool) -> None:
        """``mvdb.open(..., pool_factor=)``: checked against the recorded pooling, and recorded in a
        database that holds no documents yet."""
        rec, new = resolve_open(asked, self.store.config.get(POOLING_KEY), self.store.path,
                                self.store.snapshot().n_live, self.encoder, read_only)
        if new:
            self.store.commit_config(with_pooling(self.store.config, rec))

    @property
    def pooling(self) -> dict | None:
        """The database's token pooling ({"pool_factor", "protected"}; None: documents stored as given)."""
        rec = self.store.config.get(POOLING_KEY)
        return dict(rec) if rec else None

    @property
    def dim(self) -> int | None:
        return self.store.dim

    @property
    def load_seconds(self) -> float:
        return self._engine.load_seconds

    def __len__(self) -> int:
        with self._pub.read() as st:
            return st.snap.n_live

    def __contains__(self, doc_id) -> bool:
        with self._pub.read() as st:
            return bool(st.snap.contains([doc_id]).all())

    def contains(self, ids) -> np.ndarray:
        """Bool mask: which of ``ids`` are stored."""
        ids = ids_arg(ids)
        with self._pub.read() as st:
            return st.snap.contains([ids] if isinstance(ids, (str, int, np.integer)) else ids)

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._pub.close()

    def add(self, docs, ids=None, metadata=None, sparse=None, *, pool_factor=None, pool_protected=None) -> list:
        """Store documents ([L_i, dim] arrays / tensors) and index their tokens; returns their ids.
        ``sparse``: optional per-document sparse vectors ({term: weight} dicts or (terms, weights)
        pairs, e.g. BM25 or SPLADE weights) for the lexical channel of :meth:`search`.

        Incremental: the new tokens go into the resident pages and the index (IVF: assigned to
        the current centroids and persisted; retrained when the corpus calls for more lists, or
        has grown 4x since the centroids were trained).

        Token pooling (``mvdb.pool``): a database created with ``pool_factor`` (``mvdb.open``)
        pools every document it is given, and records it; ``pool_factor`` here must be the recorded
        one, or pools the first documents of a database without a record (which then records it).
        The documents are checked before they are pooled, and the pooled vectors are stored.
        """
        return self._add(docs, ids, metadata, sparse, pooling=pooling_arg(pool_factor, pool_protected))

    def _add(self, docs, ids=None, metadata=None, sparse=None, encoder_record: dict | None = None,
             pooling: dict | None = None, pooled: bool = False) -> list:
        """``add``; with ``encoder_record``, the encoder of the vectors is recorded in the same commit
        (``add_texts``: a refused batch leaves no record behind; with no documents, the record alone:
        a shard that gets none of a sharded batch). ``pooling``: the pooling asked for (see ``add``);
        ``pooled``: ``docs`` are pooled that way already (a shard of ShardedDatabase)."""
        with self._pub.write():
            rec, new = resolve_pooling(pooling, self.store.config.get(POOLING_KEY), self.store.path,
                                       self.store.snapshot().n_live)
            if rec is not None and not pooled and not (isinstance(docs, list) and not docs):
                docs = self._pool(docs, rec)
            config = None if encoder_record is None else dict(self.store.config, encoder=encoder_record)
            if new:
                config = with_pooling(config if config is not None else self.store.config, rec)
            if config is not None and isinstance(docs, list) and not docs:
                self.store.commit_config(config)
                out = []
            else:
                out = self.store.add(docs, ids=ids, metadata=metadata, sparse=sparse, config=config)
            self._pub.advance()
        return out

    def _pool(self, docs, rec: dict):
        """``docs`` checked (shapes, dim, finite values) and pooled on this database's device."""
        from mvdb.storage import validate
        from mvdb.storage.packed import Packed

        tokens, lengths, _ = validate.documents(docs, self.store.dim)
        return Packed.of(*pool_checked(tokens, lengths, rec, self.store.dtype, device=self.device))

    def _text_stores(self) -> list:
        return [self.store]

    def _text_progress(self) -> Progress:
        return self._engine.progress

    def _check_writable(self) -> None:
        self.store.check_writable()

    def delete(self, ids) -> None:
        ids = ids_arg(ids)
        with self._pub.write():
            self.store.delete(ids)
            self._pub.advance()

    def compact(self) -> int:
        """Rewrite segments holding deleted documents (their tokens leave the index); returns the
        number of segments rewritten."""
        with self._pub.write():
            n = self.store.compact()
            if n:
                self._pub.advance()
        return n

    def refresh(self) -> bool:
        """Follow commits made by another process (readers); True when something changed."""
        with self._pub.write(catch_up=False):
            changed = self.store.refresh()
            if changed or self._pub.behind:
                self._pub.advance()
        return changed

    def get(self, ids) -> list[np.ndarray]:
        """Each document as a float32 [L, dim] array (int8 dequantized)."""
        ids = ids_arg(ids)
        with self._pub.read() as st:
            p = st.snap.gather(st.snap.rows(ids))
        return _documents(p)

    def warmup(self, max_query_tokens: int | None = None, *, progress: bool | None = None, stop=None) -> dict:
        """Compile, and autotune or load the stored winners of, every kernel variant this
        database's searches launch for queries of up to ``max_query_tokens`` tokens (default: its
        encoder's query limit, or that of the encoder its texts were added with; at least 64), in
        batches of any size, so that the first real query runs at the warm speed (mvdb.warm).
        Searches only: nothing is written. Returns {"seconds", "searches", "query_lengths",
        "batch_sizes", "stopped"}; progress on stderr past a second (``progress``: as ``mvdb.open``'s).
        ``stop``: a ``threading.Event`` that ends the warm-up early once set (between two searches;
        a server sets it when it shuts down)."""
        n = default_query_tokens(self.encoder, recorded_encoder([self.store])) if max_query_tokens is None \
            else check_query_tokens(max_query_tokens)
        check_stop(stop)
        with self._pub.read() as st:
            rows = None if st.tokens is None else torch.nonzero(st.live).flatten().cpu().numpy()
            if rows is None or not rows.size:
                return {"seconds": 0.0, "searches": 0, "query_lengths": [], "batch_sizes": [], "stopped": False}
            rows = np.sort(np.random.default_rng(0).choice(rows, min(SOURCE_DOCS, rows.size), replace=False))
            p = st.snap.gather(rows)
            disk = self._engine.tier == "disk"
        source = _documents(p)
        # on a CPU nothing compiles: one search per length meets torch's first-call work; exhaustive
        # MaxSim over a disk tier reads every segment: not a warm-up's work
        return warm(self, source, n, WARM_BATCHES if self.device.type == "cuda" else (1,),
                    progress=Progress(progress) if progress is not None else self._engine.progress, exact=not disk,
                    stop=stop)

    def metadata(self, ids) -> list:
        ids = ids_arg(ids)
        with self._pub.read() as st:
            return st.snap.metadata_values(st.snap.rows(ids))

    def verify(self):
        return self.store.verify()

    def stats(self) -> dict:
        """Counts, residency and index figures of the current state (see the README); ``encoder``:
        the record of the model that made the vectors (mvdb.text), None when there is none."""
        with self._pub.read() as st:
            config = st.snap.manifest.get("config") or {}
            return dict(self._engine.stats(st), path=self.store.path, encoder=config.get("encoder"),
                        pooling=config.get(POOLING_KEY))

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
        with self._pub.read() as st:
            empty = empty_answer(st, queries, self.device)
            if empty is not None:
                return empty
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
        with self._pub.read() as st:
            empty = empty_answer(st, queries, self.device)
            if empty is not None:
                return empty
            qs = prepare(queries, st.dim, self.device)
            live = st.live if where is None else allowed_rows(st, where)
            cand = run_candidates(st, qs, k, live, n_candidates=n_candidates, k_tokens=k_tokens, nprobe=nprobe,
                                  sparse=sparse, n_sparse=n_sparse, ordered=True).cpu().numpy()
            keys = st.snap.row_keys()
        out = [decode_keys(keys[r[r >= 0]]) for r in cand]
        return out[0] if qs.single else out

    def rerank(self, queries, candidate_ids, k: int | None = None):
        """Exact MaxSim of each query against its own candidate ids (one list, or one per query)."""
        if k is not None:
            check_k(k)
        with self._pub.read() as st:
            if st.dim is None or st.tokens is None:
                raise InvalidInputError(f"rerank: the database at {self.store.path} is empty (no documents to score)")
            qs = prepare(queries, st.dim, self.device)
            out = run_rerank(st, qs, candidate_ids, k)
        return out[0] if qs.single else out


def _documents(p) -> list[np.ndarray]:
    """Gathered documents (a store's ``Packed``) as float32 [L, dim] arrays, int8 dequantized."""
    tokens = p.tokens.astype(np.float32)
    if p.scales is not None:
        tokens *= p.scales[:, None]
    return [tokens[p.offsets[i] : p.offsets[i + 1]] for i in range(len(p.offsets) - 1)]
