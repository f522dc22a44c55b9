"""Bad input at every public entry point: a clear InvalidInputError / InvalidTypeError naming what
was expected and what came, and the stored data left as it was (issue #14, items 6 and 7)."""

import math

import numpy as np
import pytest
import torch

import mvdb
from mvdb import InvalidInputError, InvalidTypeError

DIM = 8


def _docs(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal((int(rng.integers(2, 6)), DIM))
        out.append((x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32))
    return out


def _q(seed=1):
    return _docs(1, seed)[0]


def _state(db):
    """What is stored: ids in order, their tokens and metadata."""
    ids = db.store.ids()
    return ids, [t.tobytes() for t in db.get(ids)] if ids else [], db.metadata(ids) if ids else []


@pytest.fixture
def db(tmp_path):
    d = mvdb.open(tmp_path / "db", device="cpu")
    yield d
    d.close()


@pytest.fixture
def filled(db):
    db.add(_docs(4), metadata=[{"i": i} for i in range(4)])
    return db


def _unchanged(db, before, path):
    assert _state(db) == before
    with mvdb.open(path, device="cpu", read_only=True) as r:  # and on disk
        assert _state(r) == before


# ---- 1. integer tokens whose abs() overflows must not reach float16 as -inf


@pytest.mark.parametrize(
    "dtype, value",
    [
        (np.int64, np.iinfo(np.int64).min),  # abs() of it is itself: negative
        (np.int32, np.iinfo(np.int32).min),
        (np.int32, np.iinfo(np.int32).max),
        (np.int64, np.iinfo(np.int64).max),
        (np.uint64, np.iinfo(np.uint64).max),
        (np.float64, -1e300),
    ],
    ids=["int64-min", "int32-min", "int32-max", "int64-max", "uint64-max", "float64-neg"],
)
def test_integer_extremes_are_rejected_not_stored_as_inf(filled, tmp_path, dtype, value):
    before = _state(filled)
    bad = np.ones((3, DIM), dtype=dtype)
    bad[1, 2] = value
    with pytest.raises(InvalidInputError, match=r"document 1: value -?\S+ at token 1 overflows float16"):
        filled.add([np.ones((2, DIM), dtype=dtype), bad])  # all of one int dtype: no promotion to float
    _unchanged(filled, before, tmp_path / "db")
    hits = filled.search(_q(), k=10)
    assert len(hits) == 4 and all(math.isfinite(h.score) for h in hits)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8])
def test_small_integer_tokens_are_still_accepted(db, dtype):
    docs = [np.arange(DIM * 2, dtype=dtype).reshape(2, DIM) - (0 if np.dtype(dtype).kind == "u" else 5)]
    assert db.add(docs) == [0]
    assert np.array_equal(db.get([0])[0], docs[0].astype(np.float32))
    assert all(math.isfinite(h.score) for h in db.search(np.ones((2, DIM), np.float32), k=1))


# ---- 2. no auto ids left above the largest int id


@pytest.mark.parametrize("explicit, n_auto, ok", [(2**63 - 1, 1, False), (2**63 - 2, 2, False), (2**63 - 2, 1, True)])
def test_auto_ids_run_out_cleanly(db, tmp_path, explicit, n_auto, ok):
    db.add(_docs(1), ids=[explicit])
    before = _state(db)
    if ok:
        assert db.add(_docs(n_auto, 5)) == [explicit + 1]
        return
    with pytest.raises(InvalidInputError, match=rf"ids: no auto ids left above {explicit} .*pass ids="):
        db.add(_docs(n_auto, 5))
    _unchanged(db, before, tmp_path / "db")
    assert db.add(_docs(1, 6), ids=[7]) == [7]  # explicit ids still work
    with pytest.raises(InvalidInputError, match="no auto ids left"):
        db.add(_docs(n_auto, 7))


# ---- 3. k (and n_candidates, n_sparse) beyond the documents: fewer hits, no huge allocation

HUGE = 10**12  # 8 * HUGE int64 slots could never be allocated


