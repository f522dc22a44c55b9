"""One GPU vs a database sharded over two GPUs of one host (issue #6).

    python benchmarks/multigpu.py --docs 2000000 [--devices cuda:0,cuda:1]

The same seeded synthetic corpus (mvdb/testing/synthetic.py, 64-128 tokens, dim 128) is stored
twice: as one database on the first device, and as a sharded database with one shard per device
(documents split by id into equal halves, ids global). Each is opened with default settings (IVF
token index trained per shard on its own GPU) and measured like benchmarks/e2e.py: batched search
QPS over the queries, single-query p50/p99, and recall@10 against exhaustive fused MaxSim over
every document; queries of ``--qlen`` tokens (4-64, log-uniform, by default) drawn from stored
documents. JSON to --out.
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
from common import exhaustive_reference, make_query_set  # noqa: E402
from mvdb.testing.synthetic import make_corpus  # noqa: E402

import mvdb  # noqa: E402
from mvdb.storage import Store  # noqa: E402


def _ingest(path, tokens, lengths, first_id, chunk=50_000):
    off = np.concatenate(([0], np.cumsum(lengths)))
    with Store(path, dim=tokens.shape[1]) as st:
        for d0 in range(0, len(lengths), chunk):
            d1 = min(len(lengths), d0 + chunk)
            st.add_packed(tokens[off[d0] : off[d1]], lengths[d0:d1], ids=list(range(first_id + d0, first_id + d1)))


def _sync():
    for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        torch.cuda.synchronize(i)


def _measure(db, q, ref, n, reps=5, **kw):
    db.search(q[:8], k=10, **kw)
    _sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        hits = db.search(q, k=10, **kw)
        _sync()
        times.append(time.perf_counter() - t0)
    lat = []
    for i in range(min(200, n)):
        t0 = time.perf_counter()
        db.search(q[i], k=10, **kw)
        _sync()
        lat.append((time.perf_counter() - t0) * 1e3)
    lat.sort()
    return {
        **kw, "batch_qps": n / statistics.median(times), "batch_s_all": times,
        "single_p50_ms": statistics.median(lat), "single_p99_ms": lat[int(0.99 * (len(lat) - 1))],
        "recall10_vs_exhaustive": float(np.mean([len({h.id for h in g} & r) / 10 for g, r in zip(hits, ref)])),
        "hits": [[h.id for h in g] for g in hits],
    }


def _sweep(db, q, ref, n, settings, label) -> list[dict]:
    """_measure at each (nprobe, n_candidates), without the hit lists."""
    rows = []
    for nprobe, n_cand in settings:
        r = _measure(db, q, ref, n, nprobe=nprobe, n_candidates=n_cand)
        rows.append({k: v for k, v in r.items() if k != "hits"})
        print(f"{label}:", json.dumps(rows[-1]), flush=True)
    return rows


SINGLE_SETTINGS = [(8, 2048), (8, 4096), (16, 4096)]  # (nprobe, n_candidates) beyond the defaults
SHARDED_SETTINGS = [(2, 1024), (4, 1024), (2, 2048)]  # per shard


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=2_000_000)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--qlen", default="4-64", help='query tokens: "4-64" (log-uniform lengths, as real queries) or one number')
    p.add_argument("--devices", default="cuda:0,cuda:1")
    p.add_argument("--root", default="/tmp/mvdb-multigpu")
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = p.parse_args()
    devices = args.devices.split(",")
    shutil.rmtree(args.root, ignore_errors=True)
    os.makedirs(args.root)
    res = {"docs": args.docs, "devices": devices, "qlen": args.qlen,
           "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "faiss_gpu": mvdb.engine.gpu_available()}
    # the corpus in halves (each seeded), so no GPU holds all of it in fp32 work buffers at once
    halves = []
    per = args.docs // len(devices)
    for h in range(len(devices)):
        n_h = per if h < len(devices) - 1 else args.docs - per * (len(devices) - 1)
        corpus = make_corpus(n_h, 64, 128, 128, device=devices[0], seed=21 + h)
        if h == 0:
            Q = [x.cpu() for x in make_query_set(corpus, args.queries, args.qlen, seed=22)]
        halves.append((corpus.tokens.cpu().numpy(), corpus.lengths.cpu().numpy()))
        del corpus
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    res["tokens"] = int(sum(l.sum() for _, l in halves))
    single_path, sharded_path = os.path.join(args.root, "single"), os.path.join(args.root, "sharded")
    t0 = time.perf_counter()
    first = 0
    for toks, lens in halves:
        _ingest(single_path, toks, lens, first)
        first += len(lens)
    res["ingest_single_s"] = time.perf_counter() - t0
    mvdb.open(sharded_path, devices=devices).close()  # the layout: one empty shard per device
    t0 = time.perf_counter()
    first = 0
    for h, (toks, lens) in enumerate(halves):
        _ingest(os.path.join(sharded_path, f"shard-{h:03d}"), toks, lens, first)
        first += len(lens)
    res["ingest_sharded_s"] = time.perf_counter() - t0
    del halves

    q = [x.to(devices[0]) for x in Q]
    t0 = time.perf_counter()
    db = mvdb.open(single_path, device=devices[0])
    res["open_single_s"] = time.perf_counter() - t0
    # exhaustive reference over every document of the single database
    ref, res["exhaustive_qps"] = exhaustive_reference(db, q)
    one = _measure(db, q, ref, args.queries)
    res["one_gpu"] = {k: v for k, v in one.items() if k != "hits"}
    res["one_gpu"]["stats"] = {k: v for k, v in db.stats().items() if k != "path"}
    print("one GPU:", json.dumps(res["one_gpu"]), flush=True)
    res["one_gpu_sweep"] = _sweep(db, q, ref, args.queries, SINGLE_SETTINGS, "one GPU")
    db.close()
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    t0 = time.perf_counter()
    sh = mvdb.open(sharded_path, devices=devices)
    res["open_sharded_s"] = time.perf_counter() - t0
    two = _measure(sh, q, ref, args.queries)
    res["sharded"] = {k: v for k, v in two.items() if k != "hits"}
    res["sharded"]["shards"] = [{k: v for k, v in s.items() if k in ("documents", "tokens", "device", "index", "nlist")}
                                for s in sh.stats()["shards"]]
    res["hits_overlap_one_vs_sharded"] = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(one["hits"], two["hits"])]))
    res["speedup_batch_qps"] = res["sharded"]["batch_qps"] / res["one_gpu"]["batch_qps"]
    print("sharded:", json.dumps(res["sharded"]), flush=True)
    # per-shard settings: each shard needs fewer probes and candidates for the merged recall
    res["sharded_sweep"] = _sweep(sh, q, ref, args.queries, SHARDED_SETTINGS, "sharded")
    sh.close()
    shutil.rmtree(args.root, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"multigpu-{args.docs}.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k not in ("one_gpu", "sharded")}))


if __name__ == "__main__":
    main()
