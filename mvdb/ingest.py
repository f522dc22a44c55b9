"""Reading document embeddings from files for ``mvdb ingest``.

Every source yields batches of (ids, packed tokens [T, dim], lengths [n]). Ids come from the file
when it has them, otherwise ``<path as given>#<row>`` (directories: the file stem), so re-running
an interrupted ingest skips what is already stored, and two files of the same name do not collide.

Formats:
- ``X.npy`` packed tokens [T, dim] with ``X.lengths.npy`` beside it (optional ``X.ids.npy``)
- ``.npz`` with arrays ``tokens`` and ``lengths`` (optional ``ids``)
- ``.safetensors`` with tensors ``tokens`` and ``lengths`` (optional integer ``ids``)
- ``.h5`` with datasets ``tokens`` and ``lengths`` or ``offsets`` (optional ``ids``)
- a directory of per-document ``.npy`` files [L, dim], one document each
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import numpy as np

from mvdb.errors import InvalidInputError

Batch = tuple[list, np.ndarray, np.ndarray]


def _split(ids: list, tokens, lengths: np.ndarray, batch_docs: int) -> Iterator[Batch]:
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    for d0 in range(0, len(lengths), batch_docs):
        d1 = min(len(lengths), d0 + batch_docs)
        yield ids[d0:d1], np.asarray(tokens[offsets[d0] : offsets[d1]]), lengths[d0:d1]


def _ids(given, n: int, prefix: str) -> list:
    if given is None:
        return [f"{prefix}#{i}" for i in range(n)]
    given = np.asarray(given)
    if len(given) != n:
        raise InvalidInputError(f"{prefix}: expected {n} ids (one per document), got {len(given)}")
    return [x.decode() if isinstance(x, bytes) else (str(x) if given.dtype.kind in "US" else int(x)) for x in given.tolist()]


def _lengths(name: str, lengths=None, offsets=None) -> np.ndarray:
    if lengths is None and offsets is None:
        raise InvalidInputError(f"{name}: expected 'lengths' (or 'offsets') next to 'tokens'")
    return np.asarray(lengths if lengths is not None else np.diff(np.asarray(offsets))).astype(np.int64)


def read_source(path: str, batch_docs: int = 10_000) -> tuple[int, Iterator[Batch]]:
    """(number of documents, iterator of batches) for one source path."""
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix == ".npy")
        if not files:
            raise InvalidInputError(f"{path}: a directory of per-document .npy files, but it holds none")

        def docs():
            for f0 in range(0, len(files), batch_docs):
                chunk = files[f0 : f0 + batch_docs]
                arrays = [np.load(f) for f in chunk]
                for f, a in zip(chunk, arrays):
                    if a.ndim != 2:
                        raise InvalidInputError(f"{f}: expected a [tokens, dim] array, got shape {a.shape}")
                yield [f.stem for f in chunk], np.concatenate(arrays), np.array([len(a) for a in arrays])

        return len(files), docs()
    if not p.exists():
        raise InvalidInputError(f"{path}: no such file or directory")
    name = str(path)
    if name.endswith(".npy"):
        base = str(p)[: -len(".npy")]
        if not os.path.exists(base + ".lengths.npy"):
            raise InvalidInputError(f"{path}: packed .npy needs its lengths in {os.path.basename(base)}.lengths.npy")
        tokens = np.load(p, mmap_mode="r")
        lengths = np.load(base + ".lengths.npy").astype(np.int64)
        ids = np.load(base + ".ids.npy") if os.path.exists(base + ".ids.npy") else None
    elif name.endswith(".npz"):
        z = np.load(p)
        if "tokens" not in z:
            raise InvalidInputError(f"{path}: expected arrays 'tokens' and 'lengths', got {sorted(z.files)}")
        tokens, lengths = z["tokens"], _lengths(name, z["lengths"] if "lengths" in z else None,
                                                z["offsets"] if "offsets" in z else None)
        ids = z["ids"] if "ids" in z else None
    elif name.endswith(".safetensors"):
        try:
            from safetensors.numpy import load_file
        except ImportError:
            raise InvalidInputError(f"{path}: reading .safetensors needs the safetensors package") from None
        t = load_file(str(p))
        if "tokens" not in t:
            raise InvalidInputError(f"{path}: expected tensors 'tokens' and 'lengths', got {sorted(t)}")
        tokens, lengths, ids = t["tokens"], _lengths(name, t.get("lengths"), t.get("offsets")), t.get("ids")
    elif name.endswith((".h5", ".hdf5")):
        import h5py

        f = h5py.File(p, "r")
        if "tokens" not in f:
            f.close()
            raise InvalidInputError(f"{path}: expected datasets 'tokens' and 'lengths', got {sorted(f)}")
        tokens = f["tokens"]
        lengths = _lengths(name, f["lengths"][()] if "lengths" in f else None, f["offsets"][()] if "offsets" in f else None)
        ids = f["ids"][()] if "ids" in f else None
        if int(lengths.sum()) != tokens.shape[0]:
            f.close()
            raise InvalidInputError(f"{path}: lengths sum to {int(lengths.sum())}, but there are {tokens.shape[0]} tokens")

        def closing():
            try:
                yield from _split(_ids(ids, len(lengths), name), tokens, lengths, batch_docs)
            finally:
                f.close()

        return len(lengths), closing()
    else:
        raise InvalidInputError(f"{path}: unknown format (expected .npy, .npz, .safetensors, .h5 or a directory)")
    if int(lengths.sum()) != tokens.shape[0]:
        raise InvalidInputError(f"{path}: lengths sum to {int(lengths.sum())}, but there are {tokens.shape[0]} tokens")
    return len(lengths), _split(_ids(ids, len(lengths), name), tokens, lengths, batch_docs)
