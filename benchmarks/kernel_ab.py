"""Default calls of the issue #17 cases, mvdb only, for an A/B of two kernel sources in one GPU
session (run it once per source; each run autotunes afresh in its own process):
(a) 1 query x 32 tok vs 10k docs of 64-300 tok, fp16 / int8; (b) ColPali 1,024 x 1,000 pages of
1,024 tok, bf16 / int8; (c) 32 queries x 1,000 candidates from a 150k-doc store, fp16 / int8.
Scores are checked against the float32 reference first; medians of triton's do_bench.

    python benchmarks/kernel_ab.py --label new --out DIR

Results: results/kernel-ab-H100-20261125-*.json, labels naming the version of fused's tile loop
each run had: orig (whole tiles plus one masked tail tile for long queries, every tile masked for
short ones; the code before 2026-11-25 03:00 UTC), clamp-int64 (one loop, columns clamped to the
last token in int64), lim (one loop, the last tile shifted back, int32 columns: the version kept,
later with the token rows' byte offsets widened), two (an unmasked loop over whole tiles and a
clamped loop for the rest: two dots, 255 registers again), shiftnomask (no clamp at all, exact only
when no document is shorter than a tile: the bound for what the clamp costs). Later A/Bs of the
patches in benchmarks/ab/ (against fused.py of commit db5c6c8, measured and dropped; ``--readflush``
also times each call after an L2 flush that only reads): results/kernel-ab-H100-20261125-evictab-*,
-pfab-* (MVDB_PF_AHEAD / MVDB_PF_WAIT pick the prefetches) and -groupab-* (MVDB_GROUP documents per
program), each with runs of the unpatched code (orig, orig2) in the same call. On 2026-11-26,
results/kernel-ab-H100-20261126-fullfma-*: benchmarks/ab/fullfma.patch applied, MVDB_FULL_TILES /
MVDB_INT8_FMA 0 0 (orig), 0 1 (fma), 1 0 (full), 1 1 (new), then fulldb.patch on top (fulldb).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from common import median_ms  # noqa: E402
from synthetic import candidate_lists, colpali_inputs, one_query_inputs  # noqa: E402

from mvdb.kernels import maxsim, maxsim_candidates, maxsim_varlen, quantize_int8  # noqa: E402
from mvdb.kernels.maxsim import fused, naive  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True)
    ap.add_argument("--cases", default="a,b,c")
    ap.add_argument("--reps", type=int, default=3, help="median of this many do_bench medians per call")
    ap.add_argument("--configs", action="store_true",
                    help="(b) also: fused.launch at fixed configs, and benchmarks/rega_probe.py's plain kernel")
    ap.add_argument("--out", default=".")
    ap.add_argument("--readflush", action="store_true",
                    help="also time each call after an L2 flush that only reads (no dirty lines left behind)")
    args = ap.parse_args()
    dev = "cuda"
    rows = []
    flush = torch.empty(256 << 20, dtype=torch.int8, device=dev).view(torch.int32) if args.readflush else None

    def readflush_ms(fn, n: int = 200) -> float:
        """Median ms of fn() after a 256 MB read (do_bench zeroes its 256 MB buffer instead, which
        leaves the L2 full of dirty lines that the timed call then writes back)."""
        fn()
        torch.cuda.synchronize()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for a, b in ev:
            flush.amax()
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        return sorted(a.elapsed_time(b) for a, b in ev)[n // 2]

    def over_reps(timer, fn) -> float:
        """The median of ``args.reps`` timings of fn."""
        return sorted(timer(fn) for _ in range(args.reps))[args.reps // 2]

    def run(case, fn, ref, int8=False):
        got = fn().float()
        err = float(((got - ref).abs() / ref.abs().clamp_min(1e-3)).max())
        ok = err < (3e-2 if int8 else 2e-3)
        ms = over_reps(median_ms, fn) if ok else None
        row = dict(case=case, ms=ms, max_rel_err=err, ok=ok)
        if ok and args.readflush:
            row["readflush_ms"] = over_reps(readflush_ms, fn)
        rows.append(row)
        print(f"{args.label:>8} {case:<10} {ms if ms is None else round(ms, 4)} ms"
              f" (read flush {row.get('readflush_ms', float('nan')):.4f})  err {err:.1e}", flush=True)

    cases = set(args.cases.split(","))
    if "a" in cases:
        corpus, q, cu_q, tok, cu_d = one_query_inputs(device=dev)
        ref = naive.maxsim_csr(q.float(), cu_q, tok.float(), corpus.offsets, dtype=torch.float32)[0]
        run("a-fp16", lambda: maxsim_varlen(q, cu_q, tok, cu_d, check=False)[0], ref)
        tok8, sc8 = quantize_int8(tok)
        run("a-int8", lambda: maxsim_varlen(q, cu_q, tok8, cu_d, d_scales=sc8, check=False)[0], ref, True)
        del corpus, tok8, sc8
    if "b" in cases:
        Q, D = colpali_inputs(1000, 1024, device=dev)
        ref = naive.maxsim_padded(Q.float(), D.float(), dtype=torch.float32, budget=1 << 28)
        run("b-bf16", lambda: maxsim(Q, D), ref)
        D8, s8 = quantize_int8(D)
        run("b-int8", lambda: maxsim(Q, D8, d_scales=s8), ref, True)
        if args.configs:
            import rega_probe
            q8, qs8 = quantize_int8(Q[0])
            for bq, bd, w, st, rm in ((256, 64, 4, 3, 0), (256, 64, 4, 3, 1), (256, 64, 8, 3, 0), (128, 64, 4, 3, 0),
                                      (128, 128, 4, 3, 0), (256, 128, 8, 3, 0)):
                cfg = dict(BLOCK_Q=bq, BLOCK_D=bd, RUNMAX=rm, num_warps=w, num_stages=st)
                for name, dd, ss in (("bf16", D, None), ("int8", D8, s8)):
                    out = torch.empty(1, 1000, device=dev)
                    run(f"b-{name} {bq}/{bd}/{w}w/{st}s/rm{rm}", lambda: fused.launch(
                        out, Q, None, None, 1024, dd, ss, None, None, None, 1024, 1, 1000, fused.PADDED_CROSS, 1024,
                        config=cfg), ref, ss is not None)
                if rm == 0:
                    run(f"b-bf16 probe {bq}/{bd}/{w}w/{st}s", lambda: rega_probe.probe(
                        Q[0], qs8, D.view(-1, 128), s8.view(-1), 1000, 1024, 0, bq, bd, w, st)[None], ref)
                    run(f"b-int8 probe {bq}/{bd}/{w}w/{st}s", lambda: rega_probe.probe(
                        q8, qs8, D8.view(-1, 128), s8.view(-1), 1000, 1024, 0, bq, bd, w, st)[None], ref, True)
        del D, D8, s8
    if "c" in cases:
        corpus, Q, q, cu_q, cand = candidate_lists(150000, 32, 1000, device=dev)
        tok, off = corpus.tokens, corpus.offsets
        ref = naive.maxsim_csr(q.float(), cu_q, tok, off, cand, dtype=torch.float32)
        run("c-fp16", lambda: maxsim_candidates(q, cu_q, tok, off, cand, check=False), ref)
        tok8, sc8 = quantize_int8(tok)
        run("c-int8", lambda: maxsim_candidates(q, cu_q, tok8, off, cand, sc8, check=False), ref, True)
    with open(os.path.join(args.out, f"kernel-ab-{args.label}.json"), "w") as f:
        json.dump(dict(label=args.label, device=torch.cuda.get_device_name(), rows=rows,
                       autotuned={str(k): str(v) for k, v in fused._tuned.cache.items()}), f, indent=1)


if __name__ == "__main__":
    main()
