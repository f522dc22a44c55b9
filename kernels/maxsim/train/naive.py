"""torch forms of the training kernels' math. The reference for the gradients themselves is autograd
through the MaxSim references of mvdb.kernels.maxsim.naive (what tests/test_train.py compares to)."""

from __future__ import annotations

import torch

from mvdb.kernels.maxsim.train.fused import EPS


def _project_rows(grad_n: torch.Tensor, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """torch form of the kernels' ``_project``: from gradients of normalised rows to gradients of x."""
    xn = x.float() / n[:, None]
    proj = (grad_n - xn * (xn * grad_n).sum(1, keepdim=True)) / n[:, None]
    return torch.where((n > EPS.value)[:, None], proj, grad_n / n[:, None])