@pytest.mark.parametrize("index", ["flat", "ivf"])
@pytest.mark.parametrize(
    "kwargs",
    [
        {"k": HUGE},
        {"k": 10**9},
        {"k": 3, "n_candidates": HUGE},
        {"k": HUGE, "n_candidates": HUGE, "k_tokens": HUGE, "nprobe": HUGE},
        {"k": HUGE, "sparse": {1: 1.0}, "n_sparse": HUGE},
        {"k": HUGE, "where": {"i": {"$gte": 1}}},
        {"k": HUGE, "exact": True},
    ],
    ids=["k", "k1e9", "n_candidates", "all", "sparse", "where", "exact"],
)
def test_k_beyond_the_documents_gives_fewer_hits(tmp_path, index, kwargs):
    with mvdb.open(tmp_path / "db", device="cpu", index=index, nlist=2) as db:
        db.add(_docs(6), metadata=[{"i": i} for i in range(6)], sparse=[{1: float(i + 1)} for i in range(6)])
        db.delete([5])
        n = 4 if "where" in kwargs else 5
        hits = db.search(_q(), **kwargs)
        assert len(hits) == min(n, kwargs["k"]) and len({h.id for h in hits}) == len(hits)
        assert 5 not in {h.id for h in hits}
        both = dict(kwargs, sparse=[kwargs["sparse"]] * 2) if "sparse" in kwargs else kwargs
        batch = db.search([_q(), _q(2)], **both)
        assert [len(h) for h in batch] == [len(hits)] * 2
        opts = {key: v for key, v in kwargs.items() if key != "exact"}
        cand = db.candidates(_q(), **opts)
        assert len(cand) <= 5 and 5 not in cand


# ---- 4. str ids: bounded UTF-8 length, valid Unicode


@pytest.mark.parametrize(
    "doc_id, error",
    [
        ("x" * 1025, r"ids\[1\]: expected at most 1024 UTF-8 bytes per str id, got 1025"),
        ("é" * 513, r"ids\[1\]: expected at most 1024 UTF-8 bytes per str id, got 1026"),
        ("\ud800", r"ids\[1\]: expected a str that encodes to UTF-8, got a lone surrogate .* position 0"),
        ("ab\udfff", r"ids\[1\]: expected a str that encodes to UTF-8, got a lone surrogate .* position 2"),
        ("x" * 1024, None),
        ("é" * 512, None),
        ("\U0001f600" * 256, None),  # 4 bytes each: exactly 1024
    ],
    ids=["ascii-1025", "utf8-1026", "surrogate", "surrogate-late", "ascii-1024", "utf8-1024", "emoji-1024"],
)
def test_str_ids_are_bounded_and_valid_unicode(db, tmp_path, doc_id, error):
    db.add(_docs(1), ids=["first"])
    before = _state(db)
    if error is None:
        assert db.add(_docs(2, 3), ids=["ok", doc_id]) == ["ok", doc_id]
        assert db.get([doc_id])[0].shape[1] == DIM
        return
    with pytest.raises(InvalidInputError, match=error):
        db.add(_docs(2, 3), ids=["ok", doc_id])
    _unchanged(db, before, tmp_path / "db")


@pytest.mark.parametrize("method", ["get", "metadata", "delete", "contains"])
def test_lone_surrogate_ids_in_reads_and_deletes(db, method):
    db.add(_docs(1), ids=["a"])
    with pytest.raises(InvalidInputError, match=r"ids\[1\]: expected a str that encodes to UTF-8"):
        getattr(db, method)(["a", "\ud800"])
    assert len(db) == 1


# ---- 5. nesting depth of metadata and of where filters


def _nested(levels, leaf=1, kind="dict"):
    v = leaf
    for _ in range(levels):
        v = {"a": v} if kind == "dict" else [v]
    return v


@pytest.mark.parametrize(
    "meta, ok",
    [
        (_nested(32), True),
        (_nested(33), False),
        (_nested(10_000), False),
        ({"a": _nested(31, kind="list")}, True),
        ({"a": _nested(32, kind="list")}, False),
        ({"a": _nested(10_000, kind="list")}, False),
    ],
    ids=["dict-32", "dict-33", "dict-10000", "list-32", "list-33", "list-10000"],
)
def test_metadata_depth_is_bounded(filled, tmp_path, meta, ok):
    before = _state(filled)
    if ok:
        (new,) = filled.add(_docs(1, 9), metadata=[meta])
        assert filled.metadata([new]) == [meta]
        return
    with pytest.raises(InvalidInputError, match=r"metadata\[1\]: expected at most 32 nested levels"):
        filled.add(_docs(2, 9), metadata=[{"x": 1}, meta])
    _unchanged(filled, before, tmp_path / "db")


