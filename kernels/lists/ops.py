"""Public list scoring: :func:`credit_lists` picks the Triton kernel or the torch version."""

from __future__ import annotations

import torch

from mvdb.kernels.lists.fused import _credit_lists_kernel
from mvdb.kernels.lists.naive import _credit_lists_torch
from mvdb.kernels.maxsim.fused import launch_guard


def credit_lists(
    list_offsets: torch.Tensor,
    list_rows: torch.Tensor,
    n_rows: int,
    probes: torch.Tensor,
    gains: torch.Tensor,
    cu: torch.Tensor,
    backend: str = "auto",
) -> torch.Tensor:
    """Approximate scores [Nq, n_rows] float32 (0 where no probed list holds the row).

    list_offsets [nlist+1] int64 and list_rows [E] int32: the CSR of rows per list (distinct within
    a list). probes [Tq, P] int list ids, best first; gains [Tq, P] float, non-increasing along P;
    cu [Nq+1] token offsets of the queries (at most 32767 tokens each).
    """
    nq = cu.numel() - 1
    dev = probes.device
    use_triton = backend == "triton" or (backend == "auto" and dev.type == "cuda")
    if not use_triton:
        return _credit_lists_torch(list_offsets, list_rows, n_rows, probes, gains, cu)
    cu32 = cu.to(dev, torch.int32).contiguous()
    lens = cu32[1:] - cu32[:-1]
    if nq and int(lens.max()) > 32767:
        raise ValueError(f"credit_lists: queries of at most 32767 tokens, got {int(lens.max())}")
    score = torch.zeros(nq, n_rows, dtype=torch.float32, device=dev)
    mark = torch.full((nq, n_rows), -1, dtype=torch.int16, device=dev)
    if nq and n_rows:
        with launch_guard():
            _credit_lists_kernel[(nq,)](
                score, mark, n_rows, list_offsets.contiguous(), list_rows.contiguous(),
                probes.to(torch.int32).contiguous(), gains.float().contiguous(), cu32,
                P=probes.shape[1], BLOCK=1024, num_warps=4,
            )
    return score
