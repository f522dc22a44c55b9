"""Checks and conversion of a batch of documents, ids and metadata before anything is written."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from mvdb.kernels.errors import DuplicateIdError, InvalidInputError, InvalidTypeError
from mvdb.storage._io import POOL
from mvdb.storage.packed import Packed

FP16_MAX = 65504.0
# An int8 store's values at most this large in magnitude (2**64): with query values within
# float16's range (mvdb.engine.search.QUERY_MAX), no score of up to 2**16 query tokens at up to
# 2**16 dims passes 2**112, far inside float32.
INT8_VALUE_MAX = 2.0**64
MAX_STR_ID_BYTES = 1024  # a str id's UTF-8 length
MAX_DEPTH = 32  # nesting levels of a metadata entry (dicts and lists); also of a where filter
MAX_ID = 2**63 - 1
MAX_DIM = 1 << 16  # an embedding's dimensions (ColBERT 128, ColPali 128, the widest models a few thousand)


def db_path(path) -> str:
    """A database path argument as a str: a non-empty str or os.PathLike without NUL characters."""
    if isinstance(path, bytes):
        raise InvalidTypeError(f"path: expected a str or os.PathLike, got bytes {path[:40]!r} (decode it first)")
    try:
        p = os.fspath(path)
    except TypeError:
        raise InvalidTypeError(f"path: expected a str or os.PathLike, got {type(path).__name__}") from None
    if not isinstance(p, str):
        raise InvalidTypeError(f"path: expected a str or os.PathLike, got one giving {type(p).__name__}")
    if not p:
        raise InvalidInputError("path: expected a directory path, got an empty string")
    if "\x00" in p:
        raise InvalidInputError(f"path: expected a path without NUL characters, got {p[:60]!r}")
    return p


def positive_int(v, name: str, hi: int | None = None) -> int:
    """``v`` when it is an int (not a bool) in [1, hi]; InvalidTypeError / InvalidInputError naming ``name``."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise InvalidTypeError(f"{name}: expected a positive int, got {type(v).__name__} {v!r}")
    if v < 1 or (hi is not None and v > hi):
        raise InvalidInputError(f"{name}: expected an int from 1 to {hi:,}, got {v}" if hi else
                                f"{name}: expected a positive int, got {v}")
    return int(v)


def dim(value) -> None:
    """A ``dim=`` argument: None, or an int from 1 to MAX_DIM."""
    if value is not None:
        positive_int(value, "dim", MAX_DIM)


@dataclass
class Batch:
    tokens: np.ndarray  # [T, dim] float16 or int8
    scales: np.ndarray | None  # [T] float32 (int8 only)
    lengths: np.ndarray  # [n] int64
    ids: np.ndarray  # [n] int64, or bytes (utf-8) for str ids
    id_type: str
    metadata: list[str] | None  # JSON per document


def _to_numpy(x, where: str) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    mod = type(x).__module__
    if mod.startswith("torch"):
        import torch

        if not isinstance(x, torch.Tensor):
            raise InvalidTypeError(f"{where}: expected a 2-D numpy array or torch tensor, got {type(x).__name__}")
        dense_tensor(x, where)
        t = x.detach().cpu()
        if t.dtype == torch.bfloat16:
            t = t.float()
        return t.numpy()
    raise InvalidTypeError(f"{where}: expected a 2-D numpy array or torch tensor, got {type(x).__name__}")


def dense_tensor(x, where: str) -> None:
    """InvalidInputError for a torch tensor that holds no plain data: on the meta device, sparse or
    another layout, quantized."""
    import torch

    if x.device.type == "meta" or x.layout != torch.strided or x.is_quantized:
        what = "on the meta device (no data)" if x.device.type == "meta" else f"with layout {x.layout}" \
            if x.layout != torch.strided else f"quantized ({x.dtype})"
        raise InvalidInputError(f"{where}: expected a dense tensor with data, got one {what}")


def _numeric(a: np.ndarray, where: str) -> None:
    if a.dtype.kind not in "fiu":
        raise InvalidTypeError(f"{where}: expected a numeric (float or int) array, got dtype {a.dtype}")


