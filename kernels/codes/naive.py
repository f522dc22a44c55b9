"""Residual codes in pure torch: the reference of the Triton kernel, and the CPU path.

A token ``x`` is stored as its IVF list ``c`` and the residual ``r = x - centroid[c]`` quantized
per dimension to ``bits`` bits: code ``k`` of dimension ``d`` stands for ``weights[d, k]``, the mean
of the residual values of that dimension that fall between ``cutoffs[d, k - 1]`` and
``cutoffs[d, k]`` (quantiles, so that each code is about equally likely). Codes are packed
``8 // bits`` dimensions to a byte, the lowest bits first: ``dim * bits / 8`` bytes a token.
Lists are int32, or int16 holding the uint16 value where there are at most 65536 of them (half
the bytes a token; read back as ``lists & 0xFFFF``, see :func:`list_index`).
"""

from __future__ import annotations

import torch


DECODE_BYTES = 24
LIST16_MAX = 1 << 16  # lists a 16-bit list id tells apart


def n_bytes(dim: int, bits: int) -> int:
    """Bytes of one token's packed residual codes."""
    return (dim * bits + 7) // 8


def list_dtype(nlist: int) -> torch.dtype:
    """The narrowest dtype that holds a list id below ``nlist``: int16 (as uint16) or int32."""
    return torch.int16 if nlist <= LIST16_MAX else torch.int32


