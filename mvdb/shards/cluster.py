"""mvdb across machines on Ray: one actor per shard, a client that fans out and merges, and a
bulk-ingest pipeline on Ray Data. Install with ``pip install mvdb[distributed]``.

    import ray, mvdb.shards.cluster as md
    ray.init()
    md.ingest(["part-0.npz", "part-1.npz"], "/data/db", shards=2)   # bulk load, resumable
    cluster = md.Cluster("/data/db", num_gpus=1)                     # one actor (and GPU) per shard
    hits = cluster.search(queries, k=10)

The shards are those of a sharded database directory (its ``shards.json``, the layout
``mvdb.open(path, devices=[...])`` and ``mvdb ingest --shards`` write; ``ingest(..., shards=N)``
creates one), or a list of ordinary database directories. A shard is an ordinary mvdb database
directory on the node that runs its actor (give actors a node with ``actor_options``, e.g. a Ray
``scheduling_strategy``).

Placement and routing are those of :mod:`mvdb.shards.placement`, the same as
:class:`mvdb.ShardedDatabase` and ``mvdb ingest --shards``: new documents go to the shard holding
the fewest tokens, and reads by id (``get``, ``metadata``, ``delete``) ask every shard which ids
it holds. So a database written by any of them is read and extended by the others. Every write is
a committed batch of one shard's store: an actor that dies leaves its shard at its last commit,
and running the same ``ingest`` again skips the ids already stored (in any shard).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

try:
    import ray
except ImportError as e:  # pragma: no cover - the message says what to install
    raise ImportError(f"mvdb.shards.cluster needs Ray: pip install 'mvdb[distributed]' ({e})") from None

from mvdb.contract import DatabaseAPI
from mvdb.encoders import as_encoder
from mvdb.engine.progress import Progress
from mvdb.errors import DuplicateIdError, InvalidInputError
from mvdb.explain import ExplainMethods
from mvdb.shards import layout
from mvdb.shards.merge import (
    merge,
    merge_queries,
    merge_reports,
    merge_stats,
    single_query,
)
from mvdb.shards.placement import assign, membership, owners, split_packed, tokens_of
from mvdb.text import TextMethods

if TYPE_CHECKING:
    from typing_extensions import Self


def _shard_dirs(shard_paths, shards: int = 0) -> list[str]:
    """The shard directories: a sharded database directory's shards (``shards`` > 0 creates its
    layout where there is none), an unsharded directory as the one shard, or a list of database
    directories."""
    if isinstance(shard_paths, (str, os.PathLike)):
        return layout.resolve(shard_paths, shards, option="shards")
    if shards:
        raise InvalidInputError("shards: creates the layout of one database directory; got a list of shard "
                                "directories instead of one path")
    paths = [os.fspath(p) for p in shard_paths]
    if not paths:
        raise InvalidInputError("shard_paths: expected at least one shard directory, got none")
    return paths


def _plain_id(x):
    return x.item() if isinstance(x, np.generic) else x


@ray.remote
class ShardWriter:
    """Writes one shard's store during a bulk ingest (no index until ``finish``)."""

    def __init__(self, path: str, dtype: str | None = None):
        from mvdb.storage import Store

        self.path = path
        self.store = Store(path, dtype=dtype)

    def state(self) -> tuple[list, int, str | None]:
        """(ids stored, tokens stored, id type): what the driver places and skips by."""
        return self.store.ids(), tokens_of(self.store), self.store.manifest["id_type"]

    def write(self, ids: list, tokens: np.ndarray, lengths: np.ndarray) -> tuple[int, int]:
        """Commit the documents not stored yet; (added, skipped)."""
        from mvdb.ingest import add_new
        from mvdb.ingest.writer import Pooled
        from mvdb.pooling import POOLING_KEY

        rec = self.store.config.get(POOLING_KEY)  # a database that pools: these documents too
        store = Pooled(self.store, rec, "cpu") if rec else self.store
        added, skipped, _ = add_new(store, ids, tokens, lengths)
        return added, skipped

    def close(self) -> None:
        self.store.close()

    def finish(self, build_index: bool, device: str) -> dict:
        """Close the store; with ``build_index``, open the database once so its token index is
        trained and persisted."""
        import mvdb

        self.store.close()
        if not build_index:
            return {"path": self.path}
        with mvdb.open(self.path, device=device) as db:
            return db.stats()


