"""Probe (issue #17, case a): float queries against INT8 documents without quantizing the queries.
Each document tile is widened to the query's dtype in registers (int8 values are exact in fp16)
and multiplied on the fp16 tensor cores; the token's scale is applied to the float scores. The
default int8 call instead quantizes the query (a kernel of its own, or inside the MaxSim kernel
shared by claim) and runs int8 x int8: its host and device cost on a memory-bound call is what
this path would skip. Its scores differ from the int8 x int8 ones by the query's quantization
error (closer to the fp32 reference).

One program per document (packed varlen, one query), the fused kernel's clamped tile loop
(the last tile ends at the document's end; short documents repeat their last token).

    python benchmarks/mixed_probe.py --out DIR        # CUDA GPU

Measured (H100, 2026-11-26, results/mixed-probe-H100-20261126.json), 1 query of 32 tokens x 10k
documents of 64-300 tokens: exact to the float query against the dequantized documents (5.8e-7),
but no faster than the default int8 call (0.102 ms in the same run). With triton's int8 -> fp16
conversion (I2F, one per element) 0.118-0.167 ms; with _widen (two PRMT and two HADD2 per four
elements) 0.102-0.117, the best at one warp and 32-token tiles. Dropped: what the path saves on
the query's quantization it spends widening the documents.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@triton.jit
def _widen(x):
    """int8 -> fp16, four at a time without I2F (a quarter-rate conversion on sm_90): each byte's
    sign bit flipped (x + 128 as unsigned) under fp16's exponent of 1024 is 1024 + x + 128 exactly,
    then 1152 subtracted in pairs."""
    return tl.inline_asm_elementwise(
        "{ .reg .b32 t, c; xor.b32 t, $2, 0x80808080; mov.b32 c, 0x64806480; prmt.b32 $0, t, 0x64646464, 0x4140; "
        "prmt.b32 $1, t, 0x64646464, 0x4342; sub.f16x2 $0, $0, c; sub.f16x2 $1, $1, c; }",
        "=r,=r,r", [x], dtype=tl.float16, is_pure=True, pack=4)


@triton.jit
def _mixed(Q, D, DS, OFF, Out, q_n, BQ: tl.constexpr, BD: tl.constexpr, DIM: tl.constexpr, ASM: tl.constexpr):
    k = tl.program_id(0).to(tl.int64)
    d_start = tl.load(OFF + k).to(tl.int64)
    n = (tl.load(OFF + k + 1).to(tl.int64) - d_start).to(tl.int32)
    oq = tl.arange(0, BQ)
    od = tl.arange(0, BD)
    oc = tl.arange(0, DIM)
    q = tl.load(Q + oq[:, None] * DIM + oc[None, :], mask=(oq < q_n)[:, None], other=0.0)
    acc = tl.full([BQ, BD], float("-inf"), tl.float32)
    lim = tl.minimum(od, n - 1)
    Dd = D + d_start * DIM
    DSd = DS + d_start
    for db in range(0, n, BD):
        cols = tl.maximum(tl.minimum(db, n - BD), 0) + lim
        dt = tl.load(Dd + cols.to(tl.int64)[None, :] * DIM + oc[:, None])  # [DIM, BD] int8
        dt = _widen(dt) if ASM else dt.to(q.dtype)
        s = tl.dot(q, dt) * tl.load(DSd + cols)[None, :]
        acc = tl.maximum(acc, s)
    best = tl.max(acc, axis=1)
    best = tl.where((oq < q_n) & (best > float("-inf")), best, 0.0)
    tl.store(Out + k + tl.arange(0, 1), tl.sum(best, axis=0)[None])


def mixed(q, d8, ds, off, bq, bd, warps, stages, asm=False):
    """One query [Lq, dim] (fp16) against packed int8 documents -> [n_docs]."""
    n = off.numel() - 1
    out = torch.empty(n, device=q.device, dtype=torch.float32)
    _mixed[(n,)](q, d8, ds, off, out, q.shape[0], BQ=max(16, triton.next_power_of_2(q.shape[0])), BD=bd,
                 DIM=q.shape[1], ASM=asm, num_warps=warps, num_stages=stages)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    from common import median_ms
    from synthetic import one_query_inputs

    from mvdb.kernels import maxsim_varlen, quantize_int8
    from mvdb.kernels.maxsim import naive

    dev = "cuda"
    rows = []
    corpus, q, cu_q, tok, cu_d = one_query_inputs(device=dev)
    ref = naive.maxsim_csr(q.float(), cu_q, tok.float(), corpus.offsets, dtype=torch.float32)[0]
    tok8, sc8 = quantize_int8(tok)
    # what the mixed path computes exactly: the float query against the dequantized documents
    ref8 = naive.maxsim_csr(q.float(), cu_q, tok8.float() * sc8[:, None], corpus.offsets, dtype=torch.float32)[0]

    def bench(name, fn, want, tol, **kw):
        got = fn()
        err = float(((got.float() - want).abs() / want.abs().clamp_min(1e-3)).max())
        ms = sorted(median_ms(fn) for _ in range(3))[1] if err < tol else None
        rows.append(dict(name=name, ms=ms, max_rel_err=err, **kw))
        print(f"{name:<26} {kw} err {err:.1e} {ms if ms is None else round(ms, 4)} ms", flush=True)

    bench("default fp16", lambda: maxsim_varlen(q, cu_q, tok, cu_d, check=False)[0], ref, 2e-3)
    bench("default int8", lambda: maxsim_varlen(q, cu_q, tok8, cu_d, d_scales=sc8, check=False)[0], ref, 3e-2)
    for asm in (False, True):
        for bd, w, st in ((32, 2, 3), (32, 2, 2), (32, 4, 3), (64, 2, 3), (64, 4, 3), (32, 1, 3)):
            bench("mixed fp16 x int8", lambda: mixed(q, tok8, sc8, cu_d, 32, bd, w, st, asm), ref8, 1e-4, bd=bd,
                  warps=w, stages=st, asm=asm)
    with open(os.path.join(args.out, "mixed-probe.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
