"""End-to-end benchmark of the database on a seeded synthetic corpus (issue #4, first cut).

    python benchmarks/e2e.py --docs 100000

Builds a database from benchmarks/synthetic.py documents (64-128 tokens, dim 128), opens it on the
GPU when there is one, and measures: build (ingest + open with index), batched search QPS over
1,000 queries, single-query p50/p99, recall@10 against exhaustive fused MaxSim over every document,
and peak GPU memory. JSON to --out.
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
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = p.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    shutil.rmtree(args.path, ignore_errors=True)
    res = {"docs": args.docs, "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "index": "flat", "faiss_gpu": mvdb.index.gpu_available()}

    corpus = make_corpus(args.docs, 64, 128, 128, device=dev, seed=21)
    Q, src = make_queries(corpus, args.queries, 32, seed=22)
    tokens = corpus.tokens.cpu().numpy()
    lengths = corpus.lengths.cpu().numpy()
    res["tokens"] = int(lengths.sum())
    t0 = time.perf_counter()
    with mvdb.storage.Store(args.path, dim=128) as st:
        for d0 in range(0, args.docs, 50_000):
            off = np.concatenate(([0], np.cumsum(lengths)))
            st.add_packed(tokens[off[d0] : off[min(args.docs, d0 + 50_000)]], lengths[d0 : d0 + 50_000])
    res["ingest_s"] = time.perf_counter() - t0
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    db = mvdb.open(args.path, device=dev, read_only=True)
    res["open_and_index_s"] = time.perf_counter() - t0
    res["build_s"] = res["ingest_s"] + res["open_and_index_s"]
    print(f"build: ingest {res['ingest_s']:.1f} s + open/index {res['open_and_index_s']:.1f} s", flush=True)

    q = Q.to(dev)
    db.search(q[:8], k=10)  # warm-up: compile, autotune, FAISS GPU copy
    if dev == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    hits = db.search(q, k=10)
    if dev == "cuda":
        torch.cuda.synchronize()
    res["batch_qps"] = args.queries / (time.perf_counter() - t0)
    lat = []
    for i in range(min(200, args.queries)):
        t0 = time.perf_counter()
        db.search(q[i], k=10)
        if dev == "cuda":
            torch.cuda.synchronize()
        lat.append((time.perf_counter() - t0) * 1e3)
    lat.sort()
    res["single_p50_ms"], res["single_p99_ms"] = statistics.median(lat), lat[int(0.99 * (len(lat) - 1))]
    print(f"batched {res['batch_qps']:.0f} QPS; single query p50 {res['single_p50_ms']:.1f} ms, "
          f"p99 {res['single_p99_ms']:.1f} ms", flush=True)

    # exhaustive fused MaxSim over every document, as the reference (and the 'exhaustive' baseline)
    d = corpus.tokens
    cu_d = corpus.offsets.int()
    t0 = time.perf_counter()
    ref = []
    for i in range(args.queries):
        cu = torch.tensor([0, 32], dtype=torch.int32, device=dev)
        ref.append(maxsim_varlen(q[i].half(), cu, d, cu_d, max_seqlen_q=32, check=False)[0].topk(10).indices)
    if dev == "cuda":
        torch.cuda.synchronize()
    res["exhaustive_qps"] = args.queries / (time.perf_counter() - t0)
    ids = db.store.ids()
    recall = [len({h.id for h in got} & {ids[j] for j in r.tolist()}) / 10 for got, r in zip(hits, ref)]
    res["recall10_vs_exhaustive"] = float(np.mean(recall))
    res["source_at_1"] = float(np.mean([bool(got) and got[0].id == int(s) for got, s in zip(hits, src.tolist())]))
    if dev == "cuda":
        res["gpu_peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
    print(f"recall@10 vs exhaustive {res['recall10_vs_exhaustive']:.4f}; exhaustive fused MaxSim "
          f"{res['exhaustive_qps']:.0f} QPS; source doc first for {res['source_at_1']:.3f}", flush=True)
    db.close()
    shutil.rmtree(args.path, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"e2e-{args.docs}.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res))


if __name__ == "__main__":
    main()
