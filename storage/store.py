"""The segment store: immutable HDF5 segments + an atomically replaced manifest.

Nothing committed is ever modified: ``add`` writes new segments, ``delete`` writes a new manifest,
``compact`` writes new segments and a manifest that drops the old ones. A segment is written and
fsynced under a temp name, the manifest naming it is committed (the rename of MANIFEST.json is the
commit), and then the segment is renamed to its final name (mvdb.storage.files). A crash at any
instant leaves the last committed manifest valid; the next writer finishes the renames and removes
what it can prove is garbage (temp files no manifest names, segments a committed compaction
retired), and refuses to write beside committed segments the manifest does not name (an older
manifest put back: ``mvdb recover`` takes them in). One writer at a time
(an flock); readers take no lock and work on a manifest snapshot until ``refresh()``.
"""

from __future__ import annotations

import errno
import functools
import io
import os
import shutil
import warnings
import zlib

import numpy as np

from mvdb.kernels.errors import (
    CorruptionError,
    DuplicateIdError,
    FormatError,
    InvalidInputError,
    InvalidTypeError,
    ReadOnlyError,
    StorageError,
)
from mvdb.storage import validate
from mvdb.storage._io import WriterLock, atomic_write, fsync_dir, storage_error
from mvdb.storage.files import (
    INDEX,
    SEGMENTS,
    TMP_PREFIX,
    census,
    data_files,
    index_bytes,
    record_name,
    segment_name,
    segment_path,
    tidy,
    unexplained_message,
)
from mvdb.storage.manifest import MANIFEST, new_manifest, next_manifest, read_manifest, write_manifest
from mvdb.storage.reader import StoreReader
from mvdb.storage.repair import VerifyReport, verify
from mvdb.storage.segment import write_segment
from mvdb.storage.snapshot import Snapshot, open_segment

DTYPES = ("float16", "int8")


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