def _read(row: dict, batch_docs: int) -> list[dict]:
    """Ray Data flat_map: one source file -> rows of up to ``batch_docs`` documents."""
    from mvdb.ingest import read_source

    _, batches = read_source(row["path"], batch_docs)
    return [{"ids": list(ids), "tokens": np.asarray(t), "lengths": np.asarray(n, dtype=np.int64)}
            for ids, t, n in batches]


def _prepare(row: dict, dim: int | None) -> dict:
    """Ray Data map: validate a batch (shapes, finiteness, ids) and convert it to float16. Where
    its documents go is the driver's choice (it knows every shard's load)."""
    from mvdb.storage import validate

    tokens, lengths = row["tokens"], np.asarray(row["lengths"], dtype=np.int64)
    tokens, lengths, _ = validate.packed(tokens, lengths, dim)
    stored, _ = validate.convert(tokens, lengths, "float16")
    ids = [_plain_id(x) for x in row["ids"]]
    validate.ids(ids, len(ids), None, 0)  # one id type, no id twice in the batch
    return {"ids": ids, "tokens": stored, "lengths": lengths}


def ingest(sources, shard_paths, *, shards: int = 0, dtype: str | None = None, dim: int | None = None,
           batch_docs: int = 2048, concurrency: int | None = None, max_in_flight: int = 2, build_index: bool = True,
           device: str = "auto", writer_options: dict | None = None, on_batch=None, progress: bool = True) -> dict:
    """Bulk-load document embeddings into the shards of ``shard_paths``: a sharded database
    directory (``shards=N`` creates its layout if it has none), or a list of shard directories.

    Ray Data reads the sources (the formats of ``mvdb ingest``), validates each batch and converts
    it to float16 in parallel tasks (``concurrency``). The driver places each document on the
    shard holding the fewest tokens (:mod:`mvdb.shards.placement`, as ``ShardedDatabase.add``)
    and one ``ShardWriter`` actor per shard commits its part of each batch as it comes (at most
    ``max_in_flight`` queued each), so the shards are written in parallel. Ids already stored in
    any shard are skipped (the driver reads every shard's ids once at the start): re-running an
    interrupted ingest completes it. ``on_batch(i, writers)`` is called after dispatching batch i
    (tests use it to inject failures). Returns counts and timings.
    """
    from mvdb.storage import validate

    sources = [os.fspath(s) for s in ([sources] if isinstance(sources, (str, os.PathLike)) else sources)]
    if not sources:
        raise InvalidInputError("sources: expected at least one source file or directory, got none")
    from mvdb.ingest.sources import POOLING_SIDE_FILE

    for s in sources:
        if s.endswith(".npy") and os.path.exists(s[:-4] + POOLING_SIDE_FILE):
            raise InvalidInputError(f"{s}: its documents are pooled already ({os.path.basename(s[:-4])}{POOLING_SIDE_FILE}); "
                                    f"the Ray ingest would not record that: use `mvdb ingest`, which stores them as "
                                    f"they are and records their pooling")
    paths = _shard_dirs(shard_paths, shards)
    t0 = time.perf_counter()
    writers = [ShardWriter.options(**(writer_options or {})).remote(p, dtype) for p in paths]
    n = len(paths)
    ds = ray.data.from_items([{"path": s} for s in sources])
    ds = ds.flat_map(_read, fn_kwargs={"batch_docs": batch_docs})
    ds = ds.map(_prepare, fn_kwargs={"dim": dim}, concurrency=concurrency)
    try:
        known, loads, id_type = set(), [], None  # what the shards hold (grows as batches go out)
        for ids, load, kind in ray.get([w.state.remote() for w in writers]):
            known.update(ids)
            loads.append(load)
            id_type = id_type or kind
        pending = [deque() for _ in range(n)]
        added = skipped = tokens = 0
        for i, row in enumerate(ds.iter_rows()):
            ids = [_plain_id(x) for x in row["ids"]]
            lengths = np.asarray(row["lengths"], dtype=np.int64)
            toks = np.asarray(row["tokens"])
            tokens += int(lengths.sum())
            keep = np.array([x not in known for x in ids], dtype=bool)
            skipped += int((~keep).sum())
            if keep.any():
                ids = [x for x, k in zip(ids, keep) if k]
                _, id_type = validate.ids(ids, len(ids), id_type, 0)  # the id type of every shard
                toks, lengths = toks[np.repeat(keep, lengths)], lengths[keep]
                known.update(ids)
                parts = assign(lengths, loads)
                for s, part, part_toks, part_lens in split_packed(toks, lengths, parts):
                    if len(pending[s]) >= max_in_flight:  # backpressure: wait for this shard's oldest batch
                        a, b = ray.get(pending[s].popleft())
                        added, skipped = added + a, skipped + b
                    loads[s] += int(part_lens.sum())
                    pending[s].append(writers[s].write.remote([ids[j] for j in part], part_toks, part_lens))
            if on_batch is not None:
                on_batch(i, writers)
            if progress and i % 50 == 0:
                dt = time.perf_counter() - t0
                print(f"\ringest: {i + 1} batches, {tokens / max(dt, 1e-9):,.0f} tokens/s", end="", flush=True)
        for q in pending:
            for a, b in ray.get(list(q)):
                added, skipped = added + a, skipped + b
        t_write = time.perf_counter() - t0
        stats = ray.get([w.finish.remote(build_index, device) for w in writers])
        for w in writers:
            ray.kill(w)
    except BaseException:
        # a failed ingest closes the writers still alive and waits until every shard's writer lock
        # is free (a killed writer's goes when its process has exited) before it raises
        for w in writers:
            with contextlib.suppress(Exception):  # a dead writer's lock goes with its process
                ray.get(w.close.remote(), timeout=60)
            ray.kill(w)
        for p in paths:
            _wait_unlocked(p)
        raise
    if progress:
        print(f"\ringest: {added} added, {skipped} already stored, {tokens:,} tokens in {t_write:.1f} s")
    return {"added": added, "skipped": skipped, "tokens": tokens, "write_s": t_write,
            "total_s": time.perf_counter() - t0, "shards": stats}


