"""The wire format of ``mvdb serve``, shared by the server and :class:`mvdb.serve.client.Client`.

Bodies are MessagePack (``application/msgpack``, what the Python client sends) or JSON
(``application/json``, for curl and other languages). In MessagePack an array travels as its
little-endian bytes: ``{"$nd": dtype, "shape": [...], "data": bytes}`` (float16 / float32 /
int8 / int32 / int64 ...), so a 32 x 128 fp16 query is 8 KB on the wire. In JSON an embedding is
a nested list of numbers; the server reads a field that holds embeddings as float32 arrays.

Sparse vectors ({term: weight}) keep their int keys in MessagePack; in JSON give them as
``[terms, weights]`` pairs (JSON object keys are strings). An object MessagePack cannot carry (a
set in metadata, say) travels as ``{"$obj": type name}`` and reaches the library as an object of
that type name, so it is refused with the library's own words.
"""

from __future__ import annotations

import json

import msgpack
import numpy as np

from mvdb.errors import InvalidInputError

MSGPACK = "application/msgpack"
JSON = "application/json"
_ND = "$nd"
_OBJ = "$obj"  # an object MessagePack cannot carry (a set, a custom class): its type name only
_DTYPES = {"float16", "float32", "float64", "bfloat16", "int8", "uint8", "int16", "int32", "int64", "bool"}


def _default(obj):
    """MessagePack's hook for what it does not know: numpy arrays and scalars, torch tensors."""
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "fiub":
            return obj.tolist()  # object / string arrays travel as lists (the server names the error)
        a = np.ascontiguousarray(obj, dtype=obj.dtype.newbyteorder("<"))
        return {_ND: a.dtype.name, "shape": list(a.shape), "data": a.tobytes()}
    if isinstance(obj, np.generic):
        return obj.item()
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency of mvdb
        torch = None
    if torch is not None and isinstance(obj, torch.Tensor):
        t = obj.detach().cpu()
        if t.dtype == torch.bfloat16:
            t = t.float()
        return _default(t.numpy())
    return {_OBJ: type(obj).__name__}  # the server stands in an object of that type name (see _hook)


class _Opaque:
    """Stands in for an object the client could not send: it has the original type's name, so the
    library refuses it with the same words as in-process (``Object of type set is not JSON
    serializable``, ``expected int or str ids, got set``)."""

    def __reduce__(self):  # to the database process of a server with workers (mvdb.serve.workers)
        return (_opaque, (type(self).__name__,))


def _opaque(name: str) -> _Opaque:
    return type(name, (_Opaque,), {})()


def _hook(d: dict):
    if _OBJ in d and len(d) == 1 and isinstance(d[_OBJ], str) and d[_OBJ].isidentifier() and len(d[_OBJ]) <= 100:
        return _opaque(d[_OBJ])
    if _ND in d and "data" in d:
        dtype, shape = d[_ND], d.get("shape")
        if dtype not in _DTYPES or not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
            raise InvalidInputError(f"an array: expected a known dtype and a shape of non-negative ints, got dtype "
                                    f"{dtype!r}, shape {shape!r}")
        dt = np.dtype(dtype).newbyteorder("<")
        data = d["data"]
        want = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if not isinstance(data, bytes) or len(data) != want:
            got = len(data) if isinstance(data, bytes) else type(data).__name__
            raise InvalidInputError(f"an array of dtype {dtype} and shape {shape}: expected {want} bytes, got {got}")
        return np.frombuffer(data, dtype=dt).reshape(shape).astype(dt.newbyteorder("="), copy=True)
    return d


def pack(obj) -> bytes:
    return msgpack.packb(obj, default=_default, use_bin_type=True)


def unpack(body: bytes):
    try:
        return msgpack.unpackb(body, object_hook=_hook, raw=False, strict_map_key=False)
    except InvalidInputError:
        raise
    except Exception as e:  # noqa: BLE001 - any malformed body is the client's error
        why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        raise InvalidInputError(f"request body: expected MessagePack (or Content-Type: application/json), could not "
                                f"decode it ({why})") from None


def to_json(obj) -> bytes:
    def default(o):
        if isinstance(o, np.ndarray):
            return o.tolist()
        if isinstance(o, np.generic):
            return o.item()
        raise TypeError(f"cannot send an object of type {type(o).__name__}")

    return json.dumps(obj, default=default, allow_nan=False, separators=(",", ":")).encode()


def from_json(body: bytes):
    try:
        return json.loads(body)
    except ValueError as e:
        raise InvalidInputError(f"request body: expected JSON, could not decode it ({e})") from None


def decode(body: bytes, content_type: str | None):
    """A request body by its content type (MessagePack unless it says JSON)."""
    if content_type and content_type.split(";")[0].strip().lower() == JSON:
        return from_json(body)
    return unpack(body)


def embeddings(x, name: str):
    """A field holding embeddings, as the library takes them: arrays stay; JSON's nested lists of
    numbers become float32 arrays (depth 2: one [L, dim] array; depth 3: a list of them). Anything
    else is passed on unchanged, for the library to name the error."""
    if isinstance(x, np.ndarray) or not isinstance(x, list):
        return x
    if x and all(isinstance(r, list) for r in x) and any(r and isinstance(r[0], list) for r in x):
        return [embeddings(r, f"{name}[{i}]") for i, r in enumerate(x)]  # a list of 2-D
    if all(isinstance(r, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in r) for r in x):
        try:
            return np.asarray(x, dtype=np.float32) if x else np.zeros((0, 0), np.float32)
        except ValueError as e:  # ragged rows
            raise InvalidInputError(f"{name}: expected rows of equal length, got {e}") from None
    return [embeddings(r, f"{name}[{i}]") if isinstance(r, list) else r for i, r in enumerate(x)]
