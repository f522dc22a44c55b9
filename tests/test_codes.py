"""The compressed token tier (issue #45): residual codes (packing, buckets, decoding), the fused
approximate MaxSim kernel against its torch reference, and a database whose exact tokens live off
the device (``residency="host"``): with the lists and the codes choosing a few of its documents for
the exact stage, each query finds exhaustive MaxSim's best; its codes persist, follow adds and are
rebuilt when damaged."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import mvdb
from conftest import INTERPRET
from mvdb.engine import codes as codes_tier
from mvdb.kernels.codes import approx_maxsim_candidates, decode, encode, ops, train_buckets
from mvdb.kernels.codes.naive import (
    approx_candidates_torch,
    bucketize,
    list_dtype,
    list_index,
    n_bytes,
    narrow_lists,
    pack,
    unpack,
)


def _unit(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(x, dim=-1)


@pytest.mark.parametrize("bits", [1, 2, 4])
@pytest.mark.parametrize("dim", [8, 48, 100])
def test_pack_unpack_round_trip(bits, dim):
    codes = torch.randint(0, 1 << bits, (37, dim), generator=torch.Generator().manual_seed(dim))
    packed = pack(codes, bits)
    assert packed.dtype == torch.uint8 and packed.shape == (37, n_bytes(dim, bits))
    assert torch.equal(unpack(packed, dim, bits), codes)


@pytest.mark.parametrize("bits", [1, 2, 4])
def test_buckets_are_quantiles_and_decoding_stays_within_them(bits):
    g = torch.Generator().manual_seed(1)
    x = _unit(torch.randn(4000, 32, generator=g))
    centroids = _unit(torch.randn(16, 32, generator=g))
    lists = (x @ centroids.T).argmax(dim=1).int()
    res = x - centroids[lists.long()]
    cutoffs, weights = train_buckets(res, bits)
    assert cutoffs.shape == (32, (1 << bits) - 1) and weights.shape == (32, 1 << bits)
    assert bool((cutoffs[:, 1:] >= cutoffs[:, :-1]).all()) and bool((weights[:, 1:] >= weights[:, :-1]).all())
    edges = torch.cat([res[:7], cutoffs.T])  # values on a cutoff go below it
    assert torch.equal(bucketize(edges, cutoffs), (edges[:, :, None] > cutoffs[None]).sum(dim=2))
    packed = encode(x, lists, centroids, cutoffs, bits)
    approx = decode(packed, lists, centroids, weights, bits)
    err = (approx - x).norm(dim=1).mean() / x.norm(dim=1).mean()
    # random unit vectors, 16 lists: residuals as large as they get (measured: 0.68 / 0.41 / 0.15
    # error, 0.58 / 0.83 / 0.975 score correlation at 1 / 2 / 4 bits; the centroids alone: 1.17)
    assert err < {1: 0.72, 2: 0.45, 4: 0.17}[bits], err
    scores, approx_scores = x[:50] @ x[50:].T, approx[:50] @ approx[50:].T
    corr = torch.corrcoef(torch.stack([scores.flatten(), approx_scores.flatten()]))[0, 1]
    assert corr > {1: 0.55, 2: 0.8, 4: 0.96}[bits], corr


def _store(n_docs, dim, nlist, bits, seed=0):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 40, (n_docs,), generator=g)
    lens[0], lens[1] = 1, 63  # a one-token document and one longer than a tile
    off = torch.zeros(n_docs + 1, dtype=torch.int64)
    off[1:] = lens.cumsum(0)
    x = _unit(torch.randn(int(off[-1]), dim, generator=g))
    centroids = _unit(torch.randn(nlist, dim, generator=g))
    lists = (x @ centroids.T).argmax(dim=1).int()
    cutoffs, weights = train_buckets(x - centroids[lists.long()], bits)
    return x, off, centroids, lists, encode(x, lists, centroids, cutoffs, bits), weights


def _maxsim(q, cu, x, off, cand) -> torch.Tensor:
    """MaxSim of query i against the documents cand[i] over the token table x, in float64 (-1: -inf)."""
    out = torch.full(cand.shape, float("-inf"), dtype=torch.float64)
    for i in range(cand.shape[0]):
        qi = q[int(cu[i]) : int(cu[i + 1])].double()
        for j, c in enumerate(cand[i].tolist()):
            if c >= 0:
                out[i, j] = (qi @ x[int(off[c]) : int(off[c + 1])].double().T).max(dim=1).values.sum()
    return out


def _decoded_as_the_kernel_does(codes, lists, centroids, weights, bits, half) -> torch.Tensor:
    """The tokens with the kernel's rounding: at 1 and 2 bits each dimension's levels become the
    polynomial through them in ``code - mid`` (coefficients from float32, rounded to the decode's
    dtype), evaluated by Horner's rule in that dtype; at 4 bits the levels themselves. Then the
    centroid (float16) is added and the sum rounded to float16."""
    wt = torch.float16 if half else torch.float32
    c = unpack(codes, centroids.shape[1], bits)
    if bits == 4:
        r = weights.to(wt).float().gather(1, c.T).T.to(wt)
    else:
        v = weights.float().T  # [levels, dim]
        if bits == 1:
            coef = [(v[0] + v[1]) / 2, v[1] - v[0]]
        else:
            d1, d2, d3 = v[1] - v[0], v[2] - 2 * v[1] + v[0], v[3] - 3 * v[2] + 3 * v[1] - v[0]
            a1, a2, a3 = d1 - d2 / 2 + d3 / 3, (d2 - d3) / 2, d3 / 6
            coef = [v[0] + 1.5 * a1 + 2.25 * a2 + 3.375 * a3, a1 + 3 * a2 + 6.75 * a3, a2 + 4.5 * a3, a3]
        u = c.to(wt) - ((1 << bits) - 1) / 2
        r = coef[-1].to(wt).expand_as(u)
        for a in reversed(coef[:-1]):
            r = r * u + a.to(wt)
    return (centroids.half()[list_index(lists)].to(wt) + r).half()


def _check_kernel(got, q, cu, centroids, lists, codes, weights, off, cand, bits, half):
    """The kernel's scores against MaxSim over the same codes decoded in float32 (summed in
    float64): its error may be at most twice that of the kernel's rounding done in torch (the query
    tokens in float16, the tokens decoded as the kernel decodes them), plus float32 summation, and
    within 1e-2 of a score. A token dropped from a query moves a score by that token's best
    similarity, far more than float16 rounding."""
    ok = cand >= 0
    assert bool(torch.isinf(got[~ok]).all())
    ref = _maxsim(q, cu, decode(codes, lists, centroids, weights, bits), off, cand)
    x16 = _decoded_as_the_kernel_does(codes, lists, centroids, weights, bits, half)
    rounded = _maxsim(q.half(), cu, x16, off, cand)
    err, bound = (got.double() - ref)[ok].abs().max().item(), (rounded - ref)[ok].abs().max().item()
    assert err <= 2 * bound + 1e-5, (err, bound)
    assert err < 1e-2, err


@pytest.mark.heavy
@pytest.mark.parametrize("bits", [1, 2, 4])
@pytest.mark.parametrize("dim", [32, 48])
@pytest.mark.parametrize("group,half", [(1, False), (3, True)])
def test_fused_kernel_matches_the_reference(bits, dim, group, half, monkeypatch):
    monkeypatch.setattr(ops, "GROUP", group)  # candidates a program, and the float16 decode
    monkeypatch.setattr(ops, "HALF", half)
    x, off, centroids, lists, codes, weights = _store(60, dim, 8, bits)
    g = torch.Generator().manual_seed(2)
    q_lens = [3, 17, 1]
    cu = torch.tensor([0, *np.cumsum(q_lens)], dtype=torch.int32)
    q = _unit(torch.randn(int(cu[-1]), dim, generator=g))
    cand = torch.randint(0, 60, (3, 7), generator=g)
    cand[0, 2] = cand[2, 6] = -1  # padding
    cand[1, :2] = torch.tensor([0, 1])
    ref = approx_candidates_torch(q, cu, centroids, lists, codes, weights, off, cand, bits)
    got = approx_maxsim_candidates(q, cu, centroids, lists, codes, weights, off, cand, bits, backend="auto")
    wide = torch.full((3, 20), -1, dtype=torch.int64)
    wide[:, :7] = cand  # a strided view: the kernel must not assume rows of n_k
    torch.testing.assert_close(approx_maxsim_candidates(q, cu, centroids, lists, codes, weights, off, wide[:, :7], bits),
                               got)
    strided = torch.cat([codes, torch.zeros_like(codes)], dim=1)[:, : codes.shape[1]]  # rows 2 x n_bytes apart
    torch.testing.assert_close(approx_maxsim_candidates(q, cu, centroids, lists, strided, weights, off, cand, bits), got)
    _check_kernel(got, q, cu, centroids, lists, codes, weights, off, cand, bits, half)
    # the reference itself: MaxSim over the decoded tokens
    assert bool(torch.isinf(ref[cand < 0]).all())
    ok = cand >= 0
    want = _maxsim(q, cu, decode(codes, lists, centroids, weights, bits), off, cand)
    torch.testing.assert_close(ref[ok], want[ok].float(), atol=1e-5, rtol=1e-5)


def test_list_ids_narrow_to_16_bits_up_to_65536_lists():
    assert list_dtype(65536) == torch.int16 and list_dtype(65537) == torch.int32 and list_dtype(1) == torch.int16
    ids = torch.tensor([0, 1, 32767, 32768, 40000, 65535], dtype=torch.int32)
    narrow = narrow_lists(ids, torch.int16)
    assert narrow.dtype == torch.int16 and int(narrow[3]) < 0  # the uint16 value in an int16
    assert torch.equal(list_index(narrow), ids.long())
    assert torch.equal(list_index(narrow_lists(ids + 70000, torch.int32)), ids.long() + 70000)


@pytest.mark.parametrize("nlist,dtype", [(65536, torch.int16), (65537, torch.int32)], ids=["16bit", "32bit"])
def test_the_tier_keeps_16_bit_lists_where_they_fit(nlist, dtype):
    from mvdb.engine.codes import Growing

    centroids = torch.zeros(nlist, 8)
    g = Growing(1, centroids, torch.zeros(8, 2), torch.zeros(8, 1), {}, torch.device("cpu"))
    ids = torch.tensor([0, 32768, nlist - 1], dtype=torch.int32)
    view = g.append(ids, torch.zeros(3, n_bytes(8, 1), dtype=torch.uint8))
    assert view.lists.dtype == dtype and view.token_bytes == dtype.itemsize + 1
    assert torch.equal(list_index(view.lists), ids.long())


@pytest.mark.heavy
@pytest.mark.parametrize("bits", [1, 2, 4])
def test_fused_kernel_reads_16_bit_lists(bits):
    """Lists past 32767 (negative as int16) decode from the right centroids: the kernel masks
    ``& 0xFFFF`` as the reference does."""
    g = torch.Generator().manual_seed(bits)
    dim, nlist = 32, 65536
    off = torch.tensor([0, 1, 9, 40, 70])
    x = _unit(torch.randn(70, dim, generator=g))
    centroids = _unit(torch.randn(nlist, dim, generator=g))
    lists = torch.randint(0, nlist, (70,), dtype=torch.int32, generator=g)
    lists[:3] = torch.tensor([32767, 32768, 65535])
    cutoffs, weights = train_buckets(x - centroids[lists.long()], bits)
    codes = encode(x, lists, centroids, cutoffs, bits)
    short = narrow_lists(lists, torch.int16)
    assert int(short.min()) < 0
    q, cu = _unit(torch.randn(5, dim, generator=g)), torch.tensor([0, 2, 5], dtype=torch.int32)
    cand = torch.tensor([[0, 1, 2, -1], [3, 2, 1, 0]])
    ref = approx_candidates_torch(q, cu, centroids, lists, codes, weights, off, cand, bits)
    assert torch.equal(approx_candidates_torch(q, cu, centroids, short, codes, weights, off, cand, bits), ref)
    got = approx_maxsim_candidates(q, cu, centroids, short, codes, weights, off, cand, bits)
    _check_kernel(got, q, cu, centroids, lists, codes, weights, off, cand, bits, ops.HALF)


def test_bad_arguments_are_mvdb_errors():
    x, off, centroids, lists, codes, weights = _store(10, 16, 4, 2)
    q, cu, cand = x[:3], torch.tensor([0, 3], dtype=torch.int32), torch.zeros(1, 2, dtype=torch.int64)
    with pytest.raises(mvdb.InvalidInputError, match="bits"):
        approx_maxsim_candidates(q, cu, centroids, lists, codes, weights, off, cand, 3)
    with pytest.raises(mvdb.InvalidInputError, match="codes: expected shape"):
        approx_maxsim_candidates(q, cu, centroids, lists, codes[:, :1], weights, off, cand, 2)
    with pytest.raises(mvdb.InvalidInputError, match="cand: expected 1 rows"):
        approx_maxsim_candidates(q, cu, centroids, lists, codes, weights, off, cand.repeat(2, 1), 2)


@pytest.mark.skipif(not INTERPRET, reason="a paged CPU store's gathered read needs the Triton kernel (TRITON_INTERPRET=1)")
def test_gathered_host_read_scores_as_the_in_place_one(tmp_path, monkeypatch):
    """The rerank's gathered read of host pages (one launch of row loads, then scored on the
    device) against the in-place read, over a paged store (adds after the first load) with
    padding and repeated candidates; float16 and int8. Under the interpreter both are Triton."""
    from mvdb.engine import resident

    monkeypatch.setattr(resident, "MIN_PAGE_BYTES", 1 << 10)  # small pages: every add a new one
    rng = np.random.default_rng(3)
    for dtype in ("float16", "int8"):
        with mvdb.open(tmp_path / dtype, device="cpu", dtype=dtype, progress=False) as db:
            for _ in range(3):
                db.add(_docs(rng, 40))
            st = db._engine.state
            t = st.tokens
            assert len(t.pages) > 1 and t.starts is not None
            q = torch.from_numpy(np.concatenate([d[:3] for d in _docs(rng, 2)]))
            cu = torch.tensor([0, 3, 6], dtype=torch.int32)
            cand = torch.tensor([[0, 5, 119, -1, 5], [60, -1, 2, 90, 100]])
            want = t.score(q, cu, cand, 3)
            monkeypatch.setattr(resident, "GATHER_BUDGET", 1)  # a chunk per query
            got = t._score_gathered(q, cu, cand, 3)
            torch.testing.assert_close(got, want)
            assert bool(torch.isinf(got[cand < 0]).all())


# ---- a database whose exact tokens are off the device

DIM = 16
# The lists hand the codes POOL documents per query, the codes hand the exact stage N_EXACT: both
# well below the corpora here, so that what the lists and the codes choose decides each answer (at
# the defaults the pool is at least codes.POOL_MIN = 8192 documents: a small corpus is ranked whole).
POOL = 32
N_EXACT = 4


@pytest.fixture
def small_pool(monkeypatch):
    """The codes tier's pool from the lists at POOL documents."""
    monkeypatch.setattr(codes_tier, "POOL_MIN", POOL)
    monkeypatch.setattr(codes_tier, "POOL_MAX", POOL)


