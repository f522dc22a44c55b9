"""A committed state of a store as an immutable read view: its manifest, its opened segments, and
every read of it (rows, ids, tokens, metadata, sparse vectors)."""

from __future__ import annotations

import json
import os

import numpy as np

from mvdb.kernels.errors import CorruptionError, UnknownIdError
from mvdb.storage import validate
from mvdb.storage._io import storage_error
from mvdb.storage.packed import Packed
from mvdb.storage.segment import SegmentReader


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
            if keys.dtype.kind == "i" and len(keys) and int(keys[-1]) >= self.manifest["next_id"]:
                raise CorruptionError(f"MANIFEST.json: next_id {self.manifest['next_id']} is not above the stored id "
                                      f"{int(keys[-1])} (auto ids would repeat stored ones); damaged manifest")
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
        return [text for text, _ in self._metadata(rows)]

    def _metadata(self, rows: np.ndarray) -> list[tuple[str, int]]:
        seg, local = self.locate(np.asarray(rows, dtype=np.int64))
        out = [None] * len(seg)
        for s in np.unique(seg):
            sel = np.flatnonzero(seg == s)
            for i, v in zip(sel, self.readers[s].metadata(local[sel])):
                out[i] = (v if v is not None else "null", s)
        return out

    def metadata_values(self, rows: np.ndarray) -> list:
        """Each row's metadata as a dict (None where none was stored); CorruptionError naming the
        segment where a stored text is not JSON."""
        out = []
        for text, s in self._metadata(rows):
            try:
                out.append(json.loads(text))
            except ValueError as e:
                raise CorruptionError(f"{self.readers[s].path}: stored metadata is not JSON ({e}; damaged "
                                      f"segment; `mvdb verify` lists every problem)") from None
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


def open_segment(path: str, seg: dict, manifest: dict) -> SegmentReader:
    """Open a committed segment and make the cheap structural checks (file size, counts, offsets,
    small checksums, dim / dtype / id kind against the manifest): CorruptionError naming the file;
    FileNotFoundError when it is gone."""
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
        r = SegmentReader(path, seg["name"])
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
        wrong = r.mismatch(manifest)
        if wrong:
            raise CorruptionError(f"{path}: {wrong} (damaged segment or manifest; `mvdb verify` lists every problem)")
    except BaseException:
        r.close()
        raise
    return r


