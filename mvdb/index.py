"""Token indexes over every stored token, in the store's row order (deleted rows included,
masked at query time), so positions map to document rows through the row offsets.

- ``TokenIndex`` ("flat", small corpora): an exact FAISS inner-product index; each query token
  retrieves its k' nearest stored tokens, and ``approximate_candidates`` scores documents from them.
- ``CentroidLists`` ("ivf", large corpora): FAISS spherical k-means centroids, every token's list
  (its nearest centroid) and, per list, the documents holding such a token. A query token probes
  its ``nprobe`` best lists; a document is credited with the best probed centroid it holds. It
  never holds a second copy of the vectors (the exact rerank reads the resident store), and it is
  persisted with the manifest (centroids plus per-segment codes), so opening neither retrains nor
  re-adds.
"""

from __future__ import annotations

import time

import torch

from mvdb.kernels.lists import credit_lists

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


FLAT_MAX_TOKENS = 1 << 20  # exact token search below this many tokens, centroid lists above
DEFAULT_LISTS_PROBE = 4  # lists probed per query token (centroid lists)
DEFAULT_LISTS_CANDIDATES = 2048  # documents reranked exactly per query (centroid lists)
RETRAIN_GROWTH = 4  # compaction retrains once the corpus holds this many times its training corpus


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
    """About 2 * sqrt(N) lists (a power of two, at most 65536, at least 39 tokens each): assigning
    costs N x nlist dot products, so more lists trade build time for finer lists."""
    n = 1
    while n < 2 * n_tokens**0.5 and n < 65536 and 2 * n * 39 <= n_tokens:
        n *= 2
    return n


