"""Growing a database through many ``db.add`` calls against one bulk build of the same corpus
(issue #13), on one of the structurally different seeded generators of mvdb/testing/synthetic.py.

    python benchmarks/grow.py --docs 1000000 --generator dups --modes bulk,grow20,grow200

Per mode, as a user would do it:
- ``bulk``: ``Store.add_packed`` in 50k-document chunks, then ``mvdb.open`` (which trains and
  persists the index);
- ``growN``: ``mvdb.open`` on an empty directory, then ``db.add(list of [L, dim] arrays)`` in N
  equal batches; then ``db.compact()`` and a reopen.
Measured: ingest and build time, peak GPU memory (PyTorch, over the whole mode) and device memory
in use, residency, resident pages, then per search setting (defaults first): recall@10 against
exhaustive MaxSim over every document, batched QPS (median of 3 passes), single-query p50/p99.
``--int8`` also times a bulk ingest stored as int8 against float16. JSON to --out.
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
from common import bulk_ingest, device_used_gb, make_query_set, measure, sync  # noqa: E402
from mvdb.testing.synthetic import GENERATORS, make_structured  # noqa: E402

import mvdb  # noqa: E402
from mvdb.kernels import maxsim_varlen  # noqa: E402


def reference(tokens: torch.Tensor, offsets: torch.Tensor, q) -> tuple[list, float]:
    """Exhaustive fused MaxSim over every generated document, one query at a time (``q``: a list
    of [Lq_i, dim] queries, or one [n, Lq, dim] tensor) -> (top-10 sets of document numbers,
    which are the ids every mode stores them under; QPS)."""
    cu_d = offsets.int()

    def top10(x):
        cu1 = torch.tensor([0, x.shape[0]], dtype=torch.int32, device=x.device)
        return maxsim_varlen(x, cu1, tokens, cu_d, max_seqlen_q=x.shape[0], check=False)[0].topk(10).indices

    top10(q[0])
    sync(tokens.device)
    t0 = time.perf_counter()
    top = [top10(x) for x in q]
    sync(tokens.device)
    qps = len(q) / (time.perf_counter() - t0)
    return [set(t.tolist()) for t in top], qps


def structured_case(gen: str, docs: int, n_queries: int, seed: int, dev: str, qlens: tuple[str, ...] = ("32",)):
    """A seeded corpus of generator ``gen``, a query set per ``qlens`` entry (make_query_set) and
    its exhaustive top-10 -> ({qlen: (queries, reference sets, exhaustive QPS)}, host tokens,
    host lengths); the corpus leaves the device."""
    corpus = make_structured(gen, docs, device=dev, seed=seed)
    sets = {}
    for qlen in qlens:
        q = make_query_set(corpus, n_queries, qlen, seed + 1)
        ref, qps = reference(corpus.tokens, corpus.offsets, q)
        sets[qlen] = (q, ref, qps)
    tokens, lengths = corpus.tokens.cpu().numpy(), corpus.lengths.cpu().numpy()
    del corpus
    if dev == "cuda":
        torch.cuda.empty_cache()
    return sets, tokens, lengths


def settings(spec: str) -> list[dict]:
    """"default,8:4096" -> [{"k": 10}, {"k": 10, "nprobe": 8, "n_candidates": 4096}]"""
    out = []
    for s in spec.split(","):
        kw = {"k": 10}
        if s != "default":
            p, c = s.split(":")
            kw.update(nprobe=int(p), n_candidates=int(c))
        out.append(kw)
    return out


def run_mode(mode: str, args, tokens: np.ndarray, lengths: np.ndarray, q, ref, dev: str) -> dict:
    path = args.path
    shutil.rmtree(path, ignore_errors=True)
    if dev == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    out = {"mode": mode}
    off = np.concatenate(([0], np.cumsum(lengths)))
    n = len(lengths)
    t0 = time.perf_counter()
    if mode == "bulk":
        out["ingest_s"] = bulk_ingest(path, tokens, lengths)
        t1 = time.perf_counter()
        db = mvdb.open(path, device=dev, residency=args.residency)
        out["first_open_s"] = time.perf_counter() - t1
    else:
        batches = int(mode.removeprefix("grow"))
        db = mvdb.open(path, device=dev, residency=args.residency)
        per = -(-n // batches)
        add_s, store_s, retrains = [], [], []
        store_add = db.store.add

        def timed_store_add(*a, **kw):  # the store's share of each db.add (writing the segment, committing)
            t = time.perf_counter()
            try:
                return store_add(*a, **kw)
            finally:
                store_s.append(time.perf_counter() - t)

        db.store.add = timed_store_add
        index_id = None
        for d0 in range(0, n, per):
            d1 = min(n, d0 + per)
            docs = np.split(tokens[off[d0] : off[d1]], (off[d0 + 1 : d1] - off[d0]).tolist())
            t1 = time.perf_counter()
            db.add(docs)
            add_s.append(time.perf_counter() - t1)
            idx = db._engine.state.index
            entry = getattr(idx, "entry", None)
            if entry is not None and entry["id"] != index_id:  # this add trained the IVF index
                index_id = entry["id"]
                retrains.append({"add": len(add_s), "nlist": idx.nlist, "trained_tokens": entry["trained_tokens"],
                                 "add_s": add_s[-1], **idx.build_seconds})
        del db.store.add
        out["add_s"] = {"total": sum(add_s), "median": statistics.median(add_s), "max": max(add_s),
                        "store_total": sum(store_s), "engine_total": sum(add_s) - sum(store_s),
                        "trainings_total": sum(r["add_s"] for r in retrains)}
        out["trainings"] = retrains
    out["build_s"] = time.perf_counter() - t0
    st = db.stats()
    out["after_build"] = {k: st[k] for k in ("residency", "tier", "pages", "resident_bytes", "resident_capacity_bytes", "index",
                                             "nlist", "trained_tokens", "segments")}
    out["after_build"]["device_used_gb"] = device_used_gb(dev)
    print(f"{mode}: built in {out['build_s']:.1f} s {json.dumps(out['after_build'])}", flush=True)
    out["search"] = []
    for kw in settings(args.settings):
        try:
            out["search"].append(measure(db, q, ref, kw, args.latency_queries))
        except torch.cuda.OutOfMemoryError as e:
            out["search"].append({**kw, "error": str(e)[:200]})
        print(f"  {json.dumps(out['search'][-1])}", flush=True)
    if dev == "cuda":
        out["peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
        out["device_used_gb"] = device_used_gb(dev)
    if mode != "bulk" and not args.no_compact:
        t1 = time.perf_counter()
        db.compact()
        out["compact_s"] = time.perf_counter() - t1
        out["after_compact"] = {k: db.stats()[k] for k in ("residency", "pages", "segments")}
        out["after_compact"]["device_used_gb"] = device_used_gb(dev)
        out["after_compact"]["search"] = measure(db, q, ref, {"k": 10}, 0)
        print(f"  compact {out['compact_s']:.1f} s {json.dumps(out['after_compact'])}", flush=True)
    db.close()
    del db
    if dev == "cuda":
        torch.cuda.empty_cache()
    t1 = time.perf_counter()
    db = mvdb.open(path, device=dev, read_only=True, residency=args.residency)
    out["reopen_s"] = time.perf_counter() - t1
    out["after_reopen"] = {k: db.stats()[k] for k in ("residency", "pages", "index", "nlist")}
    out["after_reopen"]["device_used_gb"] = device_used_gb(dev)
    out["after_reopen"]["search"] = measure(db, q, ref, {"k": 10}, 0)
    print(f"  reopen {out['reopen_s']:.1f} s {json.dumps(out['after_reopen'])}", flush=True)
    db.close()
    shutil.rmtree(path, ignore_errors=True)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=100_000)
    p.add_argument("--generator", default="dups", choices=sorted(GENERATORS))
    p.add_argument("--modes", default="bulk,grow20,grow200")
    p.add_argument("--settings", default="default,8:4096", help="search settings: default, or nprobe:n_candidates")
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--qlen", default="4-64", help='query tokens: "4-64" (log-uniform lengths) or one number')
    p.add_argument("--latency-queries", type=int, default=100)
    p.add_argument("--int8", action="store_true", help="also time a bulk ingest stored as int8")
    p.add_argument("--no-compact", action="store_true")
    p.add_argument("--residency", default="auto", help="where the exact tokens live: auto, device, host, disk")
    p.add_argument("--seed", type=int, default=41)
    p.add_argument("--path", default="/tmp/mvdb-grow.mvdb")
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = p.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    res = {"docs": args.docs, "generator": args.generator, "residency": args.residency, "spec": GENERATORS[args.generator],
           "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "faiss_gpu": mvdb.engine.gpu_available(), "torch": torch.__version__}
    t0 = time.perf_counter()
    corpus = make_structured(args.generator, args.docs, device=dev, seed=args.seed)
    q = make_query_set(corpus, args.queries, args.qlen, args.seed + 1)
    res["qlen"] = args.qlen
    res["tokens"] = int(corpus.offsets[-1])
    res["generate_s"] = time.perf_counter() - t0
    ref, res["exhaustive_qps"] = reference(corpus.tokens, corpus.offsets, q)
    print(f"{args.generator}: {args.docs} docs, {res['tokens']:,} tokens, dim {corpus.tokens.shape[1]}; "
          f"exhaustive {res['exhaustive_qps']:.0f} QPS", flush=True)
    tokens = corpus.tokens.cpu().numpy()
    lengths = corpus.lengths.cpu().numpy()
    del corpus
    if dev == "cuda":
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tier = "" if args.residency == "auto" else f"-{args.residency}"
    name = f"grow-{args.generator}-{args.docs}{tier}-{'H100' if 'H100' in res['device'] else dev}.json"
    res["modes"] = []
    for m in args.modes.split(","):
        res["modes"].append(run_mode(m, args, tokens, lengths, q, ref, dev))
        (out / name).write_text(json.dumps(res, indent=1))  # what finished survives a time limit
    if args.int8:
        res["ingest_dtype_s"] = {}
        for dtype in ("float16", "int8"):
            res["ingest_dtype_s"][dtype] = bulk_ingest(args.path, tokens, lengths, dtype)
            print(f"ingest as {dtype}: {res['ingest_dtype_s'][dtype]:.1f} s", flush=True)
        shutil.rmtree(args.path, ignore_errors=True)
    (out / name).write_text(json.dumps(res, indent=1))
    print(f"\n{'mode':<9} {'build s':>8} {'peak GB':>8} {'residency':>9} {'pages':>5} {'recall':>7} {'QPS':>7} {'p50 ms':>7}")
    for m in res["modes"]:
        s0 = m["search"][0]
        print(f"{m['mode']:<9} {m['build_s']:>8.1f} {m.get('peak_gb', 0) or 0:>8.1f} {m['after_build']['residency']:>9} "
              f"{m['after_build']['pages']:>5} {s0.get('recall10', 0):>7.3f} {s0.get('batch_qps', 0):>7.0f} "
              f"{s0.get('single_p50_ms', 0):>7.2f}")


if __name__ == "__main__":
    main()
