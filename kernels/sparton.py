"""Sparton: the SPLADE head (LM-head logits, ReLU, log1p, masked max over the sequence) fused into
one tiled matmul that never materialises the [B, S, V] logits.

    out[b, v] = max over unmasked s of log1p(relu(hidden[b, s] . weight[v] + bias[v]))

log1p(relu(.)) is non-decreasing, so the max is taken over the raw logits and the activation is
applied once per (b, v). The forward saves the winning position per (b, v) as int32; the
backward sends g * (x > 0) / (1 + x) (x the winning logit) to that position only:
- d_hidden[b, s] = sum over v won by s of gz[b, v] * weight[v]: a one-hot matmul per sequence
  tile, the same FLOPs as the forward;
- d_weight[v] = sum over b of gz[b, v] * hidden[b, s*(b, v)]: a gather (fp32 sums);
- d_bias[v] = sum over b of gz[b, v].
A (b, v) with every position masked, or with no positive logit, outputs 0 and sends no gradient.
Ties go to the first position (torch's amax would split the gradient).

``backend="auto"``: Triton on CUDA (or CPU with TRITON_INTERPRET=1), else a pure-torch fallback
with the same argmax backward that materialises the logits one vocabulary chunk at a time.
:func:`reference` is the naive composition (all logits at once) the tests compare against.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mvdb.kernels.errors import InvalidInputError
from mvdb.kernels import _checks
from mvdb.kernels.maxsim.fused import interpreting

BACKENDS = ("auto", "triton", "torch")


@triton.jit
def _fwd_kernel(H, W, Bias, M, Out, Arg, n_b, S, V,
                D: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, BLOCK_S: tl.constexpr,
                BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
    pid = tl.program_id(0)
    vt = pid // n_b  # consecutive programs share a weight tile (it stays in L2)
    b = pid % n_b
    offs_v = vt * BLOCK_V + tl.arange(0, BLOCK_V)
    v_ok = offs_v < V
    offs_k = tl.arange(0, BLOCK_K)
    best = tl.full([BLOCK_V], float("-inf"), dtype=tl.float32)
    arg = tl.full([BLOCK_V], -1, dtype=tl.int32)
    if HAS_BIAS:
        bias = tl.load(Bias + offs_v, mask=v_ok, other=0.0).to(tl.float32)
    for s0 in range(0, S, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        s_in = offs_s < S
        rows = b.to(tl.int64) * S + offs_s
        acc = tl.zeros([BLOCK_S, BLOCK_V], dtype=tl.float32)
        for k0 in range(0, D, BLOCK_K):
            k_ok = k0 + offs_k < D
            h = tl.load(H + rows[:, None] * D + (k0 + offs_k)[None, :], mask=s_in[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(W + offs_v[None, :].to(tl.int64) * D + (k0 + offs_k)[:, None],
                        mask=k_ok[:, None] & v_ok[None, :], other=0.0)
            if IEEE:
                acc = tl.dot(h, w, acc, input_precision="ieee")
            else:
                acc = tl.dot(h, w, acc)
        if HAS_BIAS:
            acc += bias[None, :]
        s_ok = s_in
        if HAS_MASK:
            s_ok = s_ok & (tl.load(M + rows, mask=s_in, other=0) != 0)
        acc = tl.where(s_ok[:, None], acc, float("-inf"))
        m, idx = tl.max(acc, axis=0, return_indices=True, return_indices_tie_break_left=True)
        better = m > best
        best = tl.where(better, m, best)
        arg = tl.where(better, s0 + idx.to(tl.int32), arg)
    pos = best > 0
    out = tl.where(pos, tl.log(1.0 + tl.where(pos, best, 0.0)), 0.0)
    tl.store(Out + b.to(tl.int64) * V + offs_v, out, mask=v_ok)
    tl.store(Arg + b.to(tl.int64) * V + offs_v, tl.where(pos, arg, -1), mask=v_ok)


@triton.jit
def _bwd_hidden_kernel(GZ, Arg, W, dH, S, V,
                       D: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
                       SCALE_G: tl.constexpr, IEEE: tl.constexpr):
    """d_hidden[b, s-tile, d-tile] = one-hot(arg == s) weighted by gz, times weight[:, d-tile]."""
    b = tl.program_id(0)
    s0 = tl.program_id(1) * BLOCK_S
    d0 = tl.program_id(2) * BLOCK_D
    offs_s = s0 + tl.arange(0, BLOCK_S)
    offs_d = d0 + tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    acc = tl.zeros([BLOCK_S, BLOCK_D], dtype=tl.float32)
    for v0 in range(0, V, BLOCK_V):
        offs_v = v0 + tl.arange(0, BLOCK_V)
        v_ok = offs_v < V
        gz = tl.load(GZ + b.to(tl.int64) * V + offs_v, mask=v_ok, other=0.0)
        a = tl.load(Arg + b.to(tl.int64) * V + offs_v, mask=v_ok, other=-1)
        hit = tl.where(a[None, :] == offs_s[:, None], gz[None, :], 0.0)  # [BLOCK_S, BLOCK_V]
        w = tl.load(W + offs_v[:, None].to(tl.int64) * D + offs_d[None, :], mask=v_ok[:, None] & d_ok[None, :],
                    other=0.0)
        if IEEE:
            acc += tl.dot(hit, w.to(tl.float32), input_precision="ieee")
        elif SCALE_G:  # fp16: scale the tile's weights into range before rounding, and back after
            scale = tl.maximum(tl.max(tl.abs(gz), axis=0), 1e-30)
            acc += tl.dot((hit / scale).to(w.dtype), w) * scale
        else:
            acc += tl.dot(hit.to(w.dtype), w)
    tl.store(dH + (b.to(tl.int64) * S + offs_s)[:, None] * D + offs_d[None, :], acc.to(dH.dtype.element_ty),
             mask=(offs_s < S)[:, None] & d_ok[None, :])


@triton.jit
def _bwd_weight_kernel(GZ, Arg, H, dW, n_b, S, V,
                       D: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr):
    """d_weight[v-tile, d-tile] = sum over b of gz[b, v] * hidden[b, arg[b, v], d-tile] (fp32)."""
    offs_v = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    v_ok = offs_v < V
    d_ok = offs_d < D
    acc = tl.zeros([BLOCK_V, BLOCK_D], dtype=tl.float32)
    for b in range(0, n_b):
        a = tl.load(Arg + b * V + offs_v, mask=v_ok, other=-1)
        gz = tl.where(a >= 0, tl.load(GZ + b * V + offs_v, mask=v_ok, other=0.0), 0.0)
        rows = tl.where(a >= 0, a, 0).to(tl.int64) + b * S  # no winner: row 0, weighed by gz = 0
        h = tl.load(H + rows[:, None] * D + offs_d[None, :], mask=d_ok[None, :], other=0.0)
        acc += gz[:, None] * h.to(tl.float32)
    tl.store(dW + offs_v[:, None].to(tl.int64) * D + offs_d[None, :], acc.to(dW.dtype.element_ty),
             mask=v_ok[:, None] & d_ok[None, :])


# Launch parameters benchmarks/sparton.py --sweep may override; empty = the defaults below.
TUNE: dict = {}


def _blocks():
    if interpreting():
        return dict(BLOCK_S=16, BLOCK_V=16, BLOCK_K=16)
    # measured on the H100 (benchmarks/results/sparton-sweep-H100.json): 128 x 128 tiles, K steps of 32, 4 warps
    return dict(BLOCK_S=TUNE.get("BLOCK_S", 128), BLOCK_V=TUNE.get("BLOCK_V", 128), BLOCK_K=TUNE.get("BLOCK_K", 32))


def _forward_triton(h, w, bias, mask):
    B, S, D = h.shape
    V = w.shape[0]
    out = torch.empty(B, V, dtype=torch.float32, device=h.device)
    arg = torch.empty(B, V, dtype=torch.int32, device=h.device)
    bl = _blocks()
    if B and V:
        _fwd_kernel[(B * triton.cdiv(V, bl["BLOCK_V"]),)](
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
            _bwd_hidden_kernel[(B, triton.cdiv(S, bs), triton.cdiv(D, bd))](
                gz, arg, w, dh, S, V, D=D, BLOCK_S=bs, BLOCK_V=bv, BLOCK_D=bd, SCALE_G=h.dtype == torch.float16,
                IEEE=ieee, num_warps=TUNE.get("dh_warps", 4), num_stages=TUNE.get("dh_stages", 3))
    if need_w:
        dw = torch.empty_like(w)
        if V:
            bvw = 16 if interpreting() else 64
            _bwd_weight_kernel[(triton.cdiv(V, bvw), triton.cdiv(D, bd))](gz, arg, h, dw, B, S, V, D=D, BLOCK_V=bvw,
                                                                         BLOCK_D=bd, num_warps=4)
    return dh, dw


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


def reference(hidden, weight, bias=None, attention_mask=None) -> torch.Tensor:
    """The naive composition: all [B, S, V] logits, relu, log1p, masked max (for tests)."""
    x = hidden @ weight.T
    if bias is not None:
        x = x + bias
    x = torch.log1p(torch.relu(x))
    if attention_mask is not None:
        x = x * (attention_mask != 0)[:, :, None].to(x.dtype)
    return x.amax(dim=1)


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
