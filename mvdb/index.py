"""Token index: FAISS over every stored token (GPU when faiss-gpu and CUDA are present).

Token positions in the index follow the store's row order (every row of every segment, deleted
ones included, masked at query time), so a hit's token position maps to its document row through
the row offsets. Derived data: it is rebuilt from the resident tokens when a database opens
(persisting it with the manifest is still to do).
"""

from __future__ import annotations

import time

import torch

try:
    import faiss
    import faiss.contrib.torch_utils  # noqa: F401  (torch tensors in, torch tensors out)
except ImportError:  # pragma: no cover - faiss is a dependency; the message says what to install
    faiss = None


def _require_faiss():
    if faiss is None:
        raise ImportError("mvdb needs FAISS: pip install faiss-cpu (or faiss-gpu on a CUDA machine)")


def gpu_available() -> bool:
    return faiss is not None and hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


FLAT_MAX_TOKENS = 4_000_000  # exact search below this many tokens, IVF above
DEFAULT_NPROBE = 32


def _float_chunks(tokens: torch.Tensor, scales: torch.Tensor | None, start: int = 0, chunk: int = 1 << 20):
    """float32 views of stored tokens (int8 dequantized), chunk by chunk, on the tokens' device."""
    for t0 in range(start, tokens.shape[0], chunk):
        x = tokens[t0 : t0 + chunk].float()
        if scales is not None:
            x = x * scales[t0 : t0 + chunk, None]
        yield x.contiguous()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def default_nlist(n_tokens: int) -> int:
    """About 2 * sqrt(N) lists (a power of two, at most 65536, at least 39 tokens each): adding
    costs N x nlist dot products, so more lists trade build time for search time."""
    n = 1
    while n < 2 * n_tokens**0.5 and n < 65536 and 2 * n * 39 <= n_tokens:
        n *= 2
    return n


class TokenIndex:
    """FAISS inner-product index over token vectors: exact (flat) while small, IVF with an fp16
    scalar quantizer once large (trained on a sample). Lives on the GPU when faiss-gpu and CUDA are
    present; token positions follow the order tokens were added in."""

    def __init__(self, dim: int, device: torch.device, kind: str = "flat", nlist: int = 0):
        _require_faiss()
        self.dim, self.device, self.kind, self.nlist = dim, device, kind, nlist
        self.nprobe = DEFAULT_NPROBE
        self._res = None
        if kind == "flat":
            cpu = faiss.IndexFlatIP(dim)
        else:
            cpu = faiss.index_factory(dim, f"IVF{nlist},SQfp16", faiss.METRIC_INNER_PRODUCT)
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

    @classmethod
    def build(cls, tokens: torch.Tensor, scales: torch.Tensor | None, device: torch.device,
              kind: str = "auto", nlist: int | None = None, seed: int = 0) -> "TokenIndex":
        """Index every stored token (rows in order); IVF training uses a seeded sample."""
        n, dim = tokens.shape
        if kind == "auto":
            kind = "flat" if n < FLAT_MAX_TOKENS else "ivf"
        nlist = nlist or default_nlist(n)
        idx = cls(dim, device, kind, nlist if kind == "ivf" else 0)
        t0 = time.perf_counter()
        if kind == "ivf":
            g = torch.Generator(device=tokens.device).manual_seed(seed)
            take = torch.randperm(n, device=tokens.device, generator=g)[: min(n, 40 * nlist)]
            sample = tokens[take].float()
            if scales is not None:
                sample = sample * scales[take, None]
            idx.train(sample)
        _sync(device)
        t1 = time.perf_counter()
        idx.add_stored(tokens, scales)
        _sync(device)
        idx.build_seconds = {"train": t1 - t0, "add": time.perf_counter() - t1}
        return idx

    def _arg(self, x: torch.Tensor) -> torch.Tensor:
        return x.float().contiguous() if self.on_gpu and x.is_cuda else x.float().cpu().contiguous()

    def train(self, sample: torch.Tensor) -> None:
        self.index.train(self._arg(sample))

    def add_stored(self, tokens: torch.Tensor, scales: torch.Tensor | None, start: int = 0) -> None:
        """Append stored tokens[start:] (float16, or int8 with scales) in row order."""
        for x in _float_chunks(tokens, scales, start):
            self.index.add(self._arg(x))

    def search(self, q: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(similarities [n, k], token positions [n, k], -1 where fewer were found) for q [n, dim]."""
        k = min(k, self.ntotal, 2048)
        if self.kind == "ivf":
            if self.on_gpu:
                self.index.nprobe = self.nprobe
            else:
                faiss.extract_index_ivf(self.index).nprobe = self.nprobe
        sims, pos = self.index.search(self._arg(q), k)
        return sims.to(q.device), pos.to(q.device)


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
    found = rows >= 0  # an IVF probe can return fewer than k' tokens (position -1)
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