class TokenIndex:
    """The flat token index: an exact FAISS inner-product index over every stored token, on the
    GPU when faiss-gpu and CUDA are present; positions follow the order tokens were added in.
    Rebuilt when a database opens (copying below FLAT_MAX_TOKENS vectors costs little)."""

    kind = "flat"

    def __init__(self, dim: int, device: torch.device):
        _require_faiss()
        self.dim, self.device = dim, device
        self._res = None
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

    @classmethod
    def build(cls, tokens: torch.Tensor, scales: torch.Tensor | None, device: torch.device) -> "TokenIndex":
        """Index every stored token (rows in order)."""
        idx = cls(tokens.shape[1], device)
        t0 = time.perf_counter()
        idx.add_stored(tokens, scales)
        _sync(device)
        idx.build_seconds = {"add": time.perf_counter() - t0}
        return idx

    def _arg(self, x: torch.Tensor) -> torch.Tensor:
        return x.float().contiguous() if self.on_gpu and x.is_cuda else x.float().cpu().contiguous()

    def add_stored(self, tokens: torch.Tensor, scales: torch.Tensor | None, start: int = 0) -> None:
        """Append stored tokens[start:] (float16, or int8 with scales) in row order."""
        for x in _float_chunks(tokens, scales, start):
            self.index.add(self._arg(x))

    def search(self, q: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(similarities [n, k], token positions [n, k], -1 where fewer were found) for q [n, dim]."""
        k = min(k, self.ntotal, 2048)
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


# ---------------------------------------------------------------------------------------------
# IVF: FAISS k-means centroids + every token's list, searched as centroid lists of documents


def _assign(x: torch.Tensor, centroids: torch.Tensor, scratch: int = 1 << 30) -> torch.Tensor:
    """Each row's nearest centroid by inner product (centroids are unit norm) -> int32 [n]; rows in
    chunks whose [rows, nlist] similarity block stays near ``scratch`` bytes."""
    out = torch.empty(x.shape[0], dtype=torch.int32, device=x.device)
    c = centroids.to(x.device)
    chunk = max(256, scratch // (c.shape[0] * c.element_size()))
    for i in range(0, x.shape[0], chunk):
        out[i : i + chunk] = (x[i : i + chunk].to(c.dtype) @ c.T).argmax(dim=1).int()
    return out


def train_centroids(sample: torch.Tensor, nlist: int, seed: int = 0, niter: int = 10) -> torch.Tensor:
    """Spherical k-means with FAISS (on the GPU when faiss-gpu is present) -> float32 [nlist, dim]."""
    _require_faiss()
    x = sample.float().cpu().numpy()
    dim = x.shape[1]
    cl = faiss.Clustering(dim, nlist)
    cl.niter, cl.seed, cl.spherical = niter, seed, True
    cl.max_points_per_centroid = max(1, x.shape[0] // nlist + 1)  # the caller sized the sample
    if gpu_available():
        res = faiss.StandardGpuResources()
        quantizer = faiss.GpuIndexFlatIP(res, dim)
    else:
        quantizer = faiss.IndexFlatIP(dim)
    cl.train(x, quantizer)
    return torch.from_numpy(faiss.vector_to_array(cl.centroids).reshape(nlist, dim).copy())


class CentroidLists:
    """The IVF token index: FAISS-trained centroids, each stored token's list (nearest centroid,
    ``codes``, int32 in row order), and per list the document rows holding such a token (CSR).

    A query token is scored against every centroid (one GEMM); its ``nprobe`` best lists give
    candidate documents, each credited with the best probed centroid it holds (the imputation for
    the rest is the nprobe-th centroid's similarity), summed over the query's tokens.
    """

    kind = "ivf"

    def __init__(self, centroids: torch.Tensor, codes: torch.Tensor, row_offsets: torch.Tensor):
        self.device = row_offsets.device
        self.nlist, self.dim = centroids.shape
        half = self.device.type == "cuda"
        self.centroids = centroids.to(self.device, torch.float16 if half else torch.float32)
        self.codes = codes.to(self.device, torch.int32)
        self.nprobe = DEFAULT_LISTS_PROBE
        self.build_seconds: dict = {}
        self._lists(row_offsets)

    @property
    def ntotal(self) -> int:
        return int(self.codes.shape[0])

    def _lists(self, row_offsets: torch.Tensor) -> None:
        n_rows = row_offsets.numel() - 1
        lengths = (row_offsets[1:] - row_offsets[:-1]).long()
        if self.codes.numel() != int(row_offsets[-1]):
            raise ValueError(f"index codes: {self.codes.numel()} tokens, the store holds {int(row_offsets[-1])}")
        row_of = torch.repeat_interleave(torch.arange(n_rows, device=self.device), lengths)
        key = torch.unique(self.codes.long() * max(n_rows, 1) + row_of)  # sorted: by list, then row
        del row_of
        self.n_rows = n_rows
        self.list_rows = (key % max(n_rows, 1)).int()
        counts = torch.bincount(key // max(n_rows, 1), minlength=self.nlist)
        self.list_offsets = torch.zeros(self.nlist + 1, dtype=torch.int64, device=self.device)
        self.list_offsets[1:] = counts.cumsum(0)

    def add(self, codes: torch.Tensor, row_offsets: torch.Tensor) -> None:
        """Append the codes of newly stored rows (no retraining) and rebuild the lists."""
        self.codes = torch.cat([self.codes, codes.to(self.device, torch.int32)])
        self._lists(row_offsets)

    def assign(self, tokens: torch.Tensor, scales: torch.Tensor | None) -> torch.Tensor:
        """Lists of stored tokens (float16, or int8 with scales) -> int32 codes on the device."""
        if scales is None:
            return torch.cat([_assign(tokens[i : i + (1 << 22)].to(self.device), self.centroids)
                              for i in range(0, tokens.shape[0], 1 << 22)] or [torch.zeros(0, dtype=torch.int32, device=self.device)])
        out = [_assign(x.to(self.device), self.centroids) for x in _float_chunks(tokens, scales, chunk=1 << 22)]
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.int32, device=self.device)

    def candidates(self, q: torch.Tensor, cu_q: torch.Tensor, live: torch.Tensor, n_candidates: int,
                   scratch_bytes: int = 1 << 30, backend: str = "auto") -> torch.Tensor:
        """Per query, the ``n_candidates`` live rows with the best approximate scores, batched.

        q [Tq, dim] packed query tokens, cu_q [Nq+1]. Every query token is scored against every
        centroid (one GEMM) and probes its ``nprobe`` best lists. A row's approximate score sums,
        over the query's tokens, the similarity of the best probed centroid among the row's tokens
        minus the nprobe-th (the value imputed where the row holds none); see
        mvdb.kernels.lists. Queries go in chunks whose score tables stay near ``scratch_bytes``.
        Returns [Nq, n_candidates] rows, -1 where fewer rows exist.
        """
        nq, dev = cu_q.numel() - 1, q.device
        out = torch.full((nq, n_candidates), -1, dtype=torch.int64, device=dev)
        if nq == 0 or self.n_rows == 0:
            return out
        p = max(1, min(self.nprobe, self.nlist))
        sim = q.to(self.centroids.dtype) @ self.centroids.T  # [Tq, nlist]
        sv, probes = sim.topk(p, dim=1)
        del sim
        gains = sv.float() - sv[:, -1:].float()  # >= 0, non-increasing along the probes
        cu = cu_q.long().tolist()
        longest = max(cu[i + 1] - cu[i] for i in range(nq))
        triton_path = backend == "triton" or (backend == "auto" and dev.type == "cuda")
        # A program walks one query's lists in order; few queries would leave the GPU idle, so
        # their tokens are split into groups (one program each) whose tables are summed.
        groups = max(1, min(longest, 64 // nq)) if triton_path else 1
        per_query = self.n_rows * (6 * groups if triton_path else 4 * (longest + 1))
        chunk = max(1, scratch_bytes // max(1, per_query))
        n = min(n_candidates, self.n_rows)
        dead = ~live
        for a in range(0, nq, chunk):
            b = min(nq, a + chunk)
            if groups > 1:
                cu_g = [cu[i] + (cu[i + 1] - cu[i]) * g // groups for i in range(a, b) for g in range(groups)] + [cu[b]]
                score = credit_lists(self.list_offsets, self.list_rows, self.n_rows, probes, gains,
                                     torch.tensor(cu_g, device=dev), backend="triton")
                score = score.view(b - a, groups, self.n_rows).sum(1)
            else:
                score = credit_lists(self.list_offsets, self.list_rows, self.n_rows, probes, gains,
                                     cu_q[a : b + 1], backend="triton" if triton_path else "torch")
            score.masked_fill_(dead[None], float("-inf"))
            top = score.topk(n, dim=1)
            out[a:b, :n] = top.indices.masked_fill(torch.isinf(top.values), -1)
        return out
