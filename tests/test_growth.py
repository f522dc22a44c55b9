"""Growing a database through many adds (issue #13): resident pages, index maintenance, the
recorded index kind. Scores are checked against a database built in one add."""

import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import mvdb
from mvdb.engine import resident

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_database import SMALL_POOL, _corpus, _exhaustive, _query  # noqa: E402

DIM = 32


@pytest.fixture
def small_pages(monkeypatch):
    """Pages sized by the growth rule alone (no 4 MB floor), so small corpora get many."""
    monkeypatch.setattr(resident, "MIN_PAGE_BYTES", 0)


@pytest.mark.heavy
@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_many_adds_score_like_one_add(tmp_path, dtype, small_pages):
    docs = _corpus(90, seed=31)
    rng = np.random.default_rng(32)
    queries = [_query(docs[i], rng) for i in range(0, 90, 23)]
    kw = dict(k=6, n_candidates=40, k_tokens=512)
    with mvdb.open(tmp_path / "one", dtype=dtype, index="flat") as one:
        one.add(docs)
        want = one.search(queries, **kw)
    with mvdb.open(tmp_path / "grown", dtype=dtype, index="flat") as grown:
        for a in range(0, 90, 7):
            grown.add(docs[a : a + 7], ids=list(range(a, min(90, a + 7))))
        st = grown.stats()
        assert st["pages"] > 3, st  # the kernel reads several pages in one launch
        got = grown.search(queries, **kw)
        assert [[h.id for h in r] for r in got] == [[h.id for h in r] for r in want]
        for r, w in zip(got, want):
            assert [h.score for h in r] == pytest.approx([h.score for h in w], rel=1e-6)
        # rerank reads the same pages
        rr = grown.rerank(queries[0], [h.id for h in want[0]])
        assert [h.id for h in rr] == [h.id for h in want[0]]
    with mvdb.open(tmp_path / "grown") as again:  # reopened: one page again, same answers
        assert again.stats()["pages"] == 1
        assert again.search(queries, **kw) == got


@pytest.mark.heavy
def test_resident_capacity_grows_logarithmically(tmp_path, small_pages):
    docs = _corpus(40, seed=33)
    rng = np.random.default_rng(34)
    with mvdb.open(tmp_path / "db", index="flat") as db:
        db.add(docs)
        first_pages = db.stats()["pages"]
        n_adds = 400
        for i in range(n_adds):
            db.add([docs[i % 40][: int(rng.integers(1, 8))]])
        st = db.stats()
        allocations = st["page_allocations"]
        # geometric growth: about log_{1 + GROWTH}(final / first) new pages, never one per add
        bound = math.log(st["tokens"] / 400) / math.log(1 + resident.GROWTH) + 3
        assert first_pages == 1 and allocations <= bound, (allocations, bound)
        # and never much more memory than the tokens need
        assert st["resident_capacity_bytes"] <= (1 + resident.GROWTH) * st["resident_bytes"] + 64 * DIM * 2


def test_page_starts_are_whole_rows_from_the_first_page(tmp_path, small_pages):
    """Every page sits a whole number of rows from page 0 (so one kernel launch reads all of
    them); odd dims included."""
    for dim, int8 in ((32, False), (48, False), (100, False), (100, True)):
        r = resident.Resident(dim, int8, torch.device("cpu"), torch.device("cpu"))
        rng = np.random.default_rng(dim)
        for step in range(6):
            lengths = rng.integers(1, 9, size=5)
            tok = torch.randn(int(lengths.sum()), dim)

            def loader(pieces, tok=tok):
                at = 0
                for t, s in pieces:
                    n = t.shape[0]
                    t.copy_(tok[at : at + n].to(t.dtype))
                    if s is not None:
                        s.fill_(1.0)
                    at += n

            view = r.load(loader, lengths)
        base = view.pages[0].tokens
        row_bytes = dim * base.element_size()
        for p in view.pages:
            assert (p.tokens.data_ptr() - base.data_ptr()) == p.row * row_bytes
            if int8:
                assert (p.scales.data_ptr() - view.pages[0].scales.data_ptr()) == 4 * p.scale_row
        # the start rows address each document's first token
        off = view.host_offsets
        for row in range(view.n_rows):
            a = int(off[row])
            page = max(i for i, p in enumerate(view.pages) if p.first <= a)
            assert int(view.starts[row]) == view.pages[page].row + a - view.pages[page].first


@pytest.mark.heavy
def test_ivf_grown_in_many_adds_keeps_its_recall(tmp_path):
    """40 adds of a topic corpus into an IVF database reach the one-add build's recall@10 (within
    0.02), before and after reopening: the index is retrained as the corpus grows (list-count steps, 4x growth)."""
    from mvdb.testing.synthetic import make_corpus, make_queries

    c = make_corpus(2000, 12, 28, DIM, vocab=3000, n_topics=60, dtype=torch.float32, device="cpu", seed=5)
    queries, _ = make_queries(c, 20, 8, seed=6)
    docs = [x.numpy() for x in torch.split(c.tokens, c.lengths.tolist())]

    def recall(db, want):
        got = db.search(queries, k=10, nprobe=8, n_candidates=100)
        return float(np.mean([len({h.id for h in g} & set(w)) / 10 for g, w in zip(got, want)]))

    with mvdb.open(tmp_path / "one", index="ivf") as one:
        one.add(docs)
        want = [_exhaustive(one, q.numpy(), 10) for q in queries]
        r_one = recall(one, want)
        nlist_one = one.stats()["nlist"]
    with mvdb.open(tmp_path / "grown", index="ivf") as grown:
        for a in range(0, 2000, 50):
            grown.add(docs[a : a + 50])
        r_grown = recall(grown, want)
        st = grown.stats()
        assert st["trained_tokens"] * mvdb.engine.ivf.RETRAIN_GROWTH >= st["tokens"]
        assert st["nlist"] >= nlist_one // 2
    with mvdb.open(tmp_path / "grown", read_only=True) as again:
        assert again.stats()["index"] == "ivf"
        r_again = recall(again, want)
    assert r_grown >= r_one - 0.02 and r_again >= r_one - 0.02, (r_one, r_grown, r_again)


