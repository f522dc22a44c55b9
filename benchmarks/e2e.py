"""End-to-end benchmark of the database on a seeded synthetic corpus (issue #4).

    python benchmarks/e2e.py --docs 1000000 [--nlist 32768,65536] [--index ivf]

Builds a database from mvdb/testing/synthetic.py documents (64-128 tokens, dim 128) on the GPU when
there is one and measures: build (ingest + the first open, which trains and persists the index),
reopening (persisted index: no training), then per index setting and search setting: batched
search QPS over 1,000 queries, single-query p50/p99, recall@10 against exhaustive fused MaxSim over
every document, the candidate stage's share of the time, and peak GPU memory. JSON to --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import exhaustive_reference, measure, sync  # noqa: E402
from mvdb.testing.synthetic import make_corpus, make_queries, varlen_queries  # noqa: E402

import mvdb  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=100_000)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--qlen", default="4-64", help='query tokens: "4-64" (log-uniform lengths, as real queries) or one number')
    p.add_argument("--path", default="/tmp/mvdb-e2e.mvdb")
    p.add_argument("--nlist", default="default", help="comma-separated IVF list counts to build in turn")
    p.add_argument("--index", default="auto", choices=["auto", "flat", "ivf"])
    p.add_argument("--host-queries", type=int, default=200,
                   help="queries for the host-residency measurement (0: skip)")
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = p.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    shutil.rmtree(args.path, ignore_errors=True)
    res = {"docs": args.docs, "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "faiss_gpu": mvdb.engine.gpu_available()}

    corpus = make_corpus(args.docs, 64, 128, 128, device=dev, seed=21)
    res["qlen"] = args.qlen
    if "-" in args.qlen:  # varlen_queries' queries are make_queries' (same seed) cut to their lengths
        lo, hi = (int(x) for x in args.qlen.split("-"))
        Q, src = varlen_queries(corpus, args.queries, lo, hi, seed=22), make_queries(corpus, args.queries, hi, seed=22)[1]
    else:
        Q, src = make_queries(corpus, args.queries, int(args.qlen), seed=22)
    tokens = corpus.tokens.cpu().numpy()
    lengths = corpus.lengths.cpu().numpy()
    del corpus  # the database holds its own copy; the reference below reads that one
    torch.cuda.empty_cache() if dev == "cuda" else None
    res["tokens"] = int(lengths.sum())
    t0 = time.perf_counter()
    off = np.concatenate(([0], np.cumsum(lengths)))
    with mvdb.storage.Store(args.path, dim=128) as st:
        for d0 in range(0, args.docs, 50_000):
            st.add_packed(tokens[off[d0] : off[min(args.docs, d0 + 50_000)]], lengths[d0 : d0 + 50_000])
    del tokens
    res["ingest_s"] = time.perf_counter() - t0
    q = [x.to(dev) for x in Q]
    res["runs"], ref = [], None
    for nlist in args.nlist.split(","):
        nl = None if nlist == "default" else int(nlist)
        run = {"nlist_asked": nlist}
        if dev == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        db = mvdb.open(args.path, device=dev, index=args.index, nlist=nl)  # trains + persists the index
        run["first_open_s"] = time.perf_counter() - t0
        run["build_s"] = res["ingest_s"] + run["first_open_s"]
        run["index"], run["nlist"] = db.stats()["index"], db.stats()["nlist"]
        run["first_open_breakdown_s"] = db.stats()["build_seconds"]
        db.close()
        t0 = time.perf_counter()
        db = mvdb.open(args.path, device=dev, read_only=True, index=args.index, nlist=nl)
        run["reopen_s"] = time.perf_counter() - t0
        run["reopen_breakdown_s"] = db.stats()["build_seconds"]
        if dev == "cuda":
            free, total = torch.cuda.mem_get_info()
            run["device_used_after_open_gb"] = (total - free) / 1e9
        print(f"build: ingest {res['ingest_s']:.1f} s + first open {run['first_open_s']:.1f} s "
              f"({run['index']}, nlist {run['nlist']}; {run['first_open_breakdown_s']}); reopen "
              f"{run['reopen_s']:.1f} s {run['reopen_breakdown_s']}", flush=True)
        if ref is None:
            ref, res["exhaustive_qps"] = exhaustive_reference(db, q)
            print(f"exhaustive MaxSim: {res['exhaustive_qps']:.0f} QPS", flush=True)
        run["sweep"] = []
        for nprobe, n_cand in SETTINGS:
            kw = {"k": 10, **({"nprobe": nprobe} if nprobe else {}), **({"n_candidates": n_cand} if n_cand else {})}
            try:
                run["sweep"].append(_measure(db, q, src, ref, kw, dev, args.queries))
            except torch.cuda.OutOfMemoryError as e:  # noqa: PERF203
                run["sweep"].append({**kw, "error": str(e)[:200]})
            print(json.dumps(run["sweep"][-1]), flush=True)
        db.close()
        if args.host_queries and dev == "cuda":
            # the fallback when the tokens do not fit on the GPU: pinned host memory, candidates
            # copied per search (forced here), default settings, fewer queries
            t0 = time.perf_counter()
            db = mvdb.open(args.path, device=dev, read_only=True, index=args.index, nlist=nl, residency="host")
            host = {"reopen_s": time.perf_counter() - t0, "residency": db.stats()["residency"]}
            n_h = args.host_queries
            host.update(_measure(db, q[:n_h], src[:n_h], ref[:n_h], {"k": 10}, dev, n_h))
            run["host_residency"] = host
            print("host residency:", json.dumps(host), flush=True)
            db.close()
        res["runs"].append(run)
    shutil.rmtree(args.path, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"e2e-{args.docs}.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res))


SETTINGS = [(None, None), (2, 1024), (2, 2048), (4, 1024), (8, 2048), (8, 4096)]  # (nprobe, n_candidates); None: default


def _measure(db, q, src, ref, kw, dev, n):
    row = measure(db, q, ref, kw)
    if dev == "cuda":
        row["search_peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
    # the candidate stage alone (the rest is the exact rerank and the hits' Python objects)
    t0 = time.perf_counter()
    db.candidates(q, **kw)
    sync(dev)
    row["candidates_ms_per_1000"] = (time.perf_counter() - t0) * 1e3 * 1000 / n
    hits = db.search(q, **kw)
    row["source_at_1"] = float(np.mean([bool(g) and g[0].id == int(s) for g, s in zip(hits, src.tolist())]))
    return row


if __name__ == "__main__":
    main()
