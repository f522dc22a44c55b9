"""Immutable HDF5 segments: CSR-packed tokens written once, then only read (memory-mapped).

A segment file holds contiguous, uncompressed datasets ``tokens [T, dim]`` (float16 or int8),
``scales [T]`` (float32, int8 only), ``offsets [n+1]`` (int64), the ids (``ids [n]`` int64, or
for str ids the UTF-8 bytes back to back in ``id_bytes`` with ``id_offsets [n+1]``), optionally
``metadata [n]`` (JSON strings) and optionally sparse vectors as CSR (``sparse_offsets [n+1]``
int64, ``sparse_terms`` int32, ``sparse_weights`` float32). Every dataset's CRC-32 is in the
``checksums`` dataset (names in the ``checksum_names`` attribute), written last by the same
pwrite path as the data, so the file is never reopened for writing (version 2; version 1 files,
with fixed-width str ids and CRCs as attributes, are still read). Contiguous storage lets readers
memory-map the arrays straight from the file.
"""

from __future__ import annotations

import os
import zlib
from concurrent.futures import wait

import json

import h5py
import numpy as np

from mvdb.kernels.errors import CorruptionError

from mvdb.storage._io import POOL, READ_POOL
from mvdb.storage._io import start_writeback

SEGMENT_VERSION = 2
_WRITE_CHUNK = 64 << 20
_ARRAYS = ("tokens", "scales", "offsets", "ids", "id_bytes", "id_offsets", "sparse_offsets", "sparse_terms",
           "sparse_weights")
_SMALL = ("offsets", "ids", "id_bytes", "id_offsets", "sparse_offsets")  # checked at every open


