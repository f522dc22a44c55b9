"""One contract, one conformance suite (issue #15).

Every database-shaped class (``Database`` from ``mvdb.open(path)``, ``ShardedDatabase`` from
``mvdb.open(path, devices=[...])``, ``mvdb.shards.cluster.Cluster`` on a local Ray, and the
``mvdb.connect`` client of an ``mvdb serve`` on loopback) is held to
the same expectations for the public API of the README's "Database" section: the same results
(exact MaxSim, checked against a brute force computed here with numpy) and the same error types.
Only public API is used.

Where a class differs from the contract today, its parameter is marked
``xfail(strict=True, reason=...)`` in ``GAPS`` below: the suite documents each gap, and the
mark turns into a failure (XPASS strict) once the gap is closed, so that it is removed then.

Most read-only checks share one populated database per class (built once per module); checks
that write get a fresh one. Ray is started once for the module (2 CPUs); if it cannot start, the
Cluster parameters are skipped.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools

import numpy as np
import pytest

import mvdb
from mvdb import (
    DuplicateIdError,
    EncoderMismatchError,
    InvalidInputError,
    InvalidTypeError,
    ReadOnlyError,
    UnknownIdError,
)

try:
    import ray

    from mvdb.shards import cluster as md
except ImportError as e:  # Ray is an optional extra (mvdb[distributed])
    ray = md = None
    RAY_MISSING = f"needs Ray (pip install 'mvdb[distributed]'): {e}"

try:
    from mvdb.serve import Client, Server
except ImportError as e:  # the server is an optional extra (mvdb[serve])
    Client = Server = None
    SERVE_MISSING = f"needs the server's packages (pip install 'mvdb[serve]'): {e}"

# ---- the data: tiny, seeded, unit-norm tokens (scores stay small, so fp16 storage errs little)

DIM = 8
N = 30
TOL = 1e-2
_rng = np.random.default_rng(15)


def _unit(a) -> np.ndarray:
    a = np.asarray(a, dtype=np.float32)
    return (a / np.linalg.norm(a, axis=1, keepdims=True)).astype(np.float32)


DOCS = [_unit(_rng.standard_normal((int(_rng.integers(3, 13)), DIM))) for _ in range(N)]
IDS = [f"doc-{i:02d}" for i in range(N)]
LANGS = ("en", "fr", "de")
META = [{"lang": LANGS[i % 3], "n": i} for i in range(N - 1)] + [None]  # the last one has none
STORED = {i: d.astype(np.float16).astype(np.float32) for i, d in zip(IDS, DOCS)}  # float16 storage
TOKENS = sum(len(d) for d in DOCS)
QUERIES = [_unit(DOCS[j][:4] + 0.3 * _rng.standard_normal((min(4, len(DOCS[j])), DIM))) for j in (2, 11, 19, 27)]
QUERIES.append(_unit(_rng.standard_normal((5, DIM))))
NAN_DOC = DOCS[0].copy()
NAN_DOC[0, 0] = np.nan


def maxsim(q, d) -> float:
    return float((np.asarray(q, np.float32) @ np.asarray(d, np.float32).T).max(axis=1).sum())


def assert_exact(hits, q, pool: dict, k: int) -> None:
    """``hits`` is the exact top-k by MaxSim of ``q`` over ``pool`` (id -> stored tokens): the
    right count, distinct ids from the pool, each score its brute-force MaxSim, in order, and no
    document left out that scores higher than one returned (beyond the tolerance)."""
    assert isinstance(hits, list), f"expected a list of Hit, got {type(hits).__name__}"
    truth = {i: maxsim(q, d) for i, d in pool.items()}
    assert len(hits) == min(k, len(truth))
    assert all(isinstance(h, mvdb.Hit) for h in hits)
    got = [h.id for h in hits]
    assert len(set(got)) == len(got), f"an id returned twice: {got}"
    assert set(got) <= set(truth), f"ids outside the pool: {set(got) - set(truth)}"
    for h in hits:
        assert isinstance(h.score, float)
        assert abs(h.score - truth[h.id]) <= TOL, (h, truth[h.id])
    scores = [h.score for h in hits]
    assert all(a >= b - 1e-6 for a, b in itertools.pairwise(scores)), f"not sorted by score: {scores}"
    rest = [s for i, s in truth.items() if i not in set(got)]
    if rest and hits:
        assert max(rest) <= min(truth[i] for i in got) + TOL, "a better document was left out"


def matching(where_fn) -> dict:
    return {i: STORED[i] for i, m in zip(IDS, META) if where_fn(m)}


# ---- the three classes, opened the same way (flat index: candidates are every document here)


def _open_database(path, **kw):
    return mvdb.open(path, device="cpu", index="flat", **kw)


def _open_sharded(path, **kw):
    return mvdb.open(path, devices=["cpu", "cpu"], index="flat", **kw)


def _open_cluster(path, **kw):
    # num_cpus=0: a ShardActor otherwise holds one of the session's 2 CPUs for its lifetime, so
    # only one 2-shard Cluster could exist at a time (a second one waits forever for its actors)
    return md.Cluster([path / "s0", path / "s1"], index="flat", actor_options={"num_cpus": 0}, **kw)


if Client is not None:
    class _ServedClient(Client):
        """``mvdb.connect`` to a server on loopback that this client owns: closing the client stops the
        server (which closes the database), as closing a database handle releases its lock."""

        def __init__(self, path, **kw):
            self._server = Server(str(path), device="cpu", read_only=kw.pop("read_only", False),
                                  open_options=dict(index="flat", **kw))
            super().__init__(self._server.url)

        def close(self):
            super().close()
            self._server.stop()


def _open_client(path, **kw):
    return _ServedClient(path, **kw)


OPENERS = {"database": _open_database, "sharded": _open_sharded, "cluster": _open_cluster, "client": _open_client}
KINDS = tuple(OPENERS)

# ---- where each class differs from the contract today: (kind, check) -> (reason, raises)
# A check with cases is keyed "check[case]"; a key without the case covers all its cases.

NO = AttributeError  # the method does not exist
# every class offers text in, text out (add_texts / search_text, mvdb.text): the Cluster and the
# client encode on the caller's side and send vectors
GAPS: dict = {}


def _kind_marks(kind):
    if kind == "cluster" and md is None:
        return [pytest.mark.skip(reason=RAY_MISSING)]
    if kind == "client" and Client is None:
        return [pytest.mark.skip(reason=SERVE_MISSING)]
    if kind == "cluster":  # a local Ray and its actors: seconds a check on the 2-core CI machine
        return [pytest.mark.heavy]
    return []


def params(check: str, cases=None):
    """pytest params over the classes (and ``cases``), each gap in ``GAPS`` marked xfail(strict)."""
    out = []
    for kind in KINDS:
        for case in cases or [None]:
            key = check if case is None else f"{check}[{case}]"
            marks = _kind_marks(kind)
            gap = GAPS.get((kind, key)) or GAPS.get((kind, check))
            if gap is not None:
                reason, raises = gap
                marks = marks + [pytest.mark.xfail(strict=True, reason=reason, raises=raises)]
            values = (kind,) if case is None else (kind, case)
            out.append(pytest.param(*values, marks=marks, id=kind if case is None else f"{kind}-{case}"))
    return out


# ---- fixtures


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray for all the Cluster cases (2 CPUs, no dashboard), started on first use; skips
    them if it cannot start. Left alone if something else already started Ray. Shut down at the
    end of this module rather than of the session: a Ray left running would be reused, with its 2
    CPUs, by tests/test_distributed.py's ``ray.init(num_cpus=3, ignore_reinit_error=True)``, whose
    3-shard Cluster (one CPU per actor) would then wait forever for its third actor."""
    if ray is None:
        pytest.skip(RAY_MISSING)
    started = not ray.is_initialized()
    if started:
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
        except Exception as e:  # noqa: BLE001 - any failure to start means: no Cluster cases here
            pytest.skip(f"a local Ray cannot start here: {type(e).__name__}: {e}")
    yield
    if "cluster" in _CORPORA:  # its actors go before Ray does (this teardown may run first)
        _close_corpus(_CORPORA.pop("cluster"))
    if started:
        ray.shutdown()


