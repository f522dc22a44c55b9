"""The segment store: immutable HDF5 segments + an atomically replaced manifest.

Nothing committed is ever modified: ``add`` writes new segments, ``delete`` writes a new manifest,
``compact`` writes new segments and a manifest that drops the old ones. A crash at any instant
leaves the last committed manifest valid; the next writer removes the orphans. One writer at a
time (an fcntl lock); readers take no lock and work on a manifest snapshot until ``refresh()``.
"""

from __future__ import annotations

import errno
import functools
import io
import os
import uuid
import zlib
from dataclasses import dataclass

import numpy as np

from mvdb.kernels.errors import (
    CorruptionError,
    DuplicateIdError,
    FormatError,
    InvalidInputError,
    ReadOnlyError,
    StorageError,
    UnknownIdError,
)
from mvdb.storage import validate
from mvdb.storage._io import WriterLock, atomic_write, fsync_dir, storage_error
from mvdb.storage.manifest import MANIFEST, new_manifest, read_manifest, write_manifest
from mvdb.storage.packed import Packed
from mvdb.storage.segment import SegmentReader, write_segment

DTYPES = ("float16", "int8")
SEGMENTS = "segments"
INDEX = "index"  # derived token-index files, named by the manifest's "index_files"
TMP_PREFIX = ".tmp-"


@dataclass
class VerifyReport:
    """What verify() found; ``ok`` when nothing."""

    problems: list[str]
    n_docs: int
    n_segments: int

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        head = f"{self.n_docs} documents in {self.n_segments} segments: "
        return head + ("OK" if self.ok else f"{len(self.problems)} problem(s)\n  " + "\n  ".join(self.problems))


def _io(doing: str):
    """Decorator of the write methods: an OSError from the system leaves as a StorageError naming
    the path and errno (the last commit is intact: nothing is committed before the manifest rename)."""
    def wrap(fn):
        @functools.wraps(fn)
        def method(self, *args, **kwargs):
            try:
                return fn(self, *args, **kwargs)
            except OSError as e:
                raise storage_error(e, self.path, doing) from e.__cause__
        return method
    return wrap