def _wait_unlocked(path: str, timeout: float = 60.0) -> None:
    """Block until no process holds the writer lock of the store at ``path`` (or ``timeout``)."""
    from mvdb.errors import DatabaseLockedError
    from mvdb.storage import Store

    if not os.path.isdir(path):
        return
    deadline = time.monotonic() + timeout
    while True:
        try:
            Store(path).close()
            return
        except DatabaseLockedError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.1)


@ray.remote
class ShardActor:
    """One shard's database on the node (and device) that runs this actor."""

    def __init__(self, path: str, **open_kw):
        import mvdb

        self.db = mvdb.open(path, **open_kw)

    def search(self, queries, k, where, options, always: bool = False):
        """This shard's top-k; None when it holds no document (unless ``always``: then the
        arguments are validated and the empty answer given)."""
        if not always and not len(self.db):
            return None
        return self.db.search(queries, k, where, **options)

    def rerank(self, queries, candidate_ids, k):
        return self.db.rerank(queries, candidate_ids, k)

    def count(self) -> int:
        return len(self.db)

    def contains(self, ids) -> np.ndarray:
        return membership(self.db.store, ids)

    def info(self) -> dict:
        """What placing and validating an add needs: dim, id type, next auto id, tokens stored."""
        m = self.db.store.manifest
        return {"dim": m["dim"], "id_type": m["id_type"], "next_id": m["next_id"], "tokens": tokens_of(self.db.store)}

    def add(self, docs, ids, metadata, sparse=None, encoder_record=None):
        return self.db._add(docs, ids=ids, metadata=metadata, sparse=sparse, encoder_record=encoder_record)

    def delete(self, ids):
        self.db.delete(ids)

    def get(self, ids):
        return self.db.get(ids)

    def metadata(self, ids):
        return self.db.metadata(ids)

    def next_id(self) -> int:
        return self.db.store.manifest["next_id"]

    def stats(self) -> dict:
        return self.db.stats()

    def verify(self):
        return self.db.verify()

    def compact(self) -> int:
        return self.db.compact()

    def refresh(self) -> bool:
        return self.db.refresh()

    def close(self):
        self.db.close()


