"""The token index without FAISS (issue #18): FAISS is an extra (mvdb[cpu] / mvdb[gpu]); a bare
install searches with the pure-torch backend. Flat search must give what FAISS gives; the IVF
index (torch k-means, two-level k-means, coarse assignment) must keep the recall FAISS gives.
CI has faiss-cpu installed, so these tests hide it: in process (``mvdb.engine.ivf.faiss = None``)
and in a fresh interpreter where ``import faiss`` fails."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from mvdb.kernels.maxsim import naive

import mvdb
import mvdb.engine
from mvdb.engine import flat, ivf

DIM = 32


@pytest.fixture
def no_faiss(monkeypatch):
    """FAISS as if not installed, for everything that picks a backend."""
    monkeypatch.setattr(ivf, "faiss", None)


def _corpus(n, seed, lo=3, hi=30):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((int(k), DIM)).astype(np.float32) for k in rng.integers(lo, hi, n)]


def _queries(docs, seed, n=12):
    rng = np.random.default_rng(seed)
    return [docs[i][:6] + 0.3 * rng.standard_normal((min(6, len(docs[i])), DIM)).astype(np.float32)
            for i in range(0, len(docs), max(1, len(docs) // n))]


def test_backend_names(no_faiss):
    assert mvdb.engine.index_backend("cpu") == "torch"
    assert mvdb.engine.index_backend("cuda") == "torch"
    assert not mvdb.engine.gpu_available()


@pytest.mark.parametrize("ntotal", [None, 1000, 4097], ids=["all", "pinned-1000", "pinned-4097"])
@pytest.mark.parametrize("k", [1, 63, 300])
def test_torch_flat_search_is_exact(monkeypatch, ntotal, k):
    """Blocks (a small scratch forces several) merged into the exact top-k of the first ntotal."""
    monkeypatch.setattr(flat, "SEARCH_SCRATCH", 40 * 4 * 700)  # blocks of 700 tokens for 40 queries
    g = torch.Generator().manual_seed(0)
    x, q = torch.randn(5000, DIM, generator=g), torch.randn(40, DIM, generator=g)
    ix = flat.TorchFlat(DIM, torch.device("cpu"))
    for a in range(0, 5000, 1111):  # several adds: the buffer grows
        ix.add(x[a : a + 1111])
    assert ix.ntotal == 5000
    s, p = ix.search(q, k, ntotal)
    want = (q @ x[: ntotal or 5000].T).topk(k, dim=1)
    torch.testing.assert_close(s, want.values)
    assert torch.equal(p, want.indices)


def _flat_answers(path, docs, queries):
    with mvdb.open(path, index="flat", device="cpu") as db:
        if not len(db):
            db.add(docs)
        opts = {"n_candidates": 40, "k_tokens": 64}  # options: the token index, not the exhaustive CPU path
        cand = db.candidates(queries, k=10, **opts)
        hits = db.search(queries, k=10, **opts)
        return db.stats()["index_backend"], [sorted(c) for c in cand], [[(h.id, round(h.score, 4)) for h in q] for q in hits]


@pytest.mark.heavy
def test_torch_flat_index_matches_faiss(tmp_path, monkeypatch):
    pytest.importorskip("faiss")
    docs = _corpus(400, seed=1)
    queries = _queries(docs, seed=2)
    backend, cand, hits = _flat_answers(tmp_path / "a", docs, queries)
    assert backend == "faiss-cpu"
    monkeypatch.setattr(ivf, "faiss", None)
    backend_t, cand_t, hits_t = _flat_answers(tmp_path / "a", docs, queries)  # same database, reopened
    assert backend_t == "torch"
    assert cand_t == cand  # same candidates
    assert hits_t == hits  # same top-k, same scores


@pytest.mark.heavy
def test_torch_flat_index_follows_adds(tmp_path, no_faiss):
    docs = _corpus(300, seed=3)
    with mvdb.open(tmp_path / "db", index="flat", device="cpu") as db:
        db.add(docs[:100])
        assert db.stats()["index_tokens"] == 0  # on a CPU filled by the first search that needs it
        assert db.search(docs[30][:6], k=1, n_candidates=20)[0].id == 30
        assert db.stats()["index_tokens"] == sum(len(d) for d in docs[:100])
        for a in range(100, 300, 50):  # appends go to the same torch index
            db.add(docs[a : a + 50])
            db.search(docs[a][:6], k=1, n_candidates=20)
        assert db.stats()["index_tokens"] == sum(len(d) for d in docs)
        top = db.search([d[:6] for d in docs[::30]], k=1, n_candidates=20)
        assert [h[0].id for h in top] == list(range(0, 300, 30))


@pytest.mark.heavy
def test_torch_ivf_recall_against_exhaustive(tmp_path, monkeypatch, no_faiss):
    """test_database.test_ivf_recall_against_exhaustive's corpus and thresholds, k-means and list
    assignment in torch, on the CPU path for many lists: two-level k-means, the coarse quantizer."""
    monkeypatch.setattr(ivf, "CPU_COARSE_NLIST", 64)
    from mvdb.testing.synthetic import make_corpus, make_queries

    c = make_corpus(3000, 16, 32, DIM, vocab=3000, n_topics=60, dtype=torch.float32, device="cpu", seed=3)
    queries, _ = make_queries(c, 20, 8, seed=4)
    with mvdb.open(tmp_path / "db", index="ivf", device="cpu") as db:
        db.add([x.numpy() for x in torch.split(c.tokens, c.lengths.tolist())])
        st = db.stats()
        assert (st["index"], st["index_backend"]) == ("ivf", "torch")
        assert st["nlist"] >= 64
        p = db.store.gather(db.store.ids())  # exhaustive MaxSim in plain torch (the kernel runs interpreted here)
        tokens = torch.from_numpy(p.tokens.astype(np.float32))
        ids = db.store.ids()
        want = [[ids[i] for i in naive.maxsim_csr(torch.as_tensor(q).float(), torch.tensor([0, len(q)], dtype=torch.int32),
                                                  tokens, torch.from_numpy(p.offsets))[0].topk(10).indices.tolist()]
                for q in queries]

        def recall(**kw):
            got = db.search(queries, k=10, **kw)
            return np.mean([len({h.id for h in g} & set(w)) / 10 for g, w in zip(got, want)])

        assert recall(nprobe=8, n_candidates=100) >= 0.85
        assert recall(nprobe=16, n_candidates=200) >= 0.93


def test_torch_coarse_assignment_finds_the_nearest_centroid():
    g = torch.Generator().manual_seed(5)
    cent = torch.nn.functional.normalize(torch.randn(400, DIM, generator=g), dim=1)
    x = cent[torch.randint(0, 400, (3000,), generator=g)] + 0.05 * torch.randn(3000, DIM, generator=g)
    got = ivf.TorchCoarse(cent, 20).assign(x, chunk=1000)
    assert (got == ivf.assign(x, cent)).float().mean() >= 0.99


def test_torch_kmeans_fills_every_list():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2000, DIM, generator=g)
    x[:1500] = x[0]  # most points identical: empty clusters must be refilled
    c = ivf.kmeans(x, 64, niter=5)
    assert c.shape == (64, DIM) and torch.isfinite(c).all()
    torch.testing.assert_close(c.norm(dim=1), torch.ones(64))
    c2 = ivf.two_level_kmeans(torch.randn(3000, DIM, generator=g), 8, 100, niter=3)
    assert c2.shape == (100, DIM)


def test_torch_kmeans_half_gemm_clusters_as_well():
    """kmeans(half=True) (float16 assignment GEMMs, ivf.KMEANS_GPU = "torch-fp16"): its centroids
    fit the points as well as float32 k-means' (mean best cosine within 1%)."""
    g = torch.Generator().manual_seed(8)
    centers = torch.nn.functional.normalize(torch.randn(40, DIM, generator=g), dim=1)
    x = torch.nn.functional.normalize(centers[torch.randint(0, 40, (3000,), generator=g)]
                                      + 0.3 * torch.randn(3000, DIM, generator=g), dim=1)

    def fit(c):
        return float((x @ c.T).max(dim=1).values.mean())

    full, half = ivf.kmeans(x, 40, niter=8), ivf.kmeans(x, 40, niter=8, half=True)
    assert half.dtype == torch.float32 and half.shape == (40, DIM)
    assert fit(half) >= 0.99 * fit(full), (fit(half), fit(full))


