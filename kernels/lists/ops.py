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
    """Approximate scores [Nq, n_rows] float32 (0 where no probed list holds the row); from the
    Triton kernel a strided view of its [Nq, n_rows] int64 table (8 bytes per query and row).

    list_offsets [nlist+1] int64 and list_rows [E] int32: the CSR of rows per list (distinct within
    a list). probes [Tq, P] int list ids, best first; gains [Tq, P] float, non-increasing along P;
    cu [Nq+1] token offsets of the queries.
    """
    nq = cu.numel() - 1
    dev = probes.device
    use_triton = backend == "triton" or (backend == "auto" and dev.type == "cuda")
    if not use_triton:
        return _credit_lists_torch(list_offsets, list_rows, n_rows, probes, gains, cu)
    word = torch.zeros(nq, n_rows, dtype=torch.int64, device=dev)
    if nq and n_rows:
        with launch_guard():
            _credit_lists_kernel[(nq,)](
                word, n_rows, list_offsets.contiguous(), list_rows.contiguous(),
                probes.to(torch.int32).contiguous(), gains.float().contiguous(), cu.to(dev, torch.int32).contiguous(),
                P=probes.shape[1], BLOCK=1024, num_warps=8,
            )
    return word.view(torch.int32)[..., 0::2].view(torch.float32)  # the low halves (little-endian)
