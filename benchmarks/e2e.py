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
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    db = mvdb.open(args.path, device=dev, read_only=True)
    res["open_and_index_s"] = time.perf_counter() - t0
    res["build_s"] = res["ingest_s"] + res["open_and_index_s"]
    res["index"] = db.stats()["index"]
    res["nlist"] = db._index.nlist
    res["open_breakdown_s"] = {"load_to_device": db.load_seconds, **db._index.build_seconds}
    print(f"build: ingest {res['ingest_s']:.1f} s + open/index {res['open_and_index_s']:.1f} s "
          f"({res['index']}, nlist {res['nlist']}; {res['open_breakdown_s']})", flush=True)

    q = Q.to(dev)
    # exhaustive fused MaxSim over every document: the reference, and the 'exhaustive' baseline
    cu_d = db._row_offsets.int()
    cu1 = torch.tensor([0, 32], dtype=torch.int32, device=dev)
    maxsim_varlen(q[0], cu1, db._tokens, cu_d, max_seqlen_q=32, check=False)
    _sync(dev)
    t0 = time.perf_counter()
    ref = [maxsim_varlen(q[i], cu1, db._tokens, cu_d, max_seqlen_q=32, check=False)[0].topk(10).indices
           for i in range(args.queries)]
    _sync(dev)
    res["exhaustive_qps"] = args.queries / (time.perf_counter() - t0)
    ids = db._row_ids
    ref = [{int(ids[j]) for j in r.tolist()} for r in ref]
    print(f"exhaustive fused MaxSim: {res['exhaustive_qps']:.0f} QPS", flush=True)

    res["sweep"] = []
    for nprobe, k_tokens in [(32, 512), (8, 128), (16, 256), (64, 512)]:
        kw = dict(k=10, nprobe=nprobe, k_tokens=k_tokens)
        db.search(q[:8], **kw)  # warm-up: compile, autotune
        _sync(dev)
        t0 = time.perf_counter()
        hits = db.search(q, **kw)
        _sync(dev)
        row = {"nprobe": nprobe, "k_tokens": k_tokens, "batch_qps": args.queries / (time.perf_counter() - t0)}
        lat = []
        for i in range(min(100, args.queries)):
            t0 = time.perf_counter()
            db.search(q[i], **kw)
            _sync(dev)
            lat.append((time.perf_counter() - t0) * 1e3)
        lat.sort()
        row["single_p50_ms"], row["single_p99_ms"] = statistics.median(lat), lat[int(0.99 * (len(lat) - 1))]
        row["recall10_vs_exhaustive"] = float(np.mean([len({h.id for h in g} & r) / 10 for g, r in zip(hits, ref)]))
        row["source_at_1"] = float(np.mean([bool(g) and g[0].id == int(s) for g, s in zip(hits, src.tolist())]))
        res["sweep"].append(row)
        print(json.dumps(row), flush=True)
    if dev == "cuda":
        res["gpu_peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
    db.close()
    shutil.rmtree(args.path, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"e2e-{args.docs}.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res))


def _sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
