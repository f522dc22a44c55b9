"""Public Ward merges: :func:`merge`."""

from __future__ import annotations

import contextlib

import torch

from mvdb.kernels.maxsim.runtime import launch_guard
from mvdb.kernels.ward.naive import merge_torch


def merge(dist: torch.Tensor, near: torch.Tensor, near_at: torch.Tensor, n: torch.Tensor, k: torch.Tensor,
          triton: bool | None = None) -> torch.Tensor:
    """Ward clusters of b point sets -> int64 [b, B]: each point's cluster, named by its smallest
    point (padding: itself).

    ``dist``: float64 [b, B, B] (B a power of two >= 16 for the kernel), each set's distances in its first n[i]
    rows and columns, ``inf`` on the diagonal and the padding (changed in place: the merged
    clusters' distances); ``near`` / ``near_at``: each row's smallest distance and its column
    (``dist.min(-1)``); ``n``, ``k``: each set's points and the clusters it keeps (1 <= k <= n).
    ``triton``: the Triton kernel (default on CUDA), else torch's one merge of every set a step.
    """
    b, width = dist.shape[0], dist.shape[-1]
    if triton is None:
        triton = dist.device.type == "cuda"
    if dist.dtype not in (torch.float64, torch.float32) or dist.shape != (b, width, width) or (
            triton and (dist.dtype != torch.float64 or width < 16 or width & (width - 1))):
        raise ValueError(f"dist: expected float64 [b, B, B] (B a power of two >= 16 for the Triton kernel), got "
                         f"{dist.dtype} {tuple(dist.shape)}")
    if not triton or b == 0:
        return merge_torch(dist, near, near_at, n, k)
    from mvdb.kernels.ward.fused import _ward_kernel

    rep = torch.empty(b, width, dtype=torch.int32, device=dist.device)
    cuda = dist.device.type == "cuda"
    with launch_guard(), torch.cuda.device(dist.device) if cuda else contextlib.nullcontext():
        _ward_kernel[(b,)](dist, near.contiguous(), near_at.to(torch.int32).contiguous(), n.to(torch.int32),
                           k.to(torch.int32), rep, BLOCK=width, num_warps=max(1, min(8, width // 128)),
                           enable_fp_fusion=False)  # no fused multiply-adds: SciPy's rounding
    return rep.long()