def _docs(rng, n):
    return [(lambda a: a / np.linalg.norm(a, axis=1, keepdims=True))(
        rng.standard_normal((int(rng.integers(2, 30)), DIM)).astype(np.float32)) for _ in range(n)]


def _near(rng, docs):
    """A query per document: its first (up to) 4 tokens, moved a little."""
    return [d[:4] + 0.05 * rng.standard_normal((min(4, len(d)), DIM)).astype(np.float32) for d in docs]


def _open(path, residency="host", **kw):
    return mvdb.open(path, device="cpu", residency=residency, index="ivf", nlist=32, progress=False, **kw)


def _exact(db, qs) -> list[dict]:
    """Each query's exhaustive MaxSim score of every document, {id: score}."""
    return [{h.id: h.score for h in r} for r in db.search(qs, k=len(db), exact=True)]


def _assert_finds_the_best(db, qs, exact, **kw):
    """Searches whose lists and codes pick N_EXACT of POOL documents (``small_pool``) find each
    query's best document by exhaustive MaxSim (``exact``, of the documents ``kw`` lets through),
    and score every hit exactly."""
    got = db.search(qs, k=3, n_candidates=N_EXACT, nprobe=8, **kw)
    for hits, scores in zip(got, exact):
        assert hits[0].id == max(scores, key=scores.get)
        np.testing.assert_allclose([h.score for h in hits], [scores[h.id] for h in hits], rtol=1e-5)


