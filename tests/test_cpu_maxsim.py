"""The CPU's candidate MaxSim (mvdb.kernels.maxsim.cpu) against the float64 reference: float16,
float32 and int8 stores, documents of every length (none, one, longer than a block), padding
candidates, queries sharing candidates, queries without tokens, paged starts."""

import zlib

import pytest
import torch

from mvdb.kernels import maxsim_candidates, quantize_int8
from mvdb.kernels.maxsim import cpu, naive, ops


def _case(seed: int, n_docs: int = 60, dim: int = 16, dtype=torch.float16):
    g = torch.Generator().manual_seed(zlib.crc32(repr((seed, n_docs, dim, dtype)).encode()))
    lens = torch.randint(1, 40, (n_docs,), generator=g)
    lens[3] = 0
    lens[5] = 1
    lens[7] = 150  # longer than one block at the tests' block size
    off = torch.zeros(n_docs + 1, dtype=torch.int64)
    off[1:] = lens.cumsum(0)
    tok = torch.nn.functional.normalize(torch.randn(int(off[-1]), dim, generator=g), dim=-1)
    q_lens = [5, 0, 9, 3]
    q = torch.nn.functional.normalize(torch.randn(sum(q_lens), dim, generator=g), dim=-1)
    cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    cand = torch.stack([torch.randperm(n_docs, generator=g)[:24] for _ in q_lens])
    cand[0, :4] = -1
    cand[2, :3] = torch.tensor([3, 5, 7])
    cand[3] = cand[2]  # the same candidates: scored in one group
    if dtype == torch.int8:
        t8, sc = quantize_int8(tok)
        return q, cu, t8, off, cand, sc
    return q, cu, tok.to(dtype), off, cand, None


def _reference(q, cu, tok, off, cand, sc=None):
    """The float64 reference of the same scores (cand None: every document)."""
    return naive.maxsim_csr(q.double(), cu, tok if tok.dtype == torch.int8 else tok.double(), off, cand, sc,
                            dtype=torch.float64)


def _close(got, ref, atol=1e-5):
    assert got.dtype == torch.float32 and got.shape == ref.shape
    assert torch.equal(torch.isneginf(got), torch.isneginf(ref))  # the padding candidates
    fin = ~torch.isneginf(ref)
    assert torch.allclose(got[fin].double(), ref[fin].double(), atol=atol, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.int8])
@pytest.mark.parametrize("block", [16, 1 << 14])
@pytest.mark.parametrize("narrow", [0, 1000])  # every GEMM one way round, then the other
def test_equals_reference(dtype, block, narrow, monkeypatch):
    monkeypatch.setattr(cpu, "NARROW_QUERY", narrow)
    q, cu, tok, off, cand, sc = _case(1, dtype=dtype)
    ref = naive.maxsim_csr(q.double(), cu, tok if dtype == torch.int8 else tok.double(), off, cand, sc,
                           dtype=torch.float64)
    got = cpu.score_candidates(q, cu, tok, off, cand, sc, block_tokens=block)
    assert got.dtype == torch.float32 and got.shape == cand.shape
    pad = cand < 0
    assert torch.isneginf(got[pad]).all()
    assert torch.allclose(got[~pad].double(), ref[~pad].double(), atol=1e-5, rtol=1e-5)
    assert (got[1][~pad[1]] == 0).all()  # a query without tokens scores 0
    assert got[2, 0] == 0  # a document without tokens scores 0


def test_starts_read_rows_elsewhere():
    q, cu, tok, off, cand, _ = _case(2, dtype=torch.float32)
    shift = 11
    moved = torch.cat([torch.randn(shift, tok.shape[1]), tok])  # every document 11 rows further on
    got = cpu.score_candidates(q, cu, moved, off, cand, starts=off[:-1] + shift)
    _close(got, _reference(q, cu, tok, off, cand))


