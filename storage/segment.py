"""Immutable HDF5 segments: CSR-packed tokens written once, then only read (memory-mapped).

A segment file holds contiguous, uncompressed datasets ``tokens [T, dim]`` (float16 or int8),
``scales [T]`` (float32, int8 only), ``offsets [n+1]`` (int64), ``ids [n]`` (int64, or
fixed-width UTF-8 bytes) and optionally ``metadata [n]`` (JSON strings); each dataset's CRC-32
is an attribute. Contiguous storage lets readers memory-map the arrays straight from the file.
"""

from __future__ import annotations

import os
import zlib
from concurrent.futures import ThreadPoolExecutor

import h5py
import numpy as np

from mvdb.storage._io import fsync_file

SEGMENT_VERSION = 1
_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="mvdb-crc")
_ARRAYS = ("tokens", "scales", "offsets", "ids")


def crc32(a: np.ndarray) -> int:
    return zlib.crc32(memoryview(np.ascontiguousarray(a)).cast("B"))


def write_segment(
    path: str,
    tokens: np.ndarray,
    scales: np.ndarray | None,
    offsets: np.ndarray,
    ids: np.ndarray,
    metadata: list[str] | None,
) -> int:
    """Write a complete segment to ``path`` and fsync it; returns the file size. The caller renames it.

    Checksums are computed on a second thread while HDF5 writes (zlib releases the GIL).
    """
    arrays = {n: a for n, a in (("tokens", tokens), ("scales", scales), ("offsets", offsets), ("ids", ids))
              if a is not None}
    with h5py.File(path, "w", libver="latest", locking=False) as f:
        f.attrs["mvdb_segment_version"] = SEGMENT_VERSION
        crcs = {n: _POOL.submit(crc32, a) for n, a in arrays.items()}
        for name, arr in arrays.items():
            f.create_dataset(name, data=arr)  # contiguous, uncompressed: readers memory-map it
        for name, fut in crcs.items():
            f.attrs[f"crc32_{name}"] = fut.result()
        if metadata is not None:
            f.create_dataset("metadata", data=np.array(metadata, dtype=object), dtype=h5py.string_dtype("utf-8"))
            f.attrs["crc32_metadata"] = zlib.crc32("\n".join(metadata).encode())
    fsync_file(path)
    return os.path.getsize(path)


def _memmap(path: str, ds: h5py.Dataset) -> np.ndarray:
    offset = ds.id.get_offset()
    if offset is None or ds.chunks is not None or ds.compression is not None:
        return ds[()]  # not contiguous on disk (never written that way by mvdb): read it
    return np.memmap(path, dtype=ds.dtype, mode="r", offset=offset, shape=ds.shape)


class SegmentReader:
    """Read access to one committed segment; arrays are memory-mapped, metadata read on demand."""

    def __init__(self, path: str):
        self.path = path
        self._file = h5py.File(path, "r", locking=False)
        f = self._file
        self.tokens = _memmap(path, f["tokens"])
        self.scales = _memmap(path, f["scales"]) if "scales" in f else None
        self.offsets = np.asarray(_memmap(path, f["offsets"]))
        ids = f["ids"][()]
        self.ids = ids
        self.has_metadata = "metadata" in f
        self.n_docs = len(ids)
        self.n_tokens = int(self.tokens.shape[0])

    def metadata(self, rows: np.ndarray) -> list:
        if not self.has_metadata:
            return [None] * len(rows)
        if not len(rows):
            return []
        uniq, inverse = np.unique(np.asarray(rows), return_inverse=True)
        values = self._file["metadata"][uniq]  # h5py wants increasing, unique indices
        values = [v.decode() if isinstance(v, bytes) else v for v in values]
        return [values[i] for i in inverse]

    def checksum_problems(self) -> list[str]:
        """Recompute every dataset's CRC-32 and compare with the one written."""
        problems = []
        f = self._file
        for name in _ARRAYS:
            if name not in f:
                continue
            want = f.attrs.get(f"crc32_{name}")
            got = crc32(f[name][()])
            if want is None or int(want) != got:
                problems.append(f"{os.path.basename(self.path)}: dataset {name} checksum mismatch")
        if self.has_metadata:
            values = [v.decode() if isinstance(v, bytes) else v for v in f["metadata"][()]]
            if int(f.attrs.get("crc32_metadata", -1)) != zlib.crc32("\n".join(values).encode()):
                problems.append(f"{os.path.basename(self.path)}: dataset metadata checksum mismatch")
        return problems

    def close(self) -> None:
        self._file.close()
