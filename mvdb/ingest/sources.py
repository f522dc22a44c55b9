"""Reading document embeddings from files for ``mvdb ingest``.

Every source yields batches of (ids, packed tokens [T, dim], lengths [n]). Ids come from the file
when it has them (an ``X.ids.npy`` side file, or an ``ids`` array). Otherwise they are
``<content key>#<row>``: the key is a fingerprint of the source's content (its size, a hash of
its first and last 64 KiB and of 16 blocks of 4 KiB spread between them, and of its document
lengths), never of its path. Re-running an interrupted ingest therefore skips what is already
stored however the path is spelled (relative, absolute, through a symlink, or a copy of the file
elsewhere), and two different files of the same name do not collide. A directory of per-document
files names its documents by their file stems.

Before content keys, ids were ``<path as given>#<row>``; ``Source.legacy_ids`` gives those, so
``mvdb ingest`` still skips documents a database stored under the old ids when the path is
spelled as it was then.

Formats:
- ``X.npy`` packed tokens [T, dim] with ``X.lengths.npy`` beside it (optional ``X.ids.npy``)
- ``.npz`` with arrays ``tokens`` and ``lengths`` (optional ``ids``)
- ``.safetensors`` with tensors ``tokens`` and ``lengths`` (optional integer ``ids``)
- ``.h5`` with datasets ``tokens`` and ``lengths`` or ``offsets`` (optional ``ids``)
- a directory of per-document ``.npy`` files [L, dim], one document each

``open_source`` checks everything that can be checked without reading the tokens (formats,
shapes, dtypes, lengths, ids) and raises InvalidInputError naming the file, so a caller can check
all its sources before writing anything.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mvdb.errors import InvalidInputError, MvdbError

Batch = tuple[list, np.ndarray, np.ndarray]

POOLING_SIDE_FILE = ".pooling.json"  # the pooling of documents exported pooled (mvdb export, mvdb get --out)
SIDE_FILES = (".lengths.npy", ".ids.npy", POOLING_SIDE_FILE)
KEY_VERSION = b"mvdb-ingest-v1"
EDGE = 64 << 10  # bytes hashed at each end of a source
SAMPLES, SAMPLE = 16, 4 << 10  # blocks hashed between the ends


@dataclass
class Source:
    """One opened and checked source. ``key`` is its content key when its ids are derived from it
    (None when the source names its documents)."""

    path: str
    n: int
    dim: int
    key: str | None
    _batches: Callable[[int], Iterator[Batch]] = field(repr=False)
    _close: Callable[[], None] | None = field(default=None, repr=False)
    pooled: dict | None = None  # the pooling its documents were stored with (an X.pooling.json side file)

    def batches(self, batch_docs: int = 10_000) -> Iterator[Batch]:
        return self._batches(batch_docs)

    def legacy_ids(self, ids: list) -> list | None:
        """The ids the same documents got before content keys (``<path as given>#<row>``), or None
        when the source names its documents."""
        if self.key is None:
            return None
        return [f"{self.path}#{i.rsplit('#', 1)[1]}" for i in ids]

    def close(self) -> None:
        if self._close is not None:
            self._close()
            self._close = None


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"))


def regular_file(path: str) -> None:
    """InvalidInputError naming ``path`` unless it is a regular file (or a link to one): a FIFO,
    socket or device would block the reader, or never end."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise InvalidInputError(f"{path}: no such file or directory") from None
    except OSError:
        return  # the reader says what is wrong
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise InvalidInputError(f"{path}: {kind}, not a regular file (sources are read from regular files only)")


@contextlib.contextmanager
def _reading(path: str, what: str = "it"):
    """Check that ``path`` is a regular file (:func:`regular_file`), then turn what a file reader
    raises (numpy's ValueError for a pickled or truncated .npy, a bad zip, h5py's OSError, ...)
    into one InvalidInputError naming the file."""
    regular_file(path)
    try:
        yield
    except MvdbError:
        raise
    except FileNotFoundError:
        raise InvalidInputError(f"{path}: no such file or directory") from None
    except Exception as e:  # any failure to parse the file makes it a bad source
        msg = str(e).strip() or type(e).__name__
        if "allow_pickle" in msg or "Python objects" in msg:
            msg = "holds Python objects (dtype object); expected a numeric array"
        elif "mmap length is greater than file size" in msg:
            msg = "truncated (the file is shorter than its header says)"
        raise InvalidInputError(f"{path}: cannot read {what}: {msg}") from e


def load_npy(path: str, what: str = "it", mmap: bool = False) -> np.ndarray:
    """np.load without pickles; InvalidInputError naming the file when it cannot be read."""
    with _reading(path, what):
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)