@pytest.fixture
def opener(kind, request):
    if kind == "cluster":
        request.getfixturevalue("ray_session")
    return OPENERS[kind]


class Corpus:
    """A shared database holding DOCS under IDS with META, and what its ``add`` returned."""

    def __init__(self, db, path, added):
        self.db, self.path, self.added = db, path, added
        self.readers = []


_CORPORA: dict = {}  # kind -> Corpus, for the module


@pytest.fixture(scope="module")
def _corpora():
    yield _CORPORA
    while _CORPORA:
        _close_corpus(_CORPORA.popitem()[1])


def _close_corpus(c: Corpus) -> None:
    for h in [*c.readers, c.db]:
        with contextlib.suppress(Exception):  # closing what a failed check may have left broken
            h.close()


@pytest.fixture
def corpus(kind, opener, _corpora, tmp_path_factory):
    """The shared database of ``kind`` (built on first use). A check that should write nothing but
    did (len changed) gets its database rebuilt for the checks after it."""
    c = _corpora.get(kind)
    if c is None:
        path = tmp_path_factory.mktemp(f"corpus-{kind}")
        db = opener(path)
        c = _corpora[kind] = Corpus(db, path, db.add(DOCS, ids=IDS, metadata=META))
    yield c
    try:
        intact = len(c.db) == N
    except Exception:  # noqa: BLE001
        intact = False
    if not intact:
        _close_corpus(_corpora.pop(kind))