def _free_bytes(path: str) -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _runs(src: np.ndarray, dst: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge copies (src[i] -> dst[i], n[i] rows) that continue each other on both sides into runs."""
    if len(src) == 0:
        return src, dst, n
    cont = np.zeros(len(src), bool)
    cont[1:] = (src[1:] == src[:-1] + n[:-1]) & (dst[1:] == dst[:-1] + n[:-1])
    head = np.flatnonzero(~cont)
    total = np.add.reduceat(n, head)
    return src[head], dst[head], total


class Snapshot:
    """One committed state: its manifest, its opened segments and every read of it. Immutable:
    a writer's commit makes a new snapshot, and one held (by a search, say) keeps reading the
    segments it opened, which stay open until the last holder drops it.

    Rows are the snapshot's documents in storage order, deleted ones included (``live`` says
    which are not); row numbers hold until a compaction rewrites segments."""

    def __init__(self, manifest: dict, readers: list[SegmentReader]):
        self.manifest = manifest
        self.readers = readers
        counts = [r.n_docs for r in readers]
        self.doc_start = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        self.live = np.ones(int(self.doc_start[-1]), dtype=bool)
        for i, seg in enumerate(manifest["segments"]):
            if seg["deleted"]:
                self.live[self.doc_start[i] + np.asarray(seg["deleted"], dtype=np.int64)] = False
        self.live.setflags(write=False)
        self.n_live = int(self.live.sum())
        self._keys = None
        self._all_keys = None

    @property
    def live_tokens(self) -> int:
        """Tokens of the live documents (deleted ones left out)."""
        return sum(int(np.diff(r.offsets)[self.live[a:b]].sum())
                   for r, a, b in zip(self.readers, self.doc_start[:-1], self.doc_start[1:]))

    @property
    def generation(self) -> int:
        return self.manifest["generation"]

    @property
    def dim(self) -> int | None:
        return self.manifest["dim"]

    @property
    def dtype(self) -> str:
        return self.manifest["dtype"]

    @property
    def n_rows(self) -> int:
        return int(self.doc_start[-1])

    def row_keys(self) -> np.ndarray:
        """Every row's stored id key (int64, or utf-8 bytes), in row order."""
        if self._all_keys is None:
            self._all_keys = np.concatenate([r.ids for r in self.readers]) if self.readers else np.zeros(0, np.int64)
        return self._all_keys

    def _index(self):
        if self._keys is None:
            rows = np.flatnonzero(self.live)
            keys = self.row_keys()[rows]
            order = np.argsort(keys, kind="stable")
            keys, rows = keys[order], rows[order]
            twice = np.flatnonzero(keys[1:] == keys[:-1])
            if len(twice):
                seg = self.locate(rows[[twice[0], twice[0] + 1]])[0]
                segs = sorted({self.readers[int(i)].path for i in seg})
                raise CorruptionError(f"ids: live id {validate.decode_id(keys[twice[0]])!r} is stored twice "
                                      f"({', '.join(segs)}); damaged ids or manifest")
            self._keys, self._rows = keys, rows
        return self._keys, self._rows

    def find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows of live ids given as stored keys (and a found mask)."""
        sorted_keys, rows = self._index()
        if len(sorted_keys) == 0 or len(keys) == 0:
            return np.zeros(len(keys), np.int64), np.zeros(len(keys), bool)
        if sorted_keys.dtype.kind != np.asarray(keys).dtype.kind:
            return np.zeros(len(keys), np.int64), np.zeros(len(keys), bool)
        pos = np.searchsorted(sorted_keys, keys).clip(max=len(sorted_keys) - 1)
        found = sorted_keys[pos] == keys
        return rows[pos], found

    def keys(self, ids, check_type: bool = True) -> np.ndarray | None:
        """User ids -> the stored key representation (int64, or utf-8 bytes).

        Ids of the wrong kind for this database raise UnknownIdError, or give None when
        ``check_type`` is False (membership tests: such ids are simply absent).
        """
        if isinstance(ids, (str, int, np.integer)):
            ids = [ids]
        values = list(ids.tolist() if hasattr(ids, "tolist") else ids)
        if not values:
            return np.zeros(0, np.int64)
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
            if any(not -(2**63) <= int(v) < 2**63 for v in values):  # never stored: ids are int64
                if not check_type:
                    return None
                raise UnknownIdError(f"ids: not in the database (outside int64): {values[:5]}")
            kind, keys = "int", lambda: np.array(values, dtype=np.int64)
        elif all(isinstance(v, str) for v in values):
            kind, keys = "str", lambda: np.array([v.encode() for v in values], dtype=bytes)
        else:
            kind, keys = None, None
        stored = self.manifest["id_type"] or "int"
        if kind == stored:
            return keys()
        if not check_type:
            return None
        if kind is None:
            raise UnknownIdError(f"ids: expected int or str ids, got {[type(v).__name__ for v in values[:3]]}")
        raise UnknownIdError(f"ids: this database uses {stored} ids; unknown ids {values[:5]}")

    def rows(self, ids) -> np.ndarray:
        """Rows of live ids (UnknownIdError naming the first missing ones)."""
        keys = self.keys(ids)
        rows, found = self.find(keys)
        if not found.all():
            missing = [validate.decode_id(x) for x in keys[~found][:5]]
            raise UnknownIdError(f"ids: not in the database: {missing}" + (" ..." if (~found).sum() > 5 else ""))
        return rows

    def contains(self, ids) -> np.ndarray:
        """Bool mask: which of ``ids`` are live (ids of the other type are simply absent)."""
        keys = self.keys(ids, check_type=False)
        if keys is None:
            return np.zeros(len(list(ids)), bool)
        return self.find(keys)[1]

    def locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        seg = np.searchsorted(self.doc_start, rows, side="right") - 1
        return seg, rows - self.doc_start[seg]

    def row_lengths(self, rows: np.ndarray) -> np.ndarray:
        seg, local = self.locate(np.asarray(rows, dtype=np.int64))
        lengths = np.zeros(len(seg), np.int64)
        for s in np.unique(seg):
            sel = seg == s
            off = self.readers[s].offsets
            lengths[sel] = off[local[sel] + 1] - off[local[sel]]
        return lengths

    def gather(self, rows: np.ndarray) -> "Packed":
        """Packed tokens of rows, in the order given (as stored: float16, or int8 + scales)."""
        rows = np.asarray(rows, dtype=np.int64)
        seg, local = self.locate(rows)
        lengths = self.row_lengths(rows)
        out_off = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        dim = self.dim
        tok_dtype = np.int8 if self.dtype == "int8" else np.float16
        tokens = np.empty((int(out_off[-1]), dim or 0), dtype=tok_dtype)
        scales = np.empty(int(out_off[-1]), dtype=np.float32) if self.dtype == "int8" else None
        keys = None
        for s in np.unique(seg):
            sel = np.flatnonzero(seg == s)
            r = self.readers[s]
            src, dst, n = _runs(r.offsets[local[sel]], out_off[sel], lengths[sel])
            r.read_runs("tokens", tokens, src, dst, n)
            if scales is not None:
                r.read_runs("scales", scales, src, dst, n)
            k = r.ids[local[sel]]
            if keys is None:
                keys = np.empty(len(rows), dtype=k.dtype if k.dtype.kind != "S" else object)
            keys[sel] = k
        if keys is None:
            keys = np.zeros(0, np.int64)
        elif keys.dtype == object:
            keys = keys.astype(bytes)
        packed = Packed(tokens, out_off, scales, [validate.decode_id(x) for x in keys])
        packed.rows, packed.keys = rows, keys
        return packed

    def metadata(self, rows: np.ndarray) -> list[str]:
        """Each row's metadata as its JSON text ("null" where none was stored)."""
        seg, local = self.locate(np.asarray(rows, dtype=np.int64))
        out = [None] * len(seg)
        for s in np.unique(seg):
            sel = np.flatnonzero(seg == s)
            for i, v in zip(sel, self.readers[s].metadata(local[sel])):
                out[i] = v if v is not None else "null"
        return out

    def sparse(self, rows: np.ndarray):
        """Sparse vectors of rows as (offsets, terms, weights); documents stored without one have
        no terms."""
        seg, local = self.locate(np.asarray(rows, dtype=np.int64))
        counts = np.zeros(len(seg), dtype=np.int64)
        pieces = [None] * len(seg)
        for s in np.unique(seg):
            sp = self.readers[s].sparse
            if sp is None:
                continue
            off, t, w = sp
            for i in np.flatnonzero(seg == s):
                a, b = int(off[local[i]]), int(off[local[i] + 1])
                pieces[i] = (t[a:b], w[a:b])
                counts[i] = b - a
        offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        terms = np.concatenate([p[0] for p in pieces if p is not None] or [np.zeros(0, np.int32)]).astype(np.int32)
        weights = np.concatenate([p[1] for p in pieces if p is not None] or [np.zeros(0, np.float32)])
        return offsets, terms, weights.astype(np.float32)

    def close(self) -> None:
        for r in self.readers:
            r.close()


