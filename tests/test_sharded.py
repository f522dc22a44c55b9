"""Several shards in one database (issue #6): mvdb.open(path, devices=[...])."""

import os

import numpy as np
import pytest
import torch

import mvdb
from mvdb import DuplicateIdError, InvalidInputError, UnknownIdError

DIM = 16


def _docs(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((int(rng.integers(3, 12)), DIM)).astype(np.float32) for _ in range(n)]


def _pair(tmp_path, docs, devices=("cpu", "cpu", "cpu"), **kw):
    one = mvdb.open(tmp_path / "one", device=devices[0], index="flat")
    sh = mvdb.open(tmp_path / "sh", devices=list(devices), index="flat")
    meta = [{"even": i % 2 == 0} for i in range(len(docs))]
    sparse = [{i % 7: 1.0, 100 + i: 2.0} for i in range(len(docs))]
    assert one.add(docs, metadata=meta, sparse=sparse, **kw) == sh.add(docs, metadata=meta, sparse=sparse, **kw)
    return one, sh


DEVICE_SETS = [
    pytest.param(("cpu", "cpu", "cpu"), id="cpu-x3"),
    pytest.param(("cuda", "cuda"), id="cuda-x2", marks=pytest.mark.gpu),
]


@pytest.mark.heavy
@pytest.mark.parametrize("devices", DEVICE_SETS)
def test_sharded_results_equal_a_single_database(tmp_path, devices):
    """With every document a candidate in both, the merged per-shard top-k is the single top-k."""
    docs = _docs(60)
    one, sh = _pair(tmp_path, docs, devices)
    assert len(sh) == 60 and sorted(len(s) for s in sh.shards) != [0, 0, 60]
    queries = [docs[3][:4], docs[10][:3], docs[41]]
    for kw in ({}, {"where": {"even": True}}, {"sparse": [{3: 1.0}, {141: 1.0}, None], "n_sparse": 5}):
        want = one.search(queries, k=7, n_candidates=60, **kw)
        got = sh.search(queries, k=7, n_candidates=60, **kw)
        for w, g in zip(want, got):
            assert [h.id for h in g] == [h.id for h in w]
            np.testing.assert_allclose([h.score for h in g], [h.score for h in w], rtol=1e-5)
    single = sh.search(docs[10][:3], k=3, n_candidates=60)
    assert [h.id for h in single] == [h.id for h in one.search(docs[10][:3], k=3, n_candidates=60)]
    cands = [[1, 2, 3, 59], [40, 4]]
    for w, g in zip(one.rerank(queries[:2], cands), sh.rerank(queries[:2], cands)):
        assert [h.id for h in g] == [h.id for h in w]
    assert [h.id for h in sh.rerank(queries[0], [5, 6], k=1)] == [h.id for h in one.rerank(queries[0], [5, 6], k=1)]
    one.close()
    sh.close()


def test_placement_ids_and_reopening(tmp_path):
    docs = _docs(90, seed=1)
    sh = mvdb.open(tmp_path / "sh", devices=["cpu", "cpu", "cpu"])
    ids = sh.add(docs[:60])
    assert ids == list(range(60))
    tokens = [s.stats()["tokens"] for s in sh.shards]
    assert max(tokens) - min(tokens) <= 12  # least-loaded placement keeps the shards even
    sh.delete([5, 17])
    assert 5 not in sh and 6 in sh and len(sh) == 58
    sh.close()
    # reopened on fewer devices (shards round-robin) and on none: same shards, same ids
    sh = mvdb.open(tmp_path / "sh", devices=["cpu"])
    assert len(sh.shards) == 3 and len(sh) == 58
    assert sh.add(docs[60:70]) == list(range(60, 70))  # auto ids continue past every shard's ids
    sh.close()
    sh = mvdb.open(tmp_path / "sh")
    np.testing.assert_array_equal(sh.get([64])[0].astype(np.float32), docs[64].astype(np.float16).astype(np.float32))
    assert sh.metadata([1, 2]) == [None, None]
    assert sh.compact() >= 1 and len(sh) == 68
    hit = sh.search(docs[64][:5], k=1)[0]
    assert hit.id == 64
    sh.close()
    with mvdb.open(tmp_path / "sh", read_only=True) as ro:
        assert len(ro) == 68


def test_bad_input_leaves_every_shard_unchanged(tmp_path):
    docs = _docs(20, seed=2)
    sh = mvdb.open(tmp_path / "sh", devices=["cpu", "cpu"])
    sh.add(docs[:10], ids=[f"d{i}" for i in range(10)])
    before = [len(s) for s in sh.shards]
    with pytest.raises(DuplicateIdError, match=r"already in the database: \['d3'\]"):
        sh.add(docs[10:14], ids=["x1", "d3", "x2", "x3"])
    bad = docs[10:14] + [np.zeros((4, DIM + 1), dtype=np.float32)]
    with pytest.raises(InvalidInputError):
        sh.add(bad, ids=[f"y{i}" for i in range(5)])
    nan = [d.copy() for d in docs[10:12]]
    nan[1][0, 0] = np.nan
    with pytest.raises(InvalidInputError):
        sh.add(nan, ids=["z1", "z2"])
    with pytest.raises(InvalidInputError, match="str ids"):
        sh.add(docs[10:12])
    # a value float16 cannot hold, in a document that would go to the second shard: refused before
    # the first shard writes its part
    big = [d.copy() for d in docs[10:16]]
    big[-1][0, 0] = 1e6
    with pytest.raises(InvalidInputError, match="document 5: value 1e\\+06 at token 0 overflows float16"):
        sh.add(big, ids=[f"w{i}" for i in range(6)])
    assert [len(s) for s in sh.shards] == before
    with pytest.raises(UnknownIdError):
        sh.get(["d1", "nope"])
    with pytest.raises(UnknownIdError):
        sh.delete(["nope"])
    assert len(sh) == 10
    sh.close()