def _npy_header(path: Path) -> tuple[tuple, np.dtype]:
    """Shape and dtype of a .npy file from its header, checking the file holds all its data."""
    with _reading(str(path)), open(path, "rb") as f:
        fmt = np.lib.format
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = fmt.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, _, dtype = fmt.read_array_header_2_0(f)
        else:  # 3.0 (utf-8 field names) has no public header reader
            a = np.load(path, mmap_mode="r", allow_pickle=False)
            return a.shape, a.dtype
        if dtype.hasobject:
            raise InvalidInputError(f"{path}: holds Python objects (dtype object); expected a numeric array")
        need = f.tell() + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        size = os.fstat(f.fileno()).st_size
        if size < need:
            raise InvalidInputError(f"{path}: truncated ({size} bytes, its header needs {need})")
    return shape, dtype


def _check_tokens(path: str, shape: tuple, dtype) -> int:
    """The dim of a [T, dim] tokens array (checked numeric)."""
    if len(shape) != 2:
        raise InvalidInputError(f"{path}: expected tokens as a [tokens, dim] array, got shape {tuple(shape)}")
    if np.dtype(dtype).kind not in "fiu":
        raise InvalidInputError(f"{path}: expected numeric (float or int) tokens, got dtype {dtype}")
    if shape[1] < 1:
        raise InvalidInputError(f"{path}: expected a positive embedding dim, got shape {tuple(shape)}")
    return int(shape[1])


def _check_lengths(path: str, lengths, n_tokens: int, offsets=None) -> np.ndarray:
    """Lengths (or offsets) as int64, each >= 1, summing to ``n_tokens``."""
    what = "offsets" if lengths is None else "lengths"
    if lengths is None and offsets is None:
        raise InvalidInputError(f"{path}: expected 'lengths' (or 'offsets') next to 'tokens'")
    a = np.asarray(lengths if lengths is not None else offsets)
    if a.ndim != 1:
        raise InvalidInputError(f"{path}: expected {what} as a 1-D array, got shape {a.shape}")
    if a.dtype.kind not in "iu":
        raise InvalidInputError(f"{path}: expected integer {what}, got dtype {a.dtype}")
    a = a.astype(np.int64)
    if lengths is None:
        if len(a) == 0 or a[0] != 0:
            raise InvalidInputError(f"{path}: offsets must start at 0")
        a = np.diff(a)
    bad = np.flatnonzero(a < 1)
    if len(bad):
        raise InvalidInputError(f"{path}: every document needs at least one token; document {int(bad[0])} has "
                                f"length {int(a[bad[0]])}" + (" (offsets must increase)" if lengths is None else ""))
    if int(a.sum()) != n_tokens:
        raise InvalidInputError(f"{path}: lengths sum to {int(a.sum())}, but there are {n_tokens} tokens")
    return a


def _ids(path: str, given, n: int) -> list | None:
    if given is None:
        return None
    given = np.asarray(given)
    if given.ndim != 1 or len(given) != n:
        raise InvalidInputError(f"{path}: expected {n} ids (one per document), got shape {given.shape}")
    if given.dtype.kind not in "iuSUO":
        raise InvalidInputError(f"{path}: expected integer or string ids, got dtype {given.dtype}")
    out = [x.decode() if isinstance(x, bytes) else (str(x) if given.dtype.kind in "US" else x) for x in given.tolist()]
    if given.dtype.kind == "O" and not all(isinstance(x, str) for x in out):
        raise InvalidInputError(f"{path}: expected integer or string ids")
    if len(set(out)) != len(out):
        seen, dup = set(), None
        for x in out:
            if x in seen:
                dup = x
                break
            seen.add(x)
        raise InvalidInputError(f"{path}: id {dup!r} appears more than once")
    return out