class Store:
    """A directory of immutable CSR segments and a manifest. See the module docstring."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        dim: int | None = None,
        dtype: str | None = None,
        read_only: bool = False,
        segment_tokens: int = 1 << 22,
        checksums: bool = True,
    ):
        self.path = os.fspath(path)
        self.checksums = checksums  # check each whole segment's tokens CRC-32 as it is loaded
        # segments this handle wrote: their bytes were checksummed as they were written, so loading
        # them back (the engine following its own add) skips the re-check
        self.written_here: set[str] = set()
        self.read_only = read_only
        self.segment_tokens = segment_tokens
        if dtype is not None and dtype not in DTYPES:
            raise InvalidInputError(f"dtype: expected one of {DTYPES}, got {dtype!r}")
        self._lock = None
        self._snap = None
        self._behind = None  # a committed manifest not opened yet (see _catch_up)
        self._prepare_directory(read_only)
        try:
            if os.path.exists(os.path.join(self.path, MANIFEST)):
                read_manifest(self.path)  # another format or a newer version: refuse before writing anything
            if not read_only:
                self._lock = WriterLock(self.path)
            if not os.path.exists(os.path.join(self.path, MANIFEST)):
                os.makedirs(os.path.join(self.path, SEGMENTS), exist_ok=True)
                write_manifest(self.path, dict(new_manifest(dim, dtype or "float16"), generation=-1))
            manifest = read_manifest(self.path)
            if dim is not None and manifest["dim"] is not None and dim != manifest["dim"]:
                raise InvalidInputError(f"dim: the database at {self.path} stores dim {manifest['dim']}, got {dim}")
            if dtype is not None and dtype != manifest["dtype"]:
                raise InvalidInputError(f"dtype: the database at {self.path} stores {manifest['dtype']}, got {dtype!r}")
            if not read_only:
                self._remove_orphans(manifest)
            self._snap = self._open_snapshot(manifest)
            self._snap._index()  # the id index, built now: a live id stored twice is damage (CorruptionError)
        except BaseException:
            self.close()
            raise

    def _prepare_directory(self, read_only: bool) -> None:
        p = self.path
        if os.path.isfile(p):
            raise FormatError(f"{p}: is a file; expected an mvdb database directory")
        if os.path.isdir(p):
            if os.path.exists(os.path.join(p, MANIFEST)):
                return
            ours = ("LOCK", SEGMENTS)  # and a manifest temp file: a crash while creating the database
            if any(not name.startswith((".", MANIFEST + ".tmp")) and name not in ours and name != INDEX
                   for name in os.listdir(p)):
                raise FormatError(f"{p}: holds other files and no {MANIFEST}; not an mvdb database")
            data = _data_files(p)
            if data:
                # Segments without a manifest: never treat them as orphans (that deletes the data).
                shown = ", ".join(data[:5]) + (f" and {len(data) - 5} more" if len(data) > 5 else "")
                raise CorruptionError(
                    f"{p}: {MANIFEST} is missing but the database holds {len(data)} data file(s) ({shown}); "
                    f"nothing was changed. Rebuild the manifest from the checksummed segments with "
                    f"`mvdb recover {p}` (or mvdb.recover(path)); deletions made since they were written are lost"
                )
        elif read_only:
            raise FileNotFoundError(f"{p}: no database here (read_only=True does not create one)")
        if read_only:
            raise FileNotFoundError(f"{p}: no {MANIFEST} here (read_only=True does not create one)")
        os.makedirs(p, exist_ok=True)

    def _open_snapshot(self, manifest: dict) -> Snapshot:
        """Open every segment of ``manifest``, reusing the ones already open."""
        old = {r.path: r for r in self._snap.readers} if self._snap is not None else {}
        for attempt in range(5):
            readers, opened = [], []
            try:
                for seg in manifest["segments"]:
                    path = os.path.join(self.path, SEGMENTS, seg["name"])
                    if path in old:
                        readers.append(old[path])
                    else:
                        r = _open_segment(path, seg)
                        opened.append(r)
                        readers.append(r)
                return Snapshot(manifest, readers)
            except FileNotFoundError as e:
                # A writer compacted between our manifest read and the open: read the new manifest.
                for r in opened:
                    r.close()
                newer = read_manifest(self.path)
                if attempt == 4 or newer["generation"] == manifest["generation"]:
                    raise CorruptionError(f"{e.filename}: a segment the manifest names is missing "
                                          f"(`mvdb verify {self.path}` lists every problem)") from None
                manifest = newer
            except BaseException:
                for r in opened:
                    r.close()
                raise
        raise AssertionError("unreachable")

    def _remove_orphans(self, manifest: dict) -> None:
        """Temp files and segments no manifest names: leftovers of a crashed writer (writer only)."""
        seg_dir = os.path.join(self.path, SEGMENTS)
        os.makedirs(seg_dir, exist_ok=True)
        live = {s["name"] for s in manifest["segments"]}
        removed = False
        for name in os.listdir(seg_dir):
            if name.startswith(TMP_PREFIX) or (name.endswith(".h5") and name not in live):
                os.unlink(os.path.join(seg_dir, name))
                removed = True
        for name in os.listdir(self.path):
            if name.startswith(MANIFEST + ".tmp"):
                os.unlink(os.path.join(self.path, name))
                removed = True
        if removed:
            fsync_dir(seg_dir)
        index_dir = os.path.join(self.path, INDEX)
        if os.path.isdir(index_dir):
            named = {e["name"] for e in manifest.get("index_files", [])}
            stale = [n for n in os.listdir(index_dir) if n not in named]
            for name in stale:
                os.unlink(os.path.join(index_dir, name))
            if stale:
                fsync_dir(index_dir)

    # ---- properties

    @property
    def manifest(self) -> dict:
        if self._snap is None:
            raise InvalidInputError(f"{self.path}: the store is closed")
        return self._snap.manifest

    @property
    def dim(self) -> int | None:
        return self._snap.manifest["dim"]

    @property
    def dtype(self) -> str:
        return self._snap.manifest["dtype"]

    @property
    def generation(self) -> int:
        return self._snap.manifest["generation"]

    def __len__(self) -> int:
        return self._snap.n_live

    def __contains__(self, doc_id) -> bool:
        key = self._keys([doc_id], check_type=False)
        return bool(key is not None and self._snap.find(key)[1].all())

    def contains(self, ids) -> np.ndarray:
        """Bool mask: which of ``ids`` are live (ids of the other type are simply absent)."""
        return self._snap.contains(ids)

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._snap is not None:
            self._snap.close()
            self._snap = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def refresh(self) -> bool:
        """Move to the latest committed state; True when it changed."""
        manifest = read_manifest(self.path)
        if manifest["generation"] == self.generation:
            return False
        self._snap_swap(manifest)
        return True

    # ---- writes

    def check_writable(self) -> None:
        """ReadOnlyError (or InvalidInputError when closed) unless a write could go ahead now."""
        self._writable()

    def _writable(self) -> None:
        if self.read_only:
            raise ReadOnlyError(f"{self.path}: opened read-only")
        if self._snap is None:
            raise InvalidInputError(f"{self.path}: the store is closed")
        self._catch_up()

    def _catch_up(self) -> None:
        """After a commit whose snapshot could not be opened (no descriptors, say): open it now."""
        if self._behind is not None:
            try:
                self._snap_swap(self._behind)
            except OSError as e:
                raise storage_error(e, self.path, "opening") from None
            self._behind = None

    @_io("add")
    def add(self, docs, ids=None, metadata=None, sparse=None) -> list:
        """Store documents (list of [L_i, dim] arrays/tensors, or one [n, L, dim]); returns their ids.
        ``sparse``: optional per-document sparse vectors ({term: weight} dicts or (terms, weights)
        pairs), stored in the same segments.

        Everything is checked before anything is written: one bad document, id, metadata entry or
        sparse vector and nothing is stored.
        """
        self._writable()
        tokens, lengths, dim = validate.documents(docs, self.dim)
        return self._add(tokens, lengths, dim, ids, metadata, sparse)

    @_io("add")
    def add_packed(self, tokens, lengths, ids=None, metadata=None, sparse=None) -> list:
        """Store packed documents: tokens [T, dim] and lengths [n] (each >= 1)."""
        self._writable()
        tokens, lengths, dim = validate.packed(tokens, lengths, self.dim)
        return self._add(tokens, lengths, dim, ids, metadata, sparse)

    def _add(self, tokens, lengths, dim, ids, metadata, sparse=None) -> list:
        m = self.manifest
        n = len(lengths)
        id_arr, id_type = validate.ids(ids, n, m["id_type"], m["next_id"])
        meta = validate.metadata(metadata, n)
        sp = validate.sparse(sparse, n)
        if n == 0:
            return []
        # auto ids start above every int id ever added: only given ids can already be stored
        _, found = self._snap.find(id_arr) if ids is not None else (None, np.zeros(0, bool))
        if found.any():
            dup = [validate.decode_id(x) for x in id_arr[found][:5]]
            raise DuplicateIdError(f"ids: already in the database: {dup}")
        stored, scales = validate.convert(tokens, lengths, m["dtype"])
        new = dict(m, dim=dim, id_type=id_type, segments=list(m["segments"]))
        if id_type == "int":
            new["next_id"] = max(m["next_id"], int(id_arr.max()) + 1)
        offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        pieces = self._split(offsets)
        written = []
        try:
            for d0, d1 in pieces:
                t0, t1 = int(offsets[d0]), int(offsets[d1])
                written.append(
                    self._write_segment(
                        new, stored[t0:t1], None if scales is None else scales[t0:t1], offsets[d0 : d1 + 1] - t0,
                        id_arr[d0:d1], None if meta is None else meta[d0:d1], validate.sparse_slice(sp, d0, d1),
                    )
                )
            self._commit(new, [w["name"] for w in written])
        except BaseException:
            self._discard([w["name"] for w in written])
            raise
        self.written_here.update(w["name"] for w in written)
        return [validate.decode_id(x) for x in id_arr]

    def _split(self, offsets: np.ndarray) -> list[tuple[int, int]]:
        """Document ranges of at most segment_tokens tokens each (a longer document gets its own)."""
        out, d0 = [], 0
        n = len(offsets) - 1
        while d0 < n:
            d1 = int(np.searchsorted(offsets, offsets[d0] + self.segment_tokens, side="right")) - 1
            d1 = min(max(d1, d0 + 1), n)
            out.append((d0, d1))
            d0 = d1
        return out

    def _write_segment(self, new: dict, tokens, scales, offsets, ids, meta, sparse=None) -> dict:
        need = tokens.nbytes + offsets.nbytes + ids.nbytes + (0 if scales is None else scales.nbytes) \
            + sum(len(m) for m in meta or ()) + sum(a.nbytes for a in sparse or ())
        need += need // 32 + (64 << 10)  # HDF5's own structures
        free = _free_bytes(os.path.join(self.path, SEGMENTS))
        if free is not None and free < need:  # refuse before writing: a full disk mid-file helps nobody
            raise StorageError(errno.ENOSPC, f"write failed: a segment needs about {need:,} bytes, {free:,} "
                               f"are free on the filesystem of", os.path.join(self.path, SEGMENTS))
        new["segment_counter"] += 1
        name = f"seg-{new['segment_counter']:08d}-{uuid.uuid4().hex[:8]}.h5"
        seg_dir = os.path.join(self.path, SEGMENTS)
        tmp = os.path.join(seg_dir, TMP_PREFIX + name)
        try:
            size = write_segment(tmp, tokens, scales, offsets, ids, meta, sparse)
            os.replace(tmp, os.path.join(seg_dir, name))
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        info = {"name": name, "n_docs": len(ids), "n_tokens": int(offsets[-1]), "file_size": size, "deleted": []}
        new["segments"].append(info)
        return info

    def _commit(self, new: dict, added: list[str], removed: list[str] = ()) -> None:
        """Make ``new`` the committed state (the manifest rename), then open it."""
        if added:
            fsync_dir(os.path.join(self.path, SEGMENTS))
        committed = write_manifest(self.path, new)
        try:
            self._snap_swap(committed)
        except BaseException:
            self._behind = committed  # committed on disk, not opened yet: the next call catches up
            raise
        self._behind = None
        for name in removed:
            os.unlink(os.path.join(self.path, SEGMENTS, name))
        if removed:
            fsync_dir(os.path.join(self.path, SEGMENTS))

    def _snap_swap(self, manifest: dict) -> None:
        """Open ``manifest``'s snapshot. Segments it no longer names close once the last holder of
        an older snapshot (a search in another thread, say) lets go of it."""
        self._snap = self._open_snapshot(manifest)

    def _discard(self, names: list[str]) -> None:
        """After a failed write: remove the new segments that no committed manifest names.

        The failure may have come after the manifest rename (a directory fsync, opening the new
        snapshot, an interrupt): then the segments are committed and must stay. When the manifest
        cannot be read, nothing is removed; the next writer removes true orphans.
        """
        try:
            committed = {s["name"] for s in read_manifest(self.path)["segments"]}
        except Exception:  # noqa: BLE001 - keep everything rather than guess
            return
        for name in names:
            path = os.path.join(self.path, SEGMENTS, name)
            if name not in committed and os.path.exists(path):
                os.unlink(path)

    # ---- settings of the layers above (the database's index choice), versioned with the data

    @property
    def config(self) -> dict:
        return dict(self.manifest.get("config") or {})

    @_io("commit")
    def commit_config(self, config: dict) -> None:
        """Commit a manifest whose ``config`` is ``config`` (JSON values), data unchanged."""
        self._writable()
        m = self.manifest
        if (m.get("config") or {}) != config:
            self._commit(dict(m, config=dict(config)), [])

    # ---- derived index files (written by the database; the segments stay the data of record)

    @_io("index file write")
    def write_index_file(self, name: str, array: np.ndarray) -> dict:
        """Write one index file (an .npy) durably under index/; returns its manifest entry. The file
        counts only once :meth:`commit_index` names it; until then the next writer may remove it."""
        self._writable()
        if os.sep in name or not name.endswith(".npy") or name.startswith("."):
            raise InvalidInputError(f"index file name: expected a plain name ending in .npy, got {name!r}")
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
        data = buf.getvalue()
        os.makedirs(os.path.join(self.path, INDEX), exist_ok=True)
        atomic_write(os.path.join(self.path, INDEX, name), data)
        return {"name": name, "nbytes": len(data), "crc32": zlib.crc32(data)}

    def read_index_file(self, entry: dict) -> np.ndarray:
        """Read an index file named by the manifest, checking its size and CRC-32 (CorruptionError)."""
        return np.load(io.BytesIO(_index_bytes(self.path, entry)), allow_pickle=False)

    @_io("commit")
    def commit_index(self, entries: list[dict]) -> None:
        """Commit a manifest naming ``entries`` (from :meth:`write_index_file`) as the index files,
        segments unchanged; files the old manifest named and the new one does not are removed."""
        self._writable()
        for e in entries:
            if not os.path.exists(os.path.join(self.path, INDEX, e["name"])):
                raise InvalidInputError(f"index file {e['name']!r}: not written")
        m = self.manifest
        old = {e["name"] for e in m.get("index_files", [])}
        self._commit(dict(m, index_files=[dict(e) for e in entries]), [])
        gone = old - {e["name"] for e in entries}
        for name in gone:
            path = os.path.join(self.path, INDEX, name)
            if os.path.exists(path):
                os.unlink(path)
        if gone:
            fsync_dir(os.path.join(self.path, INDEX))

    @_io("delete")
    def delete(self, ids) -> None:
        """Delete live documents by id (UnknownIdError, and nothing deleted, if any is not live)."""
        self._writable()
        rows = np.unique(self._rows(ids))
        if not len(rows):
            return
        m = self.manifest
        new = dict(m, segments=[dict(s) for s in m["segments"]])
        seg, local = self._snap.locate(rows)
        for s in np.unique(seg):
            entry = new["segments"][s]
            entry["deleted"] = sorted(set(entry["deleted"]) | set(local[seg == s].tolist()))
        self._commit(new, [])

    @_io("compact")
    def compact(self, min_segment_tokens: int | None = None) -> int:
        """Rewrite segments that hold deleted documents, and merge small ones; returns segments rewritten."""
        self._writable()
        small = self.segment_tokens // 4 if min_segment_tokens is None else min_segment_tokens
        m = self.manifest
        segs = m["segments"]
        small_idx = [i for i, s in enumerate(segs) if s["n_tokens"] < small]
        rewrite = sorted({i for i, s in enumerate(segs) if s["deleted"]} | (set(small_idx) if len(small_idx) > 1 else set()))
        if not rewrite:
            return 0
        new = dict(m, segments=[])
        written = []
        try:
            for i, s in enumerate(segs):
                if i == rewrite[0]:
                    self._rewrite(new, rewrite, written)
                if i not in rewrite:
                    new["segments"].append(dict(s))
            self._commit(new, written, removed=[segs[i]["name"] for i in rewrite])
        except BaseException:
            self._discard(written)
            raise
        return len(rewrite)

    def _rewrite(self, new: dict, seg_indices: list[int], written: list[str]) -> None:
        """Write the live documents of the given segments, in order, as new bounded segments."""
        snap = self._snap
        rows = np.concatenate([snap.doc_start[i] + np.arange(snap.readers[i].n_docs) for i in seg_indices])
        rows = rows[snap.live[rows]]
        with_meta = any(snap.readers[i].has_metadata for i in seg_indices)
        with_sparse = any(snap.readers[i].sparse is not None for i in seg_indices)
        lengths = snap.row_lengths(rows)
        for d0, d1 in self._split(np.concatenate(([0], np.cumsum(lengths)))):
            part = self._gather_rows(rows[d0:d1])
            meta = self._metadata_rows(part.rows) if with_meta else None
            sp = self.sparse_rows(part.rows) if with_sparse else None
            info = self._write_segment(new, part.tokens, part.scales, part.offsets, part.keys, meta, sp)
            written.append(info["name"])

    # ---- reads

    def snapshot(self) -> Snapshot:
        """The current committed state as an immutable read view (see :class:`Snapshot`)."""
        if self._snap is None:
            raise InvalidInputError(f"{self.path}: the store is closed")
        self._catch_up()
        return self._snap

    def _keys(self, ids, check_type: bool = True) -> np.ndarray | None:
        return self._snap.keys(ids, check_type)

    def _rows(self, ids) -> np.ndarray:
        return self._snap.rows(ids)

    def _gather_rows(self, rows: np.ndarray):
        return self._snap.gather(rows)

    def gather(self, ids) -> Packed:
        """The documents of ``ids`` packed in request order (tokens as stored: float16, or int8 + scales)."""
        return self._gather_rows(self._rows(ids))

    def get(self, ids) -> list[np.ndarray]:
        """Each document as a float32 [L, dim] array (int8 dequantized)."""
        p = self.gather(ids)
        tokens = p.tokens.astype(np.float32)
        if p.scales is not None:
            tokens *= p.scales[:, None]
        return [tokens[p.offsets[i] : p.offsets[i + 1]] for i in range(len(p.offsets) - 1)]

    def _metadata_rows(self, rows: np.ndarray) -> list[str]:
        return self._snap.metadata(rows)

    def sparse_rows(self, rows: np.ndarray):
        """Sparse vectors of snapshot rows as (offsets, terms, weights)."""
        return self._snap.sparse(rows)

    def sparse(self, ids) -> list[dict]:
        """Each document's sparse vector as a {term: weight} dict (empty where none was stored)."""
        off, t, w = self.sparse_rows(self._rows(ids))
        return [dict(zip(t[off[i] : off[i + 1]].tolist(), w[off[i] : off[i + 1]].tolist())) for i in range(len(off) - 1)]

    def metadata(self, ids) -> list:
        """Each document's metadata dict (None where none was given)."""
        import json

        return [json.loads(v) for v in self._snap.metadata(self._rows(ids))]

    def ids(self) -> list:
        """Live ids in storage order."""
        snap = self._snap
        if not snap.readers:
            return []
        keys = np.concatenate([r.ids for r in snap.readers])[snap.live]
        return [validate.decode_id(x) for x in keys]

    def iter_batches(self, max_tokens: int = 1 << 20):
        """Stream every live document in storage order as Packed batches of at most ~max_tokens tokens."""
        snap = self._snap
        for s, r in enumerate(snap.readers):
            rows = snap.doc_start[s] + np.flatnonzero(snap.live[snap.doc_start[s] : snap.doc_start[s + 1]])
            lens = (r.offsets[1:] - r.offsets[:-1])[rows - snap.doc_start[s]]
            ends = np.cumsum(lens)
            d0 = 0
            while d0 < len(rows):
                d1 = int(np.searchsorted(ends, (ends[d0 - 1] if d0 else 0) + max_tokens, side="right"))
                d1 = min(max(d1, d0 + 1), len(rows))
                yield self._gather_rows(rows[d0:d1])
                d0 = d1

    def load_all(self, device=None, pin: bool = False, *, include_deleted: bool = False,
                 from_segment: int = 0, snap: Snapshot | None = None, out: list | None = None) -> Packed:
        """Every live document in one contiguous buffer (storage order), with offsets and ids.

        ``include_deleted`` keeps deleted documents too (every row of every segment, the row order
        the database's token index uses); ``from_segment`` starts at that segment of the snapshot
        (``snap``, by default the current one). ``out``: consecutive (tokens, scales) buffers on one
        device whose rows add up to the load's, written in place (the result then holds no tokens).

        ``device`` (e.g. "cuda") copies through pinned staging buffers, overlapping disk reads with
        host-to-device copies; ``pin=True`` without a device returns pinned host tensors (plain host
        tensors where there is no CUDA driver). Without either, numpy arrays.
        """
        if device is None and not pin and not include_deleted and not from_segment and snap is None and out is None:
            parts = list(self.iter_batches(self.segment_tokens))
            if not parts:
                return Packed(np.zeros((0, self.dim or 0), np.float16), np.zeros(1, np.int64), None, [])
            return _concat(parts)
        from mvdb.storage._load import load_to_device

        return load_to_device(self, device, pin, include_deleted, from_segment, snap=snap, out=out)

    # ---- checks

    def verify(self) -> VerifyReport:
        """See :func:`verify` (works on a database that cannot be opened, too)."""
        return verify(self.path)


