"""The IVF candidate-scoring kernel (mvdb.kernels.lists): Triton against the torch reference."""

import pytest
import torch

from mvdb.kernels.lists import credit_lists


def _lists(nlist, n_rows, max_len, g):
    rows, off = [], [0]
    for _ in range(nlist):
        r = torch.randperm(n_rows, generator=g)[: int(torch.randint(0, max_len + 1, (1,), generator=g))]
        rows.append(r.sort().values)
        off.append(off[-1] + r.numel())
    return torch.tensor(off), torch.cat(rows).int()


@pytest.mark.heavy
@pytest.mark.parametrize("n_rows,max_len,p", [(50, 20, 3), (3000, 2500, 2), (9, 9, 5)])
def test_credit_lists_triton_matches_torch(n_rows, max_len, p):
    g = torch.Generator().manual_seed(n_rows)
    nlist = 6
    lo, lr = _lists(nlist, n_rows, max_len, g)  # lists longer than a block, empty ones, shared rows
    cu = torch.tensor([0, 3, 8, 9, 9 + 2])
    t = int(cu[-1])
    probes = torch.stack([torch.randperm(nlist, generator=g)[:p] for _ in range(t)])
    gains = torch.rand(t, p, generator=g).sort(dim=1, descending=True).values
    gains[:, -1] = 0
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    args = (lo.to(dev), lr.to(dev), n_rows, probes.to(dev), gains.to(dev))
    for c in (cu, cu[1:], cu[2:4]):  # whole batch, and chunks starting mid-batch
        ref = credit_lists(*args, c.to(dev), backend="torch")
        got = credit_lists(*args, c.to(dev), backend="triton")
        assert got.shape == (c.numel() - 1, n_rows)
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)
    # the reference by hand for one query: per token the best probed list holding the row
    want = torch.zeros(n_rows)
    for tok in range(3):
        best = torch.zeros(n_rows)
        for j in range(p):
            c = probes[tok, j]
            rows = lr[lo[c] : lo[c + 1]].long()
            best[rows] = torch.maximum(best[rows], gains[tok, j].expand(rows.numel()))
        want += best
    torch.testing.assert_close(credit_lists(*args, cu[:2].to(dev), backend="triton")[0].cpu(), want)


def test_credit_lists_host_entries_match_the_tensor_ops():
    """On a CPU the entries are built from slices of the lists (entries of a gain of 0 left out);
    the scores are the hand reference's, and the tensor-op builder's, for the whole batch and for
    chunks starting mid-batch, with a token whose gains are all 0 and a query without tokens."""
    from mvdb.kernels.lists.naive import _credit_lists_torch, _entries_host, _entries_torch

    g = torch.Generator().manual_seed(7)
    n_rows, nlist, p = 300, 40, 4
    lo, lr = _lists(nlist, n_rows, 60, g)
    cu = torch.tensor([0, 5, 5, 9, 12])
    t = int(cu[-1])
    probes = torch.stack([torch.randperm(nlist, generator=g)[:p] for _ in range(t)])
    gains = torch.rand(t, p, generator=g).sort(dim=1, descending=True).values
    gains[:, -1] = 0
    gains[6] = 0
    for c in (cu, cu[1:], cu[3:]):
        got = _credit_lists_torch(lo, lr, n_rows, probes, gains, c)
        want = torch.zeros(c.numel() - 1, n_rows)
        for q in range(c.numel() - 1):
            for tok in range(int(c[q]), int(c[q + 1])):
                best = torch.zeros(n_rows)
                for j in range(p):
                    rows = lr[lo[probes[tok, j]] : lo[probes[tok, j] + 1]].long()
                    best[rows] = torch.maximum(best[rows], gains[tok, j].expand(rows.numel()))
                want[q] += best
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    k_host, v_host = _entries_host(lo, lr, n_rows, probes, gains)
    k_ops, v_ops = _entries_torch(lo, lr, n_rows, probes, gains)
    keep = v_ops > 0
    assert torch.equal(k_host, k_ops[keep]) and torch.equal(v_host, v_ops[keep])
    k, v = _entries_host(lo, lr, n_rows, probes, torch.zeros_like(gains))
    assert k.numel() == 0 and v.numel() == 0


