"""Probe (issue #17): variants of the padded cross-product dD kernel's query-block load, timed on
the same winners (2026-11-26). MODE 0: the query block masked by the token range only (the kernel
before commit d5393a7, and the kernel now, which gets a copy with masked rows zeroed when a query
mask is given); 1: masked by the winners (a >= 0, a load that waits on the winners' load; the
kernel from d5393a7 to e40aefc); 2: masked by the token range, then rows without a winner zeroed
by a select; 3: as 2 with the pointers advanced per query instead of int64 index products.
Every mode's dD is checked against mode 1's (bitwise) on inputs without NaN.

    python benchmarks/cross_dd_probe.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch
import triton
import triton.language as tl

from mvdb.kernels.maxsim.train import ops
from training import make_shape  # noqa: E402  (benchmarks/ is the script's folder)


@triton.jit
def _probe_kernel(Q, Arg, G, dD, n_q, n_k, lq, ld, DIM: tl.constexpr, BLOCK_DIM: tl.constexpr,
                  BLOCK_T: tl.constexpr, BLOCK_J: tl.constexpr, MODE: tl.constexpr):
    k = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)
    tok = k * ld + rows
    offs_t = tl.arange(0, BLOCK_T)
    t_ok = offs_t < lq
    offs_c = tl.arange(0, BLOCK_DIM)
    c_ok = offs_c < DIM
    acc = tl.zeros([BLOCK_J, BLOCK_DIM], dtype=tl.float32)
    a_ptr = Arg + k * lq + offs_t
    g_ptr = G + k
    q_ptr = Q + offs_t[:, None] * DIM + offs_c[None, :]
    for i in range(0, n_q):
        if MODE == 3:
            a = tl.load(a_ptr, mask=t_ok, other=-1)
            g = tl.load(g_ptr)
            q = tl.load(q_ptr, mask=t_ok[:, None] & c_ok[None, :], other=0.0)
            q = tl.where((a >= 0)[:, None], q, 0.0)
            a_ptr += n_k * lq
            g_ptr += n_k
            q_ptr += lq * DIM
        else:
            pair = i * n_k + k
            a = tl.load(Arg + pair * lq + offs_t, mask=t_ok, other=-1)
            g = tl.load(G + pair)
            if MODE == 0:
                q = tl.load(Q + (i * lq + offs_t)[:, None] * DIM + offs_c[None, :], mask=t_ok[:, None] & c_ok[None, :],
                            other=0.0)
            elif MODE == 1:
                q = tl.load(Q + (i * lq + offs_t).to(tl.int64)[:, None] * DIM + offs_c[None, :],
                            mask=(a >= 0)[:, None] & c_ok[None, :], other=0.0)
            else:
                q = tl.load(Q + (i * lq + offs_t).to(tl.int64)[:, None] * DIM + offs_c[None, :],
                            mask=t_ok[:, None] & c_ok[None, :], other=0.0)
                q = tl.where((a >= 0)[:, None], q, 0.0)
        hit = tok[:, None] == a[None, :]
        acc += g * tl.dot(hit.to(q.dtype), q, out_dtype=tl.float32)
    m2 = (rows < ld)[:, None] & c_ok[None, :]
    tl.store(dD + tok[:, None] * DIM + offs_c[None, :], acc.to(dD.dtype.element_ty), mask=m2)


SHAPES = [(256, 32, 180), (256, 32, 300), (128, 64, 512), (256, 32, 1024), (1024, 32, 180), (64, 32, 300)]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = p.parse_args()
    rows = []
    for b, lq, ld in SHAPES:
        Q, D = make_shape(dict(b=b, lq=lq, ld=ld, neg=0), "cuda")
        q, d = Q.reshape(-1, 128), D.reshape(-1, 128)
        _, arg, _, _ = ops.forward(q, ops._arange_steps(b, lq, q.device), d, ops._arange_steps(b, ld, q.device), b, b,
                                   lq, False, equal_lengths=True)
        grad = torch.randn(b, b, device="cuda")
        out = torch.empty_like(d)

        def run(mode, bj=64, stages=3, warps=4):
            _probe_kernel[(b, triton.cdiv(ld, bj))](q, arg, grad, out, b, b, lq, ld, DIM=128, BLOCK_DIM=128,
                                                    BLOCK_T=max(16, triton.next_power_of_2(lq)), BLOCK_J=bj, MODE=mode,
                                                    num_warps=warps, num_stages=stages)
            return out

        ref = run(1).clone()
        for mode in (0, 1, 2, 3):
            for bj, stages, warps in ((64, 3, 4), (64, 2, 4), (64, 4, 4), (128, 3, 8), (32, 3, 4)):
                same = bool(torch.equal(run(mode, bj, stages, warps), ref))
                t = statistics.median(triton.testing.do_bench(lambda: run(mode, bj, stages, warps), warmup=10, rep=40,
                                                               return_mode="median") for _ in range(3))
                r = {"b": b, "lq": lq, "ld": ld, "mode": mode, "bj": bj, "stages": stages, "warps": warps,
                     "equal": same, "ms": t}
                rows.append(r)
                print(json.dumps(r), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cross-dd-probe.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows},
                                                        indent=1))


if __name__ == "__main__":
    main()