@pytest.fixture
def reader(corpus, opener):
    """A read-only handle on the shared database (one per class, opened on first use)."""
    if not corpus.readers:
        corpus.readers.append(opener(corpus.path, read_only=True))
    return corpus.readers[0]


@pytest.fixture
def fresh(opener, tmp_path):
    """fresh(name) opens (or reopens) the database ``name`` in this test's directory."""
    opened = []

    def make(name="db", **kw):
        db = opener(tmp_path / name, **kw)
        opened.append(db)
        return db

    yield make
    for db in reversed(opened):
        with contextlib.suppress(Exception):  # already closed, or left broken by a failed check
            db.close()


# ---- the declared contract


@pytest.mark.parametrize("kind", params("states_the_contract"))
def test_the_class_states_the_contract(kind, corpus):
    from mvdb.contract import MEMBERS

    db, cls = corpus.db, type(corpus.db)
    assert isinstance(db, mvdb.DatabaseAPI) and mvdb.DatabaseAPI in cls.__mro__
    for name in MEMBERS:
        owner = next(b for b in cls.__mro__ if name in vars(b))
        assert owner is not mvdb.DatabaseAPI, f"{cls.__name__}.{name}: the protocol's stub, not an implementation"
        want = getattr(mvdb.DatabaseAPI, name)
        if isinstance(want, property):
            assert isinstance(getattr(owner, name), property), f"{cls.__name__}.{name}: expected a property"
            continue
        have = inspect.signature(getattr(cls, name)).parameters
        kinds = {p.kind for p in have.values()}
        for p in inspect.signature(want).parameters.values():
            if p.kind is p.VAR_POSITIONAL:
                assert p.VAR_POSITIONAL in kinds or len(have) >= 4, f"{cls.__name__}.{name}: takes no *{p.name}"
            elif p.kind is p.VAR_KEYWORD:
                assert p.VAR_KEYWORD in kinds or {"n_candidates", "nprobe"} <= set(have), \
                    f"{cls.__name__}.{name}: takes no search options"
            else:
                assert p.name in have or p.VAR_KEYWORD in kinds, f"{cls.__name__}.{name}: no parameter {p.name!r}"


def test_the_servers_proxy_forwards_the_contract():
    workers = pytest.importorskip("mvdb.serve.workers")
    from mvdb.contract import MEMBERS

    # answered by the app itself; explain by its /explain route (mvdb.serve.texts, in the database process)
    local = {"dim", "close", "explain", "__contains__", "__enter__", "__exit__"}
    assert set(MEMBERS) - local <= workers.CALLS