@pytest.mark.parametrize("n,k", [(100, 16), (128 * 17, 16), (128 * 40 + 77, 16), (128 * 40, 1), (128 * 40, 64)])
def test_top_rows_is_topk(n, k):
    """The probes a CPU picks through blocks of centroids are torch.topk's, best first, with a
    partial last block and more probes than blocks."""
    from mvdb.engine.ivf import top_rows

    sim = torch.randn(9, n, generator=torch.Generator().manual_seed(n + k))
    sim[3, : min(n, 200)] = 5.0 - torch.arange(min(n, 200)) * 1e-3  # the best all in the first blocks
    v, i = top_rows(sim.T.contiguous(), k)
    rv, ri = sim.topk(k, dim=1)
    assert torch.equal(v, rv) and torch.equal(i, ri)


@pytest.mark.gpu  # 33,000 tokens take 75 s under the interpreter
def test_credit_lists_long_query():
    """A long query (more tokens than an int16 could count): a row is credited once per token,
    however many tokens each program's bitmap has served before."""
    dev = "cuda"
    t = 33_000
    lo, lr = torch.tensor([0, 2, 3]), torch.tensor([0, 1, 1], dtype=torch.int32)
    probes = torch.tensor([[0, 1]]).repeat(t, 1)
    gains = torch.tensor([[1.0, 0.0]]).repeat(t, 1)
    gains[-1] = torch.tensor([0.5, 0.25])
    got = credit_lists(lo.to(dev), lr.to(dev), 2, probes.to(dev), gains.to(dev), torch.tensor([0, t]).to(dev),
                       backend="triton")
    # fixed point: a gain of 1 is about 2**31 / t units; up to half a unit per token off: t / 2**32 (8e-6) relative
    torch.testing.assert_close(got.cpu(), torch.full((1, 2), t - 0.5), rtol=1e-5, atol=0)


@pytest.mark.heavy
@pytest.mark.parametrize("tokens_per_launch,block,p", [(1, 16, 3), (7, 32, 3), (100, 64, 3), (3, 32, 1)])
def test_credit_lists_fixed_launches_and_blocks(tokens_per_launch, block, p):
    """However many tokens a launch holds (its bitmaps re-zeroed between launches) and however
    the lists' dense rows fall into blocks (runs of rows sharing a bitmap word cut by a block's
    end), the fixed-point table is the reference's scores in the fixed point, and chunks starting
    mid-batch land in the right table rows."""
    from mvdb.kernels.lists import credit_lists_fixed, fixed_gains

    g = torch.Generator().manual_seed(block + p)
    n_rows, nlist = 200, 8
    lo, lr = _lists(nlist, n_rows, 150, g)
    cu = [0, 4, 9, 10, 16]
    t = cu[-1]
    probes = torch.stack([torch.randperm(nlist, generator=g)[:p] for _ in range(t)])
    gains = torch.rand(t, p, generator=g).sort(dim=1, descending=True).values
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    lo, lr, probes, gains = lo.to(dev), lr.to(dev), probes.to(dev), gains.to(dev)
    gq, scale = fixed_gains(gains, torch.tensor(cu))
    assert gq.dtype == torch.int32
    qid = torch.repeat_interleave(torch.arange(4, dtype=torch.int32), torch.tensor([4, 5, 1, 6])).to(dev)
    ref = credit_lists(lo, lr, n_rows, probes, gains, torch.tensor(cu).to(dev), backend="torch")
    words = (n_rows + 31) // 32
    got = credit_lists_fixed(lo, lr, n_rows, probes, gq, cu, qid, bitmap_bytes=4 * words * tokens_per_launch,
                             block=block)
    torch.testing.assert_close((got.double() / scale).float(), ref, rtol=0, atol=1e-6)
    # the largest possible score of a query (its tokens' best gains) fits int32 and uses most of it
    best = [int(gq[cu[i] : cu[i + 1]].amax(dim=1).long().sum()) for i in range(4)]
    assert 0.98 * 2**31 <= max(best) <= 2**31 - 1, best
    assert int(got.max()) > 2**29
    tail = credit_lists_fixed(lo, lr, n_rows, probes, gq, cu[2:], qid, q_base=2, block=block)
    assert torch.equal(tail, got[2:])