def narrow_lists(lists: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """List ids (any integer dtype, values >= 0) stored as ``dtype``; int16 wraps 32768.. to
    negative values, which :func:`list_index` masks back."""
    if dtype == torch.int16:
        lists = lists.to(torch.int32)
        return torch.where(lists >= 1 << 15, lists - LIST16_MAX, lists).to(torch.int16)
    return lists.to(dtype)


def list_index(lists: torch.Tensor) -> torch.Tensor:
    """Stored list ids (int16 as uint16, or int32) -> int64 indices into the centroids."""
    return lists.long() & 0xFFFF if lists.dtype == torch.int16 else lists.long()


def train_buckets(residuals: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(cutoffs [dim, 2**bits - 1], weights [dim, 2**bits]) float32 from a sample of residuals
    [n, dim] (float): per-dimension quantiles and the mean of each bucket (the quantiles' midpoint
    where a bucket is empty)."""
    r = residuals.float()
    levels = 1 << bits
    q = torch.arange(1, levels, dtype=torch.float32, device=r.device) / levels
    cutoffs = torch.quantile(r, q, dim=0).T.contiguous() if r.shape[0] else \
        torch.zeros(r.shape[1], levels - 1, device=r.device)
    codes = bucketize(r, cutoffs)
    weights = torch.zeros(r.shape[1], levels, dtype=torch.float32, device=r.device)
    counts = torch.zeros_like(weights)
    dims = torch.arange(r.shape[1], device=r.device).expand_as(codes)
    flat = (dims * levels + codes).flatten()
    weights.view(-1).index_add_(0, flat, r.flatten())
    counts.view(-1).index_add_(0, flat, torch.ones_like(r).flatten())
    edges = torch.cat([cutoffs[:, :1], cutoffs, cutoffs[:, -1:]], dim=1)
    mid = (edges[:, :-1] + edges[:, 1:]) / 2
    weights = torch.where(counts > 0, weights / counts.clamp_min(1), mid)
    return cutoffs, weights


def bucketize(r: torch.Tensor, cutoffs: torch.Tensor) -> torch.Tensor:
    """Per-dimension bucket of each value: int64 [n, dim], the count of cutoffs below it. A binary
    search a value: a comparison with every cutoff at once builds [n, dim, 2**bits - 1], which the
    count casts to int64 whole (16 GB for a million tokens at 4 bits)."""
    c = cutoffs.to(r.device, torch.float32).contiguous()
    return torch.searchsorted(c, r.float().T.contiguous()).T


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes [n, dim] (< 2**bits) -> uint8 [n, n_bytes(dim, bits)]."""
    n, dim = codes.shape
    per = 8 // bits
    pad = (-dim) % per
    c = torch.nn.functional.pad(codes.to(torch.int32), (0, pad)).view(n, -1, per)
    shifts = torch.arange(per, dtype=torch.int32, device=codes.device) * bits
    return (c << shifts).sum(dim=2).to(torch.uint8)


def unpack(packed: torch.Tensor, dim: int, bits: int) -> torch.Tensor:
    """uint8 [n, n_bytes] -> codes int64 [n, dim]."""
    per = 8 // bits
    shifts = torch.arange(per, dtype=torch.int32, device=packed.device) * bits
    c = (packed.to(torch.int32)[:, :, None] >> shifts) & ((1 << bits) - 1)
    return c.reshape(packed.shape[0], -1)[:, :dim].long()


def encode(x: torch.Tensor, lists: torch.Tensor, centroids: torch.Tensor, cutoffs: torch.Tensor,
           bits: int) -> torch.Tensor:
    """Packed residual codes of tokens x [n, dim] (float) in lists [n] -> uint8 [n, n_bytes]."""
    r = x.float() - centroids[list_index(lists)].float().to(x.device)
    return pack(bucketize(r, cutoffs.to(x.device)), bits)


def decode(packed: torch.Tensor, lists: torch.Tensor, centroids: torch.Tensor, weights: torch.Tensor,
           bits: int) -> torch.Tensor:
    """Approximate tokens float32 [n, dim]: centroid + each dimension's bucket weight."""
    dim = centroids.shape[1]
    codes = unpack(packed, dim, bits)
    w = weights.to(packed.device).float()
    r = w.gather(1, codes.T).T if codes.numel() else torch.zeros(codes.shape, device=packed.device)
    return centroids[list_index(lists)].float().to(packed.device) + r


def approx_candidates_torch(q: torch.Tensor, cu_q: torch.Tensor, centroids: torch.Tensor, lists: torch.Tensor,
                            packed: torch.Tensor, weights: torch.Tensor, offsets: torch.Tensor, cand: torch.Tensor,
                            bits: int, budget: int = 1 << 27) -> torch.Tensor:
    """MaxSim of query i against its candidates cand[i] (-1 pads: -inf) with every document token
    decoded from its codes -> float32 [Nq, K]. The distinct candidates of a chunk of queries are
    decoded once (about ``budget`` bytes of decoded tokens at a time) and scored by the MaxSim
    reference (mvdb.kernels.maxsim.naive.maxsim_csr)."""
    from mvdb.kernels.maxsim.naive import distinct_candidates, maxsim_csr, token_rows

    nq, width = cand.shape
    out = torch.full((nq, width), float("-inf"), dtype=torch.float32, device=q.device)
    off = offsets.to(torch.int64)
    cu = cu_q.to(torch.int64)
    lens_all = off[1:] - off[:-1]
    mean_len = max(1, int(off[-1]) // max(1, off.numel() - 1))
    # about DECODE_BYTES a decoded value (unpacking, the weights gathered, the centroids, the sum)
    per_row = mean_len * centroids.shape[1] * DECODE_BYTES
    step = max(1, budget // max(1, width * per_row))
    rows_step = max(1, budget // per_row)
    for a in range(0, nq, step):
        b = min(nq, a + step)
        rows, lc = distinct_candidates(cand[a:b])
        qa = q[int(cu[a]) : int(cu[b])]
        for r0 in range(0, rows.numel(), rows_step):  # a pool wider than the budget: in slices of rows
            part = rows[r0 : r0 + rows_step]
            inside = (lc >= r0) & (lc < r0 + part.numel())
            idx, local = token_rows(off[part], lens_all[part])
            d = decode(packed[idx], lists[idx], centroids, weights, bits)
            s = maxsim_csr(qa, cu[a : b + 1] - cu[a], d, local, torch.where(inside, lc - r0, -1), dtype=torch.float32)
            out[a:b] = torch.where(inside, s, out[a:b])
    return out
