"""Compile fused MaxSim forward variants for sm_90 on a machine without a GPU (Triton AOT) and report
registers per thread, stack bytes (spills), shared memory and the MMA instructions used. Catches compile errors,
and register growth (fewer programs per SM), before GPU time.

    python benchmarks/compile_check.py            # the variants below
    python benchmarks/compile_check.py --quick    # the short-query ones only
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from mvdb.kernels.maxsim import fused

TYPES = {"fp16": "fp16", "bf16": "bf16", "fp32": "fp32", "int8": "i8"}
LAYOUTS = {"padded": 0, "per-query": 1, "varlen": 2, "candidates": 3}


def compile_variant(dtype: str, layout: str, bq: int, bd: int, warps: int, stages: int, runmax: int = 1,
                    quant: bool = False, qcache: bool = False, lq: int = 32, dim: int = 128,
                    maxnreg: int | None = None, qchunk: int = 0) -> dict:
    """Compile one variant; pointer arguments that the variant does not use are None (constexpr)."""
    fn = fused._maxsim_fwd_kernel
    int8 = dtype == "int8"
    lay = LAYOUTS[layout]
    varlen = lay >= 2
    ptrs = dict(Q=("fp16" if quant else "i8") if int8 else TYPES[dtype], QS="fp32" if int8 and not quant else None, QM=None,
                CU_Q="i32" if varlen else None, D=TYPES[dtype], DS="fp32" if int8 else None, DM=None,
                OFF=("i32" if lay == 2 else "i64") if varlen else None, CAND="i64" if lay == 3 else None,
                STARTS=None, SC_STARTS=None, Out="fp32", QC="i8" if qcache else None,
                QCS="fp32" if qcache else None, QFLAG="i64" if qcache else None)
    meta = dict(LQ_BUCKET=lq, DIM=dim, BLOCK_DIM=max(32, triton.next_power_of_2(dim)), Q_VARLEN=varlen, D_LAYOUT=lay,
                HAS_QMASK=False, HAS_DMASK=False, INT8=int8, IEEE=dtype == "fp32", UPCAST=False, PAGED=False,
                QUANT=quant, QCACHE=qcache, QCHUNK=qchunk, BLOCK_Q=bq, BLOCK_D=bd, RUNMAX=runmax)
    sig, consts = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in ptrs:
            sig[name] = "constexpr" if ptrs[name] is None else "*" + ptrs[name]
            if ptrs[name] is None:
                consts[(i,)] = None
        elif name == "gen":
            sig[name] = "i64"
        elif name in meta:
            sig[name] = "constexpr"
            consts[(i,)] = meta[name]
        else:
            sig[name] = "i32"
    # The JIT marks 16-byte-aligned pointers (tt.divisibility); without it nothing is pipelined.
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names) if sig[name].startswith("*")}
    k = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=warps, num_stages=stages,
                                    **({} if maxnreg is None else {"maxnreg": maxnreg})))
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    regs = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)  # ptxas puts spilled registers on the stack frame
    mma = sorted(set(re.findall(r"(wgmma\.mma_async[.\w]*|mma\.sync[.\w]*)", k.asm["ptx"])))
    return {"regs": int(regs[1]) if regs else None, "stack_bytes": int(stack[1]) if stack else None,
            "shared": k.metadata.shared, "mma": [m[:40] for m in mma][:2]}


def variants(quick: bool):
    short = [("fp16", "varlen", False, False), ("int8", "varlen", True, False), ("int8", "varlen", True, True),
             ("int8", "varlen", False, False), ("fp16", "candidates", False, False),
             ("int8", "candidates", False, False), ("int8", "candidates", True, True)]
    for dtype, layout, quant, qcache in short:
        for warps in (1, 2, 4):
            yield dict(dtype=dtype, layout=layout, bq=32, bd=32, warps=warps, stages=3, quant=quant, qcache=qcache)
    if quick:
        return
    for dtype in ("bf16", "int8"):
        yield dict(dtype=dtype, layout="padded", bq=128, bd=128, warps=4, stages=3, runmax=0, lq=1024)
        yield dict(dtype=dtype, layout="padded", bq=128, bd=128, warps=8, stages=3, runmax=0, lq=1024)
        yield dict(dtype=dtype, layout="padded", bq=128, bd=128, warps=4, stages=3, runmax=0, lq=1024, qchunk=256)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    failed = 0
    for v in variants(args.quick):
        name = " ".join(f"{k}={v[k]}" for k in v)
        try:
            print(f"{name}: {compile_variant(**v)}", flush=True)
        except Exception as e:  # noqa: BLE001 - report every variant
            failed += 1
            print(f"{name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