def array(x, where: str) -> np.ndarray:
    """A numpy array or torch tensor as a numeric numpy array (a tensor: dense, on the host,
    bfloat16 widened) -> the array; InvalidTypeError / InvalidInputError naming ``where``."""
    a = _to_numpy(x, where)
    _numeric(a, where)
    return a


def documents(docs, dim: int | None) -> tuple[np.ndarray, np.ndarray, int]:
    """docs (list of [L_i, dim], one [n, L, dim] array, or :class:`~mvdb.storage.packed.Packed`
    documents) -> (float tokens [T, dim], lengths [n], dim)."""
    if isinstance(docs, Packed):
        return packed(docs.tokens, np.diff(np.asarray(docs.offsets)), dim)
    if isinstance(docs, (list, tuple)):
        arrays = [_to_numpy(d, f"document {i}") for i, d in enumerate(docs)]
    else:
        whole = _to_numpy(docs, "docs")
        if whole.ndim != 3:
            raise InvalidInputError(
                f"docs: expected a list of [L, dim] arrays or one [n, L, dim] array, got shape {whole.shape}"
            )
        arrays = list(whole)
    for i, a in enumerate(arrays):
        if a.ndim != 2:
            raise InvalidInputError(f"document {i}: expected a 2-D [tokens, dim] array, got shape {a.shape}")
        _numeric(a, f"document {i}")
        if dim is None:
            dim = a.shape[1]
        if a.shape[1] != dim:
            raise InvalidInputError(f"document {i}: expected dim {dim}, got {a.shape[1]}")
        if a.shape[0] == 0:
            raise InvalidInputError(f"document {i}: empty (0 tokens); every document needs at least one token")
    if dim is not None and dim <= 0:
        raise InvalidInputError(f"docs: expected a positive embedding dim, got {dim}")
    lengths = np.array([a.shape[0] for a in arrays], dtype=np.int64)
    tokens = np.concatenate(arrays) if arrays else np.zeros((0, dim or 0), np.float32)
    return tokens, lengths, dim or 0


def packed(tokens, lengths, dim: int | None) -> tuple[np.ndarray, np.ndarray, int]:
    """Packed tokens [T, dim] + lengths [n] (every length >= 1, summing to T)."""
    tokens = _to_numpy(tokens, "tokens")
    lengths = _to_numpy(lengths, "lengths") if not isinstance(lengths, (list, tuple)) else np.asarray(lengths)
    if tokens.ndim != 2:
        raise InvalidInputError(f"tokens: expected a 2-D [T, dim] array, got shape {tokens.shape}")
    _numeric(tokens, "tokens")
    if lengths.ndim != 1 or lengths.dtype.kind not in "iu":
        raise InvalidTypeError(f"lengths: expected a 1-D integer array, got {lengths.dtype} of shape {lengths.shape}")
    dim = tokens.shape[1] if dim is None else dim
    if tokens.shape[1] != dim:
        raise InvalidInputError(f"tokens: expected dim {dim}, got {tokens.shape[1]}")
    if dim <= 0:
        raise InvalidInputError(f"tokens: expected a positive embedding dim, got {dim}")
    if len(lengths) and lengths.min() < 1:
        i = int(np.argmin(lengths))
        raise InvalidInputError(f"document {i}: empty (0 tokens); every document needs at least one token")
    if int(lengths.sum()) != tokens.shape[0]:
        raise InvalidInputError(f"lengths: expected a sum of {tokens.shape[0]} (the token count), got {int(lengths.sum())}")
    return tokens, lengths.astype(np.int64), dim


def _doc_of_row(lengths: np.ndarray, row: int) -> tuple[int, int]:
    ends = np.cumsum(lengths)
    doc = int(np.searchsorted(ends, row, side="right"))
    return doc, row - int(ends[doc] - lengths[doc])


def _nonfinite_rows(chunk: np.ndarray) -> np.ndarray:
    """Rows holding NaN or Inf (float16 checked on its exponent bits: no float conversion)."""
    if chunk.dtype == np.float16:
        return ((chunk.view(np.uint16) & 0x7C00) == 0x7C00).any(axis=1)
    return ~np.isfinite(chunk).all(axis=1)


