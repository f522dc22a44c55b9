"""The compressed token tier: every stored token as its IVF list and its residual codes
(mvdb.kernels.codes), resident on the device whatever holds the exact tokens.

A search over this tier ranks a large pool of candidates from the IVF lists by approximate MaxSim
over the codes (one fused kernel: the tokens are decoded in registers), and only the best few go
to the exact rerank, which reads the exact tokens where they are (pinned host memory, gathered onto
the device by one launch, or the segments on disk). Final scores stay exact MaxSim.

:class:`Residuals` views are immutable: an add appends past the end of every earlier view (the
buffers grow by at least ``GROWTH`` of their size, so appends copy each token a bounded number of
times), and a search on an older view reads what it always did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mvdb.kernels.codes import approx_maxsim_candidates
from mvdb.kernels.codes.naive import list_dtype, n_bytes, narrow_lists

GROWTH = 0.25
# Bits a dimension of the residual codes, by the store's dtype, where open() names no rate
# (code_bits=None). At dim 128 a token takes 2 bytes for its list (up to 65536 lists) and
# dim * bits / 8 of codes: 34 at 2 bits, 18 at 1, against 256 in float16 and 132 in int8. An int8
# store chose memory over precision: its codes take 1 bit, which keeps the tier within a fifth of
# what the int8 tokens would take on the device, at about the same recall after the exact stage.
DEFAULT_BITS = {"float16": 2, "int8": 1}


def default_bits(dtype: str) -> int:
    """The code rate of a store of ``dtype`` ("float16" or "int8") where none is asked for."""
    return DEFAULT_BITS[dtype]


# The pool ranked over the codes and the documents reranked exactly, per query, at the defaults.
# The pool grows with the square root of the corpus (a fixed pool covers a shrinking share of a
# growing one): POOL_PER_SQRT x sqrt(documents), within [POOL_MIN, POOL_MAX]. (docs/scale.md has the
# measurements these come from.)
POOL_PER_SQRT = 8
POOL_MIN, POOL_MAX = 8192, 65536
EXACT_MIN = 128


def default_pool(n_live: int) -> int:
    return int(min(POOL_MAX, max(POOL_MIN, POOL_PER_SQRT * math.sqrt(max(1, n_live)))))


def default_exact(k: int) -> int:
    return max(EXACT_MIN, 12 * k)


class AppendBuffer:
    """A device buffer that grows by at least GROWTH of its size; rows [0, n) are written once."""

    def __init__(self, row_shape: tuple, dtype: torch.dtype, device: torch.device):
        self.row_shape, self.dtype, self.device = row_shape, dtype, device
        self.data = torch.empty((0, *row_shape), dtype=dtype, device=device)
        self.n = 0

    def append(self, rows: torch.Tensor) -> torch.Tensor:
        m = rows.shape[0]
        if self.n + m > self.data.shape[0]:
            cap = max(self.n + m, int(self.data.shape[0] * (1 + GROWTH)))
            grown = torch.empty((cap, *self.row_shape), dtype=self.dtype, device=self.device)
            grown[: self.n] = self.data[: self.n]
            self.data = grown  # views of the old buffer keep it alive until their searches end
        self.data[self.n : self.n + m] = rows.to(self.device, self.dtype)
        self.n += m
        return self.data[: self.n]


@dataclass(frozen=True)
class Residuals:
    """Codes of every row of one state, in row order (an immutable view)."""

    bits: int
    centroids: torch.Tensor  # [nlist, dim] float16 on the device
    weights: torch.Tensor  # [dim, 2**bits] float32 on the device
    cutoffs: torch.Tensor  # [dim, 2**bits - 1] float32 (encoding)
    lists: torch.Tensor  # [T] on the device: int16 holding the uint16 id up to 65536 lists, else int32
    codes: torch.Tensor  # [T, n_bytes] uint8 on the device
    entry: dict  # the bucket file's manifest entry (centroids id, bits)

    @property
    def n_tokens(self) -> int:
        return int(self.lists.shape[0])

    @property
    def token_bytes(self) -> int:
        """Bytes a token takes in this tier (its list and its codes)."""
        return self.lists.element_size() + n_bytes(self.centroids.shape[1], self.bits)

    @property
    def nbytes(self) -> int:
        return (self.lists.nbytes + self.codes.nbytes + self.centroids.nbytes + self.weights.nbytes)

    def score(self, q: torch.Tensor, cu_q: torch.Tensor, offsets: torch.Tensor, cand: torch.Tensor,
              max_lq: int) -> torch.Tensor:
        """Approximate MaxSim of each query against its candidate rows cand [Nq, K] (-1: -inf)."""
        return approx_maxsim_candidates(q, cu_q, self.centroids, self.lists, self.codes, self.weights, offsets,
                                        cand, self.bits, max_seqlen_q=max_lq)


class Growing:
    """The writer's side: the lists and codes buffers of one codebook, appended as segments come."""

    def __init__(self, bits: int, centroids: torch.Tensor, weights: torch.Tensor, cutoffs: torch.Tensor, entry: dict,
                 device: torch.device):
        dim = centroids.shape[1]
        self.bits, self.entry, self.device = bits, entry, device
        half = torch.float16 if device.type == "cuda" else torch.float32
        self.centroids = centroids.to(device, half)
        self.weights = weights.to(device, torch.float32)
        self.cutoffs = cutoffs.float()
        self._lists = AppendBuffer((), list_dtype(centroids.shape[0]), device)
        self._codes = AppendBuffer((n_bytes(dim, bits),), torch.uint8, device)
        self.current = self._view(self._lists.data, self._codes.data)

    def _view(self, lists: torch.Tensor, codes: torch.Tensor) -> Residuals:
        return Residuals(self.bits, self.centroids, self.weights, self.cutoffs, lists, codes, self.entry)

    def append(self, lists: torch.Tensor, codes: torch.Tensor) -> Residuals:
        """Append the next tokens' lists (any integer dtype) and codes; returns (and keeps as
        ``current``) the new view."""
        lists = narrow_lists(lists.to(self.device), self._lists.dtype)
        self.current = self._view(self._lists.append(lists), self._codes.append(codes))
        return self.current