def test_index_kind_is_recorded(tmp_path):
    """Reopened without index arguments, a database uses the index it was built with (its persisted
    lists: with them choosing 8 of the 60 documents reranked, the same answers); one asked for
    another kind warns, and a writer records the new choice."""
    docs = _corpus(60, seed=35)
    rng = np.random.default_rng(36)
    qs = [_query(docs[i], rng) for i in (5, 22, 39, 56)]
    with mvdb.open(tmp_path / "db", index="ivf", nlist=32) as db:
        db.add(docs)
        want = db.search(qs, k=3, **SMALL_POOL)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no argument: no warning, the recorded choice
        with mvdb.open(tmp_path / "db") as db:
            assert db.stats()["index"] == "ivf" and db.stats()["nlist"] == 32
            assert db.search(qs, k=3, **SMALL_POOL) == want
        with mvdb.open(tmp_path / "db", index="ivf") as db:  # the same choice again: fine
            assert db.stats()["index"] == "ivf"
    with pytest.warns(UserWarning, match=r"index='flat' asked for; the database was built with index='ivf'"):
        with mvdb.open(tmp_path / "db", read_only=True, index="flat") as db:
            assert db.stats()["index"] == "flat"  # honoured for this handle
    with mvdb.open(tmp_path / "db") as db:  # a reader records nothing
        assert db.stats()["index"] == "ivf"
    with pytest.warns(UserWarning, match="and recording it"):
        with mvdb.open(tmp_path / "db", index="flat") as db:
            assert db.stats()["index"] == "flat"
    with mvdb.open(tmp_path / "db") as db:
        assert db.stats()["index"] == "flat" and db.stats()["index_config"] == {"kind": "flat", "nlist": 32}


def test_new_database_records_its_choice_without_warning(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with mvdb.open(tmp_path / "db", dim=DIM, index="ivf", nlist=4) as db:
            assert db.stats()["index_config"] == {"kind": "ivf", "nlist": 4}
        with mvdb.open(tmp_path / "db") as db:
            db.add(_corpus(30, seed=37))
            assert db.stats()["index"] == "ivf" and db.stats()["nlist"] == 4


@pytest.mark.heavy
def test_cpu_flat_index_is_filled_on_first_use(tmp_path):
    """On a CPU, opening a flat ("auto", small) database copies no tokens into the token index:
    default searches (and nprobe or a sparse channel, which an exhaustive search covers) score
    every document exactly; the first search given the flat index's own options fills it, a later
    one adds only what an add brought, and every view answers as an eagerly built index does."""
    from mvdb.engine.flat import build_flat

    docs = _corpus(120, seed=43)
    rng = np.random.default_rng(44)
    qs = [_query(docs[i], rng) for i in (3, 50, 90)]
    with mvdb.open(tmp_path / "db", device="cpu") as db:
        db.add(docs[:60])
    with mvdb.open(tmp_path / "db", device="cpu") as db:
        flat = db._engine.flat
        assert db.stats()["index"] == "flat" and flat.ntotal == 0 and db.stats()["index_tokens"] == 0
        exact = db.search(qs, k=5)
        assert exact == db.search(qs, k=5, exact=True) == db.search(qs, k=5, nprobe=4)
        assert db.search(qs[0], k=5, sparse={1: 1.0}) == exact[0]
        assert flat.ntotal == 0  # none of these used the token index

        def same_as_eager(st):
            eager = build_flat(st.tokens, torch.device("cpu"))
            for q in qs:
                sims, pos = st.index.search(torch.from_numpy(q), 8)
                want_sims, want_pos = eager.search(torch.from_numpy(q), 8)
                assert torch.equal(pos, want_pos) and torch.allclose(sims, want_sims)

        old = db._engine.state
        db.search(qs, k=5, k_tokens=64)
        assert flat.ntotal == old.tokens.n_tokens == db.stats()["index_tokens"]
        db.add(docs[60:])
        assert flat.ntotal == old.tokens.n_tokens  # the add copied nothing into it
        new = db._engine.state
        got = db.search(qs, k=5, k_tokens=64, n_candidates=40)
        assert flat.ntotal == new.tokens.n_tokens > old.tokens.n_tokens  # only the added tokens
        assert [h[0].id for h in got] == [3, 50, 90]
        same_as_eager(new)
        # a view from before the add sees only its own tokens: the shared index's answer with the
        # later tokens masked (as during a concurrent add)
        eager = build_flat(new.tokens, torch.device("cpu"))
        for q in qs:
            pos, want = old.index.search(torch.from_numpy(q), 8)[1], eager.search(torch.from_numpy(q), 8)[1]
            assert torch.equal(pos, want.masked_fill(want >= old.tokens.n_tokens, -1))