# ---- add


@pytest.mark.parametrize("kind", params("add_str_ids"))
def test_add_returns_given_str_ids(kind, corpus):
    assert list(corpus.added) == IDS
    assert len(corpus.db) == N


@pytest.mark.parametrize("kind", params("add_auto_ids"))
def test_add_assigns_distinct_int_ids(kind, fresh):
    db = fresh()
    first = list(db.add(DOCS[:6]))
    second = list(db.add(DOCS[6:10]))
    ids = first + second
    assert all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in ids), ids
    assert len(set(ids)) == 10  # unique, also across calls
    assert len(db) == 10
    for i, got in zip(ids, db.get(ids)):
        np.testing.assert_allclose(got, DOCS[ids.index(i)], atol=2e-3)
    pool = {i: STORED[IDS[n]] for n, i in enumerate(ids)}
    assert_exact(db.search(QUERIES[0], k=10), QUERIES[0], pool, 10)


def _sparse_corpus():
    """Documents where the token index alone (one nearest token per query token) cannot find the
    best one: query tokens e0 and e1; 6 documents hold a token near e0 and 6 one near e1 (score
    about 1), and the best document ("hub") holds one token between them (score about 1.41), never
    the nearest to either. Every document has its own sparse term."""
    rng = np.random.default_rng(7)
    eye = np.eye(DIM, dtype=np.float32)
    docs, ids = [], []
    for n in range(12):
        axis, filler = (0, 2) if n % 2 == 0 else (1, 3)
        docs.append(_unit(np.stack([eye[axis] + 0.05 * rng.standard_normal(DIM), eye[filler] + eye[4 + n % 4]])))
        ids.append(f"near-{n}")
    docs.append(_unit([eye[0] + eye[1], eye[5]]))
    ids.append("hub")
    return docs, ids, eye[:2].copy()


@pytest.mark.parametrize("kind", params("add_sparse"))
def test_add_sparse_widens_the_candidates(kind, fresh):
    """Sparse vectors stored with ``add`` bring a document into ``search`` (``sparse=``,
    ``n_sparse=``) that the token channel misses, and it is scored by exact MaxSim."""
    docs, ids, q = _sparse_corpus()
    db = fresh()
    db.add(docs, ids=ids, sparse=[{n: 1.0} for n in range(len(docs))])
    pool = {i: d.astype(np.float16).astype(np.float32) for i, d in zip(ids, docs)}
    assert_exact(db.search(q, k=1, exact=True), q, pool, 1)  # the hub is the best document
    starved = {"k": 1, "n_candidates": 1, "k_tokens": 1}
    assert [h.id for h in db.search(q, **starved)] != ["hub"]  # tokens alone miss it
    hits = db.search(q, **starved, sparse={ids.index("hub"): 1.0}, n_sparse=1)
    assert_exact(hits, q, pool, 1)
    assert [h.id for h in hits] == ["hub"]


# ---- reads


@pytest.mark.parametrize("kind", params("len"))
def test_len(kind, corpus):
    assert len(corpus.db) == N


@pytest.mark.parametrize("kind", params("contains"))
def test_contains(kind, corpus):
    mask = corpus.db.contains([IDS[0], "nope", IDS[-1]])
    assert isinstance(mask, np.ndarray) and mask.dtype == bool
    assert mask.tolist() == [True, False, True]


@pytest.mark.parametrize("kind", params("in"))
def test_in(kind, corpus):
    assert IDS[7] in corpus.db
    assert "nope" not in corpus.db


@pytest.mark.parametrize("kind", params("search_single"))
def test_search_single_query_gives_a_list_of_hits(kind, corpus):
    for q in QUERIES:
        assert_exact(corpus.db.search(q, k=5), q, STORED, 5)


@pytest.mark.parametrize("kind", params("search_batch"))
def test_search_batch_gives_one_list_per_query(kind, corpus):
    out = corpus.db.search(QUERIES, k=4)
    assert isinstance(out, list) and len(out) == len(QUERIES)
    for q, hits in zip(QUERIES, out):
        assert_exact(hits, q, STORED, 4)


