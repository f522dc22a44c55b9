"""mvdb.shards.cluster on a local Ray cluster (issue #6): bulk ingest on Ray Data into one database
per shard, a client over one actor per shard, and an actor killed mid-ingest. Issue #15: one
placement policy and membership routing for ShardedDatabase, the CLI and Ray, so a database
written by one is read and extended by the others; the layout file records the placement."""

import json
import os

import numpy as np
import pytest

ray = pytest.importorskip("ray")

import mvdb
from mvdb.shards import cluster as md

DIM = 16


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


def _sources(tmp_path, n_files=3, per_file=40, seed=0):
    """npz sources with str ids; returns the paths and every (id, document)."""
    rng = np.random.default_rng(seed)
    paths, docs = [], {}
    for f in range(n_files):
        lens = rng.integers(3, 12, per_file)
        toks = rng.standard_normal((int(lens.sum()), DIM)).astype(np.float32)
        ids = np.array([f"f{f}-d{i}" for i in range(per_file)])
        p = tmp_path / f"part-{f}.npz"
        np.savez(p, tokens=toks, lengths=lens, ids=ids)
        paths.append(str(p))
        off = np.concatenate(([0], np.cumsum(lens)))
        for i, doc_id in enumerate(ids):
            docs[str(doc_id)] = toks[off[i] : off[i + 1]]
    return paths, docs


@pytest.mark.heavy
def test_ingest_and_cluster_search_equal_a_single_database(local_ray, tmp_path):
    sources, docs = _sources(tmp_path)
    shards = [tmp_path / f"shard-{i}" for i in range(3)]
    out = md.ingest(sources, shards, batch_docs=16, progress=False, device="cpu", concurrency=2)
    assert out["added"] == len(docs) and out["skipped"] == 0
    single = mvdb.open(tmp_path / "single", device="cpu", index="flat")
    single.add(list(docs.values()), ids=list(docs.keys()))
    cluster = md.Cluster(shards, index="flat")
    try:
        assert len(cluster) == len(docs)
        tokens = [st["tokens"] for st in cluster.stats()["shards"]]  # least-loaded placement: even shards
        assert min(tokens) > 0 and max(tokens) - min(tokens) <= 11
        keys = list(docs)
        queries = [docs[keys[5]][:4], docs[keys[77]][:3]]
        want = single.search(queries, k=5, n_candidates=len(docs))
        got = cluster.search(queries, k=5, n_candidates=len(docs))
        for w, g in zip(want, got):
            assert [h.id for h in g] == [h.id for h in w]
            np.testing.assert_allclose([h.score for h in g], [h.score for h in w], rtol=1e-5)
        assert cluster.search(queries[0], k=1)[0].id == keys[5]
        new = np.random.default_rng(9).standard_normal((5, DIM)).astype(np.float32)
        cluster.add([new], ids=["extra"])
        assert cluster.search(new, k=1)[0].id == "extra"
        cluster.delete(["extra"])
        with pytest.raises(mvdb.UnknownIdError):
            cluster.delete(["extra"])
        np.testing.assert_allclose(cluster.get([keys[3]])[0].astype(np.float32), docs[keys[3]], atol=2e-3)
    finally:
        cluster.close()
        single.close()


@pytest.mark.heavy
def test_actor_killed_mid_ingest_leaves_committed_shards_and_resumes(local_ray, tmp_path):
    sources, docs = _sources(tmp_path, seed=1)
    shards = [tmp_path / f"shard-{i}" for i in range(2)]

    def kill_after_some(i, writers):
        if i == 3:
            ray.get(writers[1].write.remote([], np.zeros((0, DIM), np.float16), np.zeros(0, np.int64)))
            ray.kill(writers[1])

    with pytest.raises(ray.exceptions.RayActorError):
        md.ingest(sources, shards, batch_docs=8, progress=False, build_index=False, on_batch=kill_after_some)
    counts = []
    for s in shards:  # every shard opens at a committed state
        with mvdb.open(s, device="cpu") as db:
            assert db.verify().ok
            counts.append(len(db))
    assert 0 < sum(counts) < len(docs)
    out = md.ingest(sources, shards, batch_docs=8, progress=False, device="cpu")
    assert out["added"] == len(docs) - sum(counts) and out["skipped"] == sum(counts)
    stored = []
    for s in shards:
        with mvdb.open(s, device="cpu") as db:
            stored += db.store.ids()
    assert sorted(stored) == sorted(docs)  # every document once


def test_bad_arguments(local_ray, tmp_path):
    with pytest.raises(mvdb.InvalidInputError, match="at least one shard"):
        md.ingest(["x.npz"], [])
    with pytest.raises(mvdb.InvalidInputError, match="at least one source"):
        md.ingest([], [tmp_path / "s0"])
    with pytest.raises(mvdb.InvalidInputError, match="one database directory"):
        md.ingest(["x.npz"], [tmp_path / "s0", tmp_path / "s1"], shards=2)
    with pytest.raises(mvdb.InvalidInputError, match="at least one shard"):
        md.Cluster([])