def finite(tokens: np.ndarray, lengths: np.ndarray, chunk: int = 1 << 15) -> None:
    """InvalidInputError naming the first document holding NaN or Inf (in parallel chunks)."""
    if tokens.dtype.kind == "f":
        starts = range(0, tokens.shape[0], chunk)
        found = POOL.map(lambda r0: _nonfinite_rows(tokens[r0 : r0 + chunk]), starts)  # numpy releases the GIL
        for r0, bad in zip(starts, found):
            if bad.any():
                doc, tok = _doc_of_row(lengths, r0 + int(np.argmax(bad)))
                raise InvalidInputError(f"document {doc}: contains NaN or Inf (token {tok})")


def _within(tokens: np.ndarray, lengths: np.ndarray, r0: int, part: np.ndarray, limit: float, beyond: str) -> None:
    """InvalidInputError naming the first document of rows ``part`` (from row ``r0`` of ``tokens``)
    holding a value beyond +-``limit``: its value, its token, then ``beyond``."""
    # max and min, not abs: abs overflows on the most negative int (int64 -2^63 stays negative);
    # compared in float64: a limit past the rows' dtype (2^64 against float16) must not be cast to it
    if part.size:
        big = (part.max(axis=1).astype(np.float64) > limit) | (part.min(axis=1).astype(np.float64) < -limit)
    else:
        big = np.zeros(0, bool)
    if big.any():
        row = r0 + int(np.argmax(big))
        doc, tok = _doc_of_row(lengths, row)
        values = tokens[row].astype(np.float64)
        raise InvalidInputError(f"document {doc}: value {float(values[np.argmax(np.abs(values))]):.4g} at token {tok} "
                                f"{beyond}")


FP16_BEYOND = f"overflows float16 (max {FP16_MAX:g} in magnitude); scale the embeddings or store them as int8"
INT8_BEYOND = (f"is out of range (an int8 store takes values within +-{INT8_VALUE_MAX:.4g}, so that no score "
               "overflows float32); scale the embeddings")


def in_range(tokens: np.ndarray, lengths: np.ndarray, dtype: str, chunk: int = 1 << 18) -> None:
    """``convert``'s checks alone (finite, within the stored dtype's range), for documents that are
    transformed before they are stored (pooled): an error names the document as given."""
    finite(tokens, lengths)
    limit, beyond = (FP16_MAX, FP16_BEYOND) if dtype == "float16" else (INT8_VALUE_MAX, INT8_BEYOND)
    if tokens.dtype == np.float16:  # finite float16 values are all within either limit
        return
    list(POOL.map(lambda r0: _within(tokens, lengths, r0, tokens[r0 : r0 + chunk], limit, beyond),
                  range(0, tokens.shape[0], chunk)))


def convert(tokens: np.ndarray, lengths: np.ndarray, dtype: str, chunk: int = 1 << 18) -> tuple[np.ndarray, np.ndarray | None]:
    """Check finiteness and range and convert to the stored dtype (float16, or int8 + per-token
    scales), in chunks."""
    finite(tokens, lengths)
    if dtype == "float16":
        if tokens.dtype == np.float16:
            return np.ascontiguousarray(tokens), None
        out = np.empty(tokens.shape, dtype=np.float16)
        for r0 in range(0, tokens.shape[0], chunk):
            part = tokens[r0 : r0 + chunk]
            _within(tokens, lengths, r0, part, FP16_MAX, FP16_BEYOND)
            out[r0 : r0 + chunk] = part
        return out, None
    from mvdb.kernels.quant import quantize_array

    for r0 in range(0, tokens.shape[0], chunk):
        _within(tokens, lengths, r0, tokens[r0 : r0 + chunk], INT8_VALUE_MAX, INT8_BEYOND)
    return quantize_array(tokens)