@pytest.fixture
def encodes(monkeypatch):
    """Counts the calls that encode residual codes (mvdb.kernels.codes.encode)."""
    calls = []
    encode = mvdb.kernels.codes.encode
    monkeypatch.setattr(mvdb.kernels.codes, "encode", lambda *a, **k: calls.append(1) or encode(*a, **k))
    return calls


@pytest.mark.heavy
@pytest.mark.parametrize("tier", ["host", "disk"])
def test_codes_tier_answers_as_exhaustive_maxsim(tmp_path, tier, small_pool):
    """The lists and the codes choose the few documents the exact stage reads off host memory or
    disk: each query finds exhaustive MaxSim's best document, with exact scores, also with a filter,
    after an add (the codes follow it) and after deletes and a compaction."""
    rng = np.random.default_rng(0)
    docs = _docs(rng, 120)
    qs = _near(rng, docs[:6])
    with _open(tmp_path / "db", residency=tier) as db:
        db.add(docs, metadata=[{"i": i} for i in range(120)])
        s = db.stats()
        assert s["tier"] == f"codes+{tier}" and s["codes_bits"] == 2 and s["codes_bytes"] > 0
        assert s["resident_bytes"] == (0 if tier == "disk" else s["resident_bytes"])
        exact = _exact(db, qs)
        _assert_finds_the_best(db, qs, exact)
        below = [{i: v for i, v in e.items() if i < 60} for e in exact]
        _assert_finds_the_best(db, qs, below, where={"i": {"$lt": 60}})
        files = sorted(os.listdir(tmp_path / "db" / "index"))
        assert any(f.startswith("buckets-") for f in files) and any(f.startswith("residuals-") for f in files)
        new = _docs(rng, 30)
        ids = db.add(new)
        assert len(ids) == 30 and db.stats()["codes_bytes"] > s["codes_bytes"]
        qs += _near(rng, new[5:9])
        _assert_finds_the_best(db, qs, _exact(db, qs))
        db.delete(ids[:5] + [0, 1])  # deletions and a compaction: the tier follows
        db.compact()
        _assert_finds_the_best(db, qs[2:], _exact(db, qs[2:]))