class Cluster(TextMethods, ExplainMethods, DatabaseAPI):
    """Client of one ``ShardActor`` per shard, with the API of :class:`mvdb.Database`: fans a
    query batch out and merges the exact per-shard top-k by score. ``shard_paths``: a sharded
    database directory (its ``shards.json``) or a list of database directories. ``num_gpus`` per
    actor (the actor's database then runs on its GPU), ``actor_options`` for placement; other
    keywords go to ``mvdb.open`` in each actor.

    Reads by id (``get``, ``metadata``, ``delete``, ``rerank``) ask every shard which ids it holds,
    and ``add`` places by load: the same policy as :class:`mvdb.ShardedDatabase` and ``mvdb ingest
    --shards`` (:mod:`mvdb.shards.placement`). ``stats()`` and ``verify()`` give one answer over the
    shards (:mod:`mvdb.shards.merge`), ``compact()`` and ``refresh()`` run on every shard, and
    ``close()`` (or leaving a ``with`` block) closes the shards and ends their actors: any later
    use is an InvalidInputError. ``encoder``: a text model for ``add_texts`` / ``search_text``,
    which encode here and send vectors to the actors (every shard records the encoder)."""

    def __init__(self, shard_paths, *, num_gpus: float = 0, actor_options: dict | None = None, encoder=None,
                 **open_kw):
        self.encoder = as_encoder(encoder)
        paths = _shard_dirs(shard_paths)
        opts = dict(actor_options or {}, num_gpus=num_gpus)
        open_kw.setdefault("device", "cuda" if num_gpus else "cpu")
        one_dir = isinstance(shard_paths, (str, os.PathLike))
        self.path = os.fspath(shard_paths) if one_dir else None
        self.paths = paths
        # how verify() names each shard's problems: its directory's name in a sharded directory
        self.names = [os.path.basename(os.path.normpath(p)) for p in paths] if one_dir else list(paths)
        self._closed = False
        self.actors = [ShardActor.options(**opts).remote(p, **open_kw) for p in paths]
        try:
            ray.get([a.count.remote() for a in self.actors])  # surface open errors here
        except BaseException:
            self._end_actors()
            raise

    def _live(self) -> list:
        """The actors of an open cluster (InvalidInputError once closed, as ``Database``)."""
        if self._closed:
            raise InvalidInputError(f"{self.path or self.paths}: the cluster is closed")
        return self.actors

    def __len__(self) -> int:
        return sum(ray.get([a.count.remote() for a in self._live()]))

    def __enter__(self) -> Self:
        self._live()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def dim(self) -> int | None:
        """The token dimension the shards store (None before the first add)."""
        infos = ray.get([a.info.remote() for a in self._live()])
        return next((i["dim"] for i in infos if i["dim"] is not None), None)

    def stats(self) -> dict:
        """The keys of ``Database.stats()`` over the shards (:func:`mvdb.shards.merge.merge_stats`):
        counts summed, ``dim`` / ``dtype`` / ``index`` / ``residency`` shared, ``devices``, and each
        shard's own dict under ``shards``."""
        return merge_stats(ray.get([a.stats.remote() for a in self._live()]), self.path)

    def verify(self):
        """Every shard's checks (run on its actor's node) as one ``VerifyReport``: ``ok``,
        ``problems`` (each prefixed by its shard's name), ``n_docs`` and ``n_segments`` summed."""
        return merge_reports(zip(self.names, ray.get([a.verify.remote() for a in self._live()])))

    def compact(self) -> int:
        """Compact every shard (in parallel); returns the number of segments rewritten in all."""
        return int(sum(ray.get([a.compact.remote() for a in self._live()])))

    def refresh(self) -> bool:
        """Every shard follows the commits of its writer (read-only clusters); True when any
        shard changed."""
        return any(ray.get([a.refresh.remote() for a in self._live()]))

    def search(self, queries, k: int = 10, where=None, **options):
        """Top-k by exact MaxSim over every shard (same arguments as ``Database.search``)."""
        actors = self._live()
        single = single_query(queries)
        per = [p for p in ray.get([a.search.remote(queries, k, where, options) for a in actors]) if p is not None]
        if not per:  # no shard holds a document: one validates the arguments and answers empty
            return ray.get(actors[0].search.remote(queries, k, where, options, True))
        return merge_queries(per, k, single)

    def rerank(self, queries, candidate_ids, k: int | None = None):
        """Exact MaxSim of each query against its own candidate ids (one list, or one per query),
        as ``Database.rerank``: each id is scored on the shard holding it (every id must be stored:
        else UnknownIdError), and the shards' lists are merged by score."""
        from mvdb.engine.search import check_k

        actors = self._live()
        if k is not None:
            check_k(k)
        single = single_query(queries)
        q_list = [queries] if single else list(queries)
        lists = [list(candidate_ids)] if single else [list(c) for c in candidate_ids]
        if len(lists) != len(q_list):
            raise InvalidInputError(f"candidate_ids: expected {len(q_list)} lists (one per query), got {len(lists)}")
        flat = [c for cs in lists for c in cs]  # every query's candidates: one membership round
        shard_of = np.zeros(len(flat), dtype=np.int64)
        if flat:
            for si, pos in enumerate(owners(self._masks(flat), flat)):
                shard_of[pos] = si
        # per shard, every query with the candidates that shard holds (possibly none): one call each
        per_shard = [[[] for _ in lists] for _ in actors]
        at = 0
        for qi, c in enumerate(lists):
            for j, cid in enumerate(c):
                per_shard[shard_of[at + j]][qi].append(cid)
            at += len(c)
        busy = [si for si in range(len(actors)) if any(per_shard[si])]
        per = ray.get([actors[si].rerank.remote(q_list, per_shard[si], None) for si in busy])
        out = [merge([p[qi] for p in per], k) for qi in range(len(lists))]
        return out[0] if single else out

    # ---- membership: every shard says which ids it holds

    def _masks(self, ids: list) -> list[np.ndarray]:
        return ray.get([a.contains.remote(ids) for a in self._live()])

    def contains(self, ids) -> np.ndarray:
        """Bool mask: which of ``ids`` are stored (in any shard)."""
        ids = list(ids)
        found = np.zeros(len(ids), dtype=bool)
        for mask in self._masks(ids):
            found |= mask
        return found

    def __contains__(self, doc_id) -> bool:
        return bool(self.contains([doc_id])[0])

    def _owners(self, ids: list) -> list[list[int]]:
        """Positions of ``ids`` per shard; every id must be stored (else UnknownIdError)."""
        return owners(self._masks(ids), ids)

    def _by_owner(self, ids, method: str) -> list:
        """``method`` on the shards holding ``ids``, results back in the order of ``ids``."""
        ids = list(ids)
        calls = [(pos, getattr(self.actors[s], method).remote([ids[i] for i in pos]))
                 for s, pos in enumerate(self._owners(ids)) if pos]
        out = [None] * len(ids)
        for pos, values in zip([p for p, _ in calls], ray.get([c for _, c in calls])):
            for i, v in zip(pos, values):
                out[i] = v
        return out

    def get(self, ids) -> list[np.ndarray]:
        return self._by_owner(ids, "get")

    def metadata(self, ids) -> list:
        return self._by_owner(ids, "metadata")

    def delete(self, ids) -> None:
        """Delete stored documents (every id must be stored: else UnknownIdError, nothing deleted)."""
        ids = list(ids)
        ray.get([self.actors[s].delete.remote([ids[i] for i in pos]) for s, pos in enumerate(self._owners(ids)) if pos])

    # ---- text: encoded here, stored by the actors

    def _text_record(self) -> dict | None:
        return next((st["encoder"] for st in ray.get([a.stats.remote() for a in self._live()]) if st.get("encoder")),
                    None)

    def _text_float16(self) -> bool:
        return all(st["dtype"] == "float16" for st in ray.get([a.stats.remote() for a in self._live()]))

    def _text_path(self):
        return self.path or self.paths

    def _text_progress(self) -> Progress:
        return Progress()

    def _check_writable(self) -> None:
        self._live()

    def add(self, docs, ids=None, metadata=None, sparse=None) -> list:
        return self._add(docs, ids, metadata, sparse)

    def _add(self, docs, ids=None, metadata=None, sparse=None, encoder_record: dict | None = None) -> list:
        """Store documents, each on the shard holding the fewest tokens; returns their ids.
        ``sparse``: per-document sparse vectors, as ``Database.add`` (each goes with its document).
        ``ids=None`` continues after the largest int id of any shard. The whole batch is checked
        (documents, ids, metadata, sparse vectors, ids already stored in any shard) before any
        shard writes; then the shards commit in parallel. One writing client at a time.
        ``encoder_record`` (``add_texts``): every shard records the encoder with its part of the
        batch (or alone)."""
        from mvdb.storage import validate
        from mvdb.storage.packed import Packed

        actors = self._live()
        infos = ray.get([a.info.remote() for a in actors])
        dim = next((i["dim"] for i in infos if i["dim"] is not None), None)
        tokens, lengths, _ = validate.documents(docs, dim)
        validate.finite(tokens, lengths)  # here, not per shard: one bad document and no shard writes
        n = len(lengths)
        id_type = next((i["id_type"] for i in infos if i["id_type"]), None)
        id_arr, _ = validate.ids(ids, n, id_type, max(i["next_id"] for i in infos))
        validate.metadata(metadata, n)
        validate.sparse(sparse, n)
        ids = [validate.decode_id(x) for x in id_arr]
        dup = np.flatnonzero(self.contains(ids)) if n else []
        if len(dup):
            raise DuplicateIdError(f"ids: already in the database: {[ids[i] for i in dup[:5]]}")
        items = docs.split() if isinstance(docs, Packed) else list(docs)
        parts = assign(lengths, [i["tokens"] for i in infos])
        ray.get([actors[s].add.remote([items[i] for i in pos], [ids[i] for i in pos],
                                      None if metadata is None else [metadata[i] for i in pos],
                                      None if sparse is None else [sparse[i] for i in pos], encoder_record)
                 for s, pos in enumerate(parts) if pos or encoder_record is not None])
        return ids

    def close(self) -> None:
        """Close every shard (their writer locks go) and end the actors; closing again does
        nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            ray.get([a.close.remote() for a in self.actors])
        finally:
            self._end_actors()

    def _end_actors(self) -> None:
        for a in self.actors:
            ray.kill(a)
        self.actors = []