def ids(given, n: int, id_type: str | None, next_id: int) -> tuple[np.ndarray, str]:
    """Resolve ids for n new documents -> (array, id_type); auto ids are next_id, next_id + 1, ..."""
    if given is None:
        if id_type == "str":
            raise InvalidInputError("ids: this database uses str ids; pass ids= (auto ids are ints)")
        if n and next_id + n - 1 > MAX_ID:
            raise InvalidInputError(
                f"ids: no auto ids left above {next_id - 1} (auto ids continue after the largest int id ever added, "
                f"and ids are int64: at most {MAX_ID}); expected room for {n} new ids, pass ids="
            )
        return np.arange(next_id, next_id + n, dtype=np.int64), "int"
    if isinstance(given, np.ndarray) or type(given).__module__.startswith("torch"):
        if getattr(given, "ndim", None) != 1 or not hasattr(given, "tolist"):
            raise InvalidTypeError(f"ids: expected a 1-D array or list of ids, got {type(given).__name__} of shape "
                                   f"{tuple(getattr(given, 'shape', ()))}")
        if type(given).__module__.startswith("torch"):
            dense_tensor(given, "ids")
        values = given.tolist()
    elif isinstance(given, (list, tuple)):
        values = list(given)
    else:
        raise InvalidTypeError(f"ids: expected a list of int or str ids, got {type(given).__name__}")
    if len(values) != n:
        raise InvalidInputError(f"ids: expected {n} ids (one per document), got {len(values)}")
    kinds = set()
    for i, v in enumerate(values):
        if isinstance(v, (bool, np.bool_)):
            raise InvalidTypeError(f"ids[{i}]: expected int or str, got bool")
        if isinstance(v, (int, np.integer)):
            kinds.add("int")
        elif isinstance(v, str):
            if "\x00" in v:
                raise InvalidInputError(f"ids[{i}]: NUL characters are not allowed in str ids")
            b = unicode_text(v, f"ids[{i}]")
            if len(b) > MAX_STR_ID_BYTES:
                raise InvalidInputError(
                    f"ids[{i}]: expected at most {MAX_STR_ID_BYTES} UTF-8 bytes per str id, got {len(b)}"
                )
            kinds.add("str")
        else:
            raise InvalidTypeError(f"ids[{i}]: expected int or str, got {type(v).__name__}")
    if len(kinds) > 1:
        raise InvalidTypeError("ids: expected all int or all str ids, got a mix")
    kind = kinds.pop() if kinds else (id_type or "int")
    if id_type is not None and kind != id_type:
        raise InvalidTypeError(f"ids: this database uses {id_type} ids, got {kind}")
    if kind == "int":
        try:
            arr = np.array(values, dtype=np.int64)
        except OverflowError:
            raise InvalidInputError("ids: int ids must fit in 64 bits") from None
    else:
        arr = np.array([v.encode() for v in values], dtype=bytes)
    uniq, counts = np.unique(arr, return_counts=True)
    if len(uniq) != len(arr):
        dup = [decode_id(x) for x in uniq[counts > 1][:5]]
        raise DuplicateIdError(f"ids: duplicate ids within the batch: {dup}")
    return arr, kind


def too_deep(value, limit: int = MAX_DEPTH) -> bool:
    """Whether dicts / lists / tuples in ``value`` nest more than ``limit`` levels (``{"a": 1}`` is
    one level). Iterative, so a structure nested far past the recursion limit (or a cyclic one)
    is reported rather than crashing."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            children = v.values()
        elif isinstance(v, (list, tuple)):
            children = v
        else:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list, tuple)))
    return False


def decode_id(x):
    return x.decode() if isinstance(x, bytes) else int(x)


def metadata(given, n: int) -> list[str] | None:
    if given is None:
        return None
    if not isinstance(given, (list, tuple)):
        raise InvalidTypeError(f"metadata: expected a list of dicts (one per document), got {type(given).__name__}")
    if len(given) != n:
        raise InvalidInputError(f"metadata: expected {n} entries (one per document), got {len(given)}")
    out = []
    for i, m in enumerate(given):
        if m is not None and not isinstance(m, dict):
            raise InvalidTypeError(f"metadata[{i}]: expected a dict or None, got {type(m).__name__}")
        if too_deep(m):
            raise InvalidInputError(f"metadata[{i}]: expected at most {MAX_DEPTH} nested levels (dicts and lists), "
                                    f"got more")
        try:
            text = json.dumps(m, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as e:
            raise InvalidInputError(f"metadata[{i}]: not JSON-serialisable ({e})") from None
        if "\\ud" in text:  # surrogate escapes: a pair (one character) or a lone one (not text)
            unicode_text(json.dumps(m, ensure_ascii=False), f"metadata[{i}]")
        out.append(text)
    return out


def unicode_text(text: str, where: str) -> bytes:
    """``text`` as UTF-8; InvalidInputError when it holds a lone surrogate (no UTF-8 for it)."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidInputError(f"{where}: expected a str that encodes to UTF-8, got a lone surrogate "
                                f"{text[e.start]!r} at position {e.start}") from None


