"""End-to-end benchmark of the database on a seeded synthetic corpus (issue #4).

    python benchmarks/e2e.py --docs 1000000 [--nlist 32768,65536] [--index ivf]

Builds a database from benchmarks/synthetic.py documents (64-128 tokens, dim 128) on the GPU when
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
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic import make_corpus, make_queries  # noqa: E402

import mvdb  # noqa: E402
from mvdb.kernels import maxsim_varlen  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=100_000)
    p.add_argument("--queries", type=int, default=1000)
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
           "faiss_gpu": mvdb.index.gpu_available()}

    corpus = make_corpus(args.docs, 64, 128, 128, device=dev, seed=21)
    Q, src = make_queries(corpus, args.queries, 32, seed=22)
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
    q = Q.to(dev)
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
        run["first_open_breakdown_s"] = {"load_to_device": db.load_seconds, **db._index.build_seconds}
        db.close()
        t0 = time.perf_counter()
        db = mvdb.open(args.path, device=dev, read_only=True, index=args.index, nlist=nl)
        run["reopen_s"] = time.perf_counter() - t0
        run["reopen_breakdown_s"] = {"load_to_device": db.load_seconds, **db._index.build_seconds}
        if dev == "cuda":
            free, total = torch.cuda.mem_get_info()
            run["device_used_after_open_gb"] = (total - free) / 1e9
        print(f"build: ingest {res['ingest_s']:.1f} s + first open {run['first_open_s']:.1f} s "
              f"({run['index']}, nlist {run['nlist']}; {run['first_open_breakdown_s']}); reopen "
              f"{run['reopen_s']:.1f} s {run['reopen_breakdown_s']}", flush=True)
        if ref is None:
            ref = _reference(db, q, args.queries, dev, res)
        run["sweep"] = []
        for nprobe, n_cand in SETTINGS:
            kw = {"k": 10, **({"nprobe": nprobe} if nprobe else {}), **({"n_candidates": n_cand} if n_cand else {})}
            try:
                run["sweep"].append(_measure(db, q, src, ref, kw, dev, args.queries))
            except torch.cuda.OutOfMemoryError as e:
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


def _reference(db, q, n, dev, res):
    """Exhaustive fused MaxSim over every document, one query at a time: top-10 ids and the QPS."""
    cu_d = db._row_offsets.int()
    cu1 = torch.tensor([0, q.shape[1]], dtype=torch.int32, device=dev)
    maxsim_varlen(q[0], cu1, db._tokens, cu_d, max_seqlen_q=q.shape[1], check=False)
    _sync(dev)
    t0 = time.perf_counter()
    ref = [maxsim_varlen(q[i], cu1, db._tokens, cu_d, max_seqlen_q=q.shape[1], check=False)[0].topk(10).indices
           for i in range(n)]
    _sync(dev)
    res["exhaustive_qps"] = n / (time.perf_counter() - t0)
    print(f"exhaustive fused MaxSim: {res['exhaustive_qps']:.0f} QPS", flush=True)
    ids = db._row_ids
    return [{int(ids[j]) for j in r.tolist()} for r in ref]


def _measure(db, q, src, ref, kw, dev, n):
    db.search(q[:8], **kw)  # warm-up: compile, autotune
    _sync(dev)
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        hits = db.search(q, **kw)
        _sync(dev)
        times.append(time.perf_counter() - t0)
    row = {**kw, "batch_qps": n / statistics.median(times)}
    if dev == "cuda":
        row["search_peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
    # the candidate stage alone (the rest is the exact rerank and the hits' Python objects)
    live = db._live
    cu = torch.arange(0, (n + 1) * q.shape[1], q.shape[1], dtype=torch.int32, device=q.device)
    qp = q.reshape(-1, q.shape[2]).float()
    if hasattr(db._index, "candidates"):
        db._index.nprobe = kw.get("nprobe", mvdb.index.DEFAULT_LISTS_PROBE)
        t0 = time.perf_counter()
        db._index.candidates(qp, cu, live, kw.get("n_candidates", mvdb.index.DEFAULT_LISTS_CANDIDATES))
        _sync(dev)
        row["candidates_ms_per_1000"] = (time.perf_counter() - t0) * 1e3 * 1000 / n
    lat = []
    for i in range(min(100, n)):
        t0 = time.perf_counter()
        db.search(q[i], **kw)
        _sync(dev)
        lat.append((time.perf_counter() - t0) * 1e3)
    lat.sort()
    row["single_p50_ms"], row["single_p99_ms"] = statistics.median(lat), lat[int(0.99 * (len(lat) - 1))]
    row["recall10_vs_exhaustive"] = float(np.mean([len({h.id for h in g} & r) / 10 for g, r in zip(hits, ref)]))
    row["source_at_1"] = float(np.mean([bool(g) and g[0].id == int(s) for g, s in zip(hits, src.tolist())]))
    return row


def _sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