def pack_str_ids(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fixed-width bytes ids -> (UTF-8 bytes back to back as uint8, offsets [n+1] int64)."""
    values = ids.tolist()
    lens = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
    return np.frombuffer(b"".join(values), dtype=np.uint8), np.concatenate(([0], np.cumsum(lens))).astype(np.int64)


def unpack_str_ids(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The inverse of pack_str_ids: a fixed-width bytes array as wide as the longest id."""
    lens = np.diff(offsets)
    n = len(lens)
    width = int(lens.max()) if n else 1
    out = np.zeros((n, max(1, width)), dtype=np.uint8)
    rows = np.repeat(np.arange(n), lens)
    cols = np.arange(int(offsets[-1])) - np.repeat(offsets[:-1], lens)
    out[rows, cols] = data[: int(offsets[-1])]
    return out.view(f"S{max(1, width)}").reshape(n)


def crc32(a: np.ndarray) -> int:
    return zlib.crc32(memoryview(np.ascontiguousarray(a)).cast("B"))


def _empty_contiguous(f: h5py.File, name: str, arr: np.ndarray) -> int:
    """Create a contiguous dataset, allocated now and never filled; return its byte offset in the file."""
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_layout(h5py.h5d.CONTIGUOUS)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    space = h5py.h5s.create_simple(arr.shape)
    dsid = h5py.h5d.create(f.id, name.encode(), h5py.h5t.py_create(arr.dtype), space, dcpl=dcpl)
    return dsid.get_offset()


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    start, size = offset, len(data)
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n
    start_writeback(fd, start, size)


def write_segment(
    path: str,
    tokens: np.ndarray,
    scales: np.ndarray | None,
    offsets: np.ndarray,
    ids: np.ndarray,
    metadata: list[str] | None,
    sparse: tuple | None = None,
    *,
    generation: int = 0,
    supersedes: list[str] = (),
) -> int:
    """Write a complete segment to ``path`` and fsync it; returns the file size. The caller renames it.
    ``generation``: that of the manifest commit that will name it; ``supersedes``: the segments a
    compaction rewrote into it (so that a recovery leaves them out). Both are header attributes.

    HDF5 lays out and allocates the contiguous datasets; their bytes then go in with parallel
    pwrite calls while another thread computes the checksums (both release the GIL), which is
    about twice as fast as writing through h5py.
    """
    named = [("tokens", tokens), ("scales", scales), ("offsets", offsets)]
    if ids.dtype.kind == "S":
        named += list(zip(("id_bytes", "id_offsets"), pack_str_ids(ids)))
    else:
        named.append(("ids", ids))
    if sparse is not None:
        named += list(zip(("sparse_offsets", "sparse_terms", "sparse_weights"), sparse))
    arrays = {n: np.ascontiguousarray(a) for n, a in named if a is not None}
    crcs = {n: POOL.submit(crc32, a) for n, a in arrays.items()}
    names = list(arrays)
    with h5py.File(path, "w", libver="latest", locking=False) as f:
        f.attrs["mvdb_segment_version"] = SEGMENT_VERSION
        f.attrs["checksum_names"] = json.dumps(names)
        f.attrs["mvdb_generation"] = int(generation)
        f.attrs["mvdb_supersedes"] = json.dumps(list(supersedes))
        where = {n: _empty_contiguous(f, n, a) for n, a in arrays.items()}
        where["checksums"] = _empty_contiguous(f, "checksums", np.zeros(len(names), np.uint32))
        if metadata is not None:
            f.create_dataset("metadata", data=np.array(metadata, dtype=object), dtype=h5py.string_dtype("utf-8"))
            f.attrs["crc32_metadata"] = zlib.crc32("\n".join(metadata).encode())
    fd = os.open(path, os.O_WRONLY)
    jobs = []
    try:
        for name, arr in arrays.items():
            raw = memoryview(arr).cast("B")
            for c0 in range(0, len(raw), _WRITE_CHUNK):
                jobs.append(POOL.submit(_pwrite_all, fd, raw[c0 : c0 + _WRITE_CHUNK], where[name] + c0))
        wait(jobs)  # every write has finished (or failed) before the descriptor is closed
        for j in jobs:
            j.result()
        sums = np.array([crcs[n].result() for n in names], dtype=np.uint32)
        _pwrite_all(fd, memoryview(sums).cast("B"), where["checksums"])
        os.fsync(fd)
    finally:
        wait(jobs)
        os.close(fd)
    return os.path.getsize(path)


def _memmap(path: str, ds: h5py.Dataset) -> np.ndarray:
    offset = ds.id.get_offset()
    if offset is None or ds.chunks is not None or ds.compression is not None:
        return ds[()]  # not contiguous on disk (never written that way by mvdb): read it
    return np.memmap(path, dtype=ds.dtype, mode="r", offset=offset, shape=ds.shape)


class SegmentReader:
    """Read access to one committed segment; arrays are memory-mapped, metadata read on demand.
    The metadata and the sparse terms and weights are checked against their CRC-32 the first time
    they are read (CorruptionError naming the file)."""

    def __init__(self, path: str, name: str | None = None):
        self.path = path
        self.name = name or os.path.basename(path)  # the segment's name in the manifest
        self._file = h5py.File(path, "r", locking=False)

        f = self._file
        self.tokens = _memmap(path, f["tokens"])
        self.scales = _memmap(path, f["scales"]) if "scales" in f else None
        self.version = int(f.attrs.get("mvdb_segment_version", 1))
        generation = f.attrs.get("mvdb_generation")
        self.generation = None if generation is None else int(generation)
        self.supersedes = json.loads(f.attrs.get("mvdb_supersedes", "[]"))
        if "checksums" in f:
            self.crcs = dict(zip(json.loads(f.attrs["checksum_names"]), (int(x) for x in f["checksums"][()])))
        else:
            self.crcs = {n: int(f.attrs[f"crc32_{n}"]) for n in _ARRAYS if f"crc32_{n}" in f.attrs}
        self.offsets = np.asarray(_memmap(path, f["offsets"]))
        if "id_offsets" in f:
            self._id_parts = (f["id_bytes"][()], f["id_offsets"][()])
            ids = unpack_str_ids(*self._id_parts)
        else:
            self._id_parts = None
            ids = f["ids"][()]
        self.ids = ids
        self.has_metadata = "metadata" in f
        self.has_sparse = "sparse_offsets" in f
        self._sparse = tuple(np.asarray(_memmap(path, f[n])) for n in ("sparse_offsets", "sparse_terms", "sparse_weights")) \
            if self.has_sparse else None
        self._checked = set()  # the lazily checked datasets that passed
        self.n_docs = len(ids)
        self.n_tokens = int(self.tokens.shape[0])
        # For pread-based gathers: byte offsets of the contiguous datasets (None: not contiguous).
        self._at = {n: f[n].id.get_offset() for n in ("tokens", "scales") if n in f and f[n].chunks is None}
        self._fd = os.open(path, os.O_RDONLY)

    def _damaged(self, what: str):
        return CorruptionError(f"{self.path}: {what} (damaged segment; `mvdb verify` lists every problem)")

    @property
    def sparse(self):
        """(offsets, terms, weights) of the segment's sparse vectors, or None; terms and weights
        are checked against their CRC-32 on first use."""
        if self._sparse is not None and "sparse" not in self._checked:
            for name, arr in zip(("sparse_terms", "sparse_weights"), self._sparse[1:]):
                if name in self.crcs and crc32(arr) != self.crcs[name]:
                    raise self._damaged(f"dataset {name} checksum mismatch")
            self._checked.add("sparse")
        return self._sparse

    def _texts(self, values) -> list[str]:
        try:
            return [v.decode() if isinstance(v, bytes) else v for v in values]
        except UnicodeDecodeError:
            raise self._damaged("dataset metadata is not valid UTF-8") from None

    def _read_metadata(self, sel):
        try:
            return self._texts(self._file["metadata"][sel])
        except CorruptionError:
            raise
        except Exception as e:  # noqa: BLE001 - h5py reports a damaged string heap as OSError, ValueError...
            raise self._damaged(f"dataset metadata cannot be read ({type(e).__name__}: {e})") from None

    def _metadata_values(self) -> list[str]:
        values = self._read_metadata(())
        if int(self._file.attrs.get("crc32_metadata", -1)) != zlib.crc32("\n".join(values).encode()):
            raise self._damaged("dataset metadata checksum mismatch")
        return values

    def read_runs(self, name: str, out: np.ndarray, src: np.ndarray, dst: np.ndarray, n: np.ndarray) -> None:
        """out[dst[i] : dst[i] + n[i]] = dataset[src[i] : src[i] + n[i]] (rows) for each run i.

        One pread per run, straight into ``out``: no page-fault storms on a cold page cache, and
        threads issue them in parallel for large requests (the syscalls release the GIL).
        """
        arr = self.tokens if name == "tokens" else self.scales
        base = self._at.get(name)
        if base is None:
            for a, b, k in zip(src.tolist(), dst.tolist(), n.tolist()):
                out[b : b + k] = arr[a : a + k]
            return
        row = arr.dtype.itemsize * (arr.shape[1] if arr.ndim == 2 else 1)
        raw = memoryview(out.reshape(-1).view(np.uint8))
        fd = self._fd

        def work(lo: int, hi: int) -> None:
            for a, b, k in zip(src[lo:hi].tolist(), dst[lo:hi].tolist(), n[lo:hi].tolist()):
                view, pos = raw[b * row : (b + k) * row], base + a * row
                while view:
                    got = os.preadv(fd, [view], pos)
                    if got <= 0:
                        raise OSError(f"{self.path}: short read at byte {pos}")
                    view, pos = view[got:], pos + got

        step = 64
        if len(src) <= step:
            work(0, len(src))
        else:
            for f in [READ_POOL.submit(work, lo, lo + step) for lo in range(0, len(src), step)]:
                f.result()

    def metadata(self, rows: np.ndarray) -> list:
        """The stored JSON text of each row's metadata (None where the segment has none)."""
        if not self.has_metadata:
            return [None] * len(rows)
        if not len(rows):
            return []
        if "metadata" not in self._checked:
            values = self._metadata_values()  # the whole dataset, once: its checksum covers all of it
            self._checked.add("metadata")
            return [values[i] for i in np.asarray(rows).tolist()]
        uniq, inverse = np.unique(np.asarray(rows), return_inverse=True)
        values = self._read_metadata(uniq)  # h5py wants increasing, unique indices
        return [values[i] for i in inverse]

    def check(self, n_docs: int, n_tokens: int) -> None:
        """The cheap structural checks every open makes (CorruptionError naming the file and what
        is wrong): the counts the manifest recorded, offsets increasing from 0 to the token count,
        and the CRC-32s of the small datasets (offsets, ids, sparse offsets)."""
        def bad(what):
            raise self._damaged(what)

        if self.n_docs != n_docs or self.n_tokens != n_tokens:
            bad(f"holds {self.n_docs} documents / {self.n_tokens} tokens, the manifest says {n_docs} / {n_tokens}")
        f = self._file
        for ds in _SMALL:
            if ds in f and ds in self.crcs and crc32(f[ds][()]) != self.crcs[ds]:
                bad(f"dataset {ds} checksum mismatch")
        off = self.offsets
        if len(off) != n_docs + 1 or (len(off) and (off[0] != 0 or off[-1] != n_tokens)) or (np.diff(off) < 1).any():
            bad("offsets are not increasing from 0 to the token count")
        if self._sparse is not None:
            so = self._sparse[0]
            if len(so) != n_docs + 1 or so[0] != 0 or (np.diff(so) < 0).any() or so[-1] != len(self._sparse[1]):
                bad("sparse offsets are not increasing from 0 to the term count")

    def mismatch(self, manifest: dict) -> str | None:
        """What in this segment disagrees with the manifest's dim, dtype and id kind (None if nothing)."""
        dim, dtype = manifest["dim"], manifest["dtype"]
        if self.tokens.ndim != 2 or dim is None or self.tokens.shape[1] != dim:
            return f"token shape {tuple(self.tokens.shape)}, the manifest says dim {dim}"
        stored = "int8" if self.tokens.dtype == np.int8 and self.scales is not None else \
            "float16" if self.tokens.dtype == np.float16 and self.scales is None else f"{self.tokens.dtype} tokens"
        if stored != dtype:
            return f"stored as {stored}, the manifest says {dtype}"
        kind = "str" if self.ids.dtype.kind == "S" else "int"
        if self.n_docs and manifest["id_type"] != kind:
            return f"holds {kind} ids, the manifest says {manifest['id_type']}"
        return None

    def checksum_problems(self) -> list[str]:
        """Recompute every dataset's CRC-32 and compare with the one written."""
        problems = []
        f = self._file
        for name in _ARRAYS:
            if name not in f:
                continue
            want = self.crcs.get(name)
            got = crc32(f[name][()])
            if want is None or int(want) != got:
                problems.append(f"{os.path.basename(self.path)}: dataset {name} checksum mismatch")
        if self.has_metadata:
            try:
                self._metadata_values()
            except CorruptionError:
                problems.append(f"{os.path.basename(self.path)}: dataset metadata checksum mismatch")
        return problems

    def close(self) -> None:
        f, self._file = getattr(self, "_file", None), None
        if f is not None:
            f.close()
        fd, self._fd = getattr(self, "_fd", None), None
        if fd is not None:
            os.close(fd)

    def __del__(self):  # readers of snapshots nobody holds any more
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to release
            pass
