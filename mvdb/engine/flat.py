"""The flat token index (small corpora): an exact FAISS inner-product index over every stored
token, in row order (deleted rows included, masked at query time), on the GPU when faiss-gpu and
CUDA are present. Each query token retrieves its k' nearest stored tokens, and
``approximate_candidates`` scores documents from them.

The FAISS index only grows (adds append); a :class:`FlatView` pins how many tokens a search may
see, so a search that started before an add ignores what the add appended. FAISS CPU indexes
allow concurrent searches; GPU ones do not, so there searches take the lock exclusively.
"""

from __future__ import annotations

import time

import torch

from mvdb.engine.ivf import faiss, gpu_available, require_faiss
from mvdb.engine.rwlock import RWLock

if faiss is not None:
    import faiss.contrib.torch_utils  # noqa: F401  (torch tensors in, torch tensors out)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class FlatIndex:
    """The mutable FAISS index behind every :class:`FlatView` of one database."""

    def __init__(self, dim: int, device: torch.device):
        require_faiss()
        self.dim, self.device = dim, device
        self._res = None
        self.lock = RWLock()
        cpu = faiss.IndexFlatIP(dim)
        if device.type == "cuda" and gpu_available():
            self._res = faiss.StandardGpuResources()
            self.index = faiss.index_cpu_to_gpu(self._res, device.index or 0, cpu)
        else:
            self.index = cpu

    @property
    def on_gpu(self) -> bool:
        return self._res is not None

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    def _arg(self, x: torch.Tensor) -> torch.Tensor:
        return x.float().contiguous() if self.on_gpu and x.is_cuda else x.float().cpu().contiguous()

    def add(self, chunks) -> None:
        """Append stored tokens (an iterable of (tokens, scales or None) in row order)."""
        with self.lock.write():
            for tok, sc in chunks:
                for t0 in range(0, tok.shape[0], 1 << 20):
                    x = tok[t0 : t0 + (1 << 20)].float()
                    if sc is not None:
                        x = x * sc[t0 : t0 + (1 << 20), None].to(x.device)
                    self.index.add(self._arg(x))

    def view(self) -> "FlatView":
        return FlatView(self, self.ntotal)


class FlatView:
    """The flat index as one snapshot sees it: its first ``ntotal`` tokens."""

    kind = "flat"

    def __init__(self, index: FlatIndex, ntotal: int):
        self.index, self.ntotal = index, ntotal
        self.build_seconds: dict = {}

    def search(self, q: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(similarities [n, k], token positions [n, k], -1 where fewer were found) for q [n, dim]."""
        k = min(k, self.ntotal, 2048)
        idx = self.index
        lock = idx.lock.write() if idx.on_gpu else idx.lock.read()
        with lock:
            sims, pos = idx.index.search(idx._arg(q), k)
        sims, pos = sims.to(q.device), pos.to(q.device)
        if idx.ntotal > self.ntotal:  # tokens added after this snapshot: not ours
            late = pos >= self.ntotal
            pos = pos.masked_fill(late, -1)
            sims = sims.masked_fill(late, float("-inf"))
        return sims, pos


def build_flat(tokens, device: torch.device) -> FlatView:
    """A flat index over every token of a resident view (mvdb.engine.resident.Tokens)."""
    idx = FlatIndex(tokens.dim, device)
    t0 = time.perf_counter()
    idx.add(tokens.chunks())
    _sync(device)
    view = idx.view()
    view.build_seconds = {"add": time.perf_counter() - t0}
    return view


def approximate_candidates(
    sims: torch.Tensor,
    rows: torch.Tensor,
    live: torch.Tensor,
    cu_q: torch.Tensor,
    n_candidates: int,
) -> torch.Tensor:
    """Per query, the rows with the best approximate MaxSim, in one batched pass (no per-query loop).

    sims, rows [Tq, k']: each query token's retrieved similarities and their document rows. A row's
    approximate score sums, over the query's tokens, the best retrieved similarity with that row,
    or the token's k'-th similarity (the imputation) where none was retrieved; ranking needs only
    the gain over the imputed value. Deleted rows are skipped. Returns [Nq, n_candidates] rows,
    -1 where a query has fewer distinct candidates.
    """
    tq, kk = sims.shape
    nq = cu_q.numel() - 1
    device = sims.device
    if tq == 0 or kk == 0:
        return torch.full((nq, n_candidates), -1, dtype=torch.int64, device=device)
    query_of_token = torch.repeat_interleave(torch.arange(nq, device=device), (cu_q[1:] - cu_q[:-1]).long())
    found = rows >= 0  # fewer than k' tokens may come back (position -1)
    kth = torch.where(found, sims, torch.full_like(sims, float("inf"))).amin(dim=1, keepdim=True)
    kth = torch.where(torch.isinf(kth), torch.zeros_like(kth), kth)  # the imputed similarity per token
    gain = torch.where(found, sims - kth, torch.zeros_like(sims)).clamp_min(0)  # [Tq, k']
    ok = live[rows.clamp_min(0)] & found
    n_rows = live.numel()
    tok = torch.arange(tq, device=device)[:, None].expand(tq, kk)
    # best gain per (query token, row): several tokens of one document may be retrieved
    key = (tok * n_rows + rows.clamp_min(0))[ok]
    uniq, inv = torch.unique(key, return_inverse=True)
    best = torch.zeros(uniq.numel(), dtype=gain.dtype, device=device).scatter_reduce(
        0, inv, gain[ok], "amax", include_self=False
    )
    # sum over the query's tokens per (query, row)
    qr = query_of_token[uniq // n_rows] * n_rows + uniq % n_rows
    uq, inv2 = torch.unique(qr, return_inverse=True)
    score = torch.zeros(uq.numel(), dtype=gain.dtype, device=device).index_add_(0, inv2, best)
    q_of, row_of = uq // n_rows, uq % n_rows
    # scatter into a padded [Nq, width] table, then top-n per query
    counts = torch.bincount(q_of, minlength=nq)
    width = max(1, int(counts.max()) if counts.numel() else 1)
    start = torch.cumsum(counts, 0) - counts
    slot = torch.arange(uq.numel(), device=device) - start[q_of]
    table = torch.full((nq, width), float("-inf"), dtype=gain.dtype, device=device)
    table[q_of, slot] = score
    table_rows = torch.full((nq, width), -1, dtype=torch.int64, device=device)
    table_rows[q_of, slot] = row_of
    n = min(n_candidates, width)
    top = table.topk(n, dim=1)
    cand = table_rows.gather(1, top.indices)
    cand[torch.isinf(top.values)] = -1
    if n < n_candidates:
        cand = torch.cat([cand, torch.full((nq, n_candidates - n), -1, dtype=torch.int64, device=device)], 1)
    return cand
