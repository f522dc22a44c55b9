"""Token pooling (mvdb.pool): the clusters of SciPy's Ward linkage on cosine distance, cut at
``tokens // pool_factor`` clusters, with the leading tokens protected."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mvdb
from conftest import INTERPRET

hierarchy = pytest.importorskip("scipy.cluster.hierarchy")
distance = pytest.importorskip("scipy.spatial.distance")


def _unit(rng, n, dim=16, topics=4):
    """Tokens around a few topic directions, as a document's are: clusters to find, few ties."""
    centers = rng.standard_normal((topics, dim))
    x = centers[rng.integers(0, topics, n)] + 0.6 * rng.standard_normal((n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _reference(doc: np.ndarray, pool_factor: float, protected: int) -> list[tuple]:
    """The partition of the pooled tokens that SciPy's linkage + fcluster give."""
    x = torch.from_numpy(doc[protected:])
    n = x.shape[0]
    k = max(int(n // pool_factor), 1)
    if k >= n:
        return [(i,) for i in range(n)]
    d = (1 - x @ x.T).clamp_(0, 2).numpy()
    labels = hierarchy.fcluster(hierarchy.linkage(distance.squareform(d, checks=False), method="ward"), t=k,
                                criterion="maxclust")
    return sorted(tuple(np.flatnonzero(labels == v).tolist()) for v in np.unique(labels))


def _partition(groups: np.ndarray, protected: int) -> list[tuple]:
    g = groups[protected:]
    return sorted(tuple(np.flatnonzero(g == v).tolist()) for v in np.unique(g))


@pytest.mark.parametrize("pool_factor,protected", [(2, 1), (3, 0), (1.5, 2), (4, 1)])
def test_the_clusters_are_scipys_ward_clusters(pool_factor, protected):
    rng = np.random.default_rng(int(pool_factor * 10) + protected)
    docs = [_unit(rng, int(n)) for n in rng.integers(1, 60, 40)]
    pooled, groups = mvdb.pool(docs, pool_factor, protected=protected, return_groups=True)
    for doc, out, g in zip(docs, pooled, groups):
        n = doc.shape[0] - min(protected, doc.shape[0])
        want = _reference(doc, pool_factor, protected)
        assert _partition(g, protected) == want
        assert out.shape == (min(protected, doc.shape[0]) + len(want), doc.shape[1]) and out.dtype == np.float32
        np.testing.assert_array_equal(g[:protected], np.arange(min(protected, doc.shape[0])))
        # each pooled vector is its cluster's mean, normalised; protected tokens stay as they were
        for row in range(out.shape[0]):
            mean = doc[g == row].mean(axis=0)
            np.testing.assert_allclose(out[row], mean / np.linalg.norm(mean), atol=1e-5)
        assert n == 0 or out.shape[0] - min(protected, doc.shape[0]) == max(int(n // pool_factor), 1) or n == 1


def test_a_wrong_merge_order_would_be_seen():
    """The reference comparison can fail: clustering by position instead of by distance does not
    give SciPy's partition on these documents."""
    rng = np.random.default_rng(1)
    docs = [_unit(rng, 30) for _ in range(10)]
    _, groups = mvdb.pool(docs, 2, protected=0, return_groups=True)
    by_position = [np.arange(30) // 2 for _ in docs]
    assert any(_partition(g, 0) != _partition(p, 0) for g, p in zip(groups, by_position))
    assert all(_partition(g, 0) == _reference(d, 2, 0) for g, d in zip(groups, docs))


def test_inputs_keep_their_kind_and_short_documents_pass_through():
    rng = np.random.default_rng(2)
    docs = [torch.from_numpy(_unit(rng, n)).to(torch.float16) for n in (1, 2, 3, 9)]
    out = mvdb.pool(docs, 2, protected=1, normalize=False)
    assert all(isinstance(o, torch.Tensor) and o.dtype == torch.float16 for o in out)
    assert [o.shape[0] for o in out] == [1, 2, 2, 5]  # 1 + max(1, (n - 1) // 2) where pooling shrinks it
    torch.testing.assert_close(out[0], docs[0])
    torch.testing.assert_close(out[1], docs[1])  # one token to pool: nothing to merge
    same = mvdb.pool([_unit(rng, 8)], 1)  # pool factor 1: every token its own cluster
    assert same[0].shape == (8, 16)


def test_bad_arguments_are_refused_with_what_was_expected():
    doc = np.ones((4, 8), np.float32)
    with pytest.raises(mvdb.InvalidInputError, match="pool_factor: expected a number >= 1, got 0.5"):
        mvdb.pool([doc], 0.5)
    with pytest.raises(mvdb.InvalidTypeError, match="pool_factor: expected a number >= 1, got str"):
        mvdb.pool([doc], "2")
    with pytest.raises(mvdb.InvalidTypeError, match="protected: expected an int >= 0, got float"):
        mvdb.pool([doc], 2, protected=1.0)
    with pytest.raises(mvdb.InvalidInputError, match="protected: expected an int >= 0, got -1"):
        mvdb.pool([doc], 2, protected=-1)
    with pytest.raises(mvdb.InvalidInputError, match=r"docs\[1\]: expected dim 8 like docs\[0\], got 4"):
        mvdb.pool([doc, np.ones((3, 4), np.float32)], 2)
    with pytest.raises(mvdb.InvalidInputError, match=r"docs\[0\]: expected a non-empty \[tokens, dim\] float array"):
        mvdb.pool([np.ones((0, 8), np.float32)], 2)
    with pytest.raises(mvdb.InvalidTypeError, match="docs: expected a list of"):
        mvdb.pool(doc, 2)


@pytest.mark.skipif(not INTERPRET and not torch.cuda.is_available(),
                    reason="the Triton kernel needs CUDA or TRITON_INTERPRET=1")
def test_the_triton_merges_are_the_torch_merges_and_scipys():
    """One program a document, all its merges in one launch (the GPU's path), against the torch
    steps (the CPU's) and SciPy, on documents of several widths, with padding and protected tokens."""
    from mvdb.kernels.ward import merge

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rng = np.random.default_rng(11)
    docs = [_unit(rng, int(n)) for n in [2, 3, 9, 16, 17, 30, 33, 5]]
    for factor in (2, 3):
        ks = [max(d.shape[0] // factor, 1) for d in docs]
        width = 64
        x = torch.zeros(len(docs), width, 16)
        for i, d in enumerate(docs):
            x[i, : d.shape[0]] = torch.from_numpy(d)
        n = torch.tensor([d.shape[0] for d in docs])
        pos = torch.arange(width)
        valid = pos[None, :] < n[:, None]
        dist = (1 - x @ x.transpose(1, 2)).clamp_(0, 2)
        dist = torch.where(valid[:, :, None] & valid[:, None, :] & (pos[:, None] != pos[None, :]), dist,
                           float("inf")).double()
        near, near_at = dist.min(-1)
        args = (near, near_at, n, torch.tensor(ks))
        want = merge(dist.clone(), *args, triton=False)
        got = merge(dist.to(device), *(a.to(device) for a in args), triton=True).cpu()
        assert torch.equal(got[valid], want[valid])
        for i, d in enumerate(docs):
            r = got[i, : d.shape[0]].numpy()
            assert sorted(tuple(np.flatnonzero(r == v).tolist()) for v in np.unique(r)) == _reference(d, factor, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_the_gpu_the_clusters_are_scipys_on_nearly_every_document():
    rng = np.random.default_rng(3)
    docs = [_unit(rng, int(n), dim=128) for n in rng.integers(20, 200, 300)]
    _, groups = mvdb.pool([torch.from_numpy(d).cuda() for d in docs], 2, protected=1, return_groups=True)
    same = sum(_partition(g, 1) == _reference(d, 2, 1) for g, d in zip(groups, docs))
    assert same >= 0.99 * len(docs)