@pytest.mark.heavy
def test_ivf_index_trained_in_torch_is_persisted(tmp_path, monkeypatch, no_faiss):
    docs = _corpus(200, seed=7)
    with mvdb.open(tmp_path / "db", index="ivf", device="cpu") as db:
        db.add(docs)
        first = db.search(docs[5][:6], k=3, nprobe=16)

    def no_training(*a, **k):
        raise AssertionError("reopening retrained the index")

    monkeypatch.setattr(ivf, "train_centroids", no_training)
    with mvdb.open(tmp_path / "db", device="cpu") as db:
        assert db.search(docs[5][:6], k=3, nprobe=16) == first


BLOCKED = ("import sys; sys.modules['faiss'] = None\n"  # `import faiss` raises ImportError, as when not installed
           "import json, tempfile, numpy as np, mvdb, mvdb.engine, mvdb.engine.state as st\n"
           "st.FLAT_MAX_TOKENS = st.CPU_FLAT_MAX_TOKENS = 2000\n"  # this corpus grows from flat into IVF
           "rng = np.random.default_rng(0)\n"
           "docs = [rng.standard_normal((int(n), 32)).astype(np.float32) for n in rng.integers(5, 30, 300)]\n"
           "out = {'backend': mvdb.engine.index_backend('cpu')}\n"
           "with tempfile.TemporaryDirectory() as d, mvdb.open(d + '/db', device='cpu') as db:\n"
           "    db.add(docs[:50]); s = db.stats(); out['small'] = [s['index'], s['index_backend']]\n"
           "    db.add(docs[50:]); s = db.stats(); out['large'] = [s['index'], s['index_backend']]\n"
           "    out['top'] = [h[0].id for h in db.search([x[:6] for x in docs[::50]], k=1, nprobe=32)]\n"
           "print(json.dumps(out))\n")


@pytest.mark.heavy
def test_a_fresh_interpreter_without_faiss_searches(tmp_path):
    r = subprocess.run([sys.executable, "-c", BLOCKED], check=False, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["backend"] == "torch"
    assert out["small"] == ["flat", "torch"] and out["large"] == ["ivf", "torch"]
    assert out["top"] == list(range(0, 300, 50))


def test_stats_name_the_faiss_backend(tmp_path):
    pytest.importorskip("faiss")
    with mvdb.open(tmp_path / "db", device="cpu") as db:
        db.add(_corpus(20, seed=8))
        assert db.stats()["index_backend"] == "faiss-cpu"