def _open_segment(path: str, seg: dict) -> SegmentReader:
    """Open a committed segment and make the cheap structural checks (file size, counts, offsets,
    small checksums): CorruptionError naming the file; FileNotFoundError when it is gone."""
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise CorruptionError(f"{path}: cannot be read ({e.strerror or e})") from None
    if size != seg["file_size"]:
        raise CorruptionError(f"{path}: {size} bytes, the manifest says {seg['file_size']} (truncated or "
                              f"overwritten; `mvdb verify` lists every problem)")
    try:
        r = SegmentReader(path)
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno is not None:  # the system refused (no descriptors, no permission): not damage
            raise storage_error(e, path, "opening") from None
        raise CorruptionError(f"{path}: not a readable segment ({type(e).__name__}: {e})") from None
    except Exception as e:  # noqa: BLE001 - h5py reports damage as OSError, KeyError, ValueError...
        raise CorruptionError(f"{path}: not a readable segment ({type(e).__name__}: {e})") from None
    try:
        r.check(seg["n_docs"], seg["n_tokens"])
    except BaseException:
        r.close()
        raise
    return r


def _index_bytes(db_path: str, entry: dict) -> bytes:
    """An index file's bytes, checked against the size and CRC-32 its manifest entry records
    (CorruptionError; OSError when it cannot be read)."""
    path = os.path.join(db_path, INDEX, entry["name"])
    with open(path, "rb") as f:
        data = f.read()
    if len(data) != entry["nbytes"] or zlib.crc32(data) != entry["crc32"]:
        raise CorruptionError(f"{path}: size or checksum does not match the manifest")
    return data