def sparse(given, n: int):
    """Per-document sparse vectors -> None, or (offsets [n+1] int64, terms int32, weights float32)
    with each document's terms sorted. An entry is None (no terms), a {term: weight} dict, or a
    (terms, weights) pair of sequences; terms are ints in [0, 2^31), unique per document, and
    weights finite numbers."""
    if given is None:
        return None
    if not isinstance(given, (list, tuple)):
        raise InvalidTypeError(f"sparse: expected a list of sparse vectors (one per document), got {type(given).__name__}")
    if len(given) != n:
        raise InvalidInputError(f"sparse: expected {n} entries (one per document), got {len(given)}")
    terms, weights, counts = [], [], []
    for i, e in enumerate(given):
        if e is not None and not isinstance(e, dict) and not (isinstance(e, (list, tuple)) and len(e) == 2):
            raise InvalidTypeError(f"sparse[{i}]: expected a {{term: weight}} dict or a (terms, weights) pair, got "
                                   f"{type(e).__name__}")
        try:
            if e is None:
                t, w = np.zeros(0, np.int64), np.zeros(0, np.float64)
            elif isinstance(e, dict):
                t, w = np.array(list(e.keys())), np.array(list(e.values()))
            else:
                t, w = np.asarray(e[0]), np.asarray(e[1])
        except (TypeError, ValueError, OverflowError) as err:  # UnicodeDecodeError is a ValueError
            raise InvalidInputError(f"sparse[{i}]: expected int terms and numeric weights ({type(err).__name__}: "
                                    f"{str(err)[:80]})") from None
        if t.shape != w.shape or t.ndim != 1:
            raise InvalidInputError(f"sparse[{i}]: expected as many weights as terms, got {t.shape} terms and "
                                    f"{w.shape} weights")
        if t.size and (t.dtype.kind not in "iu" or t.min() < 0 or t.max() >= 2**31):
            raise InvalidInputError(f"sparse[{i}]: expected int terms in [0, 2^31), got dtype {t.dtype}"
                                    + (f", range [{t.min()}, {t.max()}]" if t.dtype.kind in "iuf" else ""))
        if w.size and (w.dtype.kind not in "iuf" or not np.isfinite(w.astype(np.float64)).all()):
            raise InvalidInputError(f"sparse[{i}]: expected finite numeric weights")
        order = np.argsort(t, kind="stable")
        t, w = t[order], w[order]
        if t.size > 1 and (np.diff(t) == 0).any():
            raise InvalidInputError(f"sparse[{i}]: term {int(t[1:][np.diff(t) == 0][0])} appears twice")
        terms.append(t.astype(np.int32))
        weights.append(w.astype(np.float32))
        counts.append(t.size)
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    cat = (lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt))
    return offsets, cat(terms, np.int32), cat(weights, np.float32)


def sparse_slice(sp, d0: int, d1: int):
    """Documents [d0, d1) of a packed sparse triple, offsets rebased to 0."""
    if sp is None:
        return None
    off, t, w = sp
    a, b = int(off[d0]), int(off[d1])
    return off[d0 : d1 + 1] - a, t[a:b], w[a:b]
