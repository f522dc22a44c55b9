"""The flat token index (small corpora): an exact inner-product index over every stored token, in
row order (deleted rows included, masked at query time). Each query token retrieves its k' nearest
stored tokens, and ``approximate_candidates`` scores documents from them.

Backends (mvdb.engine.ivf.index_backend): FAISS (``IndexFlatIP``, on the GPU with faiss-gpu), or,
where FAISS is not installed or has no GPU for a CUDA database, :class:`TorchFlat`: the same exact
search as chunked matmuls and top-k in torch on the database's device.

The index only grows (adds append); a :class:`FlatView` pins how many tokens a search may see, so
a search that started before an add ignores what the add appended. On a CPU the index is filled
on first use (``lazy``): a CPU search scores every document exactly unless asked for the token
index's options (mvdb.engine.search), so opening such a database copies nothing. FAISS CPU indexes and the
torch one allow concurrent searches; FAISS GPU ones do not, so there searches take the lock
exclusively.
"""

from __future__ import annotations

import time

import torch

from mvdb.engine import ivf
from mvdb.engine.rwlock import RWLock

if ivf.faiss is not None:
    import faiss.contrib.torch_utils  # noqa: F401  (torch tensors in, torch tensors out)

SEARCH_SCRATCH = 1 << 28  # bytes of one [query tokens, stored tokens] similarity block (TorchFlat)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class TorchFlat:
    """Exact inner-product search in torch, with FAISS ``IndexFlatIP``'s calls (``ntotal``, ``add``,
    ``search``): float32 tokens in one buffer that doubles as it fills (as FAISS's vector does)."""

    def __init__(self, dim: int, device: torch.device):
        self.dim, self.device = dim, device
        self._buf = torch.empty(0, dim, dtype=torch.float32, device=device)
        self.ntotal = 0

    def add(self, x: torch.Tensor) -> None:
        n = x.shape[0]
        if self.ntotal + n > self._buf.shape[0]:
            buf = torch.empty(max(2 * self._buf.shape[0], self.ntotal + n, 1024), self.dim, dtype=torch.float32,
                              device=self.device)
            buf[: self.ntotal] = self._buf[: self.ntotal]
            self._buf = buf
        self._buf[self.ntotal : self.ntotal + n] = x
        self.ntotal += n

    def search(self, q: torch.Tensor, k: int, ntotal: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(similarities [n, k] descending, positions [n, k] int64) of the k best among the first
        ``ntotal`` (default: all) stored tokens."""
        n, buf = q.shape[0], self._buf
        total = self.ntotal if ntotal is None else min(ntotal, self.ntotal)
        step = max(k, SEARCH_SCRATCH // (4 * max(1, n)))
        best_s = torch.full((n, 0), float("-inf"), device=self.device)
        best_i = torch.zeros((n, 0), dtype=torch.int64, device=self.device)
        for a in range(0, total, step):
            b = min(total, a + step)
            s = q @ buf[a:b].T  # [n, b - a]
            top = s.topk(min(k, b - a), dim=1)
            del s
            if best_s.shape[1]:  # merge with the earlier blocks' best (ties keep the earlier position)
                cs, ci = torch.cat([best_s, top.values], 1), torch.cat([best_i, top.indices + a], 1)
                keep = cs.topk(min(k, cs.shape[1]), dim=1, sorted=True)
                best_s, best_i = keep.values, ci.gather(1, keep.indices)
            else:
                best_s, best_i = top.values, top.indices + a
        return best_s, best_i


class FlatIndex:
    """The mutable token index behind every :class:`FlatView` of one database. ``lazy``: a view
    adds its tokens when first searched, not when made."""

    def __init__(self, dim: int, device: torch.device, lazy: bool = False):
        self.dim, self.device, self.lazy = dim, device, lazy
        self.backend = ivf.index_backend(device)
        self._res = None
        self.lock = RWLock()
        if self.backend == "torch":
            self.index = TorchFlat(dim, device)
        elif self.backend == "faiss-gpu":
            self._res = ivf.faiss.StandardGpuResources()
            self.index = ivf.faiss.index_cpu_to_gpu(self._res, device.index or 0, ivf.faiss.IndexFlatIP(dim))
        else:
            self.index = ivf.faiss.IndexFlatIP(dim)

    @property
    def on_gpu(self) -> bool:
        """A FAISS GPU index (searches take the lock exclusively)."""
        return self._res is not None

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    def _arg(self, x: torch.Tensor) -> torch.Tensor:
        if self.backend == "torch":
            return x.to(self.device, torch.float32).contiguous()
        return x.float().contiguous() if self.on_gpu and x.is_cuda else x.float().cpu().contiguous()

    def fill(self, tokens, upto: int) -> None:
        """Append tokens ntotal..upto of ``tokens`` (a resident view holding at least ``upto``
        tokens, whose first ntotal are those already added)."""
        if self.ntotal >= upto:
            return
        with self.lock.write():  # from ntotal as it is now: a fill that got here first leaves nothing
            for tok, sc in tokens.chunks(self.ntotal, upto):
                for t0 in range(0, tok.shape[0], 1 << 20):
                    x = tok[t0 : t0 + (1 << 20)].float()
                    if sc is not None:
                        x = x * sc[t0 : t0 + (1 << 20), None].to(x.device)
                    self.index.add(self._arg(x))

    def view(self, tokens) -> FlatView:
        """The view of a snapshot's resident ``tokens`` (the index's first ones plus any an add
        appended): they are added now, or (lazy) by the view's first search."""
        if not self.lazy:
            self.fill(tokens, tokens.n_tokens)
        return FlatView(self, tokens)


class FlatView:
    """The flat index as one snapshot sees it: the first ``ntotal`` tokens, those of the
    snapshot's resident ``tokens`` (a lazy index adds them on the view's first search)."""

    kind = "flat"

    def __init__(self, index: FlatIndex, tokens):
        self.index, self.tokens, self.ntotal = index, tokens, tokens.n_tokens
        self.backend = index.backend
        self.build_seconds: dict = {}

    @property
    def filled(self) -> int:
        """Tokens of this view the index holds now (a lazy one fills on first search)."""
        return min(self.ntotal, self.index.ntotal)

    def search(self, q: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(similarities [n, k], token positions [n, k], -1 where fewer were found) for q [n, dim].
        A lazy view first fills the index up to its tokens (under the index's write lock, inside
        the caller's database read lock: a writer waiting to publish waits for that fill)."""
        k = min(k, self.ntotal, 2048)
        idx = self.index
        idx.fill(self.tokens, self.ntotal)
        lock = idx.lock.write() if idx.on_gpu else idx.lock.read()
        with lock:
            if idx.backend == "torch":  # searches only this snapshot's tokens
                sims, pos = idx.index.search(idx._arg(q), k, self.ntotal)
            else:
                sims, pos = idx.index.search(idx._arg(q), k)
        sims, pos = sims.to(q.device), pos.to(q.device)
        if idx.ntotal > self.ntotal:  # tokens added after this snapshot: not ours
            late = pos >= self.ntotal
            pos = pos.masked_fill(late, -1)
            sims = sims.masked_fill(late, float("-inf"))
        return sims, pos


def build_flat(tokens, device: torch.device, lazy: bool = False) -> FlatView:
    """A flat index over every token of a resident view (mvdb.engine.resident.Tokens); ``lazy``:
    filled by the first search that uses it."""
    t0 = time.perf_counter()
    view = FlatIndex(tokens.dim, device, lazy).view(tokens)
    if not lazy:
        _sync(device)
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