@pytest.mark.heavy
@pytest.mark.parametrize("n_rows,spans", [(200, 8), (1000, 4), (70, 16)])
def test_credit_lists_fixed_parts_give_the_same_table(n_rows, spans):
    """Rows split into spans, a program per (token, span): the same table for every number of
    parts, whether a span holds rows of a list or none (70 rows in 16 spans of 32: most empty), and
    list_bounds marks each list's entries per span."""
    from mvdb.kernels.lists import credit_lists_fixed, fixed_gains, list_bounds

    g = torch.Generator().manual_seed(n_rows)
    nlist, p = 8, 3
    lo, lr = _lists(nlist, n_rows, n_rows // 2, g)
    cu = [0, 4, 9, 10, 16]
    t = cu[-1]
    probes = torch.stack([torch.randperm(nlist, generator=g)[:p] for _ in range(t)])
    gains = torch.rand(t, p, generator=g).sort(dim=1, descending=True).values
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    lo, lr, probes, gains = lo.to(dev), lr.to(dev), probes.to(dev), gains.to(dev)
    gq, _ = fixed_gains(gains, torch.tensor(cu))
    qid = torch.repeat_interleave(torch.arange(4, dtype=torch.int32), torch.tensor([4, 5, 1, 6])).to(dev)
    bounds = list_bounds(lo, lr, n_rows, spans, chunk=97)  # chunks that cut lists
    span = max(32, -(-(-(-n_rows // spans)) // 32) * 32)  # rows per span: a multiple of 32, covering every row
    assert spans * span >= n_rows
    for c in range(nlist):
        rows = lr[lo[c] : lo[c + 1]].long().cpu()
        for s in range(spans + 1):
            assert int(bounds[c, s]) == int(lo[c]) + int((rows < s * span).sum()), (c, s)
    want = credit_lists_fixed(lo, lr, n_rows, probes, gq, cu, qid, block=32)
    for parts in sorted({2, spans // 2, spans} - {1}):
        got = credit_lists_fixed(lo, lr, n_rows, probes, gq, cu, qid, block=32, parts=parts, bounds=bounds)
        assert torch.equal(got, want), parts
    with pytest.raises(ValueError, match="multiple of 3 spans"):
        credit_lists_fixed(lo, lr, n_rows, probes, gq, cu, qid, parts=3, bounds=bounds)


def test_fixed_gains_bound_holds_for_any_gain_order():
    """The fixed-point scale bounds each query's sum of its tokens' largest gains, also where the
    gains are not in the promised order (40 tokens of gains [0, 1])."""
    from mvdb.kernels.lists import fixed_gains

    gains = torch.tensor([[0.0, 1.0]]).repeat(40, 1)
    gq, scale = fixed_gains(gains, torch.tensor([0, 40]))
    assert int(gq.amax(dim=1).long().sum()) <= 2**31 - 1
    assert float(scale) * 40 <= 2**31
    gq, _ = fixed_gains(gains[:0], torch.tensor([0]))  # an empty batch
    assert gq.shape == (0, 2)


def test_credit_lists_no_queries():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    lo, lr = torch.tensor([0, 2]).to(dev), torch.tensor([0, 1], dtype=torch.int32).to(dev)
    empty = torch.zeros(0, 1, dtype=torch.long, device=dev)
    for backend in ("torch", "triton"):
        got = credit_lists(lo, lr, 2, empty, empty.float(), torch.tensor([0]).to(dev), backend=backend)
        assert got.shape == (0, 2)


@pytest.mark.heavy
def test_candidates_triton_and_torch_agree():
    """Lists.candidates: the Triton path = the torch path, in one chunk and in chunks of one query
    (the table's first row is then a later query of the batch)."""
    from mvdb.engine.ivf import Lists

    g = torch.Generator().manual_seed(0)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cent = torch.nn.functional.normalize(torch.randn(16, 8, generator=g), dim=1)
    lens = torch.randint(1, 20, (100,), generator=g)
    off = torch.zeros(101, dtype=torch.long)
    off[1:] = lens.cumsum(0)
    tok = torch.nn.functional.normalize(torch.randn(int(off[-1]), 8, generator=g), dim=1)
    off, tok = off.to(dev), tok.to(dev)
    empty = Lists.empty(cent, {"id": "t", "trained_tokens": 1}, dev)
    lists = empty.with_rows(empty.assign(tok.half(), None), off)
    q = torch.nn.functional.normalize(torch.randn(10, 8, generator=g), dim=1).to(dev)
    live = torch.ones(100, dtype=torch.bool, device=dev)
    live[7] = False
    for cu in ([0, 4, 10], [0, 10], [0, 3, 4, 10]):
        a = lists.candidates(q, cu, live, 30, 4, backend="torch")
        b = lists.candidates(q, cu, live, 30, 4, backend="triton")
        c = lists.candidates(q, cu, live, 30, 4, backend="triton", scratch_bytes=1)
        assert torch.equal(a.sort(1).values, b.sort(1).values)
        assert torch.equal(b, c)
        assert not (a == 7).any()


def test_lists_grown_in_pieces_equal_lists_built_at_once():
    """Lists.with_rows merges new rows into every list (old entries keep their order)."""
    from mvdb.engine.ivf import Lists

    g = torch.Generator().manual_seed(1)
    cent = torch.nn.functional.normalize(torch.randn(13, 8, generator=g), dim=1)
    lens = torch.randint(1, 30, (90,), generator=g)
    off = torch.zeros(91, dtype=torch.long)
    off[1:] = lens.cumsum(0)
    codes = torch.randint(0, 13, (int(off[-1]),), generator=g, dtype=torch.int32)
    empty = Lists.empty(cent, {"id": "t", "trained_tokens": 1}, torch.device("cpu"))
    whole = empty.with_rows(codes, off)
    grown = empty
    for a, b in ((0, 1), (1, 40), (40, 41), (41, 90)):
        grown = grown.with_rows(codes[off[a] : off[b]], off[a : b + 1] - off[a])
    assert grown.n_rows == whole.n_rows == 90 and grown.ntotal == whole.ntotal
    assert torch.equal(grown.list_offsets, whole.list_offsets)
    assert torch.equal(grown.list_rows, whole.list_rows)
    # every list holds exactly the rows with a token coded to it, ascending
    for c in range(13):
        rows = whole.list_rows[whole.list_offsets[c] : whole.list_offsets[c + 1]].tolist()
        want = sorted({r for r in range(90) if (codes[off[r] : off[r + 1]] == c).any()})
        assert rows == want


def _cpu_lists(seed=2, n_rows=60, nlist=12, dim=8):
    from mvdb.engine.ivf import Lists

    g = torch.Generator().manual_seed(seed)
    cent = torch.nn.functional.normalize(torch.randn(nlist, dim, generator=g), dim=1)
    lens = torch.randint(0, 25, (n_rows,), generator=g)  # some rows without tokens
    off = torch.zeros(n_rows + 1, dtype=torch.long)
    off[1:] = lens.cumsum(0)
    codes = torch.randint(0, nlist, (int(off[-1]),), generator=g, dtype=torch.int32)
    return Lists.empty(cent, {"id": "t", "trained_tokens": 1}, torch.device("cpu")), codes, off, g


def test_cpu_lists_keep_every_tokens_list_through_adds():
    """On a CPU the lists keep each token's list and each row's first token (what the centroid
    interaction reads): grown in pieces as built at once, and two indexes grown from one base
    (an add that was not published, then another) each read their own rows."""
    empty, codes, off, _ = _cpu_lists()
    whole = empty.with_rows(codes, off)
    assert torch.equal(whole.token_lists[0], codes) and torch.equal(whole.token_lists[1], off)
    grown = empty
    for a, b in ((0, 1), (1, 30), (30, 31), (31, 60)):
        grown = grown.with_rows(codes[off[a] : off[b]], off[a : b + 1] - off[a])
    assert torch.equal(grown.token_lists[0], codes) and torch.equal(grown.token_lists[1], off)
    base = empty.with_rows(codes[: off[30]], off[:31])
    left = base.with_rows(codes[off[30] :], off[30:] - off[30])
    other = torch.randint(0, 12, (7,), dtype=torch.int32)
    right = base.with_rows(other, torch.tensor([0, 3, 7]))
    assert torch.equal(left.token_lists[0], codes) and torch.equal(left.token_lists[1], off)
    assert torch.equal(right.token_lists[0], torch.cat([codes[: off[30]], other]))
    assert right.token_lists[1].tolist() == off[:31].tolist() + [int(off[30]) + 3, int(off[30]) + 7]
    assert torch.equal(base.token_lists[0], codes[: off[30]])


def test_interaction_is_the_centroid_interaction():
    """interaction(): per query token the best centroid among the row's tokens' lists, summed;
    the soft maximum lies within log(tokens) / SHARPNESS above the hard one per query token. A
    row without tokens scores 0, padding (-1) -inf."""
    from mvdb.engine import ivf

    empty, codes, off, g = _cpu_lists()
    lists = empty.with_rows(codes, off)
    sim = torch.rand(5, 12, generator=g) * 0.6 + 0.2  # within SOFT_FLOOR of each token's best
    rows = torch.tensor([3, -1, 0, 59, 17, 3])
    got = ivf.interaction(sim.T, rows, *lists.token_lists)
    for i, r in enumerate(rows.tolist()):
        if r < 0:
            assert got[i] == float("-inf")
            continue
        own = codes[off[r] : off[r + 1]].long()
        if not own.numel():
            assert got[i] == 0
            continue
        hard = float(sim[:, own].amax(dim=1).sum())
        slack = 5 * torch.log(torch.tensor(float(own.numel()))) / ivf.SHARPNESS
        assert hard - 1e-4 <= float(got[i]) <= hard + float(slack) + 1e-4


def test_cpu_candidates_rank_a_wider_pool_by_interaction():
    """Lists.candidates(pool=) on a CPU: the lists' best ``pool`` rows, the best n of them by
    interaction(); dead rows never come back; a pool covering every row returns every live one."""
    from mvdb.engine import ivf

    empty, codes, off, g = _cpu_lists(n_rows=80)
    lists = empty.with_rows(codes, off)
    q = torch.nn.functional.normalize(torch.randn(7, 8, generator=g), dim=1)
    cu = [0, 3, 7]
    live = torch.ones(80, dtype=torch.bool)
    live[[5, 6, 40]] = False
    wide = lists.candidates(q, cu, live, 30, 4, ordered=False)
    narrow = lists.candidates(q, cu, live, 10, 4, ordered=True, pool=30)
    for i in range(2):
        sim = q[cu[i] : cu[i + 1]] @ lists.centroids.T
        pool = wide[i][wide[i] >= 0]
        want = pool[ivf.interaction(sim.T, pool, *lists.token_lists).topk(10).indices]
        assert narrow[i].tolist() == want.tolist()
    everything = lists.candidates(q, cu, live, 77, 2, ordered=False, pool=10**6)
    for row in everything:
        assert sorted(row.tolist()) == [r for r in range(80) if live[r]]


def test_cpu_candidates_take_each_querys_own_width():
    """Lists.candidates(widths=) on a CPU: query i gets its best widths[i] rows by interaction
    (the same rows as a search of that width alone), -1 past them."""
    empty, codes, off, g = _cpu_lists(n_rows=80)
    lists = empty.with_rows(codes, off)
    q = torch.nn.functional.normalize(torch.randn(7, 8, generator=g), dim=1)
    cu = [0, 3, 7]
    live = torch.ones(80, dtype=torch.bool)
    got = lists.candidates(q, cu, live, 20, 4, ordered=True, pool=80, widths=[20, 6])
    assert got.shape == (2, 20)
    assert (got[0] >= 0).all() and (got[1, :6] >= 0).all() and (got[1, 6:] == -1).all()
    for i, w in enumerate([20, 6]):
        alone = lists.candidates(q[cu[i] : cu[i + 1]], [0, cu[i + 1] - cu[i]], live, w, 4, ordered=True, pool=80 * w // 20)
        assert got[i, :w].tolist() == alone[0].tolist()


def test_cpu_default_width_follows_the_query_length(tmp_path, monkeypatch):
    """At the defaults a CPU hands a short query more candidates than a long one (cpu_widths);
    an explicit n_candidates is the same for every query."""
    import mvdb
    from mvdb.engine import search

    assert search.cpu_widths(1024, [0, 32]) == [1024]
    w = search.cpu_widths(1024, [0, 1, 5, 13, 45, 109, 1109])
    assert w == sorted(w, reverse=True) and w[0] == 4096 and w[-1] == 512 and all(x % 64 == 0 for x in w)
    monkeypatch.setattr(search, "CPU_LISTS_CANDIDATES", 64)
    g = torch.Generator().manual_seed(3)
    docs = [torch.randn(int(n), 16, generator=g) for n in torch.randint(2, 12, (400,), generator=g)]
    short, long = torch.randn(4, 16, generator=g), torch.randn(64, 16, generator=g)
    with mvdb.open(tmp_path / "db", device="cpu", index="ivf", nlist=16, progress=False) as db:
        db.add(docs)
        got = db.candidates([short, long], k=2)
        assert [len(c) for c in got] == search.cpu_widths(64, [0, 4, 68])
        assert len(got[0]) > len(got[1])
        assert [len(c) for c in db.candidates([short, long], k=2, n_candidates=100)] == [100, 100]
