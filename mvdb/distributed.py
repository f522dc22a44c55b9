"""mvdb across machines on Ray: one actor per shard, a client that fans out and merges, and a
bulk-ingest pipeline on Ray Data. Install with ``pip install mvdb[distributed]``.

    import ray, mvdb.distributed as md
    ray.init()
    md.ingest(["part-0.npz", "part-1.npz"], ["/data/s0", "/data/s1"])   # bulk load, resumable
    cluster = md.Cluster(["/data/s0", "/data/s1"], num_gpus=1)         # one actor (and GPU) per shard
    hits = cluster.search(queries, k=10)

A shard is an ordinary mvdb database directory on the node that runs its actor (give actors a
node with ``actor_options``, e.g. a Ray ``scheduling_strategy``). A document's shard is fixed by
its id (``shard_of``), so ingest, ``Cluster.add`` and a resumed ingest always agree on where it
lives. Every write is a committed batch of one shard's store: an actor that dies leaves its shard
at its last commit, and running the same ``ingest`` again skips the ids already stored.
"""

from __future__ import annotations

import time
import zlib
from collections import deque

import numpy as np

try:
    import ray
except ImportError as e:  # pragma: no cover - the message says what to install
    raise ImportError(f"mvdb.distributed needs Ray: pip install 'mvdb[distributed]' ({e})") from None

from mvdb.errors import InvalidInputError, UnknownIdError
from mvdb.sharded import _merge


def shard_of(doc_id, n_shards: int) -> int:
    """The shard of a document id: int ids modulo the shard count, str ids by CRC-32."""
    if isinstance(doc_id, (int, np.integer)) and not isinstance(doc_id, bool):
        return int(doc_id) % n_shards
    if isinstance(doc_id, str):
        return zlib.crc32(doc_id.encode()) % n_shards
    raise InvalidInputError(f"ids: expected int or str ids, got {type(doc_id).__name__}")


@ray.remote
class ShardWriter:
    """Writes one shard's store during a bulk ingest (no index until ``finish``)."""

    def __init__(self, path: str, dtype: str | None = None):
        from mvdb.storage import Store

        self.path = path
        self.store = Store(path, dtype=dtype)

    def write(self, ids: list, tokens: np.ndarray, lengths: np.ndarray) -> tuple[int, int]:
        """Commit the documents not stored yet; (added, skipped)."""
        keep = ~self.store.contains(ids) if len(self.store) else np.ones(len(ids), dtype=bool)
        if keep.any():
            self.store.add_packed(tokens[np.repeat(keep, lengths)], lengths[keep],
                                  ids=[i for i, k in zip(ids, keep) if k])
        return int(keep.sum()), int((~keep).sum())

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


def _prepare(row: dict, n_shards: int, dim: int | None) -> list[dict]:
    """Ray Data flat_map: validate a batch (shapes, finiteness), convert it to float16, and split
    it by shard."""
    from mvdb.storage import validate

    tokens, lengths = row["tokens"], np.asarray(row["lengths"], dtype=np.int64)
    tokens, lengths, _ = validate.packed(tokens, lengths, dim)
    stored, _ = validate.convert(tokens, lengths, "float16")
    ids = list(row["ids"])
    shard = np.array([shard_of(i, n_shards) for i in ids], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    out = []
    for s in np.unique(shard):
        pick = np.flatnonzero(shard == s)
        rows = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in pick])
        out.append({"shard": int(s), "ids": [ids[i] for i in pick], "tokens": stored[rows], "lengths": lengths[pick]})
    return out


def ingest(sources, shard_paths, *, dtype: str | None = None, dim: int | None = None, batch_docs: int = 2048,
           concurrency: int | None = None, max_in_flight: int = 2, build_index: bool = True, device: str = "auto",
           writer_options: dict | None = None, on_batch=None, progress: bool = True) -> dict:
    """Bulk-load document embeddings into one database per shard path.

    Ray Data reads the sources (the formats of ``mvdb ingest``), validates each batch and converts
    it to float16 in parallel tasks (``concurrency``), and splits it by shard; one ``ShardWriter``
    actor per shard commits its batches as they come (at most ``max_in_flight`` queued each), so
    the shards are written in parallel. Ids already stored are skipped: re-running an interrupted
    ingest completes it. ``on_batch(i, writers)`` is called after dispatching batch i (tests use
    it to inject failures). Returns counts and timings.
    """
    paths = [str(p) for p in shard_paths]
    if not paths:
        raise InvalidInputError("shard_paths: expected at least one shard directory, got none")
    sources = [str(s) for s in ([sources] if isinstance(sources, str) else sources)]
    if not sources:
        raise InvalidInputError("sources: expected at least one source file or directory, got none")
    t0 = time.perf_counter()
    writers = [ShardWriter.options(**(writer_options or {})).remote(p, dtype) for p in paths]
    n = len(paths)
    ds = ray.data.from_items([{"path": s} for s in sources])
    ds = ds.flat_map(_read, fn_kwargs={"batch_docs": batch_docs})
    ds = ds.flat_map(_prepare, fn_kwargs={"n_shards": n, "dim": dim}, concurrency=concurrency)
    try:
        pending = [deque() for _ in range(n)]
        added = skipped = tokens = 0
        for i, row in enumerate(ds.iter_rows()):
            s = int(row["shard"])
            if len(pending[s]) >= max_in_flight:  # backpressure: wait for this shard's oldest batch
                a, b = ray.get(pending[s].popleft())
                added, skipped = added + a, skipped + b
            lengths = np.asarray(row["lengths"], dtype=np.int64)
            tokens += int(lengths.sum())
            pending[s].append(writers[s].write.remote(list(row["ids"]), np.asarray(row["tokens"]), lengths))
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
            try:
                ray.get(w.close.remote(), timeout=60)
            except Exception:  # noqa: BLE001 - a dead writer's lock goes with its process
                pass
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
    import os

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

    def search(self, queries, k, where, options):
        if not len(self.db):
            return None
        return self.db.search(queries, k, where, **options)

    def rerank(self, queries, candidate_ids, k):
        return self.db.rerank(queries, candidate_ids, k)

    def contains(self, ids) -> np.ndarray:
        return self.db.store.contains(ids) if len(self.db) else np.zeros(len(ids), dtype=bool)

    def add(self, docs, ids, metadata):
        return self.db.add(docs, ids=ids, metadata=metadata)

    def delete(self, ids):
        self.db.delete(ids)

    def get(self, ids):
        return self.db.get(ids)

    def next_id(self) -> int:
        return self.db.store.manifest["next_id"]

    def stats(self) -> dict:
        return self.db.stats()

    def close(self):
        self.db.close()


