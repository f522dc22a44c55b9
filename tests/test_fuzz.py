"""Hypothesis over the public API and the HTTP payloads: any value in any argument either works or
raises an mvdb error (never a raw TypeError, KeyError, RecursionError...), a refused write leaves
every file as it was, and no request body makes the server answer 500."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import mvdb
from mvdb.errors import MvdbError

DIM = 8
SETTINGS = settings(max_examples=int(os.environ.get("MVDB_FUZZ_EXAMPLES", 150)), deadline=None, suppress_health_check=list(HealthCheck))

# ---- values of every shape an argument might be given

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
                    st.text(max_size=8), st.binary(max_size=8))
json_like = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                          st.dictionaries(st.text(max_size=4), inner, max_size=4)),
                         max_leaves=20)


@st.composite
def arrays(draw):
    ndim = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=ndim, max_size=ndim)))
    if ndim == 2 and draw(st.booleans()):
        shape = (shape[0], DIM)  # often the right width, so the checks past the shape run too
    dtype = draw(st.sampled_from(["float32", "float16", "float64", "int8", "int64", "bool", "complex64", "object"]))
    a = np.zeros(shape, dtype=dtype) if dtype != "object" else np.empty(shape, dtype=object)
    if dtype.startswith("float") and a.size:
        a[...] = draw(st.sampled_from([0.0, 1.0, np.nan, np.inf, 1e30, -7.5]))
    return torch.from_numpy(a) if draw(st.booleans()) and dtype not in ("object", "float16") else a


anything = st.one_of(json_like, arrays(), st.lists(arrays(), max_size=3),
                     st.builds(set, st.lists(st.integers(), max_size=3)), st.just(object()))


def _digest(path) -> str:
    h = hashlib.sha256()
    for root, _, names in sorted(os.walk(path)):
        for n in sorted(names):
            h.update(n.encode())
            with open(os.path.join(root, n), "rb") as f:
                h.update(f.read())
    return h.hexdigest()


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "db"
    rng = np.random.default_rng(0)
    handle = mvdb.open(path, device="cpu", index="flat", progress=False)
    handle.add([rng.standard_normal((4, DIM)).astype(np.float32) for _ in range(6)], ids=[f"d{i}" for i in range(6)],
               metadata=[{"n": i, "tag": ["a", "b"][i % 2]} for i in range(6)])
    yield handle
    handle.close()


def _only_mvdb_errors(call) -> bool:
    try:
        call()
    except MvdbError:
        return False
    return True


WRITES = {
    "add": lambda db, a, b, c: db.add(a, ids=b, metadata=c),
    "add_sparse": lambda db, a, b, c: db.add([np.ones((2, DIM), np.float32)], ids=["s-new"], sparse=a),
    "delete": lambda db, a, b, c: db.delete(a),
}
READS = {
    "search": lambda db, a, b, c: db.search(a, k=b),
    "search_where": lambda db, a, b, c: db.search(np.ones((2, DIM), np.float32), where=a),
    "search_options": lambda db, a, b, c: db.search(np.ones((2, DIM), np.float32), n_candidates=a, k_tokens=b,
                                                    exact=c if isinstance(c, bool) else False),
    "search_sparse": lambda db, a, b, c: db.search(np.ones((2, DIM), np.float32), sparse=a, n_sparse=b),
    "rerank": lambda db, a, b, c: db.rerank(a, b),
    "rerank_k": lambda db, a, b, c: db.rerank(np.ones((2, DIM), np.float32), ["d1", "d2"], k=a),
    "candidates": lambda db, a, b, c: db.candidates(a, k=b),
    "get": lambda db, a, b, c: db.get(a),
    "metadata": lambda db, a, b, c: db.metadata(a),
    "contains": lambda db, a, b, c: db.contains(a),
}


@pytest.mark.heavy
@SETTINGS
@given(name=st.sampled_from(sorted(WRITES)), a=anything, b=anything, c=anything)
def test_writes_refuse_with_mvdb_errors_and_leave_no_trace(db, name, a, b, c):
    before, n = _digest(db.store.path), len(db)
    stored = _only_mvdb_errors(lambda: WRITES[name](db, a, b, c))
    if not stored:
        assert _digest(db.store.path) == before and len(db) == n
    elif name != "delete":
        ids = db.store.ids()
        db.delete([i for i in ids if i not in {f"d{k}" for k in range(6)}])  # back to the six documents
    assert db.verify().ok


# per read, arguments it takes, each mixed with ``anything`` so that many reads answer (and their
# answers get checked) while the checks of every argument still meet wrong values
queries = st.builds(lambda n, seed: np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32),
                    st.integers(1, 4), st.integers(0, 2**32 - 1))
some_ids = st.lists(st.sampled_from(["d0", "d1", "d2", "d3", "d4", "d5", "missing"]), min_size=1, max_size=4,
                    unique=True)
small = st.integers(1, 8)
PLAUSIBLE = {
    "search": (queries, small, anything),
    "search_where": (st.sampled_from([{"tag": "a"}, {"n": {"$gt": 2}}, {"$not": {"tag": "b"}}]), anything, anything),
    "search_options": (small, small, st.booleans()),
    "search_sparse": (anything, small, anything),
    "rerank": (queries, some_ids, anything),
    "rerank_k": (small, anything, anything),
    "candidates": (queries, small, anything),
    "get": (some_ids, anything, anything),
    "metadata": (some_ids, anything, anything),
    "contains": (st.one_of(some_ids, st.sampled_from(["d1", "missing"])), anything, anything),
}
reads = st.sampled_from(sorted(READS)).flatmap(  # half and half (st.one_of would flatten ``anything``'s branches)
    lambda name: st.tuples(st.just(name), *(st.booleans().flatmap(lambda p, arg=arg: arg if p else anything)
                                            for arg in PLAUSIBLE[name])))


def _answered(call):
    """(True, the answer), or (False, None) where the call raised an mvdb error."""
    try:
        return True, call()
    except MvdbError:
        return False, None


def _check_hits(hits, allowed):
    """One query's ranked hits: distinct ids among ``allowed``, finite scores, best first."""
    assert all(type(h).__name__ == "Hit" for h in hits), hits
    ids, scores = [h.id for h in hits], [h.score for h in hits]
    assert len(set(ids)) == len(ids) and set(ids) <= allowed, ids
    assert np.isfinite(scores).all() and scores == sorted(scores, reverse=True), scores


