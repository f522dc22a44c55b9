"""The wire format of ``mvdb serve``, shared by the server and :class:`mvdb.serve.client.Client`.

Bodies are MessagePack (``application/msgpack``, what the Python client sends) or JSON
(``application/json``, for curl and other languages). In MessagePack an array travels as its
little-endian bytes: ``{"$nd": dtype, "shape": [...], "data": bytes}`` (float16 / float32 /
int8 / int32 / int64 ...), so a 32 x 128 fp16 query is 8 KB on the wire. In JSON an embedding is
a nested list of numbers; the server reads a field that holds embeddings as float32 arrays.

Sparse vectors ({term: weight}) keep their int keys in MessagePack; in JSON give them as
``[terms, weights]`` pairs (JSON object keys are strings). An object MessagePack cannot carry (a
set in metadata, say) travels as ``{"$obj": type name}`` and reaches the library as a stand-in
object of that type name, so it is refused with the library's own words (stand-in types are made
once per name, for at most ``MAX_STAND_INS`` names; others share one named ``object``).

Limits, checked before anything recursive touches a body: at most ``MAX_DEPTH`` levels of lists
and maps, ``MAX_CONTAINERS`` lists and maps, and ``MAX_ELEMENTS`` values inside them (a JSON body
is scanned for these before it is decoded; a MessagePack body is counted while the C decoder runs,
whose own stack stops nesting past about a thousand levels). Past a limit: InvalidInputError.
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
MAX_DEPTH = 64  # levels of lists and maps (metadata allows 32, a filter 32, plus the envelope)
MAX_CONTAINERS = 1_000_000  # lists and maps in one body
MAX_ELEMENTS = 16_000_000  # values inside them (a JSON body of 16M numbers: 1,000 x 128 x 128 floats)
MAX_STAND_INS = 64
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

    __slots__ = ()

    def __reduce__(self):  # to the database process of a server with workers (mvdb.serve.workers)
        return (_opaque, (type(self).__name__,))


_STAND_INS: dict[str, type] = {"object": type("object", (_Opaque,), {"__slots__": ()})}


def _opaque(name: str) -> _Opaque:
    """An instance of the stand-in type of ``name``; types are made once per name, and only for the
    first MAX_STAND_INS names (a body cannot make the server create types without bound)."""
    cls = _STAND_INS.get(name)
    if cls is None:
        if len(_STAND_INS) >= MAX_STAND_INS:
            cls = _STAND_INS["object"]
        else:
            cls = _STAND_INS.setdefault(name, type(name, (_Opaque,), {"__slots__": ()}))
    return cls()


class _Count:
    """Lists and maps decoded so far, and the values inside them (MessagePack's hooks)."""

    def __init__(self):
        self.containers = self.elements = 0

    def add(self, n: int) -> None:
        self.containers += 1
        self.elements += n
        if self.containers > MAX_CONTAINERS or self.elements > MAX_ELEMENTS:
            raise InvalidInputError(_too_big())


def _too_big() -> str:
    return (f"request body: more than {MAX_CONTAINERS:,} lists and maps or {MAX_ELEMENTS:,} values in them "
            f"(send embeddings as arrays: MessagePack {{'$nd', 'shape', 'data'}})")


def _too_deep() -> str:
    return f"request body: lists and maps nested more than {MAX_DEPTH} levels deep"


def check_depth(obj) -> None:
    """InvalidInputError when lists and maps in ``obj`` nest deeper than MAX_DEPTH (iterative)."""
    containers = (list, dict)
    level, depth = ([obj] if type(obj) in containers else []), 0
    while level:
        depth += 1
        if depth > MAX_DEPTH:
            raise InvalidInputError(_too_deep())
        nxt = []
        for c in level:
            values = c.values() if isinstance(c, dict) else c
            kinds = set(map(type, values))  # C speed: scalars are skipped without a Python step each
            if list in kinds or dict in kinds:
                nxt.extend(v for v in values if type(v) in containers)
        level = nxt


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
    # surrogatepass: text stored before mvdb refused lone surrogates still travels (and comes back)
    return msgpack.packb(obj, default=_default, use_bin_type=True, unicode_errors="surrogatepass")


def unpack(body: bytes, limits: bool = True):
    """A MessagePack body; ``limits``: the request limits (a client reading a server's answer,
    which may hold millions of hits, passes False)."""
    count = _Count()

    def on_map(d):
        count.add(len(d))
        return _hook(d)

    def on_list(lst):
        count.add(len(lst))
        return lst

    hooks = dict(object_hook=on_map, list_hook=on_list) if limits else dict(object_hook=_hook)
    try:
        obj = msgpack.unpackb(body, raw=False, strict_map_key=False, unicode_errors="surrogatepass", **hooks)
    except InvalidInputError:
        raise
    except msgpack.StackError:
        raise InvalidInputError(_too_deep()) from None
    except Exception as e:  # noqa: BLE001 - any malformed body is the client's error
        why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        raise InvalidInputError(f"request body: expected MessagePack (or Content-Type: application/json), could not "
                                f"decode it ({why})") from None
    if limits:
        check_depth(obj)
    return obj


def to_json(obj) -> bytes:
    def default(o):
        if isinstance(o, np.ndarray):
            return o.tolist()
        if isinstance(o, np.generic):
            return o.item()
        raise TypeError(f"cannot send an object of type {type(o).__name__}")

    return json.dumps(obj, default=default, allow_nan=False, separators=(",", ":")).encode()  # ASCII: lone surrogates as \\u escapes


def _positions(data: np.ndarray, byte: int, chunk: int = 1 << 24) -> np.ndarray:
    """Offsets of ``byte`` in ``data`` (in chunks: no array as large as the body)."""
    parts = [np.flatnonzero(data[c0:c0 + chunk] == byte) + c0 for c0 in range(0, len(data), chunk)]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def json_structure(body: bytes) -> tuple[int, int, int]:
    """(deepest nesting, lists and maps, values inside them) of a JSON text, found without
    decoding it: brackets and commas outside strings, where a quote is escaped after an odd run of
    backslashes. Vectorised over the positions of those bytes; exact for valid JSON (a text that
    is not fails to decode anyway)."""
    data = np.frombuffer(body, dtype=np.uint8)
    quotes = _positions(data, 34)
    slashes = _positions(data, 92)
    if len(slashes) and len(quotes):  # drop escaped quotes: an odd run of backslashes right before
        start = np.flatnonzero(np.diff(slashes, prepend=-2) != 1)
        run_end = np.append(slashes[start[1:] - 1], slashes[-1])
        run_len = np.diff(np.append(start, len(slashes)))
        at = np.searchsorted(run_end, quotes - 1)
        hit = at < len(run_end)
        escaped = np.zeros(len(quotes), bool)
        escaped[hit] = (run_end[at[hit]] == quotes[hit] - 1) & (run_len[at[hit]] % 2 == 1)
        quotes = quotes[~escaped]

    def outside(pos: np.ndarray) -> np.ndarray:
        return pos[np.searchsorted(quotes, pos) % 2 == 0]  # an even number of quotes before: not in a string

    opens = outside(np.sort(np.concatenate([_positions(data, 91), _positions(data, 123)])))
    closes = outside(np.sort(np.concatenate([_positions(data, 93), _positions(data, 125)])))
    commas = outside(_positions(data, 44))
    deepest = 0
    if len(opens):
        pos = np.concatenate([opens, closes])
        step = np.concatenate([np.ones(len(opens), np.int64), -np.ones(len(closes), np.int64)])
        deepest = int(np.cumsum(step[np.argsort(pos, kind="stable")]).max())
    return deepest, len(opens), len(opens) + len(commas)


def from_json(body: bytes):
    deepest, containers, elements = json_structure(body)
    if deepest > MAX_DEPTH:
        raise InvalidInputError(_too_deep())
    if containers > MAX_CONTAINERS or elements > MAX_ELEMENTS:
        raise InvalidInputError(_too_big())
    try:
        return json.loads(body)
    except ValueError as e:
        raise InvalidInputError(f"request body: expected JSON, could not decode it ({e})") from None
    except RecursionError:  # not valid JSON nesting that the scan did not see: still the client's error
        raise InvalidInputError(_too_deep()) from None


def decode(body: bytes, content_type: str | None):
    """A request body by its content type (MessagePack unless it says JSON)."""
    if content_type and content_type.split(";")[0].strip().lower() == JSON:
        return from_json(body)
    return unpack(body)


def n_queries(queries) -> int:
    """How many queries a request's ``queries`` holds: a batch (a list, or [Nq, Lq, dim]) its
    length, anything else one (the server's limit per request counts them; the client splits by it)."""
    if isinstance(queries, (list, tuple)) or getattr(queries, "ndim", 2) == 3:
        return len(queries)
    return 1


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
