"""Probe (issue #17, ColPali case b): a Gluon (triton.experimental.gluon) MaxSim kernel for long
queries x long documents that keeps one tile's wgmma in flight while the previous tile is scored.

Triton's own pipeliner makes a wgmma asynchronous only when its accumulator is float32 and its
result feeds nothing but the next dot (WGMMAPipeline.cpp, rules 2 and 2.1), so fused's int8 loop
waits for every tile's MMA before its conversion, scale and max: tensor cores and the epilogue
take turns. Gluon writes the wait by hand (warpgroup_mma_wait(num_outstanding=1)).

One program per (document, BQ-row query block), query blocks of a document side by side in the
grid; the query block in shared memory (or registers, A_REGS) for the whole document; document
tiles of BD tokens arrive by cp.async into an NBUF-deep ring; two accumulators alternate (the
loop is unrolled by two, so no accumulator is copied). MODE 0: overlapped; 1: each MMA waited on
at once (the same code, serial); 2: MMAs and loads only (the floor without any epilogue).

    python benchmarks/gluon_probe.py --out DIR            # H100/H200 only (sm_90): Gluon int8 and bf16 configs
    python benchmarks/gluon_probe.py --floors --out DIR   # int8 floors: MMAs and loads without an epilogue

Measured (H100, 2026-11-26, results/gluon-probe-H100-20261126.json and -floors-H100-20261126.json):
exact (same errors as the default call), but slower. Int8, BLOCK_Q 128 / BD 64 / 4 warps / query
block in registers: overlapped 0.393 ms, serial 0.433, MMAs and loads alone 0.243; the default
call 0.345 in the same run. The overlap hid 0.04 of the epilogue's 0.19 ms. The other eight int8
configs (both runs) 0.411-0.574 ms, bf16 0.461-0.501 (default 0.446). Floors without any epilogue: 0.198-0.217
ms in the plain triton loop (rega_probe MODE 2; 256 x 64, 128 x 64, 128 x 128 tiles, 4 warps; 0.307-0.350 with its
epilogue), 0.208-0.349 in Gluon's. The MMAs and loads alone take two thirds of the issue's 0.30 ms
target, and the epilogue adds 0.1 ms or more on top of them in every variant measured: dropped.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@gluon.jit
def _issue(D, bufs, t, n_t, base, rows_l, cols_l, BD: gl.constexpr, DIM: gl.constexpr, NBUF: gl.constexpr):
    """cp.async of the document's tile t (BD tokens from row base + t * BD) into ring slot t % NBUF, as
    one commit group (an empty one past the last tile, so that the groups stay counted alike)."""
    ptrs = D + (base + t * BD + rows_l).to(gl.int64)[:, None] * DIM + cols_l[None, :]
    ok = (rows_l < BD) & (t < n_t)
    cp.async_copy_global_to_shared(bufs.index(t % NBUF), ptrs, mask=ok[:, None])
    cp.commit_group()


@gluon.jit
def _tile_max(acc, INT8: gl.constexpr, FMA: gl.constexpr, DS, row0, scol_l):
    """[BQ] row maxima of one tile's scores: int8 accumulators converted (bit-pattern add) and
    scaled by the tokens' scales, as fused does (FMA: one FMA with 22-bit scales, benchmarks/ab/fma.patch)."""
    if INT8:
        sc = gl.load(DS + row0 + scol_l)
        if FMA:
            s22 = ((sc.to(gl.int32, bitcast=True) + 2) & -4).to(gl.float32, bitcast=True)
            s = gl.fma((acc + 0x4B400000).to(gl.float32, bitcast=True), s22[None, :],
                       (s22 * -12582912.0)[None, :])
        else:
            s = ((acc + 0x4B400000).to(gl.float32, bitcast=True) - 12582912.0) * sc[None, :]
    else:
        s = acc
    return gl.max(s, axis=1)


@gluon.jit
def _fold(m, MODE: gl.constexpr, tm):
    """The running row maxima with a tile's folded in (MODE 2: untouched)."""
    if MODE == 2:
        return m
    else:
        return gl.maximum(m, tm)


@gluon.jit
def _ready(NBUF: gl.constexpr, first: gl.constexpr):
    """Wait until the next tile's copy has landed (its group and all before it), for every thread, and
    order those writes before the tensor cores' reads (async proxy)."""
    if first:
        cp.wait_group(NBUF - 2)
    else:
        cp.wait_group(NBUF - 3)
    gl.thread_barrier()
    fence_async_shared()