@pytest.mark.parametrize("kind", params("search_k"))
def test_search_k(kind, corpus):
    q = QUERIES[1]
    for k in (1, 3, N + 20):  # k above the number of documents gives them all
        assert_exact(corpus.db.search(q, k=k), q, STORED, k)


WHERE = {
    "eq": ({"lang": "en"}, lambda m: m is not None and m["lang"] == "en"),
    "range": ({"n": {"$gte": 10, "$lt": 20}}, lambda m: m is not None and 10 <= m["n"] < 20),
    "in": ({"lang": {"$in": ["fr", "de"]}}, lambda m: m is not None and m["lang"] in ("fr", "de")),
    "or": ({"$or": [{"lang": "fr"}, {"n": {"$lt": 3}}]}, lambda m: m is not None and (m["lang"] == "fr" or m["n"] < 3)),
    "and": ({"$and": [{"lang": "de"}, {"n": {"$gt": 5}}]}, lambda m: m is not None and m["lang"] == "de" and m["n"] > 5),
    "not": ({"$not": {"lang": "en"}}, lambda m: m is None or m["lang"] != "en"),  # no metadata matches $not
}


@pytest.mark.heavy
@pytest.mark.parametrize("kind,case", params("search_where", list(WHERE)))
def test_search_where(kind, case, corpus):
    where, fn = WHERE[case]
    pool = matching(fn)
    out = corpus.db.search(QUERIES[:3], k=4, where=where)
    assert len(out) == 3
    for q, hits in zip(QUERIES[:3], out):
        assert_exact(hits, q, pool, 4)
    assert_exact(corpus.db.search(QUERIES[3], k=N, where=where), QUERIES[3], pool, N)


@pytest.mark.parametrize("kind", params("search_exact"))
def test_search_exact(kind, corpus):
    q = QUERIES[4]
    assert_exact(corpus.db.search(q, k=N, exact=True), q, STORED, N)
    where, fn = WHERE["or"]
    assert_exact(corpus.db.search(q, k=5, where=where, exact=True), q, matching(fn), 5)


@pytest.mark.parametrize("kind", params("rerank"))
def test_rerank_stored_ids(kind, corpus):
    q = QUERIES[0]
    cand = [IDS[3], IDS[17], IDS[8], IDS[25]]
    pool = {i: STORED[i] for i in cand}
    assert_exact(corpus.db.rerank(q, cand), q, pool, len(cand))
    assert_exact(corpus.db.rerank(q, cand, k=2), q, pool, 2)
    other = [IDS[1], IDS[29]]
    out = corpus.db.rerank([q, QUERIES[2]], [cand, other])
    assert isinstance(out, list) and len(out) == 2
    assert_exact(out[0], q, pool, len(cand))
    assert_exact(out[1], QUERIES[2], {i: STORED[i] for i in other}, 2)


@pytest.mark.parametrize("kind", params("get"))
def test_get_in_request_order(kind, corpus):
    want = [IDS[5], IDS[2], IDS[29]]
    out = corpus.db.get(want)
    assert isinstance(out, list) and len(out) == 3
    for i, arr in zip(want, out):
        assert isinstance(arr, np.ndarray) and arr.dtype == np.float32 and arr.shape == STORED[i].shape
        np.testing.assert_allclose(arr, DOCS[IDS.index(i)], atol=2e-3)


