"""The PyLate adapter, against the real pylate package (retrieve.ColBERT and rank.rerank)."""

import numpy as np
import pytest

pylate = pytest.importorskip("pylate")
from pylate import rank, retrieve  # noqa: E402

from mvdb.integrations.pylate import MvdbIndex  # noqa: E402

DIM = 24


def _embeddings(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal((int(rng.integers(3, 15)), DIM))
        out.append((x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32))
    return out


def test_colbert_retriever_end_to_end(tmp_path):
    docs = _embeddings(40, 0)
    ids = [f"doc-{i}" for i in range(40)]
    index = MvdbIndex(index_folder=str(tmp_path), index_name="t", override=True, device="cpu")
    assert index.add_documents(documents_ids=ids, documents_embeddings=docs) is index
    retriever = retrieve.ColBERT(index=index)
    queries = [docs[3][:4], docs[17][:5]]
    results = retriever.retrieve(queries_embeddings=queries, k=3)
    assert [r[0]["id"] for r in results] == ["doc-3", "doc-17"]
    assert all(set(r[0]) == {"id", "score"} for r in results)
    # the same scores as PyLate's own exact reranking of those documents
    want = rank.rerank(documents_ids=[["doc-3", "doc-17"]], queries_embeddings=[queries[0]],
                       documents_embeddings=[[docs[3], docs[17]]], device="cpu")[0]
    got = {r["id"]: r["score"] for r in index(queries[:1], k=40)[0]}
    for w in want:
        assert got[w["id"]] == pytest.approx(float(w["score"]), rel=2e-3)


def test_subset_remove_and_embeddings(tmp_path):
    docs = _embeddings(20, 1)
    index = MvdbIndex(index_folder=str(tmp_path), index_name="t", override=True, device="cpu")
    index.add_documents([str(i) for i in range(20)], docs)
    q = docs[5][:3]
    only = index([q], k=5, subset=["2", "9", "missing"])[0]
    assert {r["id"] for r in only} == {"2", "9"}
    per_query = index([q, q], k=5, subset=[["5"], ["1", "5"]])
    assert [r["id"] for r in per_query[0]] == ["5"] and per_query[1][0]["id"] == "5"
    index.remove_documents(["5"])
    assert "5" not in [r["id"] for r in index([q], k=20)[0]]
    emb = index.get_documents_embeddings([["3", "4"], []])
    assert len(emb[0]) == 2 and emb[1] == []
    np.testing.assert_allclose(emb[0][0], docs[3].astype(np.float16).astype(np.float32))
    index.add_documents(["3"], [docs[0]])  # re-adding an id replaces the document
    np.testing.assert_allclose(index.get_documents_embeddings([["3"]])[0][0], docs[0].astype(np.float16).astype(np.float32))


def test_replacing_with_a_bad_document_keeps_the_old_one(tmp_path):
    from mvdb import InvalidInputError

    docs = _embeddings(3, 2)
    index = MvdbIndex(index_folder=str(tmp_path), index_name="t", override=True, device="cpu")
    index.add_documents(["a", "b", "c"], docs)
    bad = np.full((3, DIM), np.nan, np.float32)
    with pytest.raises(InvalidInputError, match="NaN"):
        index.add_documents(["a"], [bad])
    assert "a" in index.db


def test_opens_an_existing_int8_database(tmp_path):
    import mvdb

    docs = _embeddings(3, 3)
    with mvdb.open(tmp_path / "t.mvdb", dtype="int8") as db:
        db.add(docs, ids=["x", "y", "z"])
    index = MvdbIndex(index_folder=str(tmp_path), index_name="t", device="cpu")
    assert index([docs[1]], k=1)[0][0]["id"] == "y"


# ---- patch(): PyLate's scores and losses on mvdb's fused kernels (issue #5)

import torch  # noqa: E402
from conftest import TRITON_DEVICES  # noqa: E402

from mvdb.kernels.maxsim.runtime import interpreting  # noqa: E402


@pytest.fixture
def kernel_calls(monkeypatch):
    """The shapes of (Q, D) each call of mvdb's differentiable MaxSim got: the patch falls back to
    PyLate's code silently, so equal scores alone do not show that the kernels ran."""
    from mvdb.kernels.maxsim import train

    calls, real = [], train.padded

    def spy(Q, D, *args, **kwargs):
        calls.append((tuple(Q.shape), tuple(D.shape)))
        return real(Q, D, *args, **kwargs)

    monkeypatch.setattr(train, "padded", spy)
    return calls


def _patched_vs_original(fn_name, q, d, qm, dm, kernel_calls):
    import pylate.scores.colbert as colbert

    from mvdb.integrations import pylate as mp

    outs = []
    for patched in (False, True):
        if patched:
            mp.patch(devices=("cpu", "cuda"))
        try:
            qg, dg = q.clone().requires_grad_(), d.clone().requires_grad_()
            out = getattr(colbert, fn_name)(qg, dg, qm, dm)
            # mvdb's autograd Function made the patched scores (so its backward made the gradients)
            assert (type(out.grad_fn).__name__ == "_MaxSimFnBackward") == patched
            assert kernel_calls == ([(tuple(q.shape), tuple(d.shape))] if patched else [])
            (out * torch.arange(out.numel(), device=out.device).reshape(out.shape).float().cos()).sum().backward()
            outs.append((out.detach(), qg.grad, dg.grad))
        finally:
            mp.unpatch()
    return outs


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("fn_name", ["colbert_scores", "colbert_kd_scores"])
def test_patched_scores_equal_pylate_values_and_gradients(fn_name, device, kernel_calls):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 6, 16, generator=g).to(device)
    d = torch.randn(*((3, 2) if fn_name == "colbert_kd_scores" else (4,)), 9, 16, generator=g).to(device)
    qm = (torch.rand(3, 6, generator=g) > 0.2).float().to(device)
    dm = (torch.rand(d.shape[:-1], generator=g) > 0.3).float().to(device)
    (a, ga_q, ga_d), (b, gb_q, gb_d) = _patched_vs_original(fn_name, q, d, qm, dm, kernel_calls)
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gb_q, ga_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gb_d, ga_d, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_patched_scores_leave_mismatched_shapes_to_pylate(device):
    """Shapes the fused kernels do not take (per-query documents for another number of queries,
    another embedding size, a mask of the wrong shape) get PyLate's own code, not an
    out-of-bounds read in the kernels."""
    import pylate.scores.colbert as colbert

    from mvdb.integrations import pylate as mp

    seen = []
    mp.patch(devices=("cpu", "cuda"))
    try:
        q = torch.randn(3, 4, 8, device=device)
        for fn, d, qm in (
            (colbert.colbert_kd_scores, torch.randn(2, 2, 5, 8, device=device), None),  # 2 query rows, not 3
            (colbert.colbert_scores, torch.randn(2, 5, 6, device=device), None),  # dim 6, not 8
            (colbert.colbert_scores, torch.randn(2, 5, 8, device=device), torch.ones(3, 5, device=device)),
        ):
            original = fn.__wrapped__
            try:
                want = original(q, d, qm, None)
            except Exception as e:  # noqa: BLE001 - PyLate's own error is the expected outcome
                want = type(e)
            try:
                got = fn(q, d, qm, None)
            except Exception as e:  # noqa: BLE001
                got = type(e)
            seen.append(got)
            if isinstance(want, type):
                assert got is want, f"{fn.__name__}: expected PyLate's {want.__name__}, got {got}"
            else:
                torch.testing.assert_close(got, want)
    finally:
        mp.unpatch()
    assert len(seen) == 3