def _assert_exhaustive(db, qs, k=10):
    """Searches whose pool and exact stage cover the corpus (every list probed): the exact stage
    reranks every live document, and the top k are exhaustive MaxSim's, scores included."""
    want = _exact(db, qs)
    wide = {"n_candidates": len(db), "nprobe": 32}
    for cand, scores in zip(db.candidates(qs, k, **wide), want):
        assert sorted(cand) == sorted(scores)
    for hits, scores in zip(db.search(qs, k, **wide), want):
        best = sorted(scores.values(), reverse=True)[:k]
        np.testing.assert_allclose([h.score for h in hits], best, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose([h.score for h in hits], [scores[h.id] for h in hits], rtol=1e-5, atol=1e-6)


def test_the_device_tiers_codes_prerank_is_exhaustive_where_the_pool_covers_the_corpus(tmp_path, small_pool,
                                                                                       monkeypatch):
    """prerank="codes": the device tier ranks its pool from the lists by the codes, then reranks
    the best exactly from the device. Where the pool and the exact stage cover the corpus, the
    answer is exhaustive MaxSim's, after adds and deletes; where the lists hand the codes POOL
    documents and the codes hand the exact stage N_EXACT, each query still finds its best. A bad
    value, or the codes over a flat index, is refused and nothing is written."""
    ranked = []
    score = codes_tier.Residuals.score
    monkeypatch.setattr(codes_tier.Residuals, "score", lambda self, *a: ranked.append(1) or score(self, *a))
    rng = np.random.default_rng(4)
    docs = _docs(rng, 90)
    qs = _near(rng, docs[:5])
    with _open(tmp_path / "db", residency="device", prerank="codes") as db:
        db.add(docs)
        s = db.stats()
        assert s["tier"] == "codes+device" and s["codes_bytes"] > 0
        _assert_exhaustive(db, qs)
        _assert_finds_the_best(db, qs, _exact(db, qs))
        ids = db.add(_docs(rng, 20))
        db.delete(ids[:3] + [0, 7])
        _assert_exhaustive(db, qs + _near(rng, [docs[20], docs[40]]))
    assert len(ranked) >= 5  # every search's pool went through the codes
    for bad, message in (({"prerank": "exact"}, "prerank: expected one of"),
                         ({"prerank": "codes", "index": "flat"}, "needs index 'ivf'")):
        path = tmp_path / f"bad-{len(message)}"
        with pytest.raises(mvdb.InvalidInputError, match=message):
            mvdb.open(path, device="cpu", progress=False, **bad)
        assert not path.exists()


@pytest.mark.heavy
def test_codes_persist_and_damaged_codes_are_rebuilt(tmp_path, small_pool, encodes):
    """Codes are read back on reopening (nothing is encoded again) and answer as before; codes
    that fail their checksum are encoded again from the segments, and answer as before."""
    rng = np.random.default_rng(1)
    docs = _docs(rng, 80)
    qs = _near(rng, docs[:6])
    with _open(tmp_path / "db") as db:
        db.add(docs)
        _assert_finds_the_best(db, qs, _exact(db, qs))
        want = db.search(qs, k=3, n_candidates=N_EXACT, nprobe=8)
    assert encodes
    encodes.clear()
    with _open(tmp_path / "db", read_only=True) as db:
        assert db.search(qs, k=3, n_candidates=N_EXACT, nprobe=8) == want
    assert not encodes  # read back, not encoded again
    res = sorted((tmp_path / "db" / "index").glob("residuals-*.npy"))[0]
    raw = bytearray(res.read_bytes())
    raw[-5] ^= 0xFF
    res.write_bytes(bytes(raw))
    assert not mvdb.verify(tmp_path / "db").ok
    with _open(tmp_path / "db") as db:  # rebuilt from the segments
        assert encodes
        assert db.search(qs, k=3, n_candidates=N_EXACT, nprobe=8) == want
    assert mvdb.verify(tmp_path / "db").ok


def _tree(path) -> dict:
    """Every file under ``path`` and its bytes."""
    return {str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*")) if f.is_file()}


@pytest.mark.heavy
def test_one_bit_codes_answer_as_exhaustive_maxsim(tmp_path, small_pool):
    """One bit a dimension: the codes' size, and they still pick each query's best document."""
    rng = np.random.default_rng(4)
    docs = _docs(rng, 60)
    qs = _near(rng, docs[:6])
    with _open(tmp_path / "db", code_bits=1) as db:
        db.add(docs)
        s = db.stats()
        tokens = sum(len(d) for d in docs)
        assert s["tier"] == "codes+host" and s["codes_bits"] == 1
        # a token: its 16-bit list and DIM bits of codes, plus the centroids and the bucket weights
        assert s["codes_bytes"] == tokens * (2 + DIM // 8) + s["nlist"] * DIM * 4 + DIM * 2 * 4
        _assert_finds_the_best(db, qs, _exact(db, qs))


def test_a_bad_code_rate_is_refused_and_the_data_untouched(tmp_path):
    rng = np.random.default_rng(5)
    with _open(tmp_path / "db") as db:
        db.add(_docs(rng, 10))
    before = _tree(tmp_path / "db")
    for bad in (3, 0, 8, -1, True, 2.0, "2", [2]):
        for path in (tmp_path / "db", tmp_path / "new"):
            with pytest.raises(mvdb.InvalidInputError) as e:
                _open(path, code_bits=bad)
            assert str(e.value) == f"code_bits: expected one of (1, 2, 4) or None, got {bad!r}"
    assert _tree(tmp_path / "db") == before and not (tmp_path / "new").exists()
    with _open(tmp_path / "db", code_bits=np.int64(1), read_only=True) as db:  # numpy ints are ints
        assert db.stats()["codes_bits"] == 1


@pytest.mark.heavy
def test_reopening_at_another_rate_encodes_again_and_loses_nothing(tmp_path, small_pool, encodes):
    """Opening at another code rate encodes that rate's codes (and keeps the other rates' files);
    each rate's codes, read back later without encoding, pick each query's best document."""
    rng = np.random.default_rng(6)
    docs = _docs(rng, 60)
    qs = [d[:3] for d in docs[:6]]
    path = tmp_path / "db"
    with _open(path) as db:
        ids = db.add(docs)
        assert db.stats()["codes_bits"] == 2
        two = db.stats()["codes_bytes"]
        exact = _exact(db, qs)  # the exact tokens' scores: the same at every rate
    segments = {k: v for k, v in _tree(path).items() if k.startswith("segments")}
    b2 = {k: v for k, v in _tree(path).items() if "-b2" in k}
    for bits in (1, 4):
        encodes.clear()
        with _open(path, code_bits=bits) as db:
            assert encodes
            s = db.stats()
            assert s["codes_bits"] == bits and (s["codes_bytes"] < two) == (bits == 1)
            _assert_finds_the_best(db, qs, exact)
            assert db.get(ids[:2])[1].tobytes() == docs[1].astype(np.float16).astype(np.float32).tobytes()
        tree = _tree(path)
        assert any("residuals-" in k and f"-b{bits}-" in k for k in tree)  # this rate's codes persisted
        assert {k: v for k, v in tree.items() if "-b2" in k} == b2  # the other rates' kept as they were
        assert {k: v for k, v in tree.items() if k.startswith("segments")} == segments
    assert mvdb.verify(path).ok
    encodes.clear()
    for bits in (1, 2, 4):  # each rate read back, not encoded again
        with _open(path, code_bits=bits, read_only=True) as db:
            _assert_finds_the_best(db, qs, exact)
    assert not encodes
    with _open(path) as db:  # the default again: its files, and an add follows at that rate
        assert db.stats()["codes_bits"] == 2
        more = db.add(_docs(rng, 5))
        assert db.search(db.get(more[:1])[0][:3], k=1, n_candidates=N_EXACT, nprobe=8)[0].id == more[0]


# ---- on the GPU: the compiled kernel, and the exact stage reading pinned host memory in place


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [1, 2, 4])
@pytest.mark.parametrize("dim", [64, 128, 96])
@pytest.mark.parametrize("list_type", [torch.int32, torch.int16], ids=["lists32", "lists16"])
def test_compiled_kernel_matches_the_reference(bits, dim, list_type):
    x, off, centroids, lists, codes, weights = _store(300, dim, 32, bits, seed=dim)
    g = torch.Generator().manual_seed(5)
    q_lens = [32, 1, 45, 7]
    cu = torch.tensor([0, *np.cumsum(q_lens)], dtype=torch.int32)
    q = _unit(torch.randn(int(cu[-1]), dim, generator=g))
    cand = torch.randint(-1, 300, (4, 50), generator=g)
    if list_type == torch.int16:  # the same centroids past row 32767: ids negative as int16
        centroids, lists = torch.cat([torch.zeros(40000, dim), centroids]), lists + 40000
    dev = [t.cuda() for t in (q, cu, centroids, narrow_lists(lists, list_type), codes, weights, off, cand)]
    got = approx_maxsim_candidates(*dev, bits).cpu()
    _check_kernel(got, q, cu, centroids, lists, codes, weights, off, cand, bits, ops.HALF)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.int8])
