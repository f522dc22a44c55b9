"""Probe (issue #17, ColPali case b): does the query block as the tensor-core dot's register
operand (wgmma A from registers; only the document tile read from shared memory) beat the
shared-memory operand on 1 x 1,024 query tokens vs 1,000 pages of 1,024 tokens?

A standalone kernel of the same shape as fused's long-query path (one program per (page, 256-row
query chunk), chunks side by side in the grid), timed for bf16 and int8 with the query operand in
shared memory (MODE 0) or registers (MODE 1: an identity inline-asm move, which triton cannot see
through, so the operand stays in registers), beside the real default call. Correctness first.
MODE 2 (int8, shared-memory operand; benchmarks/gluon_probe.py --floors): the tiles' dots
accumulated and nothing else, the floor of this loop without its conversion, scale and max.

    python benchmarks/rega_probe.py --out DIR
    TRITON_INTERPRET=1 python benchmarks/rega_probe.py --n 2 --L 256 --modes 0   # CPU check of the script

Measured (H100, results/rega-probe-H100-20261125.json): the register operand was slower in 17 of
the 18 configs (int8 at 256 x 128 / 8 warps: 0.434 against 0.448 ms); the best config of each
was bf16 0.526 against 0.440 from shared memory, int8 0.343 against 0.307: dropped. The plain
kernel itself (no bounds handling, masks or generality) showed that fused's long-query path lost
time to its masked tail tile (255 registers and a stack spill at BLOCK_Q 256): int8 0.307 ms
against the real kernel's 0.355, bf16 0.448 against 0.481, which led to fused's single unmasked
tile loop.
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
def _probe(Q, QS, D, DS, Out, d_len, n_chunks, MODE: tl.constexpr, INT8: tl.constexpr, CHUNK: tl.constexpr,
           BQ: tl.constexpr, BD: tl.constexpr, DIM: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    chunk = pid % n_chunks
    k = pid // n_chunks
    oq = tl.arange(0, BQ)
    od = tl.arange(0, BD)
    oc = tl.arange(0, DIM)
    total = tl.zeros([1], tl.float32)
    for qb in range(chunk * CHUNK, chunk * CHUNK + CHUNK, BQ):
        q = tl.load(Q + (qb + oq)[:, None] * DIM + oc[None, :])
        if MODE == 1:
            if INT8:
                q = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [q], dtype=tl.int8, is_pure=True, pack=4)
            else:
                q = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [q], dtype=q.dtype, is_pure=True, pack=2)
        if MODE == 2:
            mm = tl.zeros([BQ, BD], tl.int32)
        else:
            acc = tl.full([BQ], float("-inf"), tl.float32)
        for db in range(0, d_len, BD):
            cols = k * d_len + db + od
            dt = tl.load(D + cols[None, :] * DIM + oc[:, None])
            if MODE == 2:
                mm = tl.dot(q, dt, mm, out_dtype=tl.int32)
            else:
                if INT8:
                    a = tl.dot(q, dt, out_dtype=tl.int32)
                    s = ((a + 0x4B400000).to(tl.float32, bitcast=True) - 12582912.0) * tl.load(DS + cols)[None, :]
                else:
                    s = tl.dot(q, dt)
                acc = tl.maximum(acc, tl.max(s, axis=1))
        if MODE == 2:
            total += tl.sum(tl.sum(mm, axis=1).to(tl.float32), axis=0)
        else:
            if INT8:
                acc = acc * tl.load(QS + qb + oq)
            total += tl.sum(acc, axis=0)
    tl.store(Out + chunk * (tl.num_programs(0) // n_chunks) + k + tl.arange(0, 1), total)


def probe(q, qs, d, ds, n, L, mode, bq, bd, warps, stages, chunk=256):
    """One query's MaxSim against n padded documents of L tokens -> [n] (mode 2, int8 only: the sum
    of the dot products instead, for timing)."""
    n_chunks = q.shape[0] // chunk
    out = torch.empty(n_chunks, n, device=q.device, dtype=torch.float32)
    _probe[(n * n_chunks,)](q, qs, d, ds, out, L, n_chunks, MODE=mode, INT8=d.dtype == torch.int8, CHUNK=chunk,
                            BQ=bq, BD=bd, DIM=128, num_warps=warps, num_stages=stages)
    return out.sum(0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--L", type=int, default=1024)
    ap.add_argument("--modes", default="0,1")
    args = ap.parse_args()
    from triton.testing import do_bench

    from synthetic import colpali_inputs

    from mvdb.kernels import maxsim, quantize_int8

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    n, L = args.n, args.L
    Q, D = colpali_inputs(n, L, device=dev)
    ref = torch.einsum("qc,ndc->nqd", Q[0].float(), D.float()).amax(-1).sum(-1)
    D8, s8 = quantize_int8(D)
    q8, qs8 = quantize_int8(Q[0])
    flops = 2 * L * L * 128 * n
    rows = []

    def bench(name, fn, **kw):
        try:
            got = fn()
            err = float(((got.float() - ref).abs() / ref.abs().clamp_min(1e-6)).max())
            ok = err < (2e-2 if kw.get("int8") else 2e-3)
            ms = do_bench(fn, warmup=25, rep=200, return_mode="median") if ok and dev == "cuda" else None
        except Exception as e:  # noqa: BLE001 - report every variant
            rows.append(dict(name=name, error=f"{type(e).__name__}: {str(e)[:200]}", **kw))
            print(name, kw, "FAILED", str(e)[:200], flush=True)
            return
        tf = flops / (ms * 1e-3) / 1e12 if ms else None
        rows.append(dict(name=name, ms=ms, max_rel_err=err, tflops=tf, **kw))
        print(f"{name:<34} {kw} err {err:.1e} {ms if ms is None else round(ms, 4)} ms  {tf and round(tf)} TFLOPS",
              flush=True)

    bench("mvdb maxsim default", lambda: maxsim(Q, D)[0])
    bench("mvdb maxsim int8 default", lambda: maxsim(Q, D8, d_scales=s8)[0], int8=True)
    d2, ds2 = D.view(-1, 128), s8.view(-1)
    d82 = D8.view(-1, 128)
    for mode in [int(m) for c in [args.modes] for m in c.split(",")]:
        for bq, bd, w, st in ((256, 64, 4, 3), (256, 64, 4, 2), (256, 64, 8, 3), (256, 128, 8, 3), (256, 128, 8, 2),
                              (128, 128, 4, 3), (128, 128, 8, 3), (128, 64, 4, 3),
                              (256, 32, 4, 4))[:None if dev == "cuda" else 1]:
            cfg = dict(mode=mode, bq=bq, bd=bd, warps=w, stages=st)
            if dev == "cuda":  # the CPU interpreter (triton 3.9) multiplies bf16 tiles wrongly here
                bench("probe bf16", lambda: probe(Q[0], qs8, d2, ds2, n, L, mode, bq, bd, w, st), **cfg)
            bench("probe int8", lambda: probe(q8, qs8, d82, ds2, n, L, mode, bq, bd, w, st), int8=True, **cfg)
    dev_name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    with open(os.path.join(args.out, "rega-probe.json"), "w") as f:
        json.dump(dict(device=dev_name, n=n, L=L, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