def _unit_docs(n, seed):
    """Documents of unit-norm tokens: a query made of a document's own tokens finds it first."""
    rng = np.random.default_rng(seed)
    docs = [rng.standard_normal((int(rng.integers(3, 12)), DIM)).astype(np.float32) for _ in range(n)]
    return [d / np.linalg.norm(d, axis=1, keepdims=True) for d in docs]


def _assert_finds_every_document(db, ids, docs, meta=None):
    """get, metadata (when given) and search find every one of ``ids`` (in any order of shards)."""
    got = db.get(ids)
    for want, arr in zip(docs, got):
        np.testing.assert_allclose(np.asarray(arr, np.float32), want, atol=2e-3)
    if meta is not None:
        assert db.metadata(ids) == meta
    hits = db.search([d[:3] for d in docs], k=1, n_candidates=len(ids))
    assert [h[0].id for h in hits] == list(ids)


@pytest.mark.heavy
def test_sharded_database_opens_as_a_cluster_and_back(local_ray, tmp_path):
    """A database written by ShardedDatabase (mvdb.open(path, devices=[...])) works through a Ray
    Cluster on its directory: get, metadata, delete and search route by membership, not by a hash
    of the id (which misses about half of these documents). What the Cluster adds, and what Ray's
    ingest writes into a new layout, reads back through ShardedDatabase."""
    docs = _unit_docs(40, seed=3)
    ids = [f"doc-{i}" for i in range(40)]
    meta = [{"n": i} for i in range(40)]
    path = tmp_path / "sh"
    with mvdb.open(path, devices=["cpu", "cpu"], index="flat") as sh:
        sh.add(docs, ids=ids, metadata=meta)
        assert min(len(s) for s in sh.shards) > 0
    cluster = md.Cluster(path, index="flat")
    try:
        assert len(cluster.actors) == 2 and len(cluster) == 40
        assert cluster.contains(ids + ["nope"]).tolist() == [True] * 40 + [False]
        _assert_finds_every_document(cluster, ids, docs, meta)
        with pytest.raises(mvdb.UnknownIdError):
            cluster.get([ids[0], "nope"])
        with pytest.raises(mvdb.UnknownIdError):  # one unknown id: nothing deleted
            cluster.delete([ids[1], "nope"])
        with pytest.raises(mvdb.DuplicateIdError):  # stored in some shard: refused before any write
            cluster.add([docs[0], docs[1]], ids=["fresh", ids[7]])
        assert len(cluster) == 40
        cluster.delete(ids[::2])  # every other document, wherever it was placed
        assert len(cluster) == 20
        for gone in ids[::2]:
            with pytest.raises(mvdb.UnknownIdError):
                cluster.get([gone])
        _assert_finds_every_document(cluster, ids[1::2], docs[1::2], meta[1::2])
        extra = _unit_docs(6, seed=4)
        assert cluster.add(extra, ids=[f"extra-{i}" for i in range(6)]) == [f"extra-{i}" for i in range(6)]
    finally:
        cluster.close()
    with mvdb.open(path, device="cpu", index="flat") as sh:  # and back: the Cluster's adds, the deletes
        assert len(sh) == 26
        _assert_finds_every_document(sh, ids[1::2] + [f"extra-{i}" for i in range(6)], docs[1::2] + extra)
        tokens = [s.stats()["tokens"] for s in sh.shards]
        assert max(tokens) - min(tokens) <= 11 + max(len(d) for d in docs)  # the adds went to the lighter shard
    sources, by_id = _sources(tmp_path, n_files=2, per_file=20, seed=5)
    out = md.ingest(sources, tmp_path / "ray", shards=2, batch_docs=8, progress=False, device="cpu")
    assert out["added"] == 40
    with mvdb.open(tmp_path / "ray", device="cpu") as sh:
        assert len(sh.shards) == 2 and min(len(s) for s in sh.shards) > 0
        keys = list(by_id)
        for key, arr in zip(keys, sh.get(keys)):
            np.testing.assert_allclose(np.asarray(arr, np.float32), by_id[key], atol=2e-2)
    again = md.ingest(sources, tmp_path / "ray", shards=2, batch_docs=8, progress=False, build_index=False)
    assert again["added"] == 0 and again["skipped"] == 40  # stored in some shard: skipped, never copied