class Store(StoreReader):
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
        self.path = validate.db_path(path)
        validate.dim(dim)
        if dtype is not None and dtype not in DTYPES:
            raise InvalidInputError(f"dtype: expected one of {DTYPES}, got {dtype!r}")
        for name, v in (("read_only", read_only), ("checksums", checksums)):
            if not isinstance(v, bool):
                raise InvalidTypeError(f"{name}: expected a bool, got {type(v).__name__}")
        validate.positive_int(segment_tokens, "segment_tokens")
        self.checksums = checksums  # check each whole segment's tokens CRC-32 as it is loaded
        # segments this handle wrote: their bytes were checksummed as they were written, so loading
        # them back (the engine following its own add) skips the re-check
        self.written_here: set[str] = set()
        self.read_only = read_only
        self.segment_tokens = segment_tokens
        self._lock = None
        self._snap = None
        self._behind = None  # a committed manifest not opened yet (see _catch_up)
        self._created: list[str] = []  # what this handle created on disk while opening (a new database)
        try:
            self._prepare_directory(read_only)
            if os.path.lexists(os.path.join(self.path, MANIFEST)):
                read_manifest(self.path)  # another format or a newer version: refuse before writing anything
            if not read_only:
                self._lock = WriterLock(self.path)
            if not os.path.lexists(os.path.join(self.path, MANIFEST)):
                for sub in (SEGMENTS, MANIFEST):
                    if not os.path.lexists(os.path.join(self.path, sub)):
                        self._created.append(sub)
                os.makedirs(os.path.join(self.path, SEGMENTS), exist_ok=True)
                write_manifest(self.path, dict(new_manifest(dim, dtype or "float16"), generation=-1))
            manifest = read_manifest(self.path)
            if dim is not None and manifest["dim"] is not None and dim != manifest["dim"]:
                raise InvalidInputError(f"dim: the database at {self.path} stores dim {manifest['dim']}, got {dim}")
            if dtype is not None and dtype != manifest["dtype"]:
                raise InvalidInputError(f"dtype: the database at {self.path} stores {manifest['dtype']}, got {dtype!r}")
            if not read_only:
                tidy(self.path, manifest)
            else:
                self._warn_if_outdated(manifest)
            self._snap = self._open_snapshot(manifest)
            self._snap._index()  # the id index, built now: a live id stored twice is damage (CorruptionError)
        except BaseException:
            self.close()
            self.discard_new()
            raise

    def discard_new(self) -> None:
        """Remove what opening created, when the open that created a new database fails (or a
        layer above refuses it): a refused open leaves no trace. Only an empty new database."""
        created, self._created = self._created, []
        if not created or (self._snap is not None and self._snap.n_rows):
            return
        self.close()
        for sub in (MANIFEST, SEGMENTS, INDEX):
            target = os.path.join(self.path, sub)
            if sub in created and os.path.isfile(target):
                os.unlink(target)
            elif (sub in created or sub == INDEX) and os.path.isdir(target):
                shutil.rmtree(target, ignore_errors=True)
        if "" in created and os.path.isdir(self.path) and not os.listdir(self.path):
            os.rmdir(self.path)

    def _warn_if_outdated(self, manifest: dict) -> None:
        """A reader of a manifest older than the data (put back) is warned: it sees that state."""
        found = census(self.path, manifest)
        if found.outdated and read_manifest(self.path)["generation"] == manifest["generation"]:
            warnings.warn(unexplained_message(self.path, manifest, found, reader=True), stacklevel=3)

    def _prepare_directory(self, read_only: bool) -> None:
        p = self.path
        if os.path.isfile(p):
            raise FormatError(f"{p}: is a file; expected an mvdb database directory")
        if os.path.isdir(p):
            if os.path.lexists(os.path.join(p, MANIFEST)):
                return
            ours = ("LOCK", SEGMENTS)  # and a manifest temp file: a crash while creating the database
            if any(not name.startswith((".", MANIFEST + ".tmp")) and name not in ours and name != INDEX
                   for name in os.listdir(p)):
                raise FormatError(f"{p}: holds other files and no {MANIFEST}; not an mvdb database")
            data = data_files(p)
            if data:
                # Segments without a manifest: never treat them as orphans (that deletes the data).
                shown = ", ".join(data[:5]) + (f" and {len(data) - 5} more" if len(data) > 5 else "")
                raise CorruptionError(
                    f"{p}: {MANIFEST} is missing but the database holds {len(data)} data file(s) ({shown}); "
                    f"nothing was changed. Rebuild the manifest from the checksummed segments with "
                    f"`mvdb recover {p}` (or mvdb.recover(path)); it keeps the deletions of the latest commit record"
                )
        elif os.path.lexists(p):
            raise FormatError(f"{p}: is not a directory; expected an mvdb database directory")
        elif read_only:
            raise FileNotFoundError(f"{p}: no database here (read_only=True does not create one)")
        if read_only:
            raise FileNotFoundError(f"{p}: no {MANIFEST} here (read_only=True does not create one)")
        if not os.path.isdir(p):
            os.makedirs(p)
            self._created.append("")

    def _open_snapshot(self, manifest: dict) -> Snapshot:
        """Open every segment of ``manifest``, reusing the ones already open."""
        old = {r.name: r for r in self._snap.readers} if self._snap is not None else {}
        for attempt in range(5):
            readers, opened = [], []
            try:
                for seg in manifest["segments"]:
                    if seg["name"] in old:
                        readers.append(old[seg["name"]])
                    else:
                        r = self._open_segment(seg, manifest)
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
                                          f"(`mvdb verify {self.path}` lists every problem; where an older "
                                          f"MANIFEST.json was put back, `mvdb recover` rebuilds it)") from None
                manifest = newer
            except BaseException:
                for r in opened:
                    r.close()
                raise
        raise AssertionError("unreachable")

    def _open_segment(self, seg: dict, manifest: dict):
        """Open a segment of ``manifest`` at its final or temp name (a writer may rename it between
        the two looks: then look again)."""
        for attempt in range(3):
            try:
                return open_segment(segment_path(self.path, seg["name"]), seg, manifest)
            except FileNotFoundError:
                if attempt == 2:
                    raise

        raise AssertionError("unreachable")

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
    def add(self, docs, ids=None, metadata=None, sparse=None, *, config: dict | None = None) -> list:
        """Store documents (list of [L_i, dim] arrays/tensors, or one [n, L, dim]); returns their ids.
        ``sparse``: optional per-document sparse vectors ({term: weight} dicts or (terms, weights)
        pairs), stored in the same segments.

        Everything is checked before anything is written: one bad document, id, metadata entry or
        sparse vector and nothing is stored. ``config``: settings of the layers above committed with
        the documents, in the same commit (the encoder record of ``add_texts``).
        """
        self._writable()
        tokens, lengths, dim = validate.documents(docs, self.dim)
        return self._add(tokens, lengths, dim, ids, metadata, sparse, config)

    @_io("add")
    def add_packed(self, tokens, lengths, ids=None, metadata=None, sparse=None, *, config: dict | None = None) -> list:
        """Store packed documents: tokens [T, dim] and lengths [n] (each >= 1); ``config`` as in :meth:`add`."""
        self._writable()
        tokens, lengths, dim = validate.packed(tokens, lengths, self.dim)
        return self._add(tokens, lengths, dim, ids, metadata, sparse, config)

    def _add(self, tokens, lengths, dim, ids, metadata, sparse=None, config=None) -> list:
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
        if config is not None:
            new["config"] = dict(config)
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

    def _write_segment(self, new: dict, tokens, scales, offsets, ids, meta, sparse=None, supersedes=()) -> dict:
        """Write a segment of ``new`` (the manifest to commit) under its temp name, fsynced."""
        need = tokens.nbytes + offsets.nbytes + ids.nbytes + (0 if scales is None else scales.nbytes) \
            + sum(len(m) for m in meta or ()) + sum(a.nbytes for a in sparse or ())
        need += need // 32 + (64 << 10)  # HDF5's own structures
        free = _free_bytes(os.path.join(self.path, SEGMENTS))
        if free is not None and free < need:  # refuse before writing: a full disk mid-file helps nobody
            raise StorageError(errno.ENOSPC, f"write failed: a segment needs about {need:,} bytes, {free:,} "
                               f"are free on the filesystem of", os.path.join(self.path, SEGMENTS))
        new["segment_counter"] += 1
        generation = new["generation"] + 1  # write_manifest commits new as the next generation
        name = segment_name(new["segment_counter"], generation)
        tmp = os.path.join(self.path, SEGMENTS, TMP_PREFIX + name)
        try:
            size = write_segment(tmp, tokens, scales, offsets, ids, meta, sparse, generation=generation,
                                 supersedes=supersedes)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        info = {"name": name, "n_docs": len(ids), "n_tokens": int(offsets[-1]), "file_size": size, "deleted": []}
        new["segments"].append(info)
        return info

    def _commit(self, new: dict, added: list[str], removed: list[str] = (), *, record: bool = False) -> None:
        """Make ``new`` the committed state (the manifest rename), give the added segments their
        final names, then open it. ``record``: a commit that changes only the manifest (a delete,
        a setting) first writes its commit record, which an older manifest put back cannot erase
        (see files.py)."""
        seg_dir = os.path.join(self.path, SEGMENTS)
        # the segments this commit drops: if a crash keeps them on disk, the next writer removes them
        new["retired"] = list(removed)
        previous = new.get("record")
        if added:
            fsync_dir(seg_dir)  # the temp files' entries are durable before a manifest names them
        if record:  # (atomic_write fsyncs the directory too)
            new["record"] = record_name(new["generation"] + 1)
            atomic_write(os.path.join(seg_dir, TMP_PREFIX + new["record"]), next_manifest(new)[1])
            added = [*added, new["record"]]
        try:
            committed = write_manifest(self.path, new)
        except BaseException:
            if record:
                self._discard_record(new["record"])
            raise
        try:
            self._finish(added)
            if record and previous and os.path.exists(os.path.join(seg_dir, new["record"])):
                try:
                    os.unlink(os.path.join(seg_dir, previous))
                except FileNotFoundError:
                    pass
            self._snap_swap(committed)
        except BaseException:
            self._behind = committed  # committed on disk, not opened yet: the next call catches up
            raise
        self._behind = None
        for name in removed:
            os.unlink(os.path.join(seg_dir, name))
        if removed:
            fsync_dir(seg_dir)

    def _discard_record(self, name: str) -> None:
        """After a failed manifest write: remove the commit record written for it, unless the
        manifest was committed after all (it names the record) or cannot be read (keep it)."""
        try:
            if read_manifest(self.path).get("record") == name:
                return
        except Exception:  # noqa: BLE001 - keep it rather than guess; the next writer decides
            return
        tmp = os.path.join(self.path, SEGMENTS, TMP_PREFIX + name)
        if os.path.exists(tmp):
            os.unlink(tmp)

    def _finish(self, names) -> None:
        """Rename committed segments from their temp names (best effort: readers open either name,
        and the next writer finishes what a crash or an error left; no directory fsync needed)."""
        seg_dir = os.path.join(self.path, SEGMENTS)
        for name in names:
            tmp = os.path.join(seg_dir, TMP_PREFIX + name)
            try:
                os.replace(tmp, os.path.join(seg_dir, name))
            except OSError:
                if os.path.exists(tmp):
                    return  # the next writer's tidy renames it

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
            tmp = os.path.join(self.path, SEGMENTS, TMP_PREFIX + name)
            if name not in committed and os.path.exists(tmp):
                os.unlink(tmp)

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
            self._commit(dict(m, config=dict(config)), [], record=True)

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
        return np.load(io.BytesIO(index_bytes(self.path, entry)), allow_pickle=False)

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
        self._commit(new, [], record=True)

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
        with_sparse = any(snap.readers[i].has_sparse for i in seg_indices)
        lengths = snap.row_lengths(rows)
        for d0, d1 in self._split(np.concatenate(([0], np.cumsum(lengths)))):
            part = self._gather_rows(rows[d0:d1])
            meta = self._metadata_rows(part.rows) if with_meta else None
            sp = self.sparse_rows(part.rows) if with_sparse else None
            info = self._write_segment(new, part.tokens, part.scales, part.offsets, part.keys, meta, sp,
                                       supersedes=[snap.readers[i].name for i in seg_indices])
            written.append(info["name"])

    # ---- checks

    def verify(self) -> VerifyReport:
        """See :func:`verify` (works on a database that cannot be opened, too)."""
        return verify(self.path)
