"""Compile every kernel variant for sm_90 on a machine without a GPU (Triton AOT) and report
shared memory, spills and the MMA instructions used. Catches compile errors before GPU time.

    python benchmarks/compile_check.py
"""

from __future__ import annotations

import itertools
import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from mvdb.kernels.maxsim import fused

TYPES = {"fp16": "*fp16", "bf16": "*bf16", "fp32": "*fp32", "int8": "*i8"}


def compile_variant(dtype: str, layout: int, bq: int, bd: int, warps: int, stages: int, dim: int = 128, masks=False):
    fn = fused._maxsim_fwd_kernel
    q_varlen = layout >= 2
    consts = dict(
        LQ_BUCKET=bq, DIM=dim, BLOCK_DIM=max(32, triton.next_power_of_2(dim)), Q_VARLEN=q_varlen, D_LAYOUT=layout,
        HAS_QMASK=masks and not q_varlen, HAS_DMASK=masks and not q_varlen, INT8=dtype == "int8",
        IEEE=dtype == "fp32", UPCAST=False, BLOCK_Q=bq, BLOCK_D=bd,
    )
    sig = {
        "Q": "*fp16" if dtype == "int8" else TYPES[dtype],
        "QM": "*u8" if consts["HAS_QMASK"] else "constexpr",
        "CU_Q": "*i32" if q_varlen else "constexpr",
        "D": TYPES[dtype],
        "DS": "*fp32" if dtype == "int8" else "constexpr",
        "DM": "*u8" if consts["HAS_DMASK"] else "constexpr",
        "OFF": ("*i32" if layout == 2 else "*i64") if layout >= 2 else "constexpr",
        "CAND": "*i64" if layout == 3 else "constexpr",
        "Out": "*fp32", "n_q": "i32", "n_k": "i32", "q_len": "i32", "d_len": "i32",
    }
    for name in ("QM", "CU_Q", "DS", "DM", "OFF", "CAND"):
        if sig[name] == "constexpr":
            consts[name] = None
    for k in consts:
        sig.setdefault(k, "constexpr")
    # The JIT marks 16-byte-aligned pointers (tt.divisibility); without it nothing is pipelined.
    names = list(sig)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n, t in sig.items() if t.startswith("*")}
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
    ptx = k.asm["ptx"]
    mma = sorted(set(re.findall(r"(wgmma\.mma_async[.\w]*|mma\.sync[.\w]*)", ptx)))
    spills = re.findall(r"\.local", ptx)
    ttgir = k.asm["ttgir"]
    return {"shared": k.metadata.shared, "mma": [m[:40] for m in mma][:2], "local": len(spills),
            "async_copies": len(re.findall("async_copy_global_to_local", ttgir))}


def main():
    for dtype, layout, (bq, bd, w, s) in itertools.product(
        ("fp16", "bf16", "fp32", "int8"), (0, 1, 2, 3), ((32, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 2))
    ):
        try:
            r = compile_variant(dtype, layout, bq, bd, w, s, masks=layout < 2)
            print(f"{dtype:5} layout {layout} BQ{bq:<4}BD{bd:<4}w{w} s{s}: smem {r['shared']:6d} local {r['local']} {r['mma']}")
        except Exception as e:  # noqa: BLE001
            print(f"{dtype:5} layout {layout} BQ{bq} BD{bd}: FAILED {type(e).__name__}: {str(e)[:300]}")


if __name__ == "__main__":
    main()
