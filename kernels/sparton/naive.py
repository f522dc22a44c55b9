"""Sparton in pure torch: the fallback (same argmax forward and backward as the kernels, logits
one vocabulary chunk at a time) and :func:`reference`, the naive composition the tests compare to."""

from __future__ import annotations

import torch


def _forward_torch(h, w, bias, mask, chunk: int = 8192):
    """Max and argmax over the sequence, one vocabulary chunk of logits at a time."""
    B, S, _ = h.shape
    V = w.shape[0]
    out = torch.zeros(B, V, dtype=torch.float32, device=h.device)
    arg = torch.full((B, V), -1, dtype=torch.int32, device=h.device)
    for v0 in range(0, V, chunk):
        x = torch.einsum("bsd,vd->bsv", h.float(), w[v0 : v0 + chunk].float())
        if bias is not None:
            x = x + bias[v0 : v0 + chunk].float()
        if mask is not None:
            x = x.masked_fill(~mask.bool()[:, :, None], float("-inf"))
        m, i = x.max(dim=1)  # first maximal position, as the kernel
        pos = m > 0
        out[:, v0 : v0 + chunk] = torch.where(pos, torch.log1p(m.clamp_min(0)), 0.0)
        arg[:, v0 : v0 + chunk] = torch.where(pos, i.int(), -1)
    return out, arg


def _backward_torch(gz, arg, h, w, need_h, need_w):
    B, S, D = h.shape
    dh = torch.zeros(B, S, D, dtype=torch.float32, device=h.device) if need_h else None
    dw = torch.zeros(w.shape, dtype=torch.float32, device=h.device) if need_w else None
    for b in range(B):
        won = arg[b] >= 0
        v = torch.nonzero(won).flatten()
        s = arg[b][won].long()
        g = gz[b][won]
        if need_h:
            dh[b].index_add_(0, s, g[:, None] * w[v].float())
        if need_w:
            dw.index_add_(0, v, g[:, None] * h[b, s].float())
    return (dh.to(h.dtype) if need_h else None), (dw.to(w.dtype) if need_w else None)


def reference(hidden, weight, bias=None, attention_mask=None) -> torch.Tensor:
    """The naive composition: all [B, S, V] logits, relu, log1p, masked max (for tests)."""
    x = hidden @ weight.T
    if bias is not None:
        x = x + bias
    x = torch.log1p(torch.relu(x))
    if attention_mask is not None:
        x = x * (attention_mask != 0)[:, :, None].to(x.dtype)
    return x.amax(dim=1)
