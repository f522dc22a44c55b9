"""Every launch config of the fused MaxSim forward, timed one by one on the issue #17 shapes.

    python benchmarks/kernel_variants.py                  # all cases (GPU); JSON to $OUT or benchmarks/results/
    python benchmarks/kernel_variants.py --cases a,c      # a subset
    python benchmarks/kernel_variants.py --smoke          # tiny shapes under TRITON_INTERPRET=1 (checks the script)
    python benchmarks/kernel_variants.py --int8 --labels a-10k-int8,c-1M-int8 --cases a,c   # int8 configs only
    python benchmarks/kernel_variants.py --cases h        # host time per call, step by step
    python benchmarks/kernel_variants.py --regs --cases a,c   # short-query configs under register caps
    python benchmarks/kernel_variants.py --cases c --configs '[{"BLOCK_Q": 32, "BLOCK_D": 32, "RUNMAX": 0, "num_warps": 1, "num_stages": 1}]'
    python benchmarks/kernel_variants.py --qshared --labels a-10k-int8 --cases a   # the shared int8 path's configs

Where benchmarks/kernels.py times what the autotuner picks (and the peers), this times each
candidate config (BLOCK_Q, BLOCK_D, RUNMAX, warps, stages) directly through
``fused.launch(config=...)``, after checking it against the fp32 reference, so the short list the
autotuner searches (kernels/maxsim/fused.py ``_prune``) is chosen from measurements. It also times
the default call as users write it (``check=False``, no ``max_seqlen_q``) next to the call with
``max_seqlen_q``.

Cases: (a) 1 query x 10k docs of 64-300 tokens, varlen; (b) ColPali 1024 x 1000 x 1024, padded;
(c) 32 queries x 1000 candidates from a CSR store of 1M docs of 64-128 tokens. Each in fp16 (bf16
for b) and int8. (h) the host's time per call of case a's launch steps (no GPU wait inside the
timed region), with fused.launch_kernel's relaunch and with triton's own launch.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from common import median_ms, with_attr  # noqa: E402
from synthetic import candidate_lists, make_corpus, make_queries  # noqa: E402

from mvdb.kernels import maxsim, maxsim_candidates, maxsim_varlen, quantize_int8  # noqa: E402
from mvdb.kernels.maxsim import fused, naive  # noqa: E402


def bench(fn) -> float:
    return median_ms(fn, warmup=10, rep=60, cpu_runs=1)


def _grid(bds, warps, stages, **fixed) -> list[dict]:
    """Short-query configs (32-row query blocks): every BLOCK_D x warps x stages x RUNMAX, plus ``fixed``."""
    return [{"BLOCK_Q": 32, "BLOCK_D": bd, "RUNMAX": r, "num_warps": w, "num_stages": st, **fixed}
            for bd, w, st, r in itertools.product(bds, warps, stages, (0, 1))]


def short_configs(smoke: bool):
    if smoke:
        return [{"BLOCK_Q": 16, "BLOCK_D": 16, "RUNMAX": r, "num_warps": 4} for r in (0, 1)]
    return [c for c in _grid((32, 64, 128, 256), (2, 4, 8), (2, 3)) if not (c["BLOCK_D"] == 256 and c["num_warps"] == 2)]


def long_configs(smoke: bool):
    if SWEEP == "qchunk":
        return qchunk_configs(smoke)
    if smoke:
        return [{"BLOCK_Q": 16, "BLOCK_D": 16, "RUNMAX": r, "num_warps": 4} for r in (0, 1)]
    out = []
    for bq, bd, w, st, r in itertools.product((128, 256), (64, 128, 256), (4, 8), (3, 4), (0, 1)):
        out.append({"BLOCK_Q": bq, "BLOCK_D": bd, "RUNMAX": r, "num_warps": w, "num_stages": st})
    return out


ROWS: list[dict] = []


def sweep(case: str, configs, launch, ref, default_calls: dict, floor_ms: float) -> None:
    """Time launch(config) for each config (after a correctness check) and the named default calls."""
    if LABELS and case not in LABELS:
        return
    tol = 3e-2 if "int8" in case else 1e-2
    scale = ref.abs().max().clamp_min(1e-30)
    for name, fn in default_calls.items():
        got = fn()
        err = float(((got.float() - ref).abs().max() / scale).item())
        row = {"case": case, "call": name, "max_rel_err": err, "correct": err <= tol}
        if row["correct"]:
            row["ms"] = bench(fn)
            row["pct_of_floor"] = 100 * floor_ms / row["ms"]
        ROWS.append(row)
        print(json.dumps(row), flush=True)
    for cfg in configs:
        row = {"case": case, "config": cfg}
        try:
            got = launch(cfg)
            err = float(((got.float() - ref).abs().max() / scale).item())
            row.update(max_rel_err=err, correct=err <= tol)
            if row["correct"]:
                row["ms"] = bench(lambda cfg=cfg: launch(cfg))
                row["pct_of_floor"] = 100 * floor_ms / row["ms"]
        except Exception as e:  # noqa: BLE001 - a config that does not compile (registers, shared memory) is a result
            row.update(correct=False, error=f"{type(e).__name__}: {str(e)[:200]}")
        ROWS.append(row)
        print(json.dumps(row), flush=True)
    if default_calls and torch.cuda.is_available():  # the first call again: did the machine drift meanwhile?
        name, fn = next(iter(default_calls.items()))
        row = {"case": case, "call": f"{name}, again after the configs", "ms": bench(fn)}
        row["pct_of_floor"] = 100 * floor_ms / row["ms"]
        ROWS.append(row)
        print(json.dumps(row), flush=True)
    if torch.cuda.is_available():
        print("autotune winners:", {str(k): v for k, v in fused._BEST.items()}, flush=True)
    best = min((r for r in ROWS if r["case"] == case and "config" in r and "ms" in r), key=lambda r: r["ms"], default=None)
    if best:
        print(f"== {case}: best {best['ms']:.4f} ms {best['config']} ({best['pct_of_floor']:.0f}% of floor)", flush=True)


SWEEP = ""  # which config list cases a and c time: "" (short_configs), "int8", "int8small", "regs", "qcache",
# "qshared" or "configs" (--configs); "qchunk": case b
LABELS: list[str] = []  # only the cases whose label is listed (all when empty)


def int8_configs(smoke: bool):
    """Short-query int8 with the queries quantized by their own launch (QUANT 0): tiles, warps
    (1 included), deeper pipelines."""
    if smoke:
        return [{"BLOCK_Q": 16, "BLOCK_D": 16, "RUNMAX": 1, "num_warps": 4, "QUANT": 0}]
    return _grid((32, 64, 128), (1, 2, 4), (2, 3, 4, 5), QUANT=0)


def int8_small_configs(smoke: bool):
    """Short-query int8, queries quantized apart (QUANT 0), with less shared memory per program
    than int8_configs' smallest (16-row tiles, 1-2 stages): more programs resident per SM on
    documents of a few tiles."""
    if smoke:
        return [{"BLOCK_Q": 16, "BLOCK_D": 16, "RUNMAX": 1, "num_warps": 4, "num_stages": 1, "QUANT": 0}]
    return _grid((16, 32), (1, 2), (1, 2), QUANT=0)


def regs_configs(smoke: bool, int8: bool):
    """Short-query configs under a register cap (triton's ``maxnreg``, ptx .maxnreg): fewer registers
    per thread, more programs resident per SM (occupancy) where registers, not shared memory,
    limit them. int8: both query-quantization placements (QUANT 1 in the kernel, 0 apart)."""
    if smoke:
        return [{"BLOCK_Q": 16, "BLOCK_D": 16, "RUNMAX": 1, "num_warps": 4, "maxnreg": 64}]
    caps = {1: (None, 96, 128, 168), 2: (None, 64, 80, 96), 4: (None, 48, 64)}
    bases = [(1, 2, 0), (1, 3, 0), (1, 3, 1), (2, 2, 1), (2, 3, 1), (2, 3, 0), (4, 3, 1)] if int8 else \
        [(2, 2, 1), (2, 3, 1), (4, 2, 1), (4, 3, 1)]
    out = []
    for quant in ((1, 0) if int8 else (None,)):
        for w, st, r in bases:
            for cap in caps[w]:
                cfg = {"BLOCK_Q": 32, "BLOCK_D": 32, "RUNMAX": r, "num_warps": w, "num_stages": st}
                if quant is not None:
                    cfg["QUANT"] = quant
                if cap is not None:
                    cfg["maxnreg"] = cap
                out.append(cfg)
    return out


def qcache_configs(smoke: bool, int8: bool):
    """int8 by where the query blocks are quantized: a launch of their own (QUANT 0), every program
    (QUANT 1, QCACHE 0), or one program per query, shared with the others (QCACHE 1)."""
    if not int8:
        return []
    if smoke:
        return [{"BLOCK_Q": 16, "BLOCK_D": 16, "RUNMAX": 1, "num_warps": 4, "QUANT": 1, "QCACHE": 1}]
    out = []
    for w, st, r in ((1, 3, 0), (2, 2, 1), (2, 3, 1), (2, 3, 0), (4, 3, 1)):
        for quant, shared in ((0, 0), (1, 0), (1, 1)):
            out.append({"BLOCK_Q": 32, "BLOCK_D": 32, "RUNMAX": r, "num_warps": w, "num_stages": st, "QUANT": quant,
                        "QCACHE": shared})
    return out


def qshared_configs(smoke: bool, int8: bool):
    """int8 with the query rows quantized by one program per query and shared (QUANT 1, QCACHE 1),
    the default placement of mid-sized launches such as case a: tiles, warps and pipeline depths
    (the --qcache list timed BLOCK_D 32 only, before the claim and the one tile loop)."""
    if not int8:
        return []
    if smoke:
        return [{"BLOCK_Q": 16, "BLOCK_D": 16, "RUNMAX": 1, "num_warps": 4, "QUANT": 1, "QCACHE": 1}]
    return _grid((32, 64, 128), (1, 2, 4), (2, 3, 4), QUANT=1, QCACHE=1)


def qchunk_configs(smoke: bool):
    """Long queries split across programs (QCHUNK rows each, 0 = one program per pair) on the
    configs best unsplit (kernel-variants-H100.json) and around the best split ones: 4 warps,
    BLOCK_D 64, two programs per SM. (The second sweep, kernel-variants-qchunk-H100-2.json, also
    timed an int8 score conversion that was dropped: its rows carry an "INT8" key.)"""
    if smoke:
        return [{"BLOCK_Q": 16, "BLOCK_D": 16, "RUNMAX": 1, "num_warps": 4, "QCHUNK": c} for c in (0, 16)]
    bases = [(128, 128, 4, 3, 0, 0), (128, 128, 4, 3, 0, 256), (128, 128, 4, 2, 0, 256), (128, 128, 8, 3, 0, 256),
             (256, 64, 4, 3, 0, 0), (256, 64, 4, 3, 0, 256), (256, 64, 4, 2, 0, 256), (256, 64, 4, 4, 0, 256),
             (256, 64, 8, 3, 1, 256), (256, 128, 8, 3, 0, 256), (128, 64, 4, 3, 0, 0), (128, 64, 4, 3, 0, 128),
             (128, 64, 4, 3, 0, 256), (128, 64, 4, 4, 0, 256)]
    return [{"BLOCK_Q": bq, "BLOCK_D": bd, "RUNMAX": r, "num_warps": w, "num_stages": st, "QCHUNK": rows}
            for bq, bd, w, st, r, rows in bases]


CONFIGS: list[dict] = []  # --configs: the short-query configs to time instead of a named list


def configs_short(smoke: bool, int8: bool = False):
    if CONFIGS:
        return CONFIGS
    if SWEEP == "qcache":
        return qcache_configs(smoke, int8)
    if SWEEP == "qshared":
        return qshared_configs(smoke, int8)
    if SWEEP == "regs":
        return regs_configs(smoke, int8)
    if SWEEP == "int8small":
        return int8_small_configs(smoke)
    return int8_configs(smoke) if SWEEP == "int8" else short_configs(smoke)


def case_h(dev, smoke, hbm):
    """Host time per call (the GPU idle, no sync inside the timed region) of the steps of the
    varlen call: what a small call waits on when its device time is below the host's."""
    import statistics

    import triton

    @triton.jit
    def _nop(X):
        pass

    n = 50 if smoke else 10_000
    corpus = make_corpus(n, 64 if not smoke else 4, 300 if not smoke else 40, 128, device=dev, seed=n)
    Q, _ = make_queries(corpus, 1, 32, seed=7)
    q = Q[0].half()
    tok, cu_d = corpus.tokens, corpus.offsets.int()
    t8, s8 = quantize_int8(tok)
    cu_q = torch.tensor([0, 32], dtype=torch.int32, device=dev)
    out = torch.empty(1, n, device=dev)
    cfg = fused.default_config(32)
    grid = (n,)
    args = (q, None, None, cu_q, tok, None, None, cu_d, None, None, None, out, None, None, None, 1, n, 0, 0, 0, 1)
    meta = dict(LQ_BUCKET=32, DIM=128, BLOCK_DIM=128, Q_VARLEN=True, D_LAYOUT=2, HAS_QMASK=False, HAS_DMASK=False,
                INT8=False, IEEE=False, UPCAST=False, PAGED=False, QUANT=False, QCACHE=False, QCHUNK=0, **cfg)

    def python_only(fn):  # the call with its kernel launches left out
        return with_attr(fused, "launch_kernel", lambda *a, **k: None, fn)

    steps = {
        "torch.empty": lambda: torch.empty(1, n, device=dev),
        "empty kernel: JITFunction[grid]": lambda: _nop[(1,)](out),
        "empty kernel: fused.launch_kernel": lambda: fused.launch_kernel(_nop, (1,), (out,), {}),
        "maxsim kernel fp16: JITFunction[grid]": lambda: fused._maxsim_fwd_kernel[grid](*args, **meta),
        "maxsim kernel fp16: fused.launch_kernel": lambda: fused.launch_kernel(fused._maxsim_fwd_kernel, grid, args,
                                                                               meta),
        "fused.launch fp16 (config)": lambda: fused.launch(out, q, None, cu_q, 0, tok, None, None, cu_d, None, 0, 1, n,
                                                          fused.CSR_CROSS, 32, config=cfg),
        "fused.launch int8 (config, QUANT)": lambda: fused.launch(out, q, None, cu_q, 0, t8, s8, None, cu_d, None, 0, 1,
                                                                 n, fused.CSR_CROSS, 32, config={**cfg, "QUANT": 1}),
        "fused.launch int8 (config, 2 launches)": lambda: fused.launch(out, q, None, cu_q, 0, t8, s8, None, cu_d, None,
                                                                      0, 1, n, fused.CSR_CROSS, 32,
                                                                      config={**cfg, "QUANT": 0}),
        "fused.launch fp16 (autotuned)": lambda: fused.launch(out, q, None, cu_q, 0, tok, None, None, cu_d, None, 0, 1,
                                                             n, fused.CSR_CROSS, 32),
        "maxsim_varlen fp16 default": lambda: maxsim_varlen(q, cu_q, tok, cu_d, check=False),
        "maxsim_varlen int8 default": lambda: maxsim_varlen(q, cu_q, t8, cu_d, d_scales=s8, check=False),
        "maxsim_varlen int8 default, python only (no launch)": python_only(
            lambda: maxsim_varlen(q, cu_q, t8, cu_d, d_scales=s8, check=False)),
    }
    if dev == "cuda":  # the replayed launch gives triton's results, also for a misaligned (re-specialized) query
        ref = maxsim_varlen(q, cu_q, t8, cu_d, d_scales=s8, check=False).clone()
        qm = torch.empty(q.numel() + 8, dtype=q.dtype, device=dev)[8 - 1: 8 - 1 + q.numel()].view_as(q)
        qm.copy_(q)
        for fast, direct in ((False, False), (True, False), (True, False), (True, True), (True, True)):
            fused.FAST_LAUNCH, fused.DIRECT_LAUNCH = fast, direct
            for qq, name in ((q, "aligned"), (qm, "misaligned")):
                for t, sc in ((tok, None), (t8, s8)):
                    got = maxsim_varlen(qq, cu_q, t, cu_d, d_scales=sc, check=False)
                    want = ref if sc is not None else maxsim_varlen(q, cu_q, t, cu_d, check=False)
                    row = {"case": "h-host", "call": f"replay check fast={fast} direct={direct} {name} "
                                                     f"{'int8' if sc is not None else 'fp16'}",
                           "equal": bool(torch.equal(got, want))}
                    ROWS.append(row)
                    print(json.dumps(row), flush=True)
        row = {"case": "h-host", "call": "replay cache", "entries": len(fused._REPLAY)}
        ROWS.append(row)
        print(json.dumps(row), flush=True)
    modes = {"direct": (True, True), "replay": (True, False), "triton": (False, False)}
    for mode, (name, fn) in itertools.product(modes, steps.items()):
        fused.FAST_LAUNCH, fused.DIRECT_LAUNCH = modes[mode]
        name = f"{name} [{mode} launch]"
        for _ in range(20):
            fn()
        times = []
        for _ in range(200):
            if dev == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
        row = {"case": "h-host", "call": name, "host_us_median": statistics.median(times),
               "host_us_p10": sorted(times)[len(times) // 10]}
        ROWS.append(row)
        print(json.dumps(row), flush=True)
    fused.FAST_LAUNCH = fused.DIRECT_LAUNCH = True
    if dev == "cuda" and not smoke:  # where the host time goes in the int8 default call
        import cProfile
        import io
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        for _ in range(200):
            maxsim_varlen(q, cu_q, t8, cu_d, d_scales=s8, check=False)
        pr.disable()
        torch.cuda.synchronize()
        buf = io.StringIO()
        pstats.Stats(pr, stream=buf).sort_stats("cumulative").print_stats(25)
        ROWS.append({"case": "h-host", "call": "cProfile 200 int8 default calls", "profile": buf.getvalue()[-6000:]})
        print(buf.getvalue()[-6000:])


def case_a(dev, smoke, hbm):
    n = 50 if smoke else 10_000
    corpus = make_corpus(n, 64 if not smoke else 4, 300 if not smoke else 40, 128, device=dev, seed=n)
    Q, _ = make_queries(corpus, 1, 32, seed=7)
    q = Q[0].half()
    tok, cu_d = corpus.tokens, corpus.offsets.int()
    cu_q = torch.tensor([0, 32], dtype=torch.int32, device=dev)
    ref = naive.maxsim_csr(q.float(), cu_q, tok.float(), corpus.offsets, dtype=torch.float32)
    T = tok.shape[0]
    for label, (t, sc) in (("a-10k", (tok, None)), ("a-10k-int8", quantize_int8(tok))):
        nbytes = T * (128 + 4 if sc is not None else 256) + 8 * n
        out = torch.empty(1, n, device=dev)
        default = lambda t=t, sc=sc: maxsim_varlen(q, cu_q, t, cu_d, d_scales=sc, check=False)  # noqa: E731
        sweep(label, configs_short(smoke, sc is not None),
              lambda cfg, t=t, sc=sc, out=out: fused.launch(out, q, None, cu_q, 0, t, sc, None, cu_d, None, 0, 1, n,
                                                   fused.CSR_CROSS, 32, config=cfg),
              ref, {"default call (check=False)": default,
                    "default call, launched through triton (MVDB_FAST_LAUNCH=0)": with_attr(
                        fused, "FAST_LAUNCH", False, default),
                    "default call, int8 queries quantized by a launch of their own": with_attr(
                        fused, "QUANT_IN_KERNEL_WORK", 0, default),
                    "default call, int8 queries quantized by every program (no sharing)": with_attr(
                        fused, "QCACHE_MAX_TOKENS", -1, default),
                    "max_seqlen_q=32": lambda t=t, sc=sc: maxsim_varlen(q, cu_q, t, cu_d, d_scales=sc, max_seqlen_q=32,
                                                                        check=False)},
              nbytes / hbm * 1e3)


def case_b(dev, smoke, hbm):
    n, L = (4, 40) if smoke else (1000, 1024)
    corpus = make_corpus(n, L, L, 128, dtype=torch.bfloat16, device=dev, seed=3)
    Q, _ = make_queries(corpus, 1, L, seed=5)
    Q = Q.bfloat16()
    D = corpus.tokens.view(n, L, 128)
    ref = naive.maxsim_padded(Q.float(), D.float(), dtype=torch.float32, budget=1 << 28)
    mma = 2 * L * L * 128 * n / 989e12 * 1e3  # H100 SXM dense bf16 peak; int8 twice that
    for label, (dd, sc) in (("b-colpali", (D, None)), ("b-colpali-int8", quantize_int8(D))):
        out = torch.empty(1, n, device=dev)
        qc = Q.contiguous()
        sweep(label, long_configs(smoke),
              lambda cfg, dd=dd, sc=sc, out=out: fused.launch(out, qc, None, None, L, dd.contiguous(), sc, None, None, None, L,
                                                     1, n, fused.PADDED_CROSS, L, config=cfg),
              ref, {"maxsim(Q, D)": lambda dd=dd, sc=sc: maxsim(Q, dd, d_scales=sc)},
              mma / (2 if sc is not None else 1))


def case_c(dev, smoke, hbm):
    n_docs, nq, k = (200, 4, 50) if smoke else (1_000_000, 32, 1000)
    corpus, _, q, cu_q, cand = candidate_lists(n_docs, nq, k, device=dev)
    tok, off = corpus.tokens, corpus.offsets
    ref = naive.maxsim_csr(q.float(), cu_q, tok, off, cand, dtype=torch.float32)
    gathered = float(corpus.lengths[cand].sum())
    for label, (t, sc) in (("c-1M", (tok, None)), ("c-1M-int8", quantize_int8(tok))):
        nbytes = gathered * (128 + 4 if sc is not None else 256) + nq * k * 8 * 3
        out = torch.empty(nq, k, device=dev)
        sweep(label, configs_short(smoke, sc is not None),
              lambda cfg, t=t, sc=sc, out=out: fused.launch(out, q, None, cu_q, 0, t, sc, None, off, cand, 0, nq, k,
                                                   fused.CSR_CAND, 32, config=cfg),
              ref, {"default call (check=False)": lambda t=t, sc=sc: maxsim_candidates(q, cu_q, t, off, cand, sc,
                                                                                       check=False),
                    "default call, int8 queries quantized in the kernel (shared)": with_attr(
                        fused, "QUANT_IN_KERNEL_WORK", 1 << 40,
                        lambda t=t, sc=sc: maxsim_candidates(q, cu_q, t, off, cand, sc, check=False)),
                    "max_seqlen_q=32": lambda t=t, sc=sc: maxsim_candidates(q, cu_q, t, off, cand, sc, max_seqlen_q=32,
                                                                            check=False)},
              nbytes / hbm * 1e3)
        del t, sc


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="a,c,b")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--int8", action="store_true", help="cases a and c: the int8 configs (queries quantized apart)")
    ap.add_argument("--int8small", action="store_true", help="cases a and c: int8 configs of 16-32-row tiles, 1-2 stages")
    ap.add_argument("--regs", action="store_true", help="cases a and c: configs under register caps (maxnreg)")
    ap.add_argument("--qcache", action="store_true", help="int8 cases: where the query blocks are quantized")
    ap.add_argument("--qshared", action="store_true", help="int8 cases: the shared in-kernel quantization's configs")
    ap.add_argument("--qchunk", action="store_true", help="case b: long queries split across programs or not")
    ap.add_argument("--configs", default="", help="short-query configs to time, as a JSON list of dicts")
    ap.add_argument("--labels", default="", help="only these case labels (comma-separated), e.g. a-10k-int8")
    ap.add_argument("--out", default=os.environ.get("OUT", str(HERE / "results")))
    args = ap.parse_args()
    global SWEEP
    SWEEP = next((flag for flag in ("qcache", "qshared", "regs", "int8small", "int8", "qchunk") if getattr(args, flag)), "")
    LABELS.extend(x for x in args.labels.split(",") if x)
    CONFIGS.extend(json.loads(args.configs) if args.configs else [])
    if CONFIGS:
        SWEEP = SWEEP or "configs"
    dev = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    hbm = 3.35e12
    if dev == "cuda":  # measured copy bandwidth, as benchmarks/kernels.py's ceilings()
        x = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
        y = torch.empty_like(x)
        hbm = 2 * x.numel() / (bench(lambda: y.copy_(x)) * 1e-3)
        del x, y
    t0 = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for c in args.cases.split(","):
        {"a": case_a, "b": case_b, "c": case_c, "h": case_h}[c](dev, args.smoke, hbm)
        if dev == "cuda":
            torch.cuda.empty_cache()
        # written after every case: a run cut short by its time limit keeps what it measured
        res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (smoke)", "hbm_gbps": hbm / 1e9,
               "torch": torch.__version__, "triton": __import__("triton").__version__, "seconds": time.time() - t0,
               "cases": args.cases, "rows": ROWS}
        name = "variants-smoke.json" if args.smoke else f"variants-{res['device'].replace(' ', '_')}.json"
        if SWEEP:
            name = name.replace("variants-", f"variants-{SWEEP}-")
        (out / name).write_text(json.dumps(res, indent=1))
        print(f"wrote {out / name}")


if __name__ == "__main__":
    main()