def _check_answer(name, out, a, b, stored):
    """An answered read's answer has the shape and the content its arguments ask for."""
    names = a if isinstance(a, list) and all(isinstance(i, str) for i in a) else None
    if name == "contains":
        assert isinstance(out, np.ndarray) and out.dtype == bool
        if isinstance(a, str):
            names = [a]
        if names is not None:
            assert out.tolist() == [i in stored for i in names]
    elif name in ("get", "metadata"):
        assert isinstance(out, list)
        if names is not None:
            assert len(out) == len(names) and set(names) <= stored  # an unknown id is refused
        if name == "get":
            assert all(isinstance(x, np.ndarray) and x.dtype == np.float32 and x.ndim == 2 and x.shape[1] == DIM
                       and len(x) for x in out)
    elif name == "candidates":
        for row in (out if out and isinstance(out[0], list) else [out]):
            assert len(set(row)) == len(row) and set(row) <= stored, row
    else:
        allowed = set(b) & stored if name == "rerank" and isinstance(b, list) else stored
        k = b if name == "search" and isinstance(b, int) else a if name == "rerank_k" and isinstance(a, int) else None
        for row in (out if out and isinstance(out[0], list) else [out]):
            _check_hits(row, allowed)
            assert k is None or len(row) <= k


_Q = np.random.default_rng(1).standard_normal((3, DIM)).astype(np.float32)


