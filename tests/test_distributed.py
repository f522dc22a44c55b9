"""mvdb.distributed on a local Ray cluster (issue #6): bulk ingest on Ray Data into one database
per shard, a client over one actor per shard, and an actor killed mid-ingest."""

import numpy as np
import pytest

ray = pytest.importorskip("ray")

import mvdb  # noqa: E402
from mvdb import distributed as md  # noqa: E402

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
        for s, stats in zip(shards, cluster.stats()):  # each document sits on the shard its id maps to
            with mvdb.open(s, device="cpu", read_only=True) as db:
                assert all(md.shard_of(i, 3) == shards.index(s) for i in db.store.ids())
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
    with pytest.raises(mvdb.InvalidInputError, match="expected int or str ids"):
        md.shard_of(1.5, 2)
    assert md.shard_of(7, 3) == 1 and md.shard_of("a", 4) == md.shard_of("a", 4)
