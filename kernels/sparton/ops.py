"""Public Sparton functions: :func:`sparton` (validate, pick the backend), :class:`SpartonHead`,
the Triton launchers with their tuning table, and the autograd Function."""

from __future__ import annotations

import torch

from mvdb.kernels import _checks
from mvdb.kernels.errors import InvalidInputError
from mvdb.kernels.maxsim.runtime import cdiv, interpreting
from mvdb.kernels.sparton.fused import (
    _bwd_hidden_kernel,
    _bwd_weight_kernel,
    _fwd_kernel,
)
from mvdb.kernels.sparton.naive import _backward_torch, _forward_torch

BACKENDS = ("auto", "triton", "torch")

# Launch parameters a parameter sweep may override; empty = the defaults below.
TUNE: dict = {}


def _blocks():
    if interpreting():
        return dict(BLOCK_S=16, BLOCK_V=16, BLOCK_K=16)
    # the fastest tiles of the sweep: 128 x 128, K steps of 32, 4 warps
    return dict(BLOCK_S=TUNE.get("BLOCK_S", 128), BLOCK_V=TUNE.get("BLOCK_V", 128), BLOCK_K=TUNE.get("BLOCK_K", 32))


def _forward_triton(h, w, bias, mask):
    B, S, D = h.shape
    V = w.shape[0]
    out = torch.empty(B, V, dtype=torch.float32, device=h.device)
    arg = torch.empty(B, V, dtype=torch.int32, device=h.device)
    bl = _blocks()
    if B and V:
        _fwd_kernel[(B * cdiv(V, bl["BLOCK_V"]),)](
            h, w, bias if bias is not None else w, mask if mask is not None else h, out, arg, B, S, V, D=D,
            HAS_BIAS=bias is not None, HAS_MASK=mask is not None, IEEE=h.dtype == torch.float32,
            num_warps=TUNE.get("fwd_warps", 4) if not interpreting() else 4, num_stages=TUNE.get("fwd_stages", 3), **bl)
    return out, arg


def _backward_triton(gz, arg, h, w, need_h, need_w):
    B, S, D = h.shape
    V = w.shape[0]
    dh = dw = None
    ieee = h.dtype == torch.float32
    bs, bv, bd = (16, 16, 16) if interpreting() else (TUNE.get("dh_s", 128), TUNE.get("dh_v", 64), TUNE.get("dh_d", 128))
    if need_h:
        dh = torch.empty_like(h)
        if B and S:
            _bwd_hidden_kernel[(B, cdiv(S, bs), cdiv(D, bd))](
                gz, arg, w, dh, S, V, D=D, BLOCK_S=bs, BLOCK_V=bv, BLOCK_D=bd, SCALE_G=h.dtype == torch.float16,
                IEEE=ieee, num_warps=TUNE.get("dh_warps", 4), num_stages=TUNE.get("dh_stages", 3))
    if need_w:
        dw = torch.empty_like(w)
        if V:
            bvw = 16 if interpreting() else 64
            _bwd_weight_kernel[(cdiv(V, bvw), cdiv(D, bd))](gz, arg, h, dw, B, S, V, D=D, BLOCK_V=bvw,
                                                                         BLOCK_D=bd, num_warps=4)
    return dh, dw


class _SpartonFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, w, bias, mask, use_triton):
        out, arg = (_forward_triton if use_triton else _forward_torch)(h, w, bias, mask)
        ctx.save_for_backward(h, w, out, arg)
        ctx.use_triton, ctx.has_bias = use_triton, bias is not None
        return out

    @staticmethod
    def backward(ctx, grad):
        h, w, out, arg = ctx.saved_tensors
        # d log1p(relu(x)) / dx = 1 / (1 + x) where x > 0, i.e. exp(-out); 0 where no winner
        gz = torch.where(arg >= 0, grad.float() * torch.exp(-out), 0.0).contiguous()
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        dh, dw = (_backward_triton if ctx.use_triton else _backward_torch)(gz, arg, h, w, need_h, need_w)
        db = gz.sum(0).to(w.dtype) if need_b and ctx.has_bias else None
        return dh, dw, db, None, None