def _data_files(path: str) -> list[str]:
    """Segment files (and index files) under a database directory, as relative names."""
    out = []
    for sub, suffix in ((SEGMENTS, ".h5"), (INDEX, ".npy")):
        d = os.path.join(path, sub)
        if os.path.isdir(d):
            out += [f"{sub}/{n}" for n in sorted(os.listdir(d)) if n.endswith(suffix) and not n.startswith(TMP_PREFIX)]
    return out


def verify(path) -> VerifyReport:
    """Check a database without opening it (so a damaged one can be checked): the manifest,
    every segment's presence, size, structure and checksums, the index files, and that no live id
    appears twice. Lists every problem by file; changes nothing."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        return VerifyReport([f"{path}: no database directory here"], 0, 0)
    try:
        manifest = read_manifest(path)
    except (CorruptionError, FormatError) as e:
        return VerifyReport([f"{MANIFEST}: {e}"], 0, 0)
    except OSError as e:
        data = _data_files(path)
        hint = f"; {len(data)} data file(s) present: run `mvdb recover {path}`" if data else ""
        return VerifyReport([f"{MANIFEST}: cannot be read ({e.strerror or e}){hint}"], 0, 0)
    problems = []
    seg_dir = os.path.join(path, SEGMENTS)
    all_keys, n_docs = [], 0
    for seg in manifest["segments"]:
        name = seg["name"]
        seg_path = os.path.join(seg_dir, name)
        try:
            size = os.path.getsize(seg_path)
        except OSError as e:
            problems.append(f"{name}: missing or unreadable ({e.strerror or e})")
            continue
        if size != seg["file_size"]:
            problems.append(f"{name}: size {size} != {seg['file_size']} in the manifest (truncated or overwritten)")
            continue
        try:
            r = SegmentReader(seg_path)
        except Exception as e:  # noqa: BLE001 - any failure to open is a finding
            problems.append(f"{name}: cannot be opened ({type(e).__name__}: {e})")
            continue
        try:
            problems += r.checksum_problems()
            try:
                r.check(seg["n_docs"], seg["n_tokens"])
            except CorruptionError as e:
                problems.append(f"{name}: {str(e).split(': ', 1)[-1]}")
            if r.tokens.ndim != 2 or (manifest["dim"] is not None and r.tokens.shape[1] != manifest["dim"]):
                problems.append(f"{name}: token shape {r.tokens.shape} does not match dim {manifest['dim']}")
            want = np.int8 if manifest["dtype"] == "int8" else np.float16
            if r.tokens.dtype != want or (manifest["dtype"] == "int8") != (r.scales is not None):
                problems.append(f"{name}: stored as {r.tokens.dtype}, manifest says {manifest['dtype']}")
            deleted = np.asarray(seg["deleted"], dtype=np.int64)
            live = np.ones(r.n_docs, bool)
            live[deleted[(deleted >= 0) & (deleted < r.n_docs)]] = False
            all_keys.append(r.ids[live])
            n_docs += int(live.sum())
        except Exception as e:  # noqa: BLE001 - a damaged file can fail in any read
            problems.append(f"{name}: unreadable ({type(e).__name__}: {e})")
        finally:
            r.close()
    for entry in manifest.get("index_files", []):
        try:
            _index_bytes(path, entry)
        except CorruptionError:
            problems.append(f"index/{entry['name']}: size or checksum does not match the manifest "
                            f"(derived data: the database rebuilds it)")
        except OSError as e:
            problems.append(f"index/{entry['name']}: {e.strerror or e} (derived data: the database rebuilds it)")
    if all_keys:
        kinds = {k.dtype.kind for k in all_keys}
        keys = np.concatenate(all_keys) if len(kinds) == 1 else np.concatenate([k.astype(object).astype(str) for k in all_keys])
        uniq, counts = np.unique(keys, return_counts=True)
        if (counts > 1).any():
            dup = [validate.decode_id(x) for x in uniq[counts > 1][:5]]
            problems.append(f"ids: live ids appear more than once: {dup}")
    return VerifyReport(problems, n_docs, len(manifest["segments"]))


def recover(path, *, force: bool = False) -> VerifyReport:
    """Rebuild a lost or unreadable manifest from the segments whose checksums hold.

    Every intact segment under segments/ is taken in the order it was written (its counter); when
    an id is in more than one, the newest copy wins (a compaction's rewrite, say). Segments that
    fail their checksums are left out and reported. What cannot come back: deletions made after a
    segment was written (they lived only in the lost manifest) and the index (rebuilt on open).
    A valid manifest is left alone unless ``force``; a damaged one is kept as MANIFEST.json.damaged.
    Takes the writer lock. Returns the report of :func:`verify` on the result, with the segments
    left out added to its problems."""
    path = os.fspath(path)
    if not os.path.isdir(os.path.join(path, SEGMENTS)):
        raise FileNotFoundError(f"{path}: no {SEGMENTS}/ folder here: nothing to recover")
    lock = WriterLock(path)
    try:
        mpath = os.path.join(path, MANIFEST)
        old = None
        if os.path.exists(mpath):
            try:
                old = read_manifest(path)
            except (CorruptionError, FormatError):
                os.replace(mpath, mpath + ".damaged")
            else:
                if not force:
                    raise InvalidInputError(f"{path}: its {MANIFEST} is intact; nothing to recover "
                                            f"(force=True rebuilds it anyway)")
        seg_dir = os.path.join(path, SEGMENTS)
        names = sorted(n for n in os.listdir(seg_dir) if n.endswith(".h5") and not n.startswith(TMP_PREFIX))
        left_out, kept = [], []
        dim = dtype = id_type = None
        for name in names:
            try:
                r = SegmentReader(os.path.join(seg_dir, name))
            except Exception as e:  # noqa: BLE001
                left_out.append(f"{name}: left out, cannot be opened ({type(e).__name__})")
                continue
            try:
                bad = r.checksum_problems()
                if not bad:
                    r.check(r.n_docs, r.n_tokens)
                if bad:
                    left_out.append(f"{name}: left out, {'; '.join(bad)}")
                    continue
                seg_dtype = "int8" if r.scales is not None else "float16"
                seg_ids = "str" if r.ids.dtype.kind == "S" else "int"
                if (dim, dtype, id_type) != (None, None, None) and (r.tokens.shape[1], seg_dtype, seg_ids) != (dim, dtype, id_type):
                    left_out.append(f"{name}: left out, dim/dtype/id kind differ from the other segments")
                    continue
                dim, dtype, id_type = r.tokens.shape[1], seg_dtype, seg_ids
                kept.append((name, r.ids.copy(), r.n_docs, r.n_tokens))
            except CorruptionError as e:
                left_out.append(f"{name}: left out, {e}")
            finally:
                r.close()
        counter = lambda n: int(n.split("-")[1]) if n.count("-") >= 2 and n.split("-")[1].isdigit() else 0  # noqa: E731
        kept.sort(key=lambda k: counter(k[0]))
        seen, segments = set(), []
        for name, ids, n_docs, n_tokens in reversed(kept):  # newest first: its copy of an id wins
            keys = ids.tolist()
            deleted = [i for i, k in enumerate(keys) if k in seen]
            seen.update(keys)
            segments.append({"name": name, "n_docs": n_docs, "n_tokens": n_tokens,
                             "file_size": os.path.getsize(os.path.join(seg_dir, name)), "deleted": deleted})
        segments.reverse()
        m = new_manifest(dim, dtype or (old or {}).get("dtype", "float16"))
        ints = [k for k in seen if isinstance(k, int)]
        m.update(id_type=id_type, segments=segments, generation=-1,
                 next_id=max([(old or {}).get("next_id", 0)] + [k + 1 for k in ints if k < 2**63 - 1]),
                 segment_counter=max([counter(n) for n in names] + [0]))
        write_manifest(path, m)
    finally:
        lock.release()
    report = verify(path)
    report.problems = left_out + report.problems
    return report


def _concat(parts: list[Packed]) -> Packed:
    tokens = np.concatenate([p.tokens for p in parts])
    scales = np.concatenate([p.scales for p in parts]) if parts[0].scales is not None else None
    lens = np.concatenate([np.diff(p.offsets) for p in parts])
    offsets = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
    return Packed(tokens, offsets, scales, [i for p in parts for i in p.ids])