@pytest.mark.parametrize("kind", params("explain"))
def test_explain_takes_maxsim_apart_token_by_token(kind, corpus):
    db = corpus.db
    for q, doc_id in ((QUERIES[0], IDS[2]), (QUERIES[4], IDS[17]), (QUERIES[1][:1], IDS[29])):
        e = db.explain(q, doc_id)
        d = STORED[doc_id]
        sim = q @ d.T
        assert e.id == doc_id and len(e.matches) == len(q)
        assert abs(sum(m.similarity for m in e.matches) - e.score) <= 1e-5 * len(q)  # the terms sum to the score
        assert abs(e.score - maxsim(q, d)) <= TOL
        assert abs(e.score - db.rerank(q, [doc_id])[0].score) <= TOL  # the score search and rerank give
        if e.score:
            assert abs(sum(m.share for m in e.matches) - 1.0) <= 1e-5
        for i, m in enumerate(e.matches):  # positions as a brute force finds them (no near-ties here)
            assert m.query_token == i and m.doc_token == int(sim[i].argmax())
            assert abs(m.similarity - float(sim[i].max())) <= TOL
    with pytest.raises(UnknownIdError):
        db.explain(QUERIES[0], "no-such-doc")
    with pytest.raises(InvalidInputError):  # one query at a time
        db.explain(np.stack([QUERIES[0], QUERIES[0]]), IDS[2])
    with pytest.raises(InvalidInputError):
        db.explain(np.ones((3, DIM + 1), np.float32), IDS[2])
    with pytest.raises(InvalidInputError):
        db.explain(np.full((3, DIM), np.nan, np.float32), IDS[2])


@pytest.mark.parametrize("kind", params("metadata"))
def test_metadata_in_request_order(kind, corpus):
    assert corpus.db.metadata([IDS[4], IDS[29], IDS[0]]) == [META[4], None, META[0]]


@pytest.mark.parametrize("kind", params("stats"))
def test_stats_counts(kind, corpus):
    s = corpus.db.stats()
    assert isinstance(s, dict), f"expected a dict, got {type(s).__name__}"
    assert s["documents"] == N
    assert s["tokens"] == TOKENS


@pytest.mark.parametrize("kind", params("stats_describe"))
def test_stats_describe_the_store(kind, corpus):
    s = corpus.db.stats()
    assert isinstance(s, dict), f"expected a dict, got {type(s).__name__}"
    assert s["dim"] == DIM
    assert s["dtype"] == "float16"


@pytest.mark.parametrize("kind", params("verify"))
def test_verify_reports_ok(kind, corpus):
    report = corpus.db.verify()
    assert report.ok is True


# ---- writes after the first add


@pytest.mark.parametrize("kind", params("delete"))
def test_delete_then_not_found(kind, fresh):
    db = fresh()
    db.add(DOCS[:10], ids=IDS[:10])
    gone = [IDS[1], IDS[3]]
    db.delete(gone)
    assert len(db) == 8
    for i in gone:
        with pytest.raises(UnknownIdError):
            db.get([i])
    pool = {i: STORED[i] for i in IDS[:10] if i not in gone}
    for q in QUERIES[:2]:
        assert_exact(db.search(q, k=10), q, pool, 10)
        assert_exact(db.search(q, k=10, exact=True), q, pool, 10)
    with pytest.raises(UnknownIdError):  # deleting again: not there
        db.delete([IDS[1]])
    with pytest.raises(UnknownIdError):  # one unknown id: nothing deleted
        db.delete([IDS[2], "nope"])
    assert len(db) == 8
    np.testing.assert_allclose(db.get([IDS[2]])[0], DOCS[2], atol=2e-3)


@pytest.mark.parametrize("kind", params("compact"))
def test_compact(kind, fresh):
    db = fresh()
    db.add(DOCS[:12], ids=IDS[:12], metadata=META[:12])
    gone = IDS[2:6]
    db.delete(gone)
    n = db.compact()
    assert isinstance(n, int) and not isinstance(n, bool) and n >= 1
    assert len(db) == 8
    pool = {i: STORED[i] for i in IDS[:12] if i not in gone}
    assert_exact(db.search(QUERIES[0], k=12), QUERIES[0], pool, 12)
    with pytest.raises(UnknownIdError):
        db.get([gone[0]])
    np.testing.assert_allclose(db.get([IDS[7]])[0], DOCS[7], atol=2e-3)
    assert db.metadata([IDS[7]]) == [META[7]]
    assert db.compact() == 0  # nothing left to rewrite