@pytest.mark.skipif(not interpreting(), reason="the CPU test runs the Triton kernels under TRITON_INTERPRET=1")
def test_patch_reaches_the_losses_and_unpatch_restores(kernel_calls):
    import pylate.losses.distillation as distillation
    import pylate.scores as scores
    import pylate.scores.colbert as colbert

    from mvdb.integrations import pylate as mp

    before = (colbert.colbert_scores, scores.colbert_scores, distillation.Distillation.__init__.__defaults__)
    mp.patch(devices=("cpu",))
    try:
        assert colbert.colbert_scores is not before[0] and scores.colbert_scores is colbert.colbert_scores
        kd_default, = [f for f in distillation.Distillation.__init__.__defaults__ if f is colbert.colbert_kd_scores]
        # ColBERTScores (the contrastive losses' default metric) looks the function up at call time
        q, d = torch.randn(2, 3, 8), torch.randn(2, 2, 4, 8)
        want = torch.stack([before[0](q, d[:, j]) for j in range(2)], 2).reshape(-1, 4)
        torch.testing.assert_close(colbert.ColBERTScores()(q, d), want, rtol=1e-5, atol=1e-5)
        assert kernel_calls == [((2, 3, 8), (2, 4, 8))] * 2  # one kernel call per document group
        torch.testing.assert_close(kd_default(q, d), colbert.colbert_kd_scores.__wrapped__(q, d), rtol=1e-5, atol=1e-5)
        assert kernel_calls[2:] == [((2, 3, 8), (2, 2, 4, 8))]
        # other devices / layouts keep PyLate's code
        assert colbert.colbert_scores(q.tolist(), d[:, 0].tolist()).shape == (2, 2)
        assert len(kernel_calls) == 3
    finally:
        mp.unpatch()
    assert (colbert.colbert_scores, scores.colbert_scores, distillation.Distillation.__init__.__defaults__) == before