def content_key(path: str, lengths: np.ndarray) -> str:
    """A fingerprint of a source file's content and its document lengths: the same for a copy, a
    symlink or another spelling of the path; different when its size, either end, a sampled
    block between them, or the lengths differ."""
    h = hashlib.blake2b(digest_size=12, person=KEY_VERSION)
    with _reading(path), open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        h.update(size.to_bytes(8, "little"))
        if size <= 2 * EDGE + SAMPLES * SAMPLE:
            spans = [(0, size)]
        else:
            inner = size - 2 * EDGE - SAMPLE
            spans = [(0, EDGE), *((EDGE + inner * i // (SAMPLES - 1), SAMPLE) for i in range(SAMPLES)), (size - EDGE, EDGE)]
        for off, n in spans:
            f.seek(off)
            h.update(f.read(n))
    h.update(np.ascontiguousarray(lengths, dtype="<i8").tobytes())
    return h.hexdigest()


def _split(ids: list, tokens, lengths: np.ndarray, batch_docs: int) -> Iterator[Batch]:
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    for d0 in range(0, len(lengths), batch_docs):
        d1 = min(len(lengths), d0 + batch_docs)
        yield ids[d0:d1], np.asarray(tokens[offsets[d0] : offsets[d1]]), lengths[d0:d1]


def _packed_source(path: str, tokens, lengths: np.ndarray, given_ids, close=None) -> Source:
    ids = _ids(path, given_ids, len(lengths))
    key = content_key(path, lengths) if ids is None else None
    if ids is None:
        ids = [f"{key}#{i}" for i in range(len(lengths))]
    return Source(path, len(lengths), int(tokens.shape[1]), key,
                  lambda batch_docs: _split(ids, tokens, lengths, batch_docs), close)


def _pooled(path: str) -> dict | None:
    """The pooling an ``X.pooling.json`` side file records (``mvdb export`` of a pooled database),
    checked; None where there is none."""
    if not os.path.exists(path):
        return None
    from mvdb.pooling import pooling_arg

    with _reading(path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
    try:
        rec = json.loads(text)
        if not isinstance(rec, dict) or set(rec) != {"pool_factor", "protected"}:
            raise ValueError("expected {\"pool_factor\": N, \"protected\": M}")
        return pooling_arg(rec["pool_factor"], rec["protected"])
    except (ValueError, MvdbError) as e:
        raise InvalidInputError(f"{path}: not a pooling record ({e}), got {text[:200]!r}") from None


def side_file_of(path: str) -> str | None:
    """``X.npy`` when ``path`` is one of its side files (``X.lengths.npy``, ``X.ids.npy``,
    ``X.pooling.json``) and X.npy exists."""
    for suffix in SIDE_FILES:
        if path.endswith(suffix):
            base = path[: -len(suffix)] + ".npy"
            if os.path.isfile(base):
                return base
    return None


def sources_of(paths) -> list[str]:
    """The sources among ``paths`` (as ``mvdb ingest db *.npy`` passes them): side files of an
    ``X.npy`` that is also given are dropped; a side file given without its ``X.npy`` is an error."""
    paths = [os.fspath(p) for p in paths]
    given = {os.path.realpath(p) for p in paths}
    out = []
    for p in paths:
        base = side_file_of(p)
        if base is None:
            out.append(p)
        elif os.path.realpath(base) not in given:
            raise InvalidInputError(f"{p}: a side file of {base}; pass {base} as the source (its side files are read with it)")
    return out


def open_source(path) -> Source:
    """Open and check one source (see the module docstring); InvalidInputError naming the file
    when it cannot be ingested. Close it (``Source.close``) when done."""
    path = os.fspath(path)
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix == ".npy")
        if not files:
            raise InvalidInputError(f"{path}: a directory of per-document .npy files, but it holds none")
        dim = None
        for f in files:
            shape, dtype = _npy_header(f)
            d = _check_tokens(str(f), shape, dtype)
            if shape[0] < 1:
                raise InvalidInputError(f"{f}: empty (0 tokens); every document needs at least one token")
            if dim is not None and d != dim:
                raise InvalidInputError(f"{f}: dim {d}, but {files[0]} has dim {dim}")
            dim = d

        def docs(batch_docs):
            for f0 in range(0, len(files), batch_docs):
                chunk = files[f0 : f0 + batch_docs]
                arrays = [load_npy(str(f), "it") for f in chunk]
                yield [f.stem for f in chunk], np.concatenate(arrays), np.array([len(a) for a in arrays])

        return Source(path, len(files), dim, None, docs)
    if not p.exists():
        raise InvalidInputError(f"{path}: no such file or directory")
    if path.endswith(".npy"):
        base = path[: -len(".npy")]
        if not os.path.exists(base + ".lengths.npy"):
            hint = ""
            if side_file_of(path) is None and path.endswith(SIDE_FILES):
                hint = f" (if it is the side file of {os.path.basename(path.rsplit('.', 2)[0])}.npy, that file is missing)"
            raise InvalidInputError(f"{path}: packed .npy needs its lengths in {os.path.basename(base)}.lengths.npy{hint}")
        tokens = load_npy(path, "the tokens", mmap=True)
        _check_tokens(path, tokens.shape, tokens.dtype)
        lengths = _check_lengths(base + ".lengths.npy", load_npy(base + ".lengths.npy", "the lengths"), tokens.shape[0])
        ids = load_npy(base + ".ids.npy", "the ids") if os.path.exists(base + ".ids.npy") else None
        src = _packed_source(path, tokens, lengths, ids)
        src.pooled = _pooled(base + POOLING_SIDE_FILE)
        return src
    if path.endswith(".npz"):
        with _reading(path), np.load(path, allow_pickle=False) as z:
            if "tokens" not in z:
                raise InvalidInputError(f"{path}: expected arrays 'tokens' and 'lengths', got {sorted(z.files)}")
            tokens = z["tokens"]
            _check_tokens(path, tokens.shape, tokens.dtype)
            lengths = _check_lengths(path, z.get("lengths"), tokens.shape[0], z.get("offsets"))
            ids = z.get("ids")
        return _packed_source(path, tokens, lengths, ids)
    if path.endswith(".safetensors"):
        try:
            from safetensors.numpy import load_file
        except ImportError:
            raise InvalidInputError(f"{path}: reading .safetensors needs the safetensors package") from None
        with _reading(path):
            t = load_file(path)
        if "tokens" not in t:
            raise InvalidInputError(f"{path}: expected tensors 'tokens' and 'lengths', got {sorted(t)}")
        tokens = t["tokens"]
        _check_tokens(path, tokens.shape, tokens.dtype)
        lengths = _check_lengths(path, t.get("lengths"), tokens.shape[0], t.get("offsets"))
        return _packed_source(path, tokens, lengths, t.get("ids"))
    if path.endswith((".h5", ".hdf5")):
        import h5py

        with _reading(path):
            f = h5py.File(path, "r")
        try:
            if "tokens" not in f:
                raise InvalidInputError(f"{path}: expected datasets 'tokens' and 'lengths', got {sorted(f)}")
            tokens = f["tokens"]
            _check_tokens(path, tokens.shape, tokens.dtype)
            with _reading(path):
                lengths = f["lengths"][()] if "lengths" in f else None
                offsets = f["offsets"][()] if "offsets" in f else None
                ids = f["ids"][()] if "ids" in f else None
            lengths = _check_lengths(path, lengths, tokens.shape[0], offsets)
            return _packed_source(path, tokens, lengths, ids, f.close)
        except BaseException:
            f.close()
            raise
    raise InvalidInputError(f"{path}: unknown format (expected .npy, .npz, .safetensors, .h5 or a directory)")


def read_source(path: str, batch_docs: int = 10_000) -> tuple[int, Iterator[Batch]]:
    """(number of documents, iterator of batches) for one source path."""
    src = open_source(path)

    def batches():
        try:
            yield from src.batches(batch_docs)
        finally:
            src.close()

    return src.n, batches()