@SETTINGS
@given(read=reads)
@example(read=("search", _Q, 3, None))
@example(read=("search", [_Q, _Q[:1]], 2, None))
@example(read=("search_where", {"tag": "a"}, None, None))
@example(read=("rerank", _Q, ["d4", "d1", "d2"], None))
@example(read=("candidates", _Q, 4, None))
@example(read=("get", ["d3", "d0"], None, None))
@example(read=("metadata", ["d5"], None, None))
@example(read=("contains", ["d2", "missing"], None, None))
def test_reads_answer_or_raise_mvdb_errors(db, read):
    """A read either raises an mvdb error or answers what was asked; either way nothing changes."""
    name, a, b, c = read
    before, stored = _digest(db.store.path), set(db.store.ids())
    answered, out = _answered(lambda: READS[name](db, a, b, c))
    if answered:
        _check_answer(name, out, a, b, stored)
    assert _digest(db.store.path) == before


filters = st.recursive(
    st.dictionaries(st.sampled_from(["n", "tag", "x", "$eq", "$foo"]),
                    st.one_of(scalars, st.dictionaries(st.sampled_from(["$eq", "$ne", "$gt", "$lte", "$in", "$nin",
                                                                        "$exists", "$bad"]),
                                                       st.one_of(scalars, st.lists(scalars, max_size=3)), max_size=2)),
                    max_size=2),
    lambda inner: st.one_of(st.dictionaries(st.sampled_from(["$and", "$or"]), st.lists(inner, max_size=3), max_size=1),
                            st.builds(lambda f: {"$not": f}, inner)),
    max_leaves=10)


@pytest.mark.heavy
@SETTINGS
@given(where=filters)
def test_filters_match_a_reference_or_are_refused(db, where):
    """A filter the library takes selects exactly what a plain evaluation of the same rules does."""
    try:
        hits = db.search(np.ones((2, DIM), np.float32), k=10, where=where, exact=True)
    except MvdbError:
        return
    meta = dict(zip(db.store.ids(), db.metadata(db.store.ids())))
    assert {h.id for h in hits} == {i for i, m in meta.items() if _reference(where, m)}


def _kind(v):
    return "bool" if isinstance(v, bool) else "number" if isinstance(v, (int, float)) else type(v).__name__


def _same(a, b):
    return _kind(a) == _kind(b) and (a == b if not isinstance(a, (list, dict)) else json.dumps(a) == json.dumps(b))


def _reference(where: dict, m: dict) -> bool:
    missing = object()
    for key, cond in where.items():
        if key == "$and" and not all(_reference(c, m) for c in cond):
            return False
        if key == "$or" and not any(_reference(c, m) for c in cond):
            return False
        if key == "$not" and _reference(cond, m):
            return False
        if key.startswith("$"):
            continue
        v = m.get(key, missing)
        ops = cond if isinstance(cond, dict) else {"$eq": cond}
        for op, arg in ops.items():
            ok = {"$eq": lambda: v is not missing and _same(v, arg),
                  "$ne": lambda: v is missing or not _same(v, arg),
                  "$in": lambda: v is not missing and any(_same(v, x) for x in arg),
                  "$nin": lambda: v is missing or not any(_same(v, x) for x in arg),
                  "$exists": lambda: (v is not missing) == arg,
                  "$gt": lambda: v is not missing and _kind(v) == _kind(arg) and v > arg,
                  "$lte": lambda: v is not missing and _kind(v) == _kind(arg) and v <= arg}[op]()
            if not ok:
                return False
    return True


# ---- HTTP payloads


ROUTES = ["/search", "/candidates", "/rerank", "/add", "/delete", "/get", "/metadata", "/contains", "/compact",
          "/refresh"]
nested = st.recursive(scalars.filter(lambda v: not isinstance(v, float) or np.isfinite(v)),
                      lambda inner: st.one_of(st.lists(inner, max_size=5),
                                              st.dictionaries(st.sampled_from(["queries", "docs", "ids", "k", "where",
                                                                               "metadata", "$obj", "$nd", "shape",
                                                                               "data", "candidate_ids", "x"]),
                                                              inner, max_size=5)),
                      max_leaves=30)


