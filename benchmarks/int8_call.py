"""Where an INT8 varlen call's time goes (issue #17, case a: 1 query x 10k docs of 64-300 tokens).

    python benchmarks/int8_call.py      # GPU; JSON to $OUT or benchmarks/results/

Times the default call (``check=False``, no ``max_seqlen_q``) and the call with ``max_seqlen_q=32``
in both orders with triton.testing.do_bench (L2 flushed between runs), the host's time per call
(1,000 calls without waiting, then one wait), and each kernel's device time from torch.profiler,
so a call whose time is the host's launch work shows up as such; then, over varlen and candidate
launches of several sizes, the three placements of the int8 query quantization: every program
for itself, shared (one program per query quantizes), a launch of its own (the MaxSim launch its
programmatic dependent where fused.PDL allows; also timed without: "launch, no PDL"), scores equal
to float32 rounding; fused.SHARE_MIN_WORK and fused.QUANT_IN_KERNEL_WORK pick.
"""

from __future__ import annotations

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

from mvdb.kernels import maxsim_candidates, maxsim_varlen, quantize_int8  # noqa: E402
from mvdb.kernels.maxsim import fused  # noqa: E402


def host_us(fn, n: int = 1000) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def kernels_us(fn, n: int = 20) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    return {e.key[:60]: e.device_time_total / n for e in prof.key_averages() if e.device_time_total > 0}


def _at(placement: str, fn):
    """fn run with the query quantization placed: "shared" (one program per query quantizes, the
    others load its rows, fused.QCACHE), "every_program" (each program quantizes its own query
    block) or "launch" (a quantization launch of its own before the MaxSim kernel); the default
    call picks by the launch's work (fused.SHARE_MIN_WORK, fused.QUANT_IN_KERNEL_WORK)."""
    def call():
        with fused.placed(placement):
            return fn()

    return call


def _sweep(res: dict) -> None:
    """Where each placement of the int8 query quantization wins: the device and the whole-call
    time of both, on varlen (1 query x n docs) and candidate (nq x 1000 from 1M docs) launches.
    Scores must be bit-identical between the placements."""
    dev = "cuda"
    cases = []
    for n in (1_000, 10_000, 50_000):
        corpus = make_corpus(n, 64, 300, 128, device=dev, seed=n)
        Q, _ = make_queries(corpus, 1, 32, seed=7)
        q = Q[0].half()
        cu_q = torch.tensor([0, 32], dtype=torch.int32, device=dev)
        t8, sc = quantize_int8(corpus.tokens)
        cu_d = corpus.offsets.int()
        cases.append((f"varlen 1 x {n}", n, lambda q=q, cu_q=cu_q, t8=t8, cu_d=cu_d, sc=sc:
                      maxsim_varlen(q, cu_q, t8, cu_d, d_scales=sc, check=False)))
    corpus, Q, q_all, cu_all, cand_all = candidate_lists(1_000_000, 32, 1000, device=dev)
    t8, sc = quantize_int8(corpus.tokens)
    for nq in (1, 4, 16, 32):
        q, cu_q, cand = q_all[: nq * 32], cu_all[: nq + 1], cand_all[:nq]
        cases.append((f"candidates {nq} x 1000 of 1M", nq * 1000, lambda q=q, cu_q=cu_q, cand=cand:
                      maxsim_candidates(q, cu_q, t8, corpus.offsets, cand, sc, check=False)))
    for name, pairs, fn in cases:
        fns = {p: _at(p, fn) for p in fused.PLACEMENTS}
        fns["launch, no PDL"] = with_attr(fused, "PDL", False, fns["launch"])
        # the quantized queries are bit-identical (tests/test_kernels.py checks it under one
        # config); the autotuner may pick another warp count for each placement, which sums the
        # query tokens' maxima in another order: equal to float32 rounding
        scores = {p: f() for p, f in fns.items()}
        ref = scores["launch"]
        rel = max(float(((s - ref).abs() / ref.abs().clamp_min(1e-30)).nan_to_num(0.0).max()) for s in scores.values())
        row = {"case": name, "pairs": pairs, "bit_identical": all(torch.equal(s, ref) for s in scores.values()),
               "max_rel_diff": rel}
        for label, f in fns.items():
            f()
            row[label] = {"do_bench_ms": median_ms(f, warmup=10, rep=100), "host_us_per_call": host_us(f, 300),
                          "kernels_us": kernels_us(f)}
        row["rule"] = fused.quant_placement(pairs, 32)
        res["sweep"].append(row)
        print(json.dumps(row), flush=True)
        assert rel <= 1e-6, f"{name}: the placements of the query quantization disagree ({rel:.2e})"


def main():
    dev = "cuda"
    n = 10_000
    corpus = make_corpus(n, 64, 300, 128, device=dev, seed=n)
    Q, _ = make_queries(corpus, 1, 32, seed=7)
    q = Q[0].half()
    cu_q = torch.tensor([0, 32], dtype=torch.int32, device=dev)
    tok, cu_d = corpus.tokens, corpus.offsets.int()
    t8, sc = quantize_int8(tok)
    calls = {
        "fp16 default": lambda: maxsim_varlen(q, cu_q, tok, cu_d, check=False),
        "int8 default": lambda: maxsim_varlen(q, cu_q, t8, cu_d, d_scales=sc, check=False),
        "int8 max_seqlen_q=32": lambda: maxsim_varlen(q, cu_q, t8, cu_d, d_scales=sc, max_seqlen_q=32, check=False),
        "int8 default, quantization launch": _at("launch", lambda: maxsim_varlen(q, cu_q, t8, cu_d, d_scales=sc,
                                                                                 check=False)),
        "int8 default, every program quantizes": _at("every_program", lambda: maxsim_varlen(
            q, cu_q, t8, cu_d, d_scales=sc, check=False)),
    }
    for fn in calls.values():
        fn()
    torch.cuda.synchronize()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "quant_in_kernel_work": fused.QUANT_IN_KERNEL_WORK, "rows": [], "sweep": []}
    for order in (list(calls), list(reversed(calls))):
        for name in order:
            row = {"call": name, "order": order.index(name), "do_bench_ms": median_ms(calls[name], warmup=10, rep=100)}
            res["rows"].append(row)
            print(json.dumps(row), flush=True)
    for name, fn in calls.items():
        row = {"call": name, "host_us_per_call": host_us(fn), "kernels_us": kernels_us(fn)}
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
    out = Path(os.environ.get("OUT", HERE / "results"))
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"int8-call-{torch.cuda.get_device_name().split()[1]}.json"
    try:
        _sweep(res)
    finally:
        path.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