def sparton(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
            attention_mask: torch.Tensor | None = None, *, backend: str = "auto") -> torch.Tensor:
    """SPLADE pooling of the LM head without the [B, S, V] logits: hidden [B, S, D] (fp16, bf16 or
    fp32), weight [V, D] and bias [V] (the decoder of a masked-LM head, same dtype), attention_mask
    [B, S] (nonzero = token) -> [B, V] float32. Differentiable in hidden, weight and bias."""
    _checks.tensor("hidden", hidden, (3,), _checks.FLOAT_DTYPES)
    _checks.tensor("weight", weight, (2,), (hidden.dtype,))
    B, S, D = hidden.shape
    if weight.shape[1] != D:
        raise InvalidInputError(f"weight: expected shape [V, {D}] (hidden's last dim), got {tuple(weight.shape)}")
    if bias is not None:
        _checks.tensor("bias", bias, (1,), (hidden.dtype,))
        _checks.shape_match("bias", bias, (weight.shape[0],))
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor):
            raise InvalidInputError(f"attention_mask: expected a [B, S] tensor, got {type(attention_mask).__name__}")
        _checks.shape_match("attention_mask", attention_mask, (B, S))
        attention_mask = (attention_mask != 0).to(torch.uint8).contiguous()
    device = _checks.same_device(hidden=hidden, weight=weight, bias=bias, attention_mask=attention_mask)
    if backend not in BACKENDS:
        raise InvalidInputError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    runnable = device.type == "cuda" or interpreting()
    if backend == "triton" and not runnable:
        raise InvalidInputError(f"backend: 'triton' needs CUDA tensors or TRITON_INTERPRET=1, got tensors on {device}")
    use_triton = runnable and backend != "torch"
    return _SpartonFn.apply(hidden.contiguous(), weight.contiguous(), None if bias is None else bias.contiguous(),
                            attention_mask, use_triton)


class SpartonHead(torch.nn.Module):
    """Drop-in SPLADE head over a Hugging Face masked-LM head: ``transform`` (dense + activation +
    layer norm, or identity) then the decoder's logits pooled by :func:`sparton`.

    ``SpartonHead.from_mlm_head(model.cls)`` (BERT-style ``predictions.transform`` /
    ``predictions.decoder``) or ``from_mlm_head(model.lm_head)`` (RoBERTa-style ``dense`` /
    ``layer_norm`` / ``decoder``) shares the head's parameters."""

    def __init__(self, weight: torch.nn.Parameter, bias: torch.nn.Parameter | None = None, transform=None):
        super().__init__()
        self.weight = weight
        self.bias = bias
        self.transform = transform if transform is not None else torch.nn.Identity()

    @classmethod
    def from_mlm_head(cls, head: torch.nn.Module) -> "SpartonHead":
        pred = getattr(head, "predictions", head)
        decoder = getattr(pred, "decoder", None)
        if not isinstance(decoder, torch.nn.Linear):
            raise InvalidInputError(f"head: expected a masked-LM head with a Linear decoder, got {type(head).__name__}")
        bias = decoder.bias if decoder.bias is not None else getattr(pred, "bias", None)
        if hasattr(pred, "transform"):
            transform = pred.transform
        elif hasattr(pred, "dense") and hasattr(pred, "layer_norm"):  # RoBERTa: dense, gelu, layer_norm
            dense, norm = pred.dense, pred.layer_norm
            transform = torch.nn.Sequential(dense, torch.nn.GELU(), norm)
        else:
            transform = None
        return cls(decoder.weight, bias, transform)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.transform(hidden_states)
        return sparton(h, self.weight, self.bias, attention_mask)