def test_layout_records_placement_and_rejects_escaping_names(local_ray, tmp_path):
    path = tmp_path / "sh"
    with mvdb.open(path, devices=["cpu", "cpu"]) as sh:
        sh.add(_unit_docs(4, seed=6))
    file = path / "shards.json"
    layout = json.loads(file.read_text())
    assert layout["placement"] == "least-loaded" and layout["shards"] == ["shard-000", "shard-001"]
    del layout["placement"]  # a layout written before the key: read as least-loaded
    file.write_text(json.dumps(layout))
    with mvdb.open(path) as sh:
        assert len(sh) == 4
    from mvdb.shards import layout as shard_layout

    assert shard_layout.read(path).placement == "least-loaded"
    outside = tmp_path / "outside"
    with mvdb.open(outside, device="cpu") as db:  # a database the layout must not reach
        db.add(_unit_docs(2, seed=7))
    for bad in ("../outside", str(outside), "shard-000/../../outside", "", ".", ".."):
        file.write_text(json.dumps(dict(layout, shards=["shard-000", bad])))
        with pytest.raises(mvdb.CorruptionError, match=r"shards\.json"):
            mvdb.open(path)
        with pytest.raises(mvdb.CorruptionError, match=r"shards\.json"):
            md.Cluster(path)
    file.write_text(json.dumps(dict(layout, shards=["shard-000", "shard-000"])))
    with pytest.raises(mvdb.CorruptionError, match="named twice"):
        mvdb.open(path)
    file.write_text(json.dumps(dict(layout, placement="hash")))
    with pytest.raises(mvdb.FormatError, match="placement 'hash'"):
        mvdb.open(path)
    with pytest.raises(mvdb.FormatError, match="placement 'hash'"):
        md.ingest([os.devnull], path)


@pytest.mark.heavy
def test_cluster_has_the_database_api(local_ray, tmp_path):
    """What a Cluster offers beyond search and reads by id, against the same directory opened as
    a ShardedDatabase: rerank routed to the owner shards, one stats dict and one verify report
    over the shards, compact and refresh on every shard, sparse vectors, a context manager, and a
    closed handle that refuses every call."""
    docs = _unit_docs(30, seed=8)
    ids = [f"doc-{i}" for i in range(30)]
    path = tmp_path / "sh"
    with mvdb.open(path, devices=["cpu", "cpu"], index="flat") as sh:
        sh.add(docs, ids=ids, sparse=[{i: 1.0} for i in range(30)])
        cands = [ids[:12:2], [ids[29], ids[1], ids[14]]]
        queries = [docs[4][:3], docs[14][:2]]
        want = sh.rerank(queries, cands)
        want_one = sh.rerank(queries[0], cands[0], k=2)
        want_stats = sh.stats()
    free = {"actor_options": {"num_cpus": 0}}  # two clusters at once on the module's 3 CPUs
    with md.Cluster(path, index="flat", **free) as cluster:
        got = cluster.rerank(queries, cands)
        for w, g in zip(want, got):
            assert [h.id for h in g] == [h.id for h in w]
            np.testing.assert_allclose([h.score for h in g], [h.score for h in w], rtol=1e-5)
        assert [h.id for h in cluster.rerank(queries[0], cands[0], k=2)] == [h.id for h in want_one]
        with pytest.raises(mvdb.UnknownIdError):
            cluster.rerank(queries[0], [ids[0], "nope"])
        with pytest.raises(mvdb.InvalidTypeError):
            cluster.search("a query")
        hits = cluster.search(queries[1], k=1, n_candidates=1, k_tokens=1, sparse={14: 1.0}, n_sparse=1)
        assert hits[0].id == ids[14]
        st = cluster.stats()
        assert [s["documents"] for s in st["shards"]] == [s["documents"] for s in want_stats["shards"]]
        for key in ("documents", "tokens", "segments", "dim", "dtype", "index"):
            assert st[key] == want_stats[key], key
        assert st["path"] == os.fspath(path) and st["devices"] == ["cpu", "cpu"]
        report = cluster.verify()
        assert report.ok and report.n_docs == 30
        cluster.delete(ids[:6])
        assert cluster.compact() >= 1 and cluster.compact() == 0
        assert len(cluster) == 24 and cluster.stats()["deleted"] == 0
        with md.Cluster(path, index="flat", read_only=True, **free) as ro:
            assert len(ro) == 24 and ro.refresh() is False
            cluster.add(_unit_docs(2, seed=9), ids=["new-0", "new-1"])
            assert ro.refresh() is True and len(ro) == 26
    for call in (len, lambda c: c.stats(), lambda c: c.verify(), lambda c: c.get([ids[7]]),
                 lambda c: c.search(docs[0], k=1), lambda c: c.rerank(docs[0], [ids[7]]),
                 lambda c: c.add([docs[0]], ids=["again"]), lambda c: c.compact(), lambda c: c.refresh()):
        with pytest.raises(mvdb.InvalidInputError, match="closed"):
            call(cluster)
    cluster.close()  # closing again does nothing
    seg = next((path / "shard-001" / "segments").glob("*.h5"))
    import h5py

    with h5py.File(seg) as f:
        at = f["tokens"].id.get_offset()
    data = bytearray(seg.read_bytes())
    data[at + 10] ^= 0xFF  # one token byte of shard-001 (opened without checksums, verify finds it)
    seg.write_bytes(bytes(data))
    with md.Cluster(path, checksums=False, **free) as cluster:
        report = cluster.verify()
    assert not report.ok and len(report.problems) == 1 and report.problems[0].startswith(f"shard-001: {seg.name}: ")
