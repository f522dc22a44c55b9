"""Where the token index starts to pay on a CPU (issues #13, #57): per-query time of a batched
search through the IVF index (defaults) against exhaustive MaxSim over every document
(``search(exact=True)``, what ``index="auto"`` does below its threshold), the IVF search's
recall@10 against it, and what opening the database costs each way, at growing corpus sizes:
the measurements behind mvdb.engine.state.CPU_FLAT_MAX_TOKENS (below it, "auto" on a CPU scores
exhaustively and trains nothing).

    python benchmarks/cpu_crossover.py --gen uniform96 --docs 1000,2000,4000,8000,15000,30000,60000,120000

Corpora (``--gen``): ``uniform96`` (lengths 40-160, dim 96, one topic a document: issue #57's),
``uniform128`` (64-156, dim 128) or a ``mvdb.testing.synthetic.GENERATORS`` name (``dups``,
``topics``, ``mixed96``). Queries: ``--qlen`` tokens (``4-64``: log-uniform lengths, as real
queries; or one number), searched in batches of ``--batch``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import make_query_set  # noqa: E402
from mvdb.testing.synthetic import GENERATORS, make_corpus, make_structured  # noqa: E402

import mvdb  # noqa: E402

UNIFORM = {"uniform96": (40, 160, 96), "uniform128": (64, 156, 128)}


def corpus_of(gen: str, n: int):
    if gen in UNIFORM:
        lo, hi, dim = UNIFORM[gen]
        return make_corpus(n, lo, hi, dim, device="cpu", seed=51)
    return make_structured(gen, n, device="cpu", seed=51)


def per_query(db, q: list, batch: int, **kw) -> tuple[float, list]:
    """(seconds a query of batched searches of q, their hits), the better of two passes."""
    db.search(q[:2], k=10, **kw)  # warm
    best, hits = float("inf"), None
    for _ in range(2):
        t0 = time.perf_counter()
        hits = [h for a in range(0, len(q), batch) for h in db.search(q[a : a + batch], k=10, **kw)]
        best = min(best, (time.perf_counter() - t0) / len(q))
    return best, hits


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", default="40000,120000")
    p.add_argument("--gen", default="uniform128", choices=sorted(UNIFORM) + sorted(GENERATORS))
    p.add_argument("--queries", type=int, default=32)
    p.add_argument("--qlen", default="4-64")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--path", default="/tmp/mvdb-crossover.mvdb")
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = p.parse_args()
    res = {"suite": "cpu_crossover", "command": "python benchmarks/cpu_crossover.py " + " ".join(sys.argv[1:]),
           "device": "cpu", "cpus": os.cpu_count(), "threads": torch.get_num_threads(), "gen": args.gen,
           "qlen": args.qlen, "batch": args.batch, "torch": torch.__version__,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "sizes": []}
    for n in [int(x) for x in args.docs.split(",")]:
        shutil.rmtree(args.path, ignore_errors=True)
        corpus = corpus_of(args.gen, n)
        q = make_query_set(corpus, args.queries, args.qlen, seed=52)
        with mvdb.storage.Store(args.path, dim=corpus.tokens.shape[1]) as st:
            st.add_packed(corpus.tokens.numpy(), corpus.lengths.numpy())
        row = {"docs": n, "tokens": int(corpus.offsets[-1])}
        del corpus
        t0 = time.perf_counter()
        with mvdb.open(args.path, index="ivf", progress=False) as db:
            row["ivf_open_s"] = time.perf_counter() - t0
            row["ivf_per_query_s"], got = per_query(db, q, args.batch)
            row["exhaustive_per_query_s"], want = per_query(db, q, args.batch, exact=True)
            found = sum(len({h.id for h in g} & {h.id for h in w}) for g, w in zip(got, want))
            row["ivf_recall10"] = found / (10 * len(want))
        t0 = time.perf_counter()  # (lists already trained are reused where "auto" picks them)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "auto" asked for where "ivf" was recorded: expected here
            db = mvdb.open(args.path, index="auto", progress=False)
        with db:
            row["auto_open_s"] = time.perf_counter() - t0
            row["auto_index"] = db.stats()["index"]
            row["auto_per_query_s"], got = per_query(db, q, args.batch)
            found = sum(len({h.id for h in g} & {h.id for h in w}) for g, w in zip(got, want))
            row["auto_recall10"] = found / (10 * len(want))
        best = min(row["ivf_per_query_s"] if row["ivf_recall10"] >= 0.98 else float("inf"),
                   row["exhaustive_per_query_s"])
        row["auto_over_best"] = row["auto_per_query_s"] / best
        print(json.dumps(row), flush=True)
        res["sizes"].append(row)
    shutil.rmtree(args.path, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"cpu-crossover-{args.gen}.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