def test_metadata_cycle_is_rejected(filled):
    m = {"a": 1}
    m["self"] = m
    with pytest.raises(InvalidInputError, match="nested levels"):
        filled.add(_docs(1, 9), metadata=[m])


def _chain(op, levels):
    w = {"i": 1}
    for _ in range(levels):
        w = {"$not": w} if op == "$not" else {op: [w]}
    return w


@pytest.mark.parametrize(
    "where, ok",
    [
        (_chain("$not", 30), True),
        (_chain("$and", 31), True),
        (_chain("$not", 40), False),
        (_chain("$not", 10_000), False),
        (_chain("$or", 10_000), False),
        ({"i": {"$eq": _nested(10_000)}}, False),
        ({"i": _nested(10_000, kind="list")}, False),
        ({"i": {"$in": [_nested(10_000)]}}, False),
    ],
    ids=["not-30", "and-31", "not-40", "not-10000", "or-10000", "eq-value-10000", "value-10000", "in-value-10000"],
)
def test_where_depth_is_bounded(filled, where, ok):
    if ok:
        hits = filled.search(_q(), k=4, where=where)
        assert [h.id for h in hits] == [1]  # an even number of $not: the filter itself
        return
    with pytest.raises(InvalidInputError, match="nested"):
        filled.search(_q(), k=4, where=where)


# ---- 6. rerank-only and id arguments


@pytest.mark.parametrize(
    "docs, error, message",
    [
        ([np.ones((2, DIM), np.float32), np.full((2, DIM), np.nan, np.float32)], InvalidInputError,
         r"document 1: contains NaN or Inf"),
        ([np.ones((2, DIM), np.float32), np.full((2, DIM), np.inf, np.float32)], InvalidInputError,
         r"document 1: contains NaN or Inf"),
        ([torch.full((2, DIM), -torch.inf)], InvalidInputError, r"document 0: contains NaN or Inf"),
        ([np.full((2, DIM), 1e300)], InvalidInputError, r"document 0: values beyond the float32 range"),
        ([np.ones((2, DIM), np.complex64)], InvalidTypeError,
         r"document 0: expected a real-valued \(float or int\) array, got dtype complex64"),
        ([torch.ones((2, DIM), dtype=torch.complex64)], InvalidTypeError,
         r"document 0: expected a real-valued \(float or int\) tensor, got dtype torch.complex64"),
        ([np.ones((2, DIM), bool)], InvalidTypeError, r"document 0: expected a real-valued .* got dtype bool"),
        ([np.array([["a"] * DIM])], InvalidTypeError, r"document 0: expected a real-valued .* got dtype <U1"),
        ([None], InvalidTypeError, r"document 0: expected a numpy array or torch tensor, got NoneType"),
        ([np.zeros((0, DIM), np.float32)], InvalidInputError, r"document 0: empty \(0 tokens\)"),
        (None, InvalidTypeError,
         r"docs: expected a non-empty list of \[L, dim\] arrays / tensors, or one \[n, L, dim\] array, got NoneType"),
        (5, InvalidTypeError, r"docs: expected a non-empty list .* got int"),
        (np.ones((2, DIM), np.float32), InvalidInputError, (r"docs: expected a non-empty list .* or one \[n, L, dim\] "
         r"array, got shape \(2, 8\)")),
        ({"a": 1}, InvalidTypeError, r"docs: expected a non-empty list .* got dict"),
        ([], InvalidInputError, r"docs: expected a non-empty list .* got an empty list"),
    ],
    ids=["nan", "inf", "torch-inf", "float32-overflow", "complex", "torch-complex", "bool", "str", "none-doc",
         "empty-doc", "none", "int", "2d-array", "dict", "empty-list"],
)
def test_inline_rerank_bad_documents(docs, error, message):
    with pytest.raises(error, match=message):
        mvdb.rerank(np.ones((2, DIM), np.float32), docs, k=2)


