"""The CPU path against plain torch (issue #18): per-query time of a batched ``db.search`` with the
defaults, of exhaustive MaxSim (``search(exact=True)``), of ``mvdb.rerank`` (one query against
inline documents) and of a plain ``Q @ D.T`` over the same data, on a structured corpus.

    python benchmarks/cpu_path.py --docs 1046 --dim 384 --queries 300
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
from synthetic import make_corpus, make_queries  # noqa: E402

import mvdb  # noqa: E402


def best_of(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=1046)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--path", default="/tmp/mvdb-cpu-path.mvdb")
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = p.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("run without TRITON_INTERPRET: this measures the CPU path users get")
    corpus = make_corpus(args.docs, 100, 256, dim=args.dim, device="cpu", dtype=torch.float16, seed=3)
    q, _ = make_queries(corpus, args.queries, 32, seed=4)
    off = corpus.offsets.numpy()
    docs = [corpus.tokens[off[i] : off[i + 1]].float().numpy() for i in range(args.docs)]
    shutil.rmtree(args.path, ignore_errors=True)
    res = {"docs": args.docs, "dim": args.dim, "queries": args.queries, "tokens": int(off[-1]),
           "threads": torch.get_num_threads(), "torch": torch.__version__,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    with mvdb.open(args.path, device="cpu", progress=False) as db:
        db.add(docs)
        res["index"] = db.stats()["index"]
        db.search(q[:4], k=10)
        n = args.queries
        res["search_ms_per_query"] = 1e3 * best_of(lambda: db.search(q, k=10)) / n
        res["exhaustive_ms_per_query"] = 1e3 * best_of(lambda: db.search(q, k=10, exact=True)) / n
        hits = db.search(q, k=10)
        ref = db.search(q, k=10, exact=True)
        res["recall10_vs_exhaustive"] = float(np.mean([len({h.id for h in a} & {h.id for h in b}) / 10
                                                        for a, b in zip(hits, ref)]))
    d = corpus.tokens.float()
    qf = q.reshape(-1, args.dim)
    res["plain_matmul_ms_per_query"] = 1e3 * best_of(lambda: qf @ d.T) / args.queries
    sub = docs[:300]
    res["rerank_1x300_ms"] = 1e3 * best_of(lambda: mvdb.rerank(q[0].numpy(), sub, k=10))
    dd = torch.from_numpy(np.concatenate(sub))
    res["plain_matmul_1x300_ms"] = 1e3 * best_of(lambda: q[0] @ dd.T)  # D already one array
    res["plain_stack_matmul_1x300_ms"] = 1e3 * best_of(lambda: q[0] @ torch.from_numpy(np.concatenate(sub)).T)
    res["search_vs_matmul"] = res["search_ms_per_query"] / res["plain_matmul_ms_per_query"]
    res["search_vs_exhaustive"] = res["search_ms_per_query"] / res["exhaustive_ms_per_query"]
    res["rerank_vs_matmul"] = res["rerank_1x300_ms"] / res["plain_matmul_1x300_ms"]
    res["rerank_vs_stack_matmul"] = res["rerank_1x300_ms"] / res["plain_stack_matmul_1x300_ms"]
    print(json.dumps(res, indent=1))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"cpu-path-{args.docs}x{args.dim}.json").write_text(json.dumps(res, indent=1))
    shutil.rmtree(args.path, ignore_errors=True)


if __name__ == "__main__":
    main()
