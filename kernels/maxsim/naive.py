"""Pure-torch MaxSim references: the CPU fallback and the tests' ground truth.

score(q, d) = sum_i max_j <q_i, d_j>, over valid query tokens i and valid doc tokens j; a document
with no valid token scores 0; a padding candidate (-1) scores -inf. Work is chunked so that the
similarity tile never holds more than ``budget`` elements, whatever the batch.
"""

from __future__ import annotations

import torch

from mvdb.kernels.quant import dequantize_int8, quantize_int8

DEFAULT_BUDGET = 1 << 24  # elements of the similarity tile per chunk (64 MB in fp32)
GATHER_COST = 8  # see maxsim_csr's candidate path (measured about 6 on a 2-core CPU)


def _compute_dtype(dtype: torch.dtype | None, ref: torch.dtype) -> torch.dtype:
    if dtype is not None:
        return dtype
    return torch.float64 if ref == torch.float64 else torch.float32


def _queries_for(q: torch.Tensor, int8_docs: bool, dtype: torch.dtype) -> torch.Tensor:
    """Queries as the kernel sees them: quantized per token when the docs are int8."""
    if int8_docs:
        qq, qs = quantize_int8(q)
        return dequantize_int8(qq, qs).to(dtype)
    return q.to(dtype)


def _docs_for(d: torch.Tensor, scales: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    if d.dtype == torch.int8:
        return dequantize_int8(d, scales).to(dtype)
    return d.to(dtype)


def _reduce(sim: torch.Tensor, col_ok: torch.Tensor) -> torch.Tensor:
    """Max over the last axis among valid columns; -inf (no valid column) becomes 0.

    sim: [..., Lq, Ld]; col_ok broadcastable to [..., 1, Ld].
    """
    if sim.shape[-1] == 0:
        return sim.new_zeros(sim.shape[:-1])
    sim = sim.masked_fill(~col_ok, float("-inf"))
    best = sim.amax(dim=-1)
    return torch.where(torch.isinf(best), torch.zeros_like(best), best)


def maxsim_padded(
    Q: torch.Tensor,
    D: torch.Tensor,
    q_mask: torch.Tensor | None = None,
    d_mask: torch.Tensor | None = None,
    d_scales: torch.Tensor | None = None,
    *,
    dtype: torch.dtype | None = None,
    budget: int | None = None,
) -> torch.Tensor:
    """Q [Nq, Lq, d]; D [Nd, Ld, d] -> [Nq, Nd] or D [Nq, K, Ld, d] -> [Nq, K]."""
    budget = DEFAULT_BUDGET if budget is None else budget
    ct = _compute_dtype(dtype, Q.dtype)
    nq, lq, _ = Q.shape
    per_query = D.dim() == 4
    ld = D.shape[-2]
    q = _queries_for(Q, D.dtype == torch.int8, ct)  # [Nq, Lq, d]
    q_ok = q_mask if q_mask is not None else torch.ones(nq, lq, dtype=torch.bool, device=Q.device)
    n_cols = D.shape[1] if per_query else D.shape[0]
    out = torch.empty(nq, n_cols, dtype=torch.float32, device=Q.device)
    if nq == 0 or n_cols == 0:
        return out
    step = max(1, budget // max(1, lq * ld * (1 if per_query else nq)))
    for c0 in range(0, n_cols, step):
        c1 = min(n_cols, c0 + step)
        if per_query:
            d = _docs_for(D[:, c0:c1], None if d_scales is None else d_scales[:, c0:c1], ct)
            ok = d_mask[:, c0:c1] if d_mask is not None else torch.ones(d.shape[:-1], dtype=torch.bool, device=d.device)
            sim = torch.einsum("qid,qkjd->qkij", q, d)  # [Nq, C, Lq, Ld]
            best = _reduce(sim, ok[:, :, None, :])  # [Nq, C, Lq]
            out[:, c0:c1] = (best * q_ok[:, None, :]).sum(-1).float()
        else:
            d = _docs_for(D[c0:c1], None if d_scales is None else d_scales[c0:c1], ct)
            ok = d_mask[c0:c1] if d_mask is not None else torch.ones(d.shape[:-1], dtype=torch.bool, device=d.device)
            sim = torch.einsum("qid,njd->qnij", q, d)  # [Nq, C, Lq, Ld]
            best = _reduce(sim, ok[None, :, None, :])
            out[:, c0:c1] = (best * q_ok[:, None, :]).sum(-1).float()
    return out


def _best_per_token(qv, tokens, scales, starts, lens, ct) -> torch.Tensor:
    """For documents starts[c]:starts[c]+lens[c]: best similarity of each query row -> [Lq, C] (0 if empty)."""
    c = lens.numel()
    total = int(lens.sum())
    base = torch.zeros_like(lens)
    base[1:] = lens.cumsum(0)[:-1]
    s0 = int(starts[0]) if c else 0
    if c and bool((starts - base == s0).all()):  # consecutive documents: a view, no gather
        d = _docs_for(tokens[s0 : s0 + total], None if scales is None else scales[s0 : s0 + total], ct)
    else:
        idx = torch.repeat_interleave(starts - base, lens) + torch.arange(total, device=lens.device)
        d = _docs_for(tokens[idx], None if scales is None else scales[idx], ct)  # [S, d]
    sim = qv @ d.T  # [Lq, S]
    owner = torch.repeat_interleave(torch.arange(c, device=lens.device), lens)
    best = torch.full((qv.shape[0], c), float("-inf"), dtype=ct, device=qv.device)
    best.scatter_reduce_(1, owner[None].expand(qv.shape[0], -1), sim, "amax")
    return torch.where(torch.isinf(best), torch.zeros_like(best), best)


def _chunks(lens: torch.Tensor, rows: int, budget: int):
    """Split documents into runs whose similarity tile (rows x their tokens) fits the budget."""
    cum = lens.cumsum(0).tolist()
    start, used = 0, 0
    for i, end in enumerate(cum):
        if i > start and (end - used) * rows > budget:
            yield start, i
            start, used = i, cum[i - 1]
    if start < len(cum):
        yield start, len(cum)


def maxsim_csr(
    q: torch.Tensor,
    cu_q: torch.Tensor,
    tokens: torch.Tensor,
    offsets: torch.Tensor,
    cand: torch.Tensor | None = None,
    scales: torch.Tensor | None = None,
    *,
    dtype: torch.dtype | None = None,
    budget: int | None = None,
) -> torch.Tensor:
    """Packed queries vs a CSR store: every document ([Nq, n_docs]) or per-query ``cand`` ([Nq, K])."""
    budget = DEFAULT_BUDGET if budget is None else budget
    ct = _compute_dtype(dtype, q.dtype)
    cu_q = cu_q.long()
    offsets = offsets.long()
    nq = cu_q.numel() - 1
    qv = _queries_for(q, tokens.dtype == torch.int8, ct)  # [Tq, d]
    if cand is None:
        starts, lens = offsets[:-1], offsets[1:] - offsets[:-1]
        q_of_token = torch.repeat_interleave(torch.arange(nq, device=q.device), cu_q[1:] - cu_q[:-1])
        out = torch.empty(nq, lens.numel(), dtype=torch.float32, device=q.device)
        for c0, c1 in _chunks(lens, qv.shape[0], budget):
            best = _best_per_token(qv, tokens, scales, starts[c0:c1], lens[c0:c1], ct)  # [Tq, C]
            acc = torch.zeros(nq, c1 - c0, dtype=ct, device=q.device)
            out[:, c0:c1] = acc.index_add_(0, q_of_token, best).float()
        return out
    # Batched: queries whose candidates overlap go in one group (query_groups); the group's distinct
    # candidates are gathered once and scored against all its query tokens in one GEMM per chunk,
    # then each query sums its own tokens' maxima over its own candidates.
    out = torch.full((nq, cand.shape[1]), float("-inf"), dtype=torch.float32, device=q.device)
    for a, b in query_groups(cand, (cu_q[1:] - cu_q[:-1]).tolist(), GATHER_COST):
        c = cand[a:b]
        valid = c >= 0
        if bool(valid.any()):
            docs, inv = torch.unique(c[valid], return_inverse=True)
            starts, lens = offsets[docs], offsets[docs + 1] - offsets[docs]
            qg = qv[cu_q[a] : cu_q[b]]
            owner = torch.repeat_interleave(torch.arange(b - a, device=q.device), cu_q[a + 1 : b + 1] - cu_q[a:b])
            per_query = torch.empty(b - a, docs.numel(), dtype=ct, device=q.device)
            for c0, c1 in _chunks(lens, qg.shape[0], budget):
                best = _best_per_token(qg, tokens, scales, starts[c0:c1], lens[c0:c1], ct)  # [group tokens, C]
                per_query[:, c0:c1] = torch.zeros(b - a, c1 - c0, dtype=ct, device=q.device).index_add_(0, owner, best)
            local = torch.zeros_like(c)
            local[valid] = inv
            got = per_query.gather(1, local).float()
            out[a:b] = torch.where(valid, got, out[a:b])
    return out


def query_groups(cand: torch.Tensor, q_len: list[int], gather_cost: float | None = None, slack: float = 2.0):
    """Runs [a, b) of queries scored together, in order: a run grows while scoring its candidates'
    union against all its tokens costs at most ``slack`` times scoring each query against its own (so
    a batch whose candidates cover the corpus becomes one exhaustive pass, and disjoint ones stay
    apart where ``slack`` < 2).
    ``gather_cost``: where gathering a query's own candidates costs that many times their GEMM,
    the whole batch is one run when its union is at most that much more work."""
    per_q = [set(r[r >= 0].tolist()) for r in cand.cpu()]
    nq = len(q_len)
    whole = gather_cost is not None and \
        len(set().union(*per_q)) * sum(q_len) <= gather_cost * sum(n * len(p) for n, p in zip(q_len, per_q))
    a = 0
    while a < nq:
        b, rows_q, union, own = a + 1, q_len[a], set(per_q[a]), q_len[a] * len(per_q[a])
        while b < nq:
            grown = union | per_q[b]
            rows, cost = rows_q + q_len[b], own + q_len[b] * len(per_q[b])
            if not whole and len(grown) * rows > slack * cost:
                break
            union, rows_q, own, b = grown, rows, cost, b + 1
        yield a, b
        a = b


def distinct_candidates(cand: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct rows of cand [Nq, K] (-1 pads), ascending, and cand renumbered into them
    (-1 stays) -> (rows [R] int64, local cand [Nq, K] int64)."""
    valid = cand >= 0
    rows, inv = torch.unique(cand[valid], return_inverse=True)
    local = torch.full_like(cand, -1)
    local[valid] = inv
    return rows, local


def token_rows(starts: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [starts[i], starts[i] + lens[i]) of every document i, concatenated, and their CSR
    offsets -> (token indices [sum(lens)] int64, offsets [n + 1] int64)."""
    local = torch.zeros(lens.numel() + 1, dtype=torch.int64, device=lens.device)
    local[1:] = lens.cumsum(0)
    total = int(local[-1])
    idx = torch.repeat_interleave(starts - local[:-1], lens, output_size=total)
    return idx + torch.arange(total, device=lens.device), local