@pytest.mark.parametrize(
    "query, error, message",
    [
        (np.ones((2, DIM), np.complex128), InvalidTypeError, r"query: expected a real-valued .* got dtype complex128"),
        (None, InvalidTypeError, r"query: expected a numpy array or torch tensor, got NoneType"),
        (np.full((2, DIM), np.nan, np.float32), InvalidInputError, r"query 0: contains NaN or Inf"),
    ],
    ids=["complex", "none", "nan"],
)
def test_inline_rerank_bad_query(query, error, message):
    with pytest.raises(error, match=message):
        mvdb.rerank(query, [np.ones((2, DIM), np.float32)])


def test_inline_rerank_still_takes_ints_and_float64():
    docs = [np.ones((2, DIM), np.int64), np.full((3, DIM), 0.5), torch.full((1, DIM), 0.25, dtype=torch.float16)]
    hits = mvdb.rerank(np.ones((2, DIM), np.float64), docs)
    assert [h.id for h in hits] == [0, 1, 2]
    hits = mvdb.rerank(np.ones((2, DIM), np.float32), np.ones((3, 2, DIM), np.float32), k=2)  # one [n, L, dim] array
    assert len(hits) == 2


@pytest.mark.parametrize(
    "candidate_ids, message",
    [
        (None, r"candidate_ids: expected a list of ids, got NoneType"),
        (5, r"candidate_ids: expected a list of ids, got int"),
        ("ab", r"candidate_ids: expected a list of ids, got str"),
        ({1: 2}, r"candidate_ids: expected a list of ids, got dict"),
        ([None], r"candidate_ids\[0\]: expected an int or str id, got NoneType"),
        ([0, 1.5], r"candidate_ids\[1\]: expected an int or str id, got float"),
        ([True], r"candidate_ids\[0\]: expected an int or str id, got bool"),
        (np.array([0.0, 1.0]), r"candidate_ids\[0\]: expected an int or str id, got float"),
        (np.array(0, dtype=np.int8), r"candidate_ids: expected a list of ids, got ndarray"),  # 0-d: no length
    ],
    ids=["none", "int", "str", "dict", "none-id", "float-id", "bool-id", "float-array", "0-d-array"],
)
def test_database_rerank_bad_candidate_ids(filled, candidate_ids, message):
    with pytest.raises(InvalidTypeError, match=message):
        filled.rerank(_q(), candidate_ids)


def test_database_rerank_batch_needs_one_list_per_query(filled):
    with pytest.raises(InvalidTypeError, match=r"candidate_ids: expected one list of ids per query, got NoneType"):
        filled.rerank([_q(), _q(2)], None)
    with pytest.raises(InvalidTypeError, match=r"candidate_ids\[1\]: expected a list of ids, got int"):
        filled.rerank([_q(), _q(2)], [[0], 1])
    with pytest.raises(InvalidTypeError, match=r"candidate_ids\[1\]\[0\]: expected an int or str id, got NoneType"):
        filled.rerank([_q(), _q(2)], [[0], [None]])
    assert [len(h) for h in filled.rerank([_q(), _q(2)], [[0, 1], np.array([2])])] == [2, 1]


@pytest.mark.parametrize("method", ["get", "metadata", "delete", "contains"])
@pytest.mark.parametrize(
    "ids, message",
    [
        (None, r"ids: expected an int or str id, or a list of them, got NoneType"),
        (1.5, r"ids: expected an int or str id, or a list of them, got float"),
        (True, r"ids: expected an int or str id, or a list of them, got bool"),
        ([0, None], r"ids\[1\]: expected an int or str id, got NoneType"),
        ([0, 2.0], r"ids\[1\]: expected an int or str id, got float"),
        ([0, "a"], r"ids: expected all int or all str ids, got a mix"),
        (np.array([0.0]), r"ids: expected a 1-D array of int or str ids, got float64"),
        (torch.tensor([0.0]), r"ids: expected a 1-D integer tensor of ids, got torch.float32"),
    ],
    ids=["none", "float", "bool", "none-in-list", "float-in-list", "mix", "float-array", "float-tensor"],
)
def test_id_arguments_are_checked(filled, tmp_path, method, ids, message):
    before = _state(filled)
    with pytest.raises(InvalidTypeError, match=message):
        getattr(filled, method)(ids)
    _unchanged(filled, before, tmp_path / "db")