def test_rerank_reads_pinned_host_tokens_in_place(dtype):
    from mvdb.kernels import maxsim_candidates, quantize_int8

    g = torch.Generator().manual_seed(6)
    lens = torch.randint(1, 90, (500,), generator=g)
    off = torch.zeros(501, dtype=torch.int64)
    off[1:] = lens.cumsum(0)
    x = _unit(torch.randn(int(off[-1]), 128, generator=g)).half()
    scales = None
    if dtype == torch.int8:
        x, scales = quantize_int8(x.float())
    q = _unit(torch.randn(64, 128, generator=g)).cuda()
    cu = torch.tensor([0, 20, 64], dtype=torch.int32, device="cuda")
    cand = torch.randint(-1, 500, (2, 100), generator=g).cuda()
    on_device = maxsim_candidates(q, cu, x.cuda(), off.cuda(), cand, None if scales is None else scales.cuda())
    pinned = maxsim_candidates(q, cu, x.pin_memory(), off.cuda(), cand,
                               None if scales is None else scales.pin_memory())
    assert torch.equal(on_device, pinned)


@pytest.mark.gpu
def test_tiers_on_the_gpu_answer_alike(tmp_path):
    rng = np.random.default_rng(7)
    words = rng.standard_normal((400, 128)).astype(np.float32)  # tokens near words, as real embeddings cluster

    def doc(n):
        x = words[rng.integers(0, 400, n)] + 0.35 * rng.standard_normal((n, 128)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    docs = [doc(int(rng.integers(4, 80))) for _ in range(3000)]
    qs = [d[:8] + 0.1 * rng.standard_normal((min(8, len(d)), 128)).astype(np.float32) for d in docs[:40]]
    path = tmp_path / "db"
    with mvdb.open(path, device="cuda", index="ivf", nlist=64, progress=False) as db:
        db.add(docs)
        want = [[h.id for h in r] for r in db.search(qs, k=10, exact=True)]
        device_default = [[h.id for h in r] for r in db.search(qs, k=10)]

    def recall(got):
        return np.mean([len({h.id for h in a} & set(b)) / 10 for a, b in zip(got, want)])

    for tier, bits in (("host", None), ("disk", None), ("host", 1)):
        with mvdb.open(path, device="cuda", residency=tier, progress=False, code_bits=bits) as db:
            assert db.stats()["tier"] == f"codes+{tier}" and db.stats()["codes_bits"] == (bits or 2)
            got = db.search(qs, k=10, n_candidates=3000, nprobe=64)  # pool and rerank cover the corpus
            assert [[h.id for h in r] for r in got] == want
            if bits is not None:
                continue
            # at the defaults: the codes' ranking loses little against the exact one
            r = recall(db.search(qs, k=10))
            assert r >= np.mean([len(set(a) & set(b)) / 10 for a, b in zip(device_default, want)]) - 0.02, r


def test_the_default_rate_follows_the_store_dtype(tmp_path):
    """fp16 stores take 2-bit codes, int8 stores 1-bit (a fifth of the int8 device tier's memory)."""
    rng = np.random.default_rng(9)
    for dtype, bits in (("float16", 2), ("int8", 1)):
        with mvdb.open(tmp_path / dtype, device="cpu", residency="host", index="ivf", nlist=8, dtype=dtype,
                       progress=False) as db:
            db.add(_docs(rng, 30))
            assert db.stats()["codes_bits"] == bits