def _http():
    """The serve extra and an HTTP client, or a skip (of the tests that need them only: a
    module-level skip would skip the API's tests above too)."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    return pytest.importorskip("urllib3")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    urllib3 = _http()
    from mvdb.serve import Server

    path = tmp_path_factory.mktemp("fuzz-http") / "db"
    with mvdb.open(path, device="cpu", index="flat", progress=False) as d:
        d.add([np.ones((3, DIM), np.float32) * i for i in range(1, 5)], ids=["a", "b", "c", "d"])
    with Server(str(path), device="cpu", open_options={"index": "flat", "progress": False}) as srv:
        yield srv, urllib3.PoolManager(retries=False)


def _answer_is_not_a_crash(r) -> None:
    assert r.status < 500, (r.status, r.data[:300])
    if r.status >= 400:
        body = json.loads(r.data)
        assert body["error"] in dir(mvdb.errors) and body["message"], body


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(route=st.sampled_from(ROUTES), body=nested, fmt=st.sampled_from(["json", "msgpack"]))
def test_http_bodies_never_answer_500(server, route, body, fmt):
    import msgpack

    srv, http = server
    if fmt == "json":
        try:
            raw = json.dumps(body).encode("utf-8", "surrogatepass")
        except (TypeError, ValueError):
            return
        ctype = "application/json"
    else:
        try:
            raw, ctype = msgpack.packb(body, use_bin_type=True, unicode_errors="surrogatepass"), "application/msgpack"
        except (OverflowError, ValueError):  # no MessagePack for ints past 64 bits
            return
    r = http.request("POST", srv.url + route, body=raw, headers={"content-type": ctype, "accept": "application/json"})
    _answer_is_not_a_crash(r)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(route=st.sampled_from(ROUTES), raw=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)),
       ctype=st.sampled_from(["application/json", "application/msgpack", "text/plain"]))
def test_http_garbage_never_answers_500(server, route, raw, ctype):
    srv, http = server
    r = http.request("POST", srv.url + route, body=raw, headers={"content-type": ctype, "accept": "application/json"})
    _answer_is_not_a_crash(r)


# ---- every route, well-formed requests with extreme values (issue #58): never a 5xx

EXTREME = st.one_of(st.sampled_from([0.0, -0.0, 1.0, -1.0, 65504.0, -65504.0, 65505.0, 70000.0, 1e20, -1e20, 3e38,
                                     -3.4e38, 1e38, 1.7e308, -1.7e308, 5e-324, 1e-45]),
                    st.floats(allow_nan=False, allow_infinity=False))
HUGE_K = st.one_of(st.sampled_from([0, -1, 1, 3, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63)]),
                   st.integers(-(2**80), 2**80), st.integers(1, 20))
TEXTS = st.one_of(st.sampled_from(["", " ", "\t\n", "disk", "free disk space", "x" * 5000]), st.text(max_size=40))
IDS = st.sampled_from(["df", "cp", "ls", "date", "nope", "", 0, -1, 2**63, 2**64])
IN_RANGE = st.sampled_from([65504.0, -65504.0, 60000.0, 1e4, -1e4, 1.0, 1e-8, 0.0])  # finite at the kernels' float16
matrix = st.one_of(st.lists(st.lists(EXTREME, min_size=DIM, max_size=DIM), min_size=1, max_size=3),
                   st.builds(lambda v, n: [[v] * DIM] * n, IN_RANGE, st.integers(1, 3)),
                   st.lists(st.lists(IN_RANGE, min_size=DIM, max_size=DIM), min_size=1, max_size=3))
queries_arg = st.one_of(matrix, st.lists(matrix, min_size=1, max_size=3))
options = st.fixed_dictionaries({}, optional={"k": HUGE_K, "n_candidates": HUGE_K, "k_tokens": HUGE_K,
                                              "nprobe": HUGE_K, "exact": st.booleans()})
REQUESTS = {
    "/search": st.builds(lambda q, o: {"queries": q, **o}, queries_arg, options),
    "/candidates": st.builds(lambda q, o: {"queries": q, **{k: v for k, v in o.items() if k != "exact"}},
                             queries_arg, options),
    "/search_text": st.builds(lambda q, o: {"queries": q, **o}, st.one_of(TEXTS, st.lists(TEXTS, min_size=1, max_size=4)),
                              options),
    "/rerank": st.builds(lambda q, ids, k: {"queries": q, "candidate_ids": ids, "k": k}, matrix,
                         st.lists(IDS, max_size=4), st.one_of(st.none(), HUGE_K)),
    "/explain": st.one_of(st.builds(lambda q, d: {"query": q, "doc_id": d}, st.one_of(TEXTS, matrix), IDS),
                          st.builds(lambda q, d: {"query_id": q, "doc_id": d}, IDS, IDS)),
    "/add": st.builds(lambda d, i: {"docs": [d], "ids": [i]}, matrix, st.text(min_size=1, max_size=6)),
    "/delete": st.builds(lambda i: {"ids": i}, st.lists(IDS, max_size=3)),
    "/get": st.builds(lambda i: {"ids": i}, st.lists(IDS, max_size=3)),
    "/metadata": st.builds(lambda i: {"ids": i}, st.lists(IDS, max_size=3)),
    "/contains": st.builds(lambda i: {"ids": i}, st.lists(IDS, max_size=3)),
    "/compact": st.just({}),
    "/refresh": st.just({}),
}
GETS = ["/health", "/ready", "/stats", "/len", "/verify"]


@pytest.fixture(scope="module")
def text_server(tmp_path_factory):
    urllib3 = _http()
    from mvdb.serve import Server
    from mvdb.testing.words import encode as words

    def small(texts, is_query):  # the stand-in's vectors cut to DIM, so the strategies draw whole queries
        return [v[:, :DIM] / np.linalg.norm(v[:, :DIM], axis=1, keepdims=True) for v in words(texts, is_query)]

    path = tmp_path_factory.mktemp("fuzz-extreme") / "db"
    db = mvdb.open(path, device="cpu", index="flat", encoder=mvdb.Encoder(small, dim=DIM), progress=False)
    db.add_texts(["free disk space", "copy files", "list directory contents", "show the date"],
                 ids=["df", "cp", "ls", "date"])
    with Server(db) as srv:
        yield srv, urllib3.PoolManager(retries=False)
    db.close()


@SETTINGS
@given(data=st.data(), route=st.sampled_from(sorted(REQUESTS) + GETS), fmt=st.sampled_from(["json", "msgpack"]))
def test_every_route_with_extreme_inputs_never_answers_5xx(text_server, data, route, fmt):
    import msgpack

    srv, http = text_server
    if route in GETS:
        r = http.request("GET", srv.url + route, headers={"accept": "*/*"})
        assert r.status in (200, 503) and json.loads(r.data) is not None
        return
    body = data.draw(REQUESTS[route])
    if fmt == "json":
        raw, ctype = json.dumps(body).encode("utf-8", "surrogatepass"), "application/json"
    else:
        try:
            raw, ctype = msgpack.packb(body, use_bin_type=True, unicode_errors="surrogatepass"), "application/msgpack"
        except (OverflowError, ValueError):  # no MessagePack for ints past 64 bits
            return
    r = http.request("POST", srv.url + route, body=raw, headers={"content-type": ctype})  # JSON by default
    _answer_is_not_a_crash(r)
    if r.status == 200 and route in ("/search", "/search_text", "/rerank"):
        rows = json.loads(r.data)["hits"]
        rows = rows if rows and isinstance(rows[0], list) and rows[0] and isinstance(rows[0][0], list) else [rows]
        assert all(np.isfinite(s) for row in rows for _, s in row), body  # every score a finite number
