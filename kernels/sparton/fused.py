"""Sparton's Triton kernels: the fused logits-max forward (winning position per (b, v)) and the
two backwards (d_hidden as a one-hot matmul, d_weight as a gather). Launched by ops.py."""

from __future__ import annotations

import triton
import triton.language as tl


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
