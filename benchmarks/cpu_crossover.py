"""Where the token index starts to pay on a CPU (issue #13): per-query time of a batched search
through the IVF index (defaults) against exhaustive MaxSim over every document
(``search(exact=True)``), the IVF search's recall@10 against it, and what opening the database
costs each way, at growing corpus sizes:
the measurements behind mvdb.engine.state.CPU_FLAT_MAX_TOKENS (below it, "auto" on a CPU scores
exhaustively and trains nothing).

    python benchmarks/cpu_crossover.py --docs 40000,120000
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

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mvdb.testing.synthetic import make_corpus, make_queries  # noqa: E402

import mvdb  # noqa: E402


def per_query(db, q, **kw) -> tuple[float, list]:
    """(seconds a query of one batched search of q, its hits)."""
    db.search(q[:2], k=10, **kw)  # warm
    t0 = time.perf_counter()
    hits = db.search(q, k=10, **kw)
    return (time.perf_counter() - t0) / q.shape[0], hits


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", default="40000,120000")
    p.add_argument("--queries", type=int, default=20)
    p.add_argument("--path", default="/tmp/mvdb-crossover.mvdb")
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = p.parse_args()
    res = {"device": "cpu", "cpus": os.cpu_count(), "threads": torch.get_num_threads(),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "sizes": []}
    for n in [int(x) for x in args.docs.split(",")]:
        shutil.rmtree(args.path, ignore_errors=True)
        corpus = make_corpus(n, 64, 156, 128, device="cpu", seed=51)  # 110 tokens on average
        q, _ = make_queries(corpus, args.queries, 32, seed=52)
        with mvdb.storage.Store(args.path, dim=128) as st:
            st.add_packed(corpus.tokens.numpy(), corpus.lengths.numpy())
        row = {"docs": n, "tokens": int(corpus.offsets[-1])}
        del corpus
        t0 = time.perf_counter()
        with mvdb.open(args.path, index="ivf", progress=False) as db:
            row["ivf_open_s"] = time.perf_counter() - t0
            row["ivf_per_query_s"], got = per_query(db, q)
            row["exhaustive_per_query_s"], want = per_query(db, q, exact=True)
            found = sum(len({h.id for h in g} & {h.id for h in w}) for g, w in zip(got, want))
            row["ivf_recall10"] = found / (10 * len(want))
        print(json.dumps(row), flush=True)
        res["sizes"].append(row)
    shutil.rmtree(args.path, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cpu-crossover.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
