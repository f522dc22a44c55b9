"""Per-token symmetric INT8 quantization: x ~= q * scale, scale = absmax / 127 per token."""

from __future__ import annotations

import torch

from mvdb.kernels import _checks


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., dim] float -> (int8 [..., dim], float32 scales [...]); all-zero tokens get scale 1.

    Rounds half away from zero, exactly as the fused kernel quantizes queries on the fly.
    """
    _checks.tensor("x", x, tuple(range(1, 8)), _checks.FLOAT_DTYPES + (torch.float64,))
    xf = x.float()
    amax = xf.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    y = xf / scale[..., None]
    q = torch.trunc(y + 0.5 * torch.sign(y)).clamp_(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(int8 [..., dim], scales [...]) -> float32 [..., dim]."""
    return q.float() * scales.float()[..., None]
