"""Per-token symmetric INT8 quantization: x ~= q * scale, scale = absmax / 127 per token."""

from __future__ import annotations

import torch

from mvdb.kernels import _checks

_CHUNK = 1 << 26  # elements quantized per step


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., dim] float -> (int8 [..., dim], float32 scales [...]); all-zero tokens get scale 1.

    Rounds half away from zero, exactly as the fused kernel quantizes queries on the fly.
    """
    _checks.tensor("x", x, tuple(range(1, 8)), _checks.FLOAT_DTYPES + (torch.float64,))
    rows = x.reshape(-1, x.shape[-1]) if x.numel() else x.reshape(0, x.shape[-1])
    q = torch.empty(rows.shape, dtype=torch.int8, device=x.device)
    scale = torch.empty(rows.shape[0], dtype=torch.float32, device=x.device)
    step = max(1, _CHUNK // max(1, x.shape[-1]))  # bounded fp32 temporaries, whatever the size of x
    for r0 in range(0, rows.shape[0], step):
        xf = rows[r0 : r0 + step].float()
        amax = xf.abs().amax(dim=-1)
        s = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
        y = xf / s[:, None]
        q[r0 : r0 + step] = torch.trunc(y + 0.5 * torch.sign(y)).clamp_(-127, 127)
        scale[r0 : r0 + step] = s
    return q.view(x.shape), scale.view(x.shape[:-1])


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(int8 [..., dim], scales [...]) -> float32 [..., dim]."""
    return q.float() * scales.float()[..., None]