@gluon.jit
def _gluon_maxsim(Q, QS, D, DS, Out, n_docs, d_len, q_len, INT8: gl.constexpr, BQ: gl.constexpr, BD: gl.constexpr,
                  DIM: gl.constexpr, NBUF: gl.constexpr, A_REGS: gl.constexpr, FMA: gl.constexpr, MODE: gl.constexpr,
                  num_warps: gl.constexpr):
    """Out[c, k]: the sum over query rows [c * BQ, c * BQ + BQ) of their max over document k's d_len tokens
    (padded layout; d_len a multiple of BD and at least (NBUF - 1) * BD). MODE 0: a tile's MMA in flight
    while the previous tile is scored; 1: each MMA waited on at once; 2: MMAs and loads only (timing)."""
    pid = gl.program_id(0)
    n_qb = q_len // BQ
    c = pid % n_qb
    k = pid // n_qb
    KI: gl.constexpr = 32 if INT8 else 16
    WM: gl.constexpr = num_warps if BQ >= 16 * num_warps else BQ // 16
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WM, num_warps // WM],
                                                  instr_shape=[16, BD // (num_warps // WM), KI])
    VEC: gl.constexpr = 16 if INT8 else 8
    TC: gl.constexpr = DIM // VEC
    ld: gl.constexpr = gl.BlockedLayout([1, VEC], [32 // TC, TC], [num_warps, 1], [1, 0])
    dty: gl.constexpr = D.dtype.element_ty
    q_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BQ, DIM], dty)
    d_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BD, DIM], dty)

    qr = gl.arange(0, BQ, layout=gl.SliceLayout(1, ld))
    cc = gl.arange(0, DIM, layout=gl.SliceLayout(0, ld))
    q_smem = gl.allocate_shared_memory(dty, [BQ, DIM], q_sl)
    q_smem.store(gl.load(Q + (c * BQ + qr).to(gl.int64)[:, None] * DIM + cc[None, :]))
    fence_async_shared()
    gl.thread_barrier()
    if A_REGS:
        a = q_smem.load(gl.DotOperandLayout(operand_index=0, parent=mma, k_width=32 // dty.primitive_bitwidth))
    else:
        a = q_smem

    bufs = gl.allocate_shared_memory(dty, [NBUF, BD, DIM], d_sl)
    dr = gl.arange(0, BD, layout=gl.SliceLayout(1, ld))
    scol = gl.arange(0, BD, layout=gl.SliceLayout(0, mma))
    base = k.to(gl.int64) * d_len
    n_t = d_len // BD
    for i in gl.static_range(NBUF - 1):
        _issue(D, bufs, i, n_t, base, dr, cc, BD, DIM, NBUF)
    if INT8:
        acc_a = gl.zeros([BQ, BD], gl.int32, layout=mma)
    else:
        acc_a = gl.zeros([BQ, BD], gl.float32, layout=mma)
    acc_b = acc_a
    m = gl.full([BQ], float("-inf"), gl.float32, layout=gl.SliceLayout(1, mma))
    _ready(NBUF, True)
    acc_a = warpgroup_mma(a, bufs.index(0).permute((1, 0)), acc_a, use_acc=MODE == 2, is_async=MODE != 1)
    # tiles t (acc_b) and t + 1 (acc_a) per iteration; acc_a holds tile t - 1 in flight on entry
    for t in range(1, n_t - 1, 2):
        _ready(NBUF, False)
        acc_b = warpgroup_mma(a, bufs.index(t % NBUF).permute((1, 0)), acc_b, use_acc=MODE == 2, is_async=MODE != 1)
        acc_a = warpgroup_mma_wait(num_outstanding=1, deps=(acc_a,))
        _issue(D, bufs, t + NBUF - 2, n_t, base, dr, cc, BD, DIM, NBUF)
        m = _fold(m, MODE, _tile_max(acc_a, INT8, FMA, DS, base + (t - 1) * BD, scol))
        _ready(NBUF, False)
        acc_a = warpgroup_mma(a, bufs.index((t + 1) % NBUF).permute((1, 0)), acc_a, use_acc=MODE == 2,
                              is_async=MODE != 1)
        acc_b = warpgroup_mma_wait(num_outstanding=1, deps=(acc_b,))
        _issue(D, bufs, t + NBUF - 1, n_t, base, dr, cc, BD, DIM, NBUF)
        m = _fold(m, MODE, _tile_max(acc_b, INT8, FMA, DS, base + t * BD, scol))
    if n_t % 2 == 0:  # one tile left to issue: n_t - 1
        _ready(NBUF, False)
        last = warpgroup_mma(a, bufs.index((n_t - 1) % NBUF).permute((1, 0)), acc_b, use_acc=MODE == 2,
                             is_async=MODE != 1)
        fa = warpgroup_mma_wait(num_outstanding=1, deps=(acc_a,))
        m = gl.maximum(m, _tile_max(fa, INT8, FMA, DS, base + (n_t - 2) * BD, scol))
        fb = warpgroup_mma_wait(num_outstanding=0, deps=(last,))
        m = gl.maximum(m, _tile_max(fb, INT8, FMA, DS, base + (n_t - 1) * BD, scol))
    else:
        fa = warpgroup_mma_wait(num_outstanding=0, deps=(acc_a,))
        m = gl.maximum(m, _tile_max(fa, INT8, FMA, DS, base + (n_t - 1) * BD, scol))
    cp.wait_group(0)
    if INT8:
        m = m * gl.load(QS + c * BQ + gl.arange(0, BQ, layout=gl.SliceLayout(1, mma)))
    gl.store(Out + c * n_docs + k, gl.sum(m, axis=0))


def probe(q, qs, d, ds, n_docs, d_len, bq, bd, warps, nbuf, a_regs, fma, mode):
    """One query's MaxSim against n_docs padded documents by _gluon_maxsim -> [n_docs]."""
    n_qb = q.shape[0] // bq
    out = torch.empty(n_qb, n_docs, device=q.device, dtype=torch.float32)
    _gluon_maxsim[(n_docs * n_qb,)](q, qs, d, ds, out, n_docs, d_len, q.shape[0], INT8=d.dtype == torch.int8, BQ=bq,
                                    BD=bd, DIM=q.shape[1], NBUF=nbuf, A_REGS=a_regs, FMA=fma, MODE=mode,
                                    num_warps=warps)
    return out.sum(0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--L", type=int, default=1024)
    ap.add_argument("--floors", action="store_true",
                    help="only the int8 floors: MMAs without an epilogue in fused's loop structure (triton) and in "
                         "Gluon's at N=128, beside the default call and rega_probe's plain kernel")
    args = ap.parse_args()
    from common import median_ms
    from synthetic import colpali_inputs

    from mvdb.kernels import maxsim, quantize_int8
    from mvdb.kernels.maxsim import naive

    dev = "cuda"
    rows = []

    def bench(name, fn, ref, int8, check=True, **kw):
        try:
            got = fn()
            err = float(((got.float() - ref).abs() / ref.abs().clamp_min(1e-3)).max())
            ok = (err < (3e-2 if int8 else 2e-3)) or not check
            ms = sorted(median_ms(fn) for _ in range(3))[1] if ok else None
        except Exception as e:  # noqa: BLE001 - report every variant
            rows.append(dict(name=name, error=f"{type(e).__name__}: {str(e)[-300:]}", **kw))
            print(name, kw, "FAILED", str(e)[-300:], flush=True)
            return
        rows.append(dict(name=name, ms=ms, max_rel_err=err, checked=check, **kw))
        print(f"{name:<28} {kw} err {err:.1e} {ms if ms is None else round(ms, 4)} ms", flush=True)

    # correctness on an odd tile count and a query of 2 blocks first (960 = 15 x 64 tokens)
    Qs, Ds = colpali_inputs(64, 960, device=dev, lq=256, seed=11, query_seed=12)
    ref_s = naive.maxsim_padded(Qs.float(), Ds.float(), dtype=torch.float32)[0]
    D8s, s8s = quantize_int8(Ds)
    q8s, qs8s = quantize_int8(Qs[0])
    d8s, sc8s = D8s.view(-1, 128), s8s.view(-1)
    for bq, bd, w, nb, ar, fma in ((128, 64, 4, 4, True, True), (128, 64, 4, 4, True, False),
                                   (128, 64, 8, 4, True, True)):
        bench("small int8", lambda: probe(q8s, qs8s, d8s, sc8s, 64, 960, bq, bd, w, nb, ar, fma, 0),
              ref_s, True, bq=bq, bd=bd, warps=w, nbuf=nb, a_regs=ar, fma=fma, mode=0)
    bench("small bf16", lambda: probe(Qs[0], qs8s, Ds.view(-1, 128), sc8s, 64, 960, 128, 64, 4, 4, False, False, 0),
          ref_s, False, bq=128, bd=64, warps=4, nbuf=4, a_regs=False, mode=0)

    n, L = args.n, args.L
    Q, D = colpali_inputs(n, L, device=dev)
    ref = naive.maxsim_padded(Q.float(), D.float(), dtype=torch.float32, budget=1 << 28)[0]
    D8, s8 = quantize_int8(D)
    q8, qs8 = quantize_int8(Q[0])
    d2, ds2, d82 = D.view(-1, 128), s8.view(-1), D8.view(-1, 128)
    if args.floors:
        import rega_probe
        bench("mvdb maxsim int8 default", lambda: maxsim(Q, D8, d_scales=s8)[0], ref, True)
        for bq, bd, w, st in ((128, 128, 4, 3), (256, 64, 4, 3), (128, 64, 4, 3), (256, 128, 8, 3)):
            cfg = dict(bq=bq, bd=bd, warps=w, stages=st)
            bench("plain int8 (rega_probe)", lambda: rega_probe.probe(q8, qs8, d82, ds2, n, L, 0, bq, bd, w, st), ref,
                  True, **cfg)
            bench("plain int8 MMAs only", lambda: rega_probe.probe(q8, qs8, d82, ds2, n, L, 2, bq, bd, w, st), ref,
                  True, check=False, **cfg)
        for bq, bd, w, nb, ar, mode in ((64, 128, 4, 4, True, 2), (128, 128, 8, 4, True, 2), (128, 128, 8, 4, False, 2),
                                        (128, 32, 4, 6, True, 0), (128, 32, 4, 6, True, 2), (64, 64, 4, 4, True, 0)):
            bench("gluon int8", lambda: probe(q8, qs8, d82, ds2, n, L, bq, bd, w, nb, ar, True, mode), ref, True,
                  check=mode != 2, bq=bq, bd=bd, warps=w, nbuf=nb, a_regs=ar, fma=True, mode=mode)
        with open(os.path.join(args.out, "gluon-probe-floors.json"), "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), n=n, L=L, rows=rows), f, indent=1)
        return
    bench("mvdb maxsim bf16 default", lambda: maxsim(Q, D)[0], ref, False)
    bench("mvdb maxsim int8 default", lambda: maxsim(Q, D8, d_scales=s8)[0], ref, True)
    int8_cfgs = [(128, 64, 4, 4, True, True), (128, 64, 4, 4, True, False), (128, 64, 4, 4, False, True),
                 (128, 64, 8, 4, True, True), (256, 64, 8, 4, True, True), (128, 128, 8, 4, True, True),
                 (128, 64, 4, 5, True, True)]
    for bq, bd, w, nb, ar, fma in int8_cfgs:
        for mode in (0, 1, 2) if (bq, bd, w, nb, ar, fma) == int8_cfgs[0] else (0,):
            bench("gluon int8", lambda: probe(q8, qs8, d82, ds2, n, L, bq, bd, w, nb, ar, fma, mode), ref, True,
                  check=mode != 2, bq=bq, bd=bd, warps=w, nbuf=nb, a_regs=ar, fma=fma, mode=mode)
    bf16_cfgs = [(128, 64, 4, 4, False), (128, 64, 8, 4, True), (128, 128, 8, 4, False), (256, 64, 8, 4, False)]
    for bq, bd, w, nb, ar in bf16_cfgs:
        for mode in (0, 1, 2) if (bq, bd, w, nb, ar) == bf16_cfgs[0] else (0,):
            bench("gluon bf16", lambda: probe(Q[0], qs8, d2, ds2, n, L, bq, bd, w, nb, ar, False, mode), ref, False,
                  check=mode != 2, bq=bq, bd=bd, warps=w, nbuf=nb, a_regs=ar, mode=mode)
    with open(os.path.join(args.out, "gluon-probe.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), n=n, L=L, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