def test_rows_that_are_not_whole_words():
    """dim 3 in float16 (6 bytes a row) and a strided view: gathered as they are, same scores."""
    q, cu, tok, off, cand, _ = _case(3, dim=3, dtype=torch.float32)
    _close(cpu.score_candidates(q, cu, tok.half(), off, cand), _reference(q, cu, tok.half(), off, cand))
    wide = torch.cat([tok, torch.zeros_like(tok)], dim=1)[:, :3]  # row stride 6: not contiguous
    _close(cpu.score_candidates(q, cu, wide, off, cand), _reference(q, cu, tok, off, cand))


def _spy(monkeypatch, name: str) -> list:
    """Outside the Triton interpreter (the tests run under it), count the calls of cpu.<name>."""
    monkeypatch.setattr(ops, "interpreting", lambda: False)
    calls, real = [], getattr(cpu, name)
    monkeypatch.setattr(cpu, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def test_maxsim_candidates_takes_this_path_on_a_cpu(monkeypatch):
    calls = _spy(monkeypatch, "score_candidates")
    q, cu, tok, off, cand, _ = _case(4)
    got = maxsim_candidates(q, cu, tok, off, cand)
    assert calls == [1]
    _close(got, _reference(q, cu, tok, off, cand))


def test_database_search_on_this_path(tmp_path, monkeypatch):
    """A CPU database's IVF search reranks through this path and finds what exhaustive MaxSim finds
    where the candidates cover the corpus."""
    import mvdb

    g = torch.Generator().manual_seed(5)
    docs = [torch.randn(int(n), 16, generator=g) for n in torch.randint(1, 30, (300,), generator=g)]
    queries = torch.randn(6, 8, 16, generator=g)
    with mvdb.open(tmp_path / "db", device="cpu", index="ivf", nlist=16, progress=False) as db:
        ids = db.add(docs)
        calls = _spy(monkeypatch, "score_candidates")
        got = db.search(queries, k=5, nprobe=16, n_candidates=300)
        exact = db.search(queries, k=5, exact=True)
    assert calls
    for g_hits, e_hits in zip(got, exact):
        assert [h.id for h in g_hits] == [h.id for h in e_hits]
        assert [h.score for h in g_hits] == pytest.approx([h.score for h in e_hits], abs=1e-2)
    assert set(ids) >= {h.id for hits in got for h in hits}


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.int8])
def test_score_all_equals_reference(dtype):
    q, cu, tok, off, _, sc = _case(6, dtype=dtype)
    ref = naive.maxsim_csr(q.double(), cu, tok if dtype == torch.int8 else tok.double(), off, None, sc,
                           dtype=torch.float64)
    for budget in (1 << 24, 20):  # one step, and steps of a few documents
        got = cpu.score_all(q, cu, tok, off, sc, budget=budget, block_tokens=64)
        assert got.shape == ref.shape and torch.allclose(got.double(), ref.double(), atol=1e-5, rtol=1e-5)
    assert (got[1] == 0).all() and (got[:, 3] == 0).all()  # no query tokens / no document tokens: 0


def test_maxsim_varlen_takes_score_all_on_a_cpu(monkeypatch):
    from mvdb.kernels import maxsim_varlen

    calls = _spy(monkeypatch, "score_all")
    q, cu, tok, off, _, _ = _case(7)
    got = maxsim_varlen(q, cu, tok, off.int())
    assert calls == [1]
    _close(got, _reference(q, cu, tok, off, None))


def test_query_groups_share_a_gemm_only_where_candidates_overlap():
    """A CPU scores two queries together only when their union costs at most GROUP_SLACK times
    each alone: disjoint candidates stay apart (at slack 2 they would double the work) and the same
    candidates share one GEMM (test_equals_reference holds the scores of both cases)."""
    disjoint = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]])
    same = torch.tensor([[0, 1, 2, 3], [3, 2, 1, 0]])
    assert list(naive.query_groups(disjoint, [5, 5], slack=cpu.GROUP_SLACK)) == [(0, 1), (1, 2)]
    assert list(naive.query_groups(disjoint, [5, 5], slack=2.0)) == [(0, 2)]
    assert list(naive.query_groups(same, [5, 5], slack=cpu.GROUP_SLACK)) == [(0, 2)]