@pytest.mark.parametrize("method", ["get", "metadata", "delete", "contains"])
@pytest.mark.parametrize("ids", [[], (), np.zeros(0, np.int64), iter([])], ids=["list", "tuple", "array", "iterator"])
def test_empty_ids_on_an_empty_database(db, method, ids):
    out = getattr(db, method)(ids)
    assert out is None if method == "delete" else len(out) == 0


@pytest.mark.parametrize("method", ["get", "metadata", "contains"])
def test_good_id_arguments_still_work(filled, method):
    for ids in (1, [1], np.array([1]), torch.tensor([1]), iter([1]), (1,)):
        out = getattr(filled, method)(ids)
        assert len(out) == 1


# ---- 7. the filter language

META = [
    {"lang": "en", "n": 1, "flag": True, "tags": ["a", "b"]},
    {"lang": "fr", "n": 2.5, "flag": False},
    {"lang": "de", "n": True},
    {"lang": "en", "n": "1"},
    None,
    {"lang": "fr", "n": 1.0, "nested": {"x": 1}},
    {"n": None},
    {"lang": "es", "n": 10},
]


@pytest.fixture
def meta_db(db):
    db.add(_docs(len(META)), metadata=META)
    return db


@pytest.mark.parametrize(
    "where, expected",
    [
        ({"lang": "fr"}, [1, 5]),
        ({"n": 1}, [0, 5]),  # 1 == 1.0, but not True and not "1"
        ({"n": 1.0}, [0, 5]),
        ({"n": True}, [2]),  # True is not 1
        ({"flag": 1}, []),
        ({"flag": 0}, []),
        ({"flag": False}, [1]),
        ({"n": None}, [6]),
        ({"n": np.int64(1)}, [0, 5]),
        ({"n": {"$eq": 1}}, [0, 5]),
        ({"n": {"$ne": 1}}, [1, 2, 3, 4, 6, 7]),  # missing fields and no metadata match $ne
        ({"n": {"$gt": 1}}, [1, 7]),  # not True, not "1"
        ({"n": {"$gte": 1}}, [0, 1, 5, 7]),
        ({"n": {"$lt": 2}}, [0, 5]),
        ({"n": {"$lte": 2.5}}, [0, 1, 5]),
        ({"n": {"$gt": 1, "$lt": 10}}, [1]),
        ({"lang": {"$gt": "en"}}, [1, 5, 7]),
        ({"lang": {"$lt": 5}}, []),  # incomparable: no match, no TypeError
        ({"n": {"$gte": "0"}}, [3]),
        ({"n": {"$in": [1, "x"]}}, [0, 5]),
        ({"n": {"$in": [True]}}, [2]),
        ({"n": {"$in": []}}, []),
        ({"n": {"$nin": [1, True]}}, [1, 3, 4, 6, 7]),
        ({"n": {"$exists": True}}, [0, 1, 2, 3, 5, 6, 7]),
        ({"n": {"$exists": False}}, [4]),
        ({"lang": {"$exists": False}}, [4, 6]),
        ({"tags": ["a", "b"]}, [0]),
        ({"tags": {"$eq": ("a", "b")}}, [0]),
        ({"tags": "a"}, []),
        ({"nested": {"$eq": {"x": 1}}}, [5]),
        ({"nested": {"$eq": {"x": True}}}, []),
        ({"$or": [{"lang": "de"}, {"n": 10}]}, [2, 7]),
        ({"$and": [{"lang": "fr"}, {"n": {"$gt": 2}}]}, [1]),
        ({"$not": {"lang": "en"}}, [1, 2, 4, 5, 6, 7]),
        ({"lang": "fr", "$or": [{"n": 1}, {"flag": False}]}, [1, 5]),
        ({"$or": [{"$not": {"n": {"$exists": True}}}, {"n": "1"}]}, [3, 4]),
        ({"$and": [{"$or": [{"lang": "en"}, {"lang": "fr"}]}, {"$not": {"n": {"$in": [1]}}}]}, [1, 3]),
    ],
)
def test_filter_language(meta_db, where, expected):
    hits = meta_db.search(_q(), k=20, where=where)
    assert sorted(h.id for h in hits) == expected
    exact = meta_db.search(_q(), k=20, where=where, exact=True)
    assert sorted(h.id for h in exact) == expected
    assert sorted(meta_db.candidates(_q(), k=20, where=where)) == expected