@pytest.mark.parametrize("kind", params("refresh"))
def test_refresh_follows_a_writer(kind, fresh):
    writer = fresh()
    writer.add(DOCS[:10], ids=IDS[:10])
    ro = fresh(read_only=True)
    assert len(ro) == 10
    writer.add(DOCS[10:15], ids=IDS[10:15])
    assert ro.refresh() is True
    assert len(ro) == 15
    pool = {i: STORED[i] for i in IDS[:15]}
    assert_exact(ro.search(QUERIES[1], k=15), QUERIES[1], pool, 15)
    assert ro.refresh() is False  # nothing new
    writer.delete([IDS[11]])
    assert ro.refresh() is True
    assert len(ro) == 14


# ---- closing


@pytest.mark.parametrize("kind", params("close"))
def test_close_persists_and_releases_the_writer(kind, fresh):
    db = fresh()
    db.add(DOCS[:5], ids=IDS[:5], metadata=META[:5])
    db.close()
    again = fresh()  # a second writer opens: the lock went with close()
    assert len(again) == 5
    np.testing.assert_allclose(again.get([IDS[4]])[0], DOCS[4], atol=2e-3)
    again.add(DOCS[5:6], ids=IDS[5:6])
    assert len(again) == 6


@pytest.mark.parametrize("kind", params("context_manager"))
def test_context_manager_closes(kind, fresh):
    db = fresh()
    with db as entered:
        assert entered is db
        entered.add(DOCS[:4], ids=IDS[:4])
    again = fresh()
    assert len(again) == 4


@pytest.mark.parametrize("kind", params("closed_handle"))
def test_closed_handle_refuses(kind, fresh):
    db = fresh()
    db.add(DOCS[:3], ids=IDS[:3])
    db.close()
    with pytest.raises(InvalidInputError):
        len(db)
    with pytest.raises(InvalidInputError):
        db.get([IDS[0]])
    with pytest.raises(InvalidInputError):
        db.search(QUERIES[0], k=2)
    with pytest.raises(InvalidInputError):
        db.add(DOCS[3:4], ids=IDS[3:4])


# ---- errors (on the shared database: each must leave it as it was)

UNKNOWN = {
    "get": lambda db: db.get([IDS[0], "nope"]),
    "metadata": lambda db: db.metadata(["nope"]),
    "delete": lambda db: db.delete(["nope"]),
    "rerank": lambda db: db.rerank(QUERIES[0], [IDS[0], "nope"]),
}


@pytest.mark.parametrize("kind,case", params("unknown_id", list(UNKNOWN)))
def test_unknown_id(kind, case, corpus):
    with pytest.raises(UnknownIdError):
        UNKNOWN[case](corpus.db)
    assert len(corpus.db) == N


DUPLICATES = {
    "existing": ([DOCS[0]], [IDS[1]]),
    "in_batch": ([DOCS[0], DOCS[1]], ["dup-x", "dup-x"]),
    "existing_and_new": (DOCS[:5], ["new-0", "new-1", "new-2", "new-3", IDS[9]]),
}


@pytest.mark.parametrize("kind,case", params("duplicate_id", list(DUPLICATES)))
def test_duplicate_id(kind, case, corpus):
    docs, ids = DUPLICATES[case]
    with pytest.raises(DuplicateIdError):
        corpus.db.add(docs, ids=ids)
    assert len(corpus.db) == N  # nothing of the batch stored


BAD_ADD = {  # name -> (call, expected error)
    "wrong_dim": (lambda db: db.add([np.ones((3, DIM + 1), np.float32)], ids=["x"]), InvalidInputError),
    "nan": (lambda db: db.add([NAN_DOC], ids=["x"]), InvalidInputError),
    "empty_doc": (lambda db: db.add([np.ones((0, DIM), np.float32)], ids=["x"]), InvalidInputError),
    "ids_count": (lambda db: db.add([DOCS[0]], ids=["x", "y"]), InvalidInputError),
    "metadata_count": (lambda db: db.add(DOCS[:4], ids=["x", "y", "z", "w"], metadata=[{}]), InvalidInputError),
    "metadata_not_json": (lambda db: db.add([DOCS[0]], ids=["x"], metadata=[{"a": {1, 2}}]), InvalidInputError),
    "id_type": (lambda db: db.add([DOCS[0]], ids=[1.5]), InvalidTypeError),
    "one_bad_in_batch": (lambda db: db.add([*DOCS[:3], NAN_DOC], ids=["x", "y", "z", "w"]), InvalidInputError),
}


