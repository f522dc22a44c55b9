"""The CPU's candidate stage (issue #45): how many of the exhaustive top-10 the IVF lists' pool
holds, and what it costs, against the list count, the lists probed and the pool's width; and the
same pool when the lists hand ``--factor`` times as many rows to the centroid interaction, which
picks the pool (what a CPU search does at the defaults).

    python benchmarks/cpu_pool.py --docs 120000 --gen topics --nlist 0 --probes 16 --pools 2048 --search default
    python benchmarks/cpu_pool.py --docs 120000 --nlist 8192,32768 --search "8:512,8:1024,16:1024"

A seeded corpus (mvdb/testing/synthetic.py, ``--gen``) on the CPU, 40 queries of 32 tokens and
their exhaustive MaxSim top-10 (``search(exact=True)``: every document scored by the CPU's exact
kernel, which the tests hold to a float64 reference); per list count a database built with
``index="ivf", nlist=N`` (0: the default; the build timed), then per (nprobe, pool) the pool's
recall (the share of the true top-10 among the pool's documents) and milliseconds a query of the
lists' crediting (``Lists.candidates``, the batch in one call), alone and with the interaction
(``ranked_*``). ``--search "nprobe:n_candidates,..."`` (``default``:
the search defaults) also times whole searches in batches of 20 (the median of three passes) and
their recall@10. ``gemm_probe_ms``: a fixed GEMM timed before and after (how fast the machine ran).
JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bulk_ingest  # noqa: E402
from mvdb.testing.synthetic import make_queries, make_structured  # noqa: E402

import mvdb  # noqa: E402
from mvdb.engine import ivf, search as search_mod  # noqa: E402


def gemm_probe() -> float:
    """Milliseconds of one float32 GEMM of the exact stage's shape (16,384 tokens x 96 x 32), the
    median of 200: how fast this machine runs right now (shared machines vary by 2x from hour to
    hour), recorded before and after the run."""
    a, b = torch.randn(1 << 14, 96), torch.randn(96, 32)
    o = torch.empty(1 << 14, 32)
    times = []
    for _ in range(200):
        t0 = time.perf_counter()
        torch.mm(a, b, out=o)
        times.append(time.perf_counter() - t0)
    return sorted(times)[100] * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=30_000)
    p.add_argument("--gen", default="topics")
    p.add_argument("--queries", type=int, default=40)
    p.add_argument("--nlist", default="4096,16384")
    p.add_argument("--probes", default="8,20")
    p.add_argument("--pools", default="256,1024,4096")
    p.add_argument("--search", default="", help='"nprobe:n_candidates,...": whole searches, batches of 20')
    p.add_argument("--factor", type=int, default=ivf.CPU_POOL_PER_CANDIDATE,
                   help="rows the lists hand the interaction per row of the pool (ranked_*)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=45)
    p.add_argument("--path", default="/tmp/mvdb-cpu-pool.mvdb")
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    corpus = make_structured(args.gen, args.docs, device="cpu", seed=args.seed)
    q, _ = make_queries(corpus, args.queries, 32, seed=args.seed + 1)
    res = {"gen": args.gen, "docs": args.docs, "tokens": int(corpus.offsets[-1]), "queries": args.queries, "threads": args.threads,
           "cpu": os.cpu_count(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "factor": args.factor, "gemm_probe_ms": [gemm_probe()], "runs": []}
    bulk_ingest(args.path, corpus.tokens.numpy(), corpus.lengths.numpy())
    del corpus
    ref: list[set] = []

    def pool_recall(cand: torch.Tensor) -> float:
        return float(np.mean([len(set(c.tolist()) & r) / 10 for c, r in zip(cand, ref)]))

    for nlist in (int(x) for x in args.nlist.split(",")):
        shutil.rmtree(Path(args.path) / "index", ignore_errors=True)
        t0 = time.perf_counter()
        db = mvdb.open(args.path, device="cpu", index="ivf", nlist=nlist or None, progress=False)
        run = {"nlist": db.stats()["nlist"], "build_s": time.perf_counter() - t0,
               "build_seconds": db.stats()["build_seconds"], "pools": [], "searches": []}
        if not ref:  # the exhaustive top-10, in batches of 20
            t0 = time.perf_counter()
            for a in range(0, args.queries, 20):
                ref += [{h.id for h in g} for g in db.search(q[a : a + 20], k=10, exact=True)]
            res["exhaustive_ms_per_query"] = (time.perf_counter() - t0) / args.queries * 1e3
            print(json.dumps({k: v for k, v in res.items() if k != "runs"}), flush=True)
        with db._pub.read() as st:  # the lists' stage alone
            qs = search_mod.prepare(q, q.shape[2], torch.device("cpu"))
            for nprobe in (int(x) for x in args.probes.split(",")):
                for pool in (int(x) for x in args.pools.split(",")):
                    t0 = time.perf_counter()
                    cand = st.index.candidates(qs.q, qs.cu_host, st.live, pool, nprobe, ordered=False)
                    row = {"nprobe": nprobe, "pool": pool, "pool_recall": pool_recall(cand),
                           "ms_per_query": (time.perf_counter() - t0) / args.queries * 1e3}
                    t0 = time.perf_counter()
                    cand = st.index.candidates(qs.q, qs.cu_host, st.live, pool, nprobe, ordered=False,
                                               pool=args.factor * pool)
                    row.update(ranked_recall=pool_recall(cand),
                               ranked_ms_per_query=(time.perf_counter() - t0) / args.queries * 1e3)
                    run["pools"].append(row)
                    print(nlist, json.dumps(row), flush=True)
        for spec in filter(None, args.search.split(",")):
            kw = {} if spec == "default" else dict(zip(("nprobe", "n_candidates"), (int(x) for x in spec.split(":"))))
            db.search(q[:20], k=10, **kw)  # warm
            passes = []
            for _ in range(3):
                hits, t0 = [], time.perf_counter()
                for a in range(0, args.queries, 20):
                    hits += db.search(q[a : a + 20], k=10, **kw)
                passes.append((time.perf_counter() - t0) / args.queries * 1e3)
            row = {"search": spec, **kw, "ms_per_query": sorted(passes)[1], "passes_ms": passes,
                   "recall10": float(np.mean([len({h.id for h in g} & r) / 10 for g, r in zip(hits, ref)]))}
            run["searches"].append(row)
            print(nlist, json.dumps(row), flush=True)
        db.close()
        res["runs"].append(run)
    res["gemm_probe_ms"].append(gemm_probe())
    shutil.rmtree(args.path, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"cpu-pool-{args.gen}-{args.docs}.json").write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