def test_bad_devices_and_layouts(tmp_path):
    with pytest.raises(InvalidInputError, match="non-empty list of devices"):
        mvdb.open(tmp_path / "a", devices=[])
    with pytest.raises(InvalidInputError, match="non-empty list of devices"):
        mvdb.open(tmp_path / "a", devices="cpu")
    with pytest.raises(InvalidInputError, match="non-empty list of devices"):
        mvdb.open(tmp_path / "a", devices=torch.device("cpu"))
    with mvdb.open(tmp_path / "single", device="cpu") as db:
        db.add(_docs(3))
    with pytest.raises(InvalidInputError, match="single-shard database"):
        mvdb.open(tmp_path / "single", devices=["cpu", "cpu"])
    os.makedirs(tmp_path / "other")
    (tmp_path / "other" / "notes.txt").write_text("x")
    with pytest.raises(mvdb.FormatError):
        mvdb.open(tmp_path / "other", devices=["cpu"])
    with pytest.raises(FileNotFoundError):
        mvdb.open(tmp_path / "missing", devices=["cpu"], read_only=True)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "shards.json").write_text("{not json")
    with pytest.raises(mvdb.FormatError, match="unreadable shards.json"):
        mvdb.open(tmp_path / "broken")
    with mvdb.open(tmp_path / "empty", devices=[torch.device("cpu"), "cpu"]) as sh:
        assert [s.device for s in sh.shards] == [torch.device("cpu")] * 2
        assert sh.search(np.ones((2, DIM), np.float32), k=3) == []
        assert sh.search([np.ones((2, DIM), np.float32)] * 2, k=3) == [[], []]


def test_verify_is_one_report_naming_the_shard(tmp_path):
    """ShardedDatabase.verify() has the shape of Database.verify(): one report, its problems
    prefixed by the shard they are in, documents and segments summed over the shards."""
    sh = mvdb.open(tmp_path / "sh", devices=["cpu", "cpu"])
    sh.add(_docs(10, seed=4))
    sh.add(_docs(6, seed=5))
    report = sh.verify()
    assert report.ok and report.problems == []
    assert report.n_docs == 16 and report.n_segments == sum(s.verify().n_segments for s in sh.shards)
    assert str(report).endswith("OK")
    seg = next((tmp_path / "sh" / "shard-001" / "segments").glob("*.h5"))
    sh.close()
    import h5py

    with h5py.File(seg) as f:
        at = f["tokens"].id.get_offset()
    data = bytearray(seg.read_bytes())
    data[at + 10] ^= 0xFF  # one token byte of shard-001 (opened without checksums, verify finds it)
    seg.write_bytes(bytes(data))
    with mvdb.open(tmp_path / "sh", device="cpu", checksums=False) as sh:
        report = sh.verify()
    assert not report.ok and report.n_docs == 16
    assert len(report.problems) == 1 and report.problems[0].startswith(f"shard-001: {seg.name}: ")
    assert "1 problem(s)" in str(report)


def test_stats_describe_the_shards_together(tmp_path):
    """ShardedDatabase.stats() has the keys of Database.stats() where they add up or agree, and
    each shard's own dict under "shards"."""
    with mvdb.open(tmp_path / "sh", devices=["cpu", "cpu"], index="flat") as sh:
        sh.add(_docs(12, seed=6))
        sh.delete([3])
        st = sh.stats()
        per = st["shards"]
        assert len(per) == 2 and per == [s.stats() for s in sh.shards]
        for key in ("documents", "rows", "tokens", "segments", "deleted", "pages", "index_tokens"):
            assert st[key] == sum(p[key] for p in per), key
        assert st["documents"] == 11 and st["deleted"] == 1
        assert (st["dim"], st["dtype"], st["index"]) == (DIM, "float16", "flat")
        assert st["devices"] == ["cpu", "cpu"] and st["path"] == os.fspath(tmp_path / "sh")


def test_every_document_deleted_and_closed_handle(tmp_path):
    """With every document deleted a search still validates its arguments and answers empty (one
    list per query); a closed ShardedDatabase refuses every call with InvalidInputError."""
    sh = mvdb.open(tmp_path / "sh", devices=["cpu", "cpu"])
    docs = _docs(6, seed=7)
    sh.add(docs)
    with pytest.raises(mvdb.InvalidTypeError):
        sh.search("a query")
    sh.delete(list(range(6)))
    assert sh.search([docs[0][:2], docs[1][:2]], k=3) == [[], []]
    assert sh.search(docs[0][:2], k=3) == []
    with pytest.raises(InvalidInputError):
        sh.search(np.ones((2, DIM + 1), np.float32))
    sh.close()
    sh.close()  # closing again does nothing
    for call in (len, lambda d: d.stats(), lambda d: d.verify(), lambda d: d.contains([1]), lambda d: 1 in d,
                 lambda d: d.compact(), lambda d: d.refresh(), lambda d: d.delete([1]),
                 lambda d: d.rerank(docs[0], [1]), lambda d: d.metadata([1])):
        with pytest.raises(InvalidInputError, match="closed"):
            call(sh)
