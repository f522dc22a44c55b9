"""MaxSim of candidate documents on a CPU, in blocks of documents of similar length.

Each block's documents are padded to its longest by repeating their own last token (a repeated
token cannot change a maximum, so no mask is needed), which makes a block one GEMM against the
query's tokens and one max over a contiguous axis: the scatter of a per-token max into its
document, which costs about as much again as the GEMM on a CPU, goes away. Rows are gathered as
64-bit words (several times faster than gathering float16 rows) and scored in float32.
"""

from __future__ import annotations

import torch

from mvdb.kernels.maxsim.naive import _queries_for, distinct_candidates, query_groups
from mvdb.kernels.quant import dequantize_int8

BLOCK_TOKENS = 1 << 13  # padded document tokens a GEMM: the block's tokens stay in the caches
# up to this many query tokens a GEMM, it runs as [query tokens, dim] x [dim, document tokens] and
# the maximum over a document runs along the contiguous axis: a CPU's GEMM with so few columns is
# slower than the other way round (benchmarks/cpu_crossover.py, queries of 4-64 tokens)
NARROW_QUERY = 16
# queries share a GEMM while their candidates' union costs at most this much more than each alone: a
# CPU's GEMM is no faster per flop with more query tokens, so only shared candidates pay for it
GROUP_SLACK = 1.25


def _words(tokens: torch.Tensor) -> torch.Tensor:
    """The rows as 64-bit words where their bytes allow it (gathered several times faster), else as they are."""
    if tokens.dim() == 2 and tokens.stride(1) == 1 and tokens.shape[1] * tokens.element_size() % 8 == 0:
        try:
            return tokens.view(torch.int64)
        except RuntimeError:  # a view whose start or row stride is not a whole word
            pass
    return tokens


def _best(qt: torch.Tensor, tokens, scales, first, lens, block_tokens: int) -> torch.Tensor:
    """[docs, Lq] each query token's best similarity in each document (lens ascending, > 0)."""
    out = torch.empty((lens.numel(), qt.shape[1]), dtype=torch.float32)
    lens_l = lens.tolist()
    words = _words(tokens)
    narrow = qt.shape[1] <= NARROW_QUERY
    q = qt.T.contiguous() if narrow else None
    a = 0
    while a < len(lens_l):
        b = min(len(lens_l), a + max(1, block_tokens // lens_l[a]))
        while b - a > 1 and (b - a) * lens_l[b - 1] > block_tokens:  # a block's longest is its last
            b = a + max(1, block_tokens // lens_l[b - 1])
        longest = lens_l[b - 1]
        idx = (first[a:b, None] + torch.minimum(torch.arange(longest)[None, :], lens[a:b, None] - 1)).flatten()
        d = words.index_select(0, idx)
        d = d.view(tokens.dtype) if words is not tokens else d
        d = dequantize_int8(d, scales.index_select(0, idx)) if scales is not None else d.float()
        if narrow:
            out[a:b] = (q @ d.T).view(-1, b - a, longest).amax(dim=2).T
        else:
            out[a:b] = (d @ qt).view(b - a, longest, -1).amax(dim=1)
        a = b
    return out


def score_candidates(q: torch.Tensor, cu_q: torch.Tensor, tokens: torch.Tensor, offsets: torch.Tensor,
                     cand: torch.Tensor, scales: torch.Tensor | None = None, *, starts: torch.Tensor | None = None,
                     block_tokens: int | None = None) -> torch.Tensor:
    """MaxSim of query i against its candidate rows cand[i] (-1: -inf) -> float32 [Nq, K].

    q [Tq, dim] float, cu_q [Nq + 1] query offsets, tokens [T, dim] float16 / float32 (or int8
    with per-token ``scales``), offsets [n_rows + 1] int64 (row r's tokens start at
    ``starts[r]`` where given, else ``offsets[r]``), cand [Nq, K] int64. A row without tokens
    scores 0. With int8 tokens the queries are quantized per token as the GPU kernels do."""
    nq, width = cand.shape
    block_tokens = block_tokens or BLOCK_TOKENS
    out = torch.full((nq, width), float("-inf"), dtype=torch.float32)
    if nq == 0 or width == 0:
        return out
    qv = _queries_for(q.float(), tokens.dtype == torch.int8, torch.float32)
    cu = cu_q.long()
    offsets = offsets.long()
    first = offsets if starts is None else starts.long()
    for a, b in query_groups(cand, (cu[1:] - cu[:-1]).tolist(), slack=GROUP_SLACK):
        c = cand[a:b]
        rows, lc = distinct_candidates(c)
        if not rows.numel():
            continue
        lens = offsets[rows + 1] - offsets[rows]
        lens, order = torch.sort(lens)
        rows = rows[order]
        best = torch.zeros((rows.numel(), int(cu[b] - cu[a])), dtype=torch.float32)  # no token: 0
        some = int((lens == 0).sum())
        if some < rows.numel():
            best[some:] = _best(qv[cu[a] : cu[b]].T.contiguous(), tokens, scales, first[rows[some:]], lens[some:],
                                block_tokens)
        owner = torch.repeat_interleave(torch.arange(b - a), cu[a + 1 : b + 1] - cu[a:b])
        per_query = torch.zeros((b - a, rows.numel()), dtype=torch.float32).index_add_(0, owner, best.T)
        where = torch.empty_like(order)
        where[order] = torch.arange(order.numel())  # distinct_candidates' numbering -> the sorted one
        valid = lc >= 0
        out[a:b] = torch.where(valid, per_query.gather(1, where[lc.clamp_min(0)]), out[a:b])
    return out


def score_all(q: torch.Tensor, cu_q: torch.Tensor, tokens: torch.Tensor, offsets: torch.Tensor,
              scales: torch.Tensor | None = None, *, budget: int = 1 << 24,
              block_tokens: int | None = None) -> torch.Tensor:
    """MaxSim of every query against every document -> float32 [Nq, n_docs] (a document without
    tokens scores 0): all the queries' tokens against each block of documents in one GEMM, the
    documents in steps whose [documents, query tokens] table stays near ``budget`` values."""
    nq, n = cu_q.numel() - 1, offsets.numel() - 1
    out = torch.zeros((nq, n), dtype=torch.float32)
    qv = _queries_for(q.float(), tokens.dtype == torch.int8, torch.float32)
    cu = cu_q.long()
    if nq == 0 or n == 0 or int(cu[-1] - cu[0]) == 0:
        return out
    qt = qv[cu[0] : cu[-1]].T.contiguous()
    owner = torch.repeat_interleave(torch.arange(nq), cu[1:] - cu[:-1])
    offsets = offsets.long()
    lens = offsets[1:] - offsets[:-1]
    lens, order = torch.sort(lens)
    first = int((lens == 0).sum())
    step = max(1, budget // qt.shape[1])
    for a in range(first, n, step):
        b = min(n, a + step)
        rows = order[a:b]
        best = _best(qt, tokens, scales, offsets[rows], lens[a:b], block_tokens or BLOCK_TOKENS)  # [docs, Tq]
        out[:, rows] = torch.zeros((nq, b - a), dtype=torch.float32).index_add_(0, owner, best.T)
    return out
