"""One database over several GPUs of a host: ``mvdb.open(path, devices=["cuda:0", "cuda:1"])``.

The directory holds ``shards.json`` (:mod:`mvdb.shards.layout`) and one ordinary mvdb database
per shard (``shard-000`` ...), each with its own token index and resident tokens on its device.
Documents live in exactly one shard; ids are global (auto ids continue after the largest id of any
shard) and never move. A query batch runs on every shard at once (one thread per CUDA shard; the
GPU work of the shards overlaps; CPU shards run in turn) and the per-shard exact top-k lists are
merged by score (:mod:`mvdb.shards.merge`).

An ``add`` places each document on the shard with the fewest tokens at that moment
(:mod:`mvdb.shards.placement`, the policy ``mvdb ingest --shards`` and :mod:`mvdb.shards.cluster`
use too) and commits shard by shard: a crash in between leaves the shards committed so far, and
re-adding the same ids then reports them as duplicates (skip them with ``db.contains``). Reads by
id ask every shard which ids it holds. The number of shards is fixed when the directory is
created; it may be opened with fewer devices (shards go round-robin onto them) or with none (every
shard on ``device``).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
import torch

from mvdb.contract import DatabaseAPI
from mvdb.database import Database
from mvdb.encoders import as_encoder
from mvdb.engine.args import open_args
from mvdb.engine.progress import Progress
from mvdb.engine.search import check_k as _check_k
from mvdb.errors import DuplicateIdError, FormatError, InvalidInputError
from mvdb.explain import ExplainMethods
from mvdb.shards import layout
from mvdb.storage.packed import Packed
from mvdb.shards.merge import (
    merge,
    merge_queries,
    merge_reports,
    merge_stats,
    single_query,
)
from mvdb.shards.placement import contains_any, membership, owners, place
from mvdb.storage import VerifyReport, validate
from mvdb.storage.manifest import MANIFEST
from mvdb.warm import check_query_tokens, check_stop, default_query_tokens
from mvdb.pooling import disagreement, pool_for_store, pooling_arg, resolve_open, resolve_pooling
from mvdb.text import TextMethods, check_encoder, recorded_encoder

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["ShardedDatabase"]


class ShardedDatabase(TextMethods, ExplainMethods, DatabaseAPI):
    """The :class:`mvdb.Database` API over one shard per device; see the module docstring.
    ``encoder``: as for ``Database`` (:mod:`mvdb.text`); its record goes into every shard."""

    _pools = True

    def __init__(self, path, *, devices=None, dim=None, dtype=None, device="auto", read_only=False, encoder=None,
                 pool_factor=None, pool_protected=None, **options):
        asked = pooling_arg(pool_factor, pool_protected)
        path = open_args(path, dim=dim, dtype=dtype, read_only=read_only, **options)
        self.path = path
        self.encoder = as_encoder(encoder)
        self._progress = Progress(options.get("progress"))
        self._closed = False
        self._writer = threading.RLock()  # one write at a time across all shards
        if devices is not None:
            if isinstance(devices, (str, torch.device)) or not devices:
                raise InvalidInputError(f"devices: expected a non-empty list of devices, got {devices!r}")
            devices = [torch.device(d) if not isinstance(d, torch.device) else d for d in devices]
        if os.path.exists(os.path.join(path, MANIFEST)):
            raise InvalidInputError(
                f"{path}: holds a single-shard database; open it without devices= (it cannot be split in place)"
            )
        created = []  # what this open made on disk: removed again if it fails
        if layout.is_sharded(path):
            names = layout.read(path).shards
        elif read_only:
            raise FileNotFoundError(f"{path}: no {layout.SHARDS} here (read_only=True does not create one)")
        else:
            if devices is None:
                raise InvalidInputError(f"devices: creating a sharded database at {path} needs the list of devices")
            if os.path.lexists(path) and not os.path.isdir(path):
                raise FormatError(f"{path}: is not a directory; expected an mvdb database directory")
            if os.path.isdir(path) and layout.has_other_files(path):
                raise FormatError(f"{path}: holds other files and no {layout.SHARDS}; not an mvdb database")
            if not os.path.isdir(path):
                os.makedirs(path)
                created.append(path)
            names = [layout.shard_name(i) for i in range(len(devices))]
            layout.write(path, names)
            created.append(os.path.join(path, layout.SHARDS))
        on = [devices[i % len(devices)] for i in range(len(names))] if devices else [device] * len(names)
        self.names = list(names)
        self.shards: list[Database] = []
        try:
            for name, dev in zip(names, on):
                self.shards.append(Database(os.path.join(path, name), dim=dim, dtype=dtype, device=dev,
                                            read_only=read_only, **options))
            stores = [s.store for s in self.shards]
            check_encoder(self.encoder, recorded_encoder(stores), path, sum(len(s) for s in self.shards))
            self._check_shards_pool_alike()
            rec, new = resolve_open(asked, self.pooling, path, sum(len(s) for s in self.shards), self.encoder,
                                    read_only)
            if new:
                for s in self.shards:
                    s._add([], pooling=rec, pooled=True)  # the record alone, published to the shard's state
        except BaseException:
            empty = not any(s.store.snapshot().n_live for s in self.shards)  # counted before the shards close
            self.close()
            if created and empty:
                for s in self.shards:
                    s.store.discard_new()
                _remove_new(path, created, names)
            raise
        self._pool = ThreadPoolExecutor(max_workers=len(self.shards), thread_name_prefix="mvdb-shard")

    # ---- fan-out helpers

    def _open(self) -> list[Database]:
        """The shards of an open database (InvalidInputError once closed, as ``Database``)."""
        if self._closed:
            raise InvalidInputError(f"{self.path}: the database is closed")
        return self.shards

    def _each(self, fn, shards=None) -> list:
        """fn(shard) on every shard at once (each under its own CUDA device), results in order."""
        shards = self._open() if shards is None else shards

        def run(shard):
            if shard.device.type == "cuda":
                with torch.cuda.device(shard.device):
                    return fn(shard)
            return fn(shard)

        if len(shards) == 1 or any(s.device.type != "cuda" for s in shards):
            # CPU shards run one after another: no GPU work to overlap, and Triton's interpreter
            # (the CPU kernels) is not thread-safe
            return [run(s) for s in shards]
        return list(self._pool.map(run, shards))

    @property
    def dim(self) -> int | None:
        return next((s.dim for s in self._open() if s.dim is not None), None)

    def __len__(self) -> int:
        return sum(len(s) for s in self._open())

    def contains(self, ids) -> np.ndarray:
        """Bool mask: which of ``ids`` are stored (in any shard)."""
        return contains_any([s.store for s in self._open()], list(ids))

    def __contains__(self, doc_id) -> bool:
        return any(doc_id in s for s in self._open())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close every shard (their writer locks go); any later use is an InvalidInputError."""
        self._closed = True
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=True)
        for s in getattr(self, "shards", []):
            s.close()

    # ---- writes

    def _owner(self, ids) -> list[list[int]]:
        """Positions of ``ids`` per shard, by asking each shard which it holds; every id must be
        stored (else UnknownIdError)."""
        ids = list(ids)
        return owners([membership(s.store, ids) for s in self._open()], ids)

    @property
    def pooling(self) -> dict | None:
        """The database's token pooling (every shard records the same), as ``Database.pooling``."""
        return next((s.pooling for s in self.shards if s.pooling), None)

    def _check_shards_pool_alike(self) -> None:
        """FormatError where the shards disagree on pooling: two records, or a record on one shard
        and unpooled documents on another (a shard written on its own)."""
        held = disagreement([s.store for s in self.shards])
        if held is not None:
            raise FormatError(f"{self.path}: its shards disagree on token pooling ({held}): a shard was written on "
                              f"its own; export the documents and ingest them into a new database")

    def add(self, docs, ids=None, metadata=None, sparse=None, *, pool_factor=None, pool_protected=None) -> list:
        """Store documents, each on the shard holding the fewest tokens; returns their (global) ids.
        Everything is checked before any shard writes. Writes are serialised across threads (ids
        are allocated over all shards); searches run concurrently with them. Pooling as in
        ``Database.add``: the documents are pooled before they are placed."""
        return self._add(docs, ids, metadata, sparse, pooling=pooling_arg(pool_factor, pool_protected))

    def _add(self, docs, ids=None, metadata=None, sparse=None, encoder_record: dict | None = None,
             pooling: dict | None = None) -> list:
        """``add``; with ``encoder_record`` (``add_texts``), every shard records the encoder once the
        whole batch passed its checks (with its part of the batch, or alone); the pooling likewise."""
        with self._writer:
            return self._add_locked(docs, ids, metadata, sparse, encoder_record, pooling)

    def _add_locked(self, docs, ids, metadata, sparse, encoder_record, pooling=None) -> list:
        for s in self._open():
            s.store.check_writable()
        rec, new = resolve_pooling(pooling, self.pooling, self.path, len(self))
        tokens, lengths, _ = validate.documents(docs, self.dim)  # shapes, dtypes, dim
        # finite and within the stores' range, here, not per shard: one bad document and no shard writes
        for dtype in sorted({s.store.dtype for s in self.shards}):
            validate.in_range(tokens, lengths, dtype)
        if rec is not None and len(lengths):
            docs = Packed.of(*pool_for_store(tokens, lengths, rec, self.shards[0].store.dtype, self.shards[0].device))
            tokens, lengths = docs.tokens, np.diff(docs.offsets)
        n = len(lengths)
        id_type = next((s.store.manifest["id_type"] for s in self.shards if s.store.manifest["id_type"]), None)
        next_id = max(s.store.manifest["next_id"] for s in self.shards)
        id_arr, _ = validate.ids(ids, n, id_type, next_id)
        validate.metadata(metadata, n)
        validate.sparse(sparse, n)
        ids = [validate.decode_id(x) for x in id_arr]
        dup = np.flatnonzero(self.contains(ids)) if n else []
        if len(dup):
            raise DuplicateIdError(f"ids: already in the database: {[ids[i] for i in dup[:5]]}")
        # a [n, L, dim] array or tensor, or packed documents, split into their documents
        items = docs.split() if isinstance(docs, Packed) else list(docs)
        parts = place(lengths, [s.store for s in self.shards])
        jobs = {id(self.shards[si]): part for si, part in enumerate(parts) if part}

        def add_part(shard):
            part = jobs[id(shard)]
            return shard._add([items[i] for i in part], ids=[ids[i] for i in part],
                              metadata=None if metadata is None else [metadata[i] for i in part],
                              sparse=None if sparse is None else [sparse[i] for i in part], encoder_record=encoder_record,
                              pooling=rec, pooled=True)

        self._each(add_part, [s for s in self.shards if id(s) in jobs])
        # the shards that got none of the batch record what the others recorded with theirs, after them
        if encoder_record is not None or rec is not None:
            for s in self.shards:
                if id(s) not in jobs and (encoder_record is not None or s.pooling is None):
                    s._add([], encoder_record=encoder_record, pooling=rec, pooled=True)
        return ids

    def _text_stores(self) -> list:
        return [s.store for s in self._open()]

    def _text_progress(self) -> Progress:
        return self._progress

    def _check_writable(self) -> None:
        for s in self._open():
            s.store.check_writable()

    def delete(self, ids) -> None:
        with self._writer:
            ids = list(ids)
            for si, pos in enumerate(self._owner(ids)):
                if pos:
                    self.shards[si].delete([ids[i] for i in pos])

    def compact(self) -> int:
        with self._writer:
            return sum(self._each(lambda s: s.compact()))

    def refresh(self) -> bool:
        with self._writer:
            return any(self._each(lambda s: s.refresh()))

    # ---- reads

    def _by_owner(self, ids, fn) -> list:
        """fn(shard, its ids) for the shards holding ``ids``, results back in the order of ``ids``."""
        ids = list(ids)
        out = [None] * len(ids)
        for si, pos in enumerate(self._owner(ids)):
            if pos:
                for i, v in zip(pos, fn(self.shards[si], [ids[i] for i in pos])):
                    out[i] = v
        return out

    def get(self, ids) -> list[np.ndarray]:
        return self._by_owner(ids, lambda s, part: s.get(part))

    def metadata(self, ids) -> list:
        return self._by_owner(ids, lambda s, part: s.metadata(part))

    def verify(self) -> VerifyReport:
        """Every shard's checks as one report (the shape of ``Database.verify()``): ``ok``,
        ``problems`` (each prefixed by its shard's name), ``n_docs`` and ``n_segments`` summed."""
        return merge_reports(zip(self.names, (s.verify() for s in self._open())))

    def stats(self) -> dict:
        """The keys of ``Database.stats()`` over the shards (:func:`mvdb.shards.merge.merge_stats`):
        counts summed, ``dim`` / ``dtype`` / ``index`` / ``residency`` shared, ``devices`` and the
        per-shard dicts under ``shards``."""
        return merge_stats([s.stats() for s in self._open()], self.path)

    def warmup(self, max_query_tokens: int | None = None, *, progress: bool | None = None, stop=None) -> dict:
        """``Database.warmup`` on every shard at once -> the slowest shard's seconds and every
        shard's figures under ``shards`` (``stop``: as there)."""
        n = default_query_tokens(self.encoder, recorded_encoder(self._text_stores())) if max_query_tokens is None \
            else check_query_tokens(max_query_tokens)
        check_stop(stop)
        per = self._each(lambda s: s.warmup(n, progress=progress, stop=stop))
        return {"seconds": max(p["seconds"] for p in per), "searches": sum(p["searches"] for p in per),
                "stopped": any(p["stopped"] for p in per), "shards": per}

    def search(self, queries, k: int = 10, where=None, **options):
        """Top-k by exact MaxSim: every shard's own candidates and top-k, merged by score."""
        _check_k(k)
        if self.dim is None:  # nothing stored yet: the shards agree on the empty answer
            return self.shards[0].search(queries, k, where, **options)
        single = single_query(queries)
        per = self._each(lambda s: s.search(queries, k, where, **options) if len(s) else None)
        per = [p for p in per if p is not None]
        if not per:  # every document deleted: one shard validates the arguments and answers empty
            return self.shards[0].search(queries, k, where, **options)
        return merge_queries(per, k, single)

    def rerank(self, queries, candidate_ids, k: int | None = None):
        """Exact MaxSim of each query against its own candidate ids (one list, or one per query)."""
        if k is not None:
            _check_k(k)
        if self.dim is None:
            return self.shards[0].rerank(queries, candidate_ids, k)
        single = single_query(queries)
        q_list = [queries] if single else list(queries)
        lists = [list(candidate_ids)] if single else [list(c) for c in candidate_ids]
        if len(lists) != len(q_list):
            raise InvalidInputError(f"candidate_ids: expected {len(q_list)} lists (one per query), got {len(lists)}")
        # per shard, every query with the candidates that shard holds (possibly none): one batch each
        per_shard = [[[] for _ in lists] for _ in self.shards]
        for qi, c in enumerate(lists):
            for si, pos in enumerate(self._owner(c)):
                per_shard[si][qi] = [c[i] for i in pos]
        busy = {id(s): per_shard[si] for si, s in enumerate(self.shards) if any(per_shard[si])}
        per = self._each(lambda s: s.rerank(q_list, busy[id(s)]), [s for s in self.shards if id(s) in busy])
        out = [merge([p[qi] for p in per], k) for qi in range(len(lists))]
        return out[0] if single else out



def _remove_new(path: str, created: list[str], names: list[str]) -> None:
    """Undo a failed open that created a sharded database: its layout file, empty shard folders
    left by the shards' own clean-up, and the directory when this open made it."""
    for p in reversed(created):
        if p != path and os.path.isfile(p):
            os.unlink(p)
    for name in names:
        d = os.path.join(path, name)
        if os.path.isdir(d) and not os.listdir(d):
            os.rmdir(d)
    if path in created and os.path.isdir(path) and not os.listdir(path):
        os.rmdir(path)
