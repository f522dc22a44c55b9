"""Host cost of the search kernels' calls (issue #17): how long the host takes to issue one
``maxsim_varlen`` / ``maxsim_candidates`` call as users write it (``check=False``, no
``max_seqlen_q``), and a single call's latency (issue, then wait for the scores), for the previous
code (the package ``--old``, made by benchmarks/old_tree.sh from .old) and this tree in one
process, alternating in rounds.

    bash benchmarks/old_tree.sh /tmp/oldpk && PYTHONPATH=/tmp/oldpk python benchmarks/search_host.py --label L
    bash benchmarks/gpu_session.sh searchab:L      # the same on the lent GPU (carry .old)

Cases: (a) 1 query x 32 tokens against 10k documents of 64-300 tokens, fp16 and int8 (the default
placement of the query quantization, and forced to the quantization launch with and without PDL);
(c) 32 queries x 1,000 candidates from a 150k-document store, fp16 and int8; 1 query x 1,000
candidates int8 (a small call). Per case and arm: the median over ``--rounds`` of each arm's
median host time of 50 calls (the GPU waited for before each, untimed: the host time of a call
that finds the GPU idle), the median latency of one call with its wait, and do_bench (L2 flushed)
on the last round. Scores are compared first (bit-identical where both arms launch the same
configs). Then a cProfile of this tree's calls per case, and the host cost of the CUDA calls the
path makes.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import importlib
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch
import triton
from common import captured_calls, median_ms, with_attr, write_json
from synthetic import candidate_lists, make_corpus, make_queries


def _cases(pkg, data) -> dict:
    """name -> zero-argument call of ``pkg`` (mvdb or the old tree) on ``data``."""
    k = importlib.import_module(pkg + ".kernels")
    fused = importlib.import_module(pkg + ".kernels.maxsim.fused")
    q, cu_q, tok, t8, sc, cu_d = data["a"]
    cq, ccu, ctok, ct8, csc, coff, ccand = data["c"]

    def placed(placement, fn, pdl=None):
        def call():
            with fused.placed(placement):
                return fn()
        return call if pdl is None else with_attr(fused, "PDL", pdl, call)

    a8 = lambda: k.maxsim_varlen(q, cu_q, t8, cu_d, d_scales=sc, check=False)
    return {
        "a fp16": lambda: k.maxsim_varlen(q, cu_q, tok, cu_d, check=False),
        "a int8": a8,
        "a int8 launch": placed("launch", a8, pdl=False),
        "a int8 launch+PDL": placed("launch", a8, pdl=True),
        "c fp16": lambda: k.maxsim_candidates(cq, ccu, ctok, coff, ccand, check=False),
        "c int8": lambda: k.maxsim_candidates(cq, ccu, ct8, coff, ccand, csc, check=False),
        "c1 int8": lambda: k.maxsim_candidates(cq[:32], ccu[:2], ct8, coff, ccand[:1], csc, check=False),
    }


def host_us(fn, n: int = 50, wait: bool = False) -> float:
    """Median host time of one call that finds the GPU idle; with ``wait``, of the call and the
    wait for its scores (one call's latency)."""
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if wait:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def cuda_calls() -> dict:
    """Host microseconds of the CUDA-runtime calls a launch path can make."""
    from mvdb.kernels.maxsim import fused

    x = torch.empty(8, device="cuda")
    dev = x.device
    calls = {
        "torch.empty((1, 10000)) cuda": lambda: torch.empty((1, 10000), dtype=torch.float32, device="cuda"),
        "torch.empty(size, device=x.device)": lambda: torch.empty(1000, dtype=torch.int8, device=x.device),
        "torch.empty((1, 10000), device=torch.device)": lambda: torch.empty((1, 10000), dtype=torch.float32, device=dev),
        "x.new_empty((1, 10000))": lambda: x.new_empty((1, 10000)),
        "torch.cuda.current_device()": torch.cuda.current_device,
        "torch.cuda.is_current_stream_capturing()": torch.cuda.is_current_stream_capturing,
        "fused._stream_handle(0)": lambda: fused._stream_handle(0),
        "torch.cuda.current_stream()": torch.cuda.current_stream,
        "x.data_ptr()": x.data_ptr,
        "x.is_contiguous()": x.is_contiguous,
        "x.device": lambda: x.device,
        "x.device.index": lambda: x.device.index,
    }
    res = {}
    for name, f in calls.items():
        for _ in range(100):
            f()
        t0 = time.perf_counter()
        for _ in range(5000):
            f()
        res[name] = round((time.perf_counter() - t0) / 5000 * 1e6, 3)
    return res


def parts(fn) -> dict:
    """Host microseconds of the pieces of one call, each timed with the GPU idle (as host_us):
    the whole call, fused.launch with the call's arguments, the MaxSim kernel's launch_kernel, its
    launcher called directly, and an output allocation; warm (the same back to back) beside."""
    from mvdb.kernels.maxsim import fused

    seen = captured_calls(fused, ("launch_kernel", "launch"), fn)
    real_lk, real_launch = fused.launch_kernel, fused.launch
    f, grid, args, consts, *rest = seen["launch_kernel"][-1][0]
    dev = torch.cuda.current_device()
    ckey = rest[0] if rest else tuple(consts.items())
    hit = next(v for k, v in fused._REPLAY.items() if v[3] is f and k[1] == dev
               and k[2] == fused._arg_sigs(args) and k[3] == ckey)
    run, function, packed = hit[2]
    grid3 = (*grid, 1, 1)[:3]
    a, k = seen["launch"][-1]
    pieces = {
        "whole call": fn,
        "fused.launch": lambda: real_launch(*a, **k),
        "launch_kernel (MaxSim)": lambda: real_lk(f, grid, args, consts, *rest),
        "launcher (MaxSim)": lambda: run(*grid3, fused._stream_handle(dev), function, packed, None, None, None,
                                         *args, *hit[1]),
        "torch.empty out": lambda: torch.empty((1, 10000), dtype=torch.float32, device=a[0].device),
    }
    res = {}
    for name, g in pieces.items():
        cold = host_us(g, 200)
        for _ in range(20):
            g()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            g()
        warm = (time.perf_counter() - t0) / 200 * 1e6
        torch.cuda.synchronize()
        res[name] = {"cold_us": round(cold, 2), "warm_us": round(warm, 2)}
    return res


def profile(fn, n: int = 300) -> list:
    prof = cProfile.Profile()
    torch.cuda.synchronize()
    prof.enable()
    for i in range(n):
        fn()
        if i % 20 == 19:
            torch.cuda.synchronize()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    top = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:30]  # own time
    return [(f"{Path(k[0]).name}:{k[1]}:{k[2]}", round(v[2] / n * 1e6, 2), round(v[3] / n * 1e6, 2), v[1] // n)
            for k, v in top]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--label", required=True)
    p.add_argument("--old", default="mvdb_old", help="the previous code's package (benchmarks/old_tree.sh); '' for none")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    p.add_argument("--out", default=os.environ.get("OUT", str(HERE / "results")))
    args = p.parse_args()
    from mvdb.kernels import quantize_int8

    dev = "cuda"
    corpus = make_corpus(10_000, 64, 300, 128, device=dev, seed=10_000)
    Q, _ = make_queries(corpus, 1, 32, seed=7)
    t8, sc = quantize_int8(corpus.tokens)
    data = {"a": (Q[0].half(), torch.tensor([0, 32], dtype=torch.int32, device=dev), corpus.tokens, t8, sc,
                  corpus.offsets.int())}
    ccorpus, _, cq, ccu, ccand = candidate_lists(150_000, 32, 1000, device=dev)
    c8, csc = quantize_int8(ccorpus.tokens)
    data["c"] = (cq, ccu, ccorpus.tokens, c8, csc, ccorpus.offsets, ccand)
    arms = {"new": "mvdb"}
    if args.old:
        try:
            importlib.import_module(args.old + ".kernels")
            arms = {"old": args.old, "new": "mvdb"}
        except ImportError as e:
            print(f"no old tree ({e}): this tree alone", flush=True)
    fns = {arm: _cases(pkg, data) for arm, pkg in arms.items()}
    names = [n for n in fns["new"] if not args.cases or n in args.cases.split(",")]
    res = {"label": args.label, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "arms": arms,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "cases": {}}
    for name in names:
        scores = {arm: f[name]().clone() for arm, f in fns.items()}
        for f in fns.values():  # compile + autotune + the replay entries
            for _ in range(3):
                f[name]()
        ref = scores["new"]
        row = {"scores_equal": {arm: bool(torch.equal(s, ref)) for arm, s in scores.items()},
               "max_rel_diff": {arm: float(((s - ref).abs() / ref.abs().clamp_min(1e-30)).nan_to_num(0.0).max())
                                for arm, s in scores.items()}}
        assert max(row["max_rel_diff"].values()) <= 1e-5, (name, row)
        host = {arm: [] for arm in fns}
        lat = {arm: [] for arm in fns}
        for _ in range(args.rounds):
            for arm, f in fns.items():
                host[arm].append(host_us(f[name]))
                lat[arm].append(host_us(f[name], wait=True))
        row["host_us"] = {arm: statistics.median(t) for arm, t in host.items()}
        row["latency_us"] = {arm: statistics.median(t) for arm, t in lat.items()}
        row["do_bench_ms"] = {arm: median_ms(f[name], warmup=10, rep=100) for arm, f in fns.items()}
        row["rounds"] = {"host_us": host, "latency_us": lat}
        row["profile_new"] = profile(fns["new"][name])
        if name in ("a fp16", "a int8", "a int8 launch", "c int8"):
            row["parts_new"] = parts(fns["new"][name])
            print("  parts", row["parts_new"], flush=True)
        res["cases"][name] = row
        print(name, {k: row[k] for k in ("host_us", "latency_us", "do_bench_ms", "scores_equal")}, flush=True)
    res["cuda_calls_us"] = cuda_calls()
    print("cuda calls", res["cuda_calls_us"], flush=True)
    write_json(args.out, f"search-host-{torch.cuda.get_device_name().split()[1]}-{args.label}.json", res)


if __name__ == "__main__":
    main()
