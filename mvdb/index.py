"""Token index: FAISS over every stored token (GPU when faiss-gpu and CUDA are present).

Token positions in the index follow the store's row order (every row of every segment, deleted
ones included, masked at query time), so a hit's token position maps to its document row through
the row offsets. Derived data: it can always be rebuilt from the segments, and is persisted next
to them so that opening neither retrains nor re-adds.
"""

from __future__ import annotations

import os

import numpy as np
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


class TokenIndex:
    """Exact inner-product index (IndexFlatIP) over float32 token vectors."""

    def __init__(self, dim: int, device: torch.device):
        _require_faiss()
        self.dim = dim
        self.device = device
        self._cpu = faiss.IndexFlatIP(dim)
        self._gpu = None
        self._res = None

    @property
    def ntotal(self) -> int:
        return int(self._cpu.ntotal)

    def _search_index(self):
        if self.device.type == "cuda" and gpu_available():
            if self._gpu is None:
                self._res = faiss.StandardGpuResources()
                self._gpu = faiss.index_cpu_to_gpu(self._res, self.device.index or 0, self._cpu)
            return self._gpu
        return self._cpu

    def add(self, tokens: torch.Tensor) -> None:
        """Append token vectors (any float dtype, any device) in row order."""
        x = tokens.float().cpu().contiguous()
        self._cpu.add(x)
        if self._gpu is not None:
            self._gpu.add(tokens.float().contiguous() if tokens.is_cuda else x)

    def search(self, q: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(similarities [n, k], token positions [n, k]) for query tokens q [n, dim]."""
        index = self._search_index()
        k = min(k, self.ntotal)
        if index is self._gpu:
            return index.search(q.float().contiguous(), k)
        sims, pos = index.search(q.float().cpu().contiguous(), k)
        return sims.to(q.device), pos.to(q.device)

    def save(self, path: str) -> None:
        tmp = f"{path}.tmp-{os.getpid()}"
        faiss.write_index(self._cpu, tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str, dim: int, device: torch.device) -> "TokenIndex":
        idx = cls(dim, device)
        idx._cpu = faiss.read_index(path)
        if idx._cpu.d != dim:
            raise ValueError(f"{path}: index dim {idx._cpu.d} != {dim}")
        return idx


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
    gain = (sims - sims[:, -1:]).clamp_min(0)  # [Tq, k']
    ok = live[rows.clamp_min(0)] & (rows >= 0)
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