@pytest.mark.parametrize(
    "where, message",
    [
        ({"$nor": [{"lang": "en"}]}, r"where\['\$nor'\]: unknown operator '\$nor'; expected one of \$and, \$or, \$not"),
        ({"$or": [{"$regex": "x"}]}, r"where\['\$or'\]\[0\]\['\$regex'\]: unknown operator '\$regex'"),
        ({"lang": {"$regex": "e"}}, (r"where\['lang'\]: expected a value or a dict of operators \(\$eq, \$ne, \$gt, "
                                    r"\$gte, \$lt, \$lte, \$in, \$nin, \$exists\), got unknown operator '\$regex'")),
        ({"lang": {"$in": ["en"], "$size": 2}}, r"unknown operator '\$size'"),
        ({"lang": {"x": 1}}, r"where\['lang'\]: expected a value or a dict of operators .* got the key 'x'"),
        ({"lang": {}}, r"where\['lang'\]: expected a value or a dict of operators .* got an empty dict"),
        ({"$or": []}, r"where\['\$or'\]: expected a non-empty list of filters, got \[\]"),
        ({"$and": {"lang": "en"}}, r"where\['\$and'\]: expected a non-empty list of filters"),
        ({"$or": [5]}, r"where\['\$or'\]\[0\]: expected a non-empty dict of field conditions, got 5"),
        ({"$not": [{"lang": "en"}]}, r"where\['\$not'\]: expected a non-empty dict of field conditions"),
        ({"$not": {}}, r"where\['\$not'\]: expected a non-empty dict of field conditions, got \{\}"),
        ({"n": {"$in": 5}}, r"where\['n'\]\['\$in'\]: expected a list of values, got int"),
        ({"n": {"$nin": "ab"}}, r"where\['n'\]\['\$nin'\]: expected a list of values, got str"),
        ({"n": {"$gt": [1]}}, r"where\['n'\]\['\$gt'\]: \$gt expects a number or a str, got \[1\]"),
        ({"n": {"$lte": None}}, r"\$lte expects a number or a str, got None"),
        ({"n": {"$lt": True}}, r"\$lt expects a number or a str, got True"),
        ({"n": {"$exists": "yes"}}, r"where\['n'\]\['\$exists'\]: expected True or False, got 'yes'"),
        ({"n": {"$eq": float("nan")}}, r"got NaN"),
        ({"n": {1, 2}}, r"where\['n'\]: expected a JSON value .* got set"),
        ({1: "x"}, r"where\[1\]: expected a str field name or operator, got int"),
    ],
)
def test_bad_filters_are_rejected(meta_db, tmp_path, where, message):
    with pytest.raises(InvalidInputError, match=message):
        meta_db.search(_q(), k=3, where=where)
    with pytest.raises(InvalidInputError, match=message):
        meta_db.candidates(_q(), k=3, where=where)


@pytest.mark.parametrize("where", [{"$or": [{"a": 1}], "$xor": 1}, {"a": {"$like": 1}}])
def test_bad_filters_on_an_empty_database(db, where):
    with pytest.raises(InvalidInputError, match="unknown operator"):
        db.search(np.ones((2, DIM), np.float32), where=where)


@pytest.mark.parametrize("where", [None, [], "lang", {}])
def test_where_must_be_a_non_empty_dict(meta_db, where):
    if where is None:
        assert len(meta_db.search(_q(), k=20, where=where)) == len(META)
        return
    with pytest.raises(InvalidTypeError, match="where: expected a non-empty dict of field conditions"):
        meta_db.search(_q(), where=where)