class Cluster:
    """Client of one ``ShardActor`` per shard path: fans a query batch out and merges the exact
    per-shard top-k by score. ``num_gpus`` per actor (the actor's database then runs on its GPU),
    ``actor_options`` for placement; other keywords go to ``mvdb.open`` in each actor."""

    def __init__(self, shard_paths, *, num_gpus: float = 0, actor_options: dict | None = None, **open_kw):
        paths = [str(p) for p in shard_paths]
        if not paths:
            raise InvalidInputError("shard_paths: expected at least one shard directory, got none")
        opts = dict(actor_options or {}, num_gpus=num_gpus)
        open_kw.setdefault("device", "cuda" if num_gpus else "cpu")
        self.actors = [ShardActor.options(**opts).remote(p, **open_kw) for p in paths]
        ray.get([a.stats.remote() for a in self.actors])  # surface open errors here

    def __len__(self) -> int:
        return sum(s["documents"] for s in self.stats())

    def stats(self) -> list[dict]:
        return ray.get([a.stats.remote() for a in self.actors])

    def search(self, queries, k: int = 10, where=None, **options):
        """Top-k by exact MaxSim over every shard (same arguments as ``Database.search``)."""
        per = [p for p in ray.get([a.search.remote(queries, k, where, options) for a in self.actors]) if p is not None]
        single = getattr(queries, "ndim", None) == 2
        if not per:
            return [] if single else [[] for _ in range(len(queries))]
        if single:
            return _merge(per, k)
        return [_merge([p[i] for p in per], k) for i in range(len(per[0]))]

    def _owners(self, ids) -> list[list[int]]:
        n = len(self.actors)
        by = [[] for _ in range(n)]
        for i, doc_id in enumerate(ids):
            by[shard_of(doc_id, n)].append(i)
        return by

    def add(self, docs, ids=None, metadata=None) -> list:
        """Store documents on the shards their ids map to; ``ids=None`` continues after the
        largest int id of any shard (one writing client at a time)."""
        docs = list(docs)
        if ids is None:
            start = max(ray.get([a.next_id.remote() for a in self.actors]))
            ids = list(range(start, start + len(docs)))
        ids = list(ids)
        if len(ids) != len(docs):
            raise InvalidInputError(f"ids: expected {len(docs)} ids (one per document), got {len(ids)}")
        jobs = []
        for s, pos in enumerate(self._owners(ids)):
            if pos:
                jobs.append(self.actors[s].add.remote([docs[i] for i in pos], [ids[i] for i in pos],
                                                      None if metadata is None else [metadata[i] for i in pos]))
        ray.get(jobs)
        return ids

    def delete(self, ids) -> None:
        ids = list(ids)
        owners = self._owners(ids)
        found = np.zeros(len(ids), dtype=bool)
        for s, pos in enumerate(owners):
            if pos:
                found[pos] = ray.get(self.actors[s].contains.remote([ids[i] for i in pos]))
        if not found.all():
            raise UnknownIdError(f"ids: not in the database: {[ids[i] for i in np.flatnonzero(~found)[:5]]}")
        ray.get([self.actors[s].delete.remote([ids[i] for i in pos]) for s, pos in enumerate(owners) if pos])

    def get(self, ids) -> list[np.ndarray]:
        ids = list(ids)
        out = [None] * len(ids)
        for s, pos in enumerate(self._owners(ids)):
            if pos:
                for i, arr in zip(pos, ray.get(self.actors[s].get.remote([ids[i] for i in pos]))):
                    out[i] = arr
        return out

    def close(self) -> None:
        ray.get([a.close.remote() for a in self.actors])
        for a in self.actors:
            ray.kill(a)
        self.actors = []