@pytest.mark.parametrize("kind,case", params("bad_add", list(BAD_ADD)))
def test_bad_add_is_refused_and_stores_nothing(kind, case, corpus):
    call, error = BAD_ADD[case]
    with pytest.raises(error):
        call(corpus.db)
    assert len(corpus.db) == N


BAD_SEARCH = {
    "query_dim": (lambda db: db.search(np.ones((3, DIM + 1), np.float32)), InvalidInputError),
    "query_nan": (lambda db: db.search(NAN_DOC), InvalidInputError),
    "query_empty": (lambda db: db.search(np.ones((0, DIM), np.float32)), InvalidInputError),
    "query_type": (lambda db: db.search("a query"), InvalidTypeError),
    "k_zero": (lambda db: db.search(QUERIES[0], k=0), InvalidInputError),
    "k_negative": (lambda db: db.search(QUERIES[0], k=-1), InvalidInputError),
    "k_type": (lambda db: db.search(QUERIES[0], k="3"), InvalidTypeError),
    "where_operator": (lambda db: db.search(QUERIES[0], where={"n": {"$regex": "a"}}), InvalidInputError),
    "where_type": (lambda db: db.search(QUERIES[0], where=["n"]), InvalidTypeError),
    "exact_type": (lambda db: db.search(QUERIES[0], exact="yes"), InvalidTypeError),
}


@pytest.mark.parametrize("kind,case", params("bad_search", list(BAD_SEARCH)))
def test_bad_search_arguments(kind, case, corpus):
    call, error = BAD_SEARCH[case]
    with pytest.raises(error):
        call(corpus.db)


READ_ONLY = {
    "add": lambda db: db.add([DOCS[0]], ids=["ro-x"]),
    "delete": lambda db: db.delete([IDS[0]]),
    "compact": lambda db: db.compact(),
}


@pytest.mark.parametrize("kind,case", params("read_only", list(READ_ONLY)))
def test_read_only_refuses_writes(kind, case, corpus, reader):
    with pytest.raises(ReadOnlyError):
        READ_ONLY[case](reader)
    assert len(reader) == N
    assert_exact(reader.search(QUERIES[0], k=3), QUERIES[0], STORED, 3)


# ---- text in, text out (the classes that offer it; see GAPS)

WORDS = ["alpha beta gamma", "beta delta", "gamma epsilon zeta", "eta theta", "alpha zeta theta iota"]


def _words(texts, is_query):
    """A stand-in text model: one seeded vector per word (unit norm after the adapter)."""
    return [np.stack([np.random.default_rng(sum(map(ord, w))).standard_normal(DIM) for w in t.split()])
            .astype(np.float32) for t in texts]


@pytest.mark.parametrize("kind,case", params("text", ["round_trip", "mixing_refused"]))
def test_text_in_text_out(kind, case, fresh):
    db = fresh()
    enc = mvdb.Encoder(_words, name="contract-words", normalize=True)
    ids = [f"w{i}" for i in range(len(WORDS))]
    assert list(db.add_texts(WORDS, ids=ids, store_text=True, encoder=enc)) == ids
    if case == "round_trip":
        q = enc.encode([WORDS[2]], is_query=True)[0]
        pool = {i: d.astype(np.float16).astype(np.float32) for i, d in zip(ids, enc.encode(WORDS))}
        assert_exact(db.search_text(WORDS[2], k=3, encoder=enc), q, pool, 3)
        assert db.metadata(["w1"]) == [{"text": WORDS[1]}]
        assert db.stats()["encoder"]["name"] == "contract-words"
    else:
        other = mvdb.Encoder(_words, name="another-model", normalize=True)
        with pytest.raises(EncoderMismatchError):
            db.add_texts(["alpha"], ids=["x"], encoder=other)
        with pytest.raises(InvalidTypeError):
            db.add_texts(["alpha", 3], ids=["x", "y"], encoder=enc)
        assert len(db) == len(WORDS)
