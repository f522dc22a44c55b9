"""The database API: search against exhaustive MaxSim, rerank, deletes, reopen, bad input."""

import numpy as np
import pytest
import torch

import mvdb
from mvdb import InvalidInputError, InvalidTypeError, ReadOnlyError, UnknownIdError
from mvdb.kernels.maxsim import naive

DIM = 32


def _corpus(n, seed=0):
    """Topic-structured unit-norm documents (so rankings are not ties) and queries drawn from them."""
    rng = np.random.default_rng(seed)
    topics = rng.standard_normal((max(2, n // 5), DIM))
    docs = []
    for i in range(n):
        t = topics[i % len(topics)]
        x = t + 1.2 * rng.standard_normal((int(rng.integers(4, 40)), DIM))
        docs.append((x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32))
    return docs


def _query(doc, rng, n=8):
    x = doc[rng.integers(0, len(doc), n)] + 0.3 * rng.standard_normal((n, DIM))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _exhaustive(db, q, k):
    ids = db.store.ids()
    p = db.store.gather(ids)
    tokens = torch.from_numpy(p.tokens.astype(np.float32))
    if p.scales is not None:
        tokens = tokens * torch.from_numpy(p.scales)[:, None]
    qt = torch.from_numpy(q)
    s = naive.maxsim_csr(qt, torch.tensor([0, len(q)], dtype=torch.int32), tokens, torch.from_numpy(p.offsets))[0]
    top = s.topk(k).indices.tolist()
    return [ids[i] for i in top]


@pytest.fixture
def db(tmp_path):
    d = mvdb.open(tmp_path / "db")
    yield d
    d.close()


@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_search_recall_against_exhaustive(tmp_path, dtype):
    docs = _corpus(400)
    rng = np.random.default_rng(1)
    with mvdb.open(tmp_path / "db", dtype=dtype) as db:
        db.add(docs[:250])
        db.add(docs[250:])
        recalls, first = [], 0
        for i in range(0, 400, 20):
            q = _query(docs[i], rng)
            got = [h.id for h in db.search(q, k=10)]
            want = _exhaustive(db, q, 10)
            recalls.append(len(set(got) & set(want)) / 10)
            first += got[0] == i
        assert np.mean(recalls) >= 0.99, recalls
        assert first >= 18, "the source document ranks first"


def test_result_shapes_and_order(db):
    docs = _corpus(50)
    db.add(docs)
    rng = np.random.default_rng(2)
    q1, q2 = _query(docs[3], rng), _query(docs[7], rng)
    one = db.search(q1, k=4)
    assert isinstance(one, list) and all(isinstance(h, mvdb.Hit) for h in one) and len(one) == 4
    assert [h.score for h in one] == sorted([h.score for h in one], reverse=True)
    batch = db.search([q1, q2], k=3)
    assert len(batch) == 2 and [h.id for h in batch[0]] == [h.id for h in one[:3]]
    stacked = db.search(torch.from_numpy(np.stack([q1, q2])), k=3)
    assert [[h.id for h in r] for r in stacked] == [[h.id for h in r] for r in batch]


def test_rerank_is_exact(db):
    docs = _corpus(30)
    db.add(docs, ids=[f"d{i}" for i in range(30)])
    q = _query(docs[5], np.random.default_rng(3))
    hits = db.rerank(q, ["d1", "d5", "d9"])
    assert [h.id for h in hits][0] == "d5" and len(hits) == 3
    for h in hits:
        d = torch.from_numpy(docs[int(h.id[1:])]).half().float()
        exact = (torch.from_numpy(q).half().float() @ d.T).max(1).values.sum().item()  # queries meet fp16 docs in fp16
        assert h.score == pytest.approx(exact, rel=1e-5)
    assert len(db.rerank(q, ["d1", "d5", "d9"], k=2)) == 2
    both = db.rerank([q, q], [["d1"], ["d9", "d5"]])
    assert [h.id for h in both[1]] == ["d5", "d9"]
    with pytest.raises(UnknownIdError, match=r"not in the database: \['nope'\]"):
        db.rerank(q, ["d1", "nope"])


def test_deletes_and_compaction_keep_ids(db, tmp_path):
    docs = _corpus(60)
    db.add(docs)
    q = _query(docs[10], np.random.default_rng(4))
    assert db.search(q, k=1)[0].id == 10
    db.delete([10])
    assert 10 not in [h.id for h in db.search(q, k=20)]
    before = [h.id for h in db.search(q, k=5)]
    assert db.compact() >= 1
    assert [h.id for h in db.search(q, k=5)] == before
    db.close()
    with mvdb.open(tmp_path / "db", read_only=True) as again:
        assert [h.id for h in again.search(q, k=5)] == before
        assert len(again) == 59 and again.stats()["documents"] == 59


def test_inline_rerank():
    docs = _corpus(5)
    q = _query(docs[2], np.random.default_rng(5))
    hits = mvdb.rerank(q, docs, k=3)
    assert hits[0].id == 2 and len(hits) == 3


def test_bad_queries(db):
    db.add(_corpus(10))
    good = np.ones((3, DIM), np.float32)
    with pytest.raises(InvalidInputError, match=r"query 0: expected shape \[Lq, 32\], got \(3, 16\)"):
        db.search(np.ones((3, 16), np.float32))
    with pytest.raises(InvalidInputError, match="query 0: contains NaN or Inf"):
        db.search(np.full((3, DIM), np.nan, np.float32))
    with pytest.raises(InvalidInputError, match=r"query 1: empty \(0 tokens\)"):
        db.search([good, np.zeros((0, DIM), np.float32)])
    with pytest.raises(InvalidInputError, match="k: expected a positive int, got 0"):
        db.search(good, k=0)
    with pytest.raises(InvalidTypeError, match="k: expected a positive int, got float"):
        db.search(good, k=2.5)
    with pytest.raises(InvalidTypeError, match="queries: expected a numpy array or torch tensor, got str"):
        db.search("hello")


def test_read_only_database_refuses_writes(db, tmp_path):
    db.add(_corpus(3))
    with mvdb.open(tmp_path / "db", read_only=True) as r:
        with pytest.raises(ReadOnlyError):
            r.add(_corpus(1))
        with pytest.raises(ReadOnlyError):
            r.delete([0])
        assert len(r) == 3


def test_reader_refresh_sees_new_documents(db, tmp_path):
    docs = _corpus(20)
    db.add(docs[:10])
    with mvdb.open(tmp_path / "db", read_only=True) as r:
        db.add(docs[10:])
        q = _query(docs[15], np.random.default_rng(6))
        assert 15 not in [h.id for h in r.search(q, k=5)]
        assert r.refresh()
        assert r.search(q, k=1)[0].id == 15


def test_empty_database_search(db):
    assert db.search(np.ones((2, DIM), np.float32)) == []


def test_where_filters_return_k_hits_when_k_match(db):
    docs = _corpus(120)
    langs = ["en", "fr", "de"]
    db.add(docs, metadata=[{"lang": langs[i % 3], "n": i} if i != 5 else None for i in range(120)])
    q = _query(docs[0], np.random.default_rng(7))
    hits = db.search(q, k=10, where={"lang": "fr"})
    assert len(hits) == 10 and all(h.id % 3 == 1 for h in hits)
    hits = db.search(q, k=10, where={"lang": {"$in": ["de", "fr"]}})
    assert len(hits) == 10 and all(h.id % 3 != 0 for h in hits)
    # a rare value: only 2 documents match, far from the query: both are still returned
    hits = db.search(q, k=10, where={"n": {"$in": [77, 101]}})
    assert sorted(h.id for h in hits) == [77, 101]
    assert db.search(q, k=3, where={"lang": "xx"}) == []
    with pytest.raises(InvalidInputError, match=r"where\['lang'\]: expected a value or"):
        db.search(q, where={"lang": {"$regex": "e"}})
    with pytest.raises(InvalidTypeError, match="where: expected a non-empty dict"):
        db.search(q, where=["lang"])


@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_ivf_index_search_and_incremental_add(tmp_path, dtype):
    docs = _corpus(300, seed=9)
    rng = np.random.default_rng(10)
    with mvdb.open(tmp_path / "db", dtype=dtype, index="ivf") as db:
        db.add(docs[:200])
        assert db.stats()["index"] == "ivf"
        db.add(docs[200:])  # appended to the trained index, no retraining
        assert db._index.ntotal == db.stats()["tokens"]
        first = [db.search(_query(docs[i], rng), k=5, nprobe=64)[0].id == i for i in range(0, 300, 30)]
        assert sum(first) >= 9
