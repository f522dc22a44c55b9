"""Where an INT8 varlen call's time goes (issue #17, case a: 1 query x 10k docs of 64-300 tokens).

    python benchmarks/int8_call.py      # GPU; JSON to $OUT or benchmarks/results/

Times the default call (``check=False``, no ``max_seqlen_q``) and the call with ``max_seqlen_q=32``
in both orders with triton.testing.do_bench (L2 flushed between runs), the host's time per call
(1,000 calls without waiting, then one wait), and each kernel's device time from torch.profiler,
so a call whose time is the host's launch work shows up as such.
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
from common import median_ms  # noqa: E402
from synthetic import make_corpus, make_queries  # noqa: E402

from mvdb.kernels import maxsim_varlen, quantize_int8  # noqa: E402


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
        "fp16 max_seqlen_q=32": lambda: maxsim_varlen(q, cu_q, tok, cu_d, max_seqlen_q=32, check=False),
        "int8 default": lambda: maxsim_varlen(q, cu_q, t8, cu_d, d_scales=sc, check=False),
        "int8 max_seqlen_q=32": lambda: maxsim_varlen(q, cu_q, t8, cu_d, d_scales=sc, max_seqlen_q=32, check=False),
    }
    for fn in calls.values():
        fn()
    torch.cuda.synchronize()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    for order in (list(calls), list(reversed(calls))):
        for name in order:
            row = {"call": name, "order": order.index(name), "do_bench_ms": median_ms(calls[name], warmup=10, rep=100)}
            res["rows"].append(row)
            print(json.dumps(row), flush=True)
    for name, fn in calls.items():
        row = {"call": name, "host_us_per_call": host_us(fn), "kernels_us": kernels_us(fn)}
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
    import cProfile
    import io
    import pstats

    for name in ("fp16 default", "int8 default"):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(500):
            calls[name]()
        prof.disable()
        torch.cuda.synchronize()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
        res[f"cprofile {name} x500"] = buf.getvalue().splitlines()
        print(buf.getvalue(), flush=True)
    out = Path(os.environ.get("OUT", HERE / "results"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "int8-call-H100.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
