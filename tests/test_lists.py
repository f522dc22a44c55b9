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


def test_credit_lists_refuses_overlong_queries():
    lo, lr = torch.tensor([0, 1]), torch.tensor([0], dtype=torch.int32)
    with pytest.raises(ValueError, match="at most 32767 tokens, got 40000"):
        credit_lists(lo, lr, 1, torch.zeros(40000, 1, dtype=torch.int64), torch.zeros(40000, 1),
                     torch.tensor([0, 40000]), backend="triton")


def test_candidates_triton_and_torch_agree():
    """CentroidLists.candidates: the Triton path (token groups for small batches) = the torch path."""
    from mvdb.index import CentroidLists

    g = torch.Generator().manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cent = torch.nn.functional.normalize(torch.randn(16, 8, generator=g), dim=1)
    lens = torch.randint(1, 20, (100,), generator=g)
    off = torch.zeros(101, dtype=torch.long)
    off[1:] = lens.cumsum(0)
    tok = torch.nn.functional.normalize(torch.randn(int(off[-1]), 8, generator=g), dim=1)
    off, tok = off.to(dev), tok.to(dev)
    lists = CentroidLists(cent, torch.zeros(0, dtype=torch.int32), off[:1])
    lists.add(lists.assign(tok.half(), None), off)
    q = torch.nn.functional.normalize(torch.randn(10, 8, generator=g), dim=1).to(dev)
    live = torch.ones(100, dtype=torch.bool, device=dev)
    live[7] = False
    for cu in (torch.tensor([0, 4, 10], device=dev), torch.tensor([0, 10], device=dev)):
        a = lists.candidates(q, cu, live, 30, backend="torch")
        b = lists.candidates(q, cu, live, 30, backend="triton")
        assert torch.equal(a.sort(1).values, b.sort(1).values)
        assert not (a == 7).any()
