"""How long a new user waits for the first answer: a database bulk-ingested with ``Store``
(no index yet), then ``mvdb.open`` (which trains and persists the token index) and one search;
then a reopen (persisted index) and one search. Issue #13: on a 2-core CPU, 40,000 documents.

    python benchmarks/first_open.py --docs 40000
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


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=40_000)
    p.add_argument("--path", default="/tmp/mvdb-first-open.mvdb")
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = p.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    shutil.rmtree(args.path, ignore_errors=True)
    corpus = make_corpus(args.docs, 64, 156, 128, device=dev, seed=51)  # 110 tokens on average
    q, _ = make_queries(corpus, 20, 32, seed=52)
    res = {"docs": args.docs, "tokens": int(corpus.offsets[-1]), "device": dev, "cpus": os.cpu_count(),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    t0 = time.perf_counter()
    with mvdb.storage.Store(args.path, dim=128) as st:
        st.add_packed(corpus.tokens.cpu().numpy(), corpus.lengths.cpu().numpy())
    res["ingest_s"] = time.perf_counter() - t0
    del corpus
    for step in ("first", "reopen"):
        t0 = time.perf_counter()
        db = mvdb.open(args.path, device=dev)
        opened = time.perf_counter() - t0
        hits = db.search(q[0], k=10)
        res[step] = {"open_s": opened, "first_search_s": time.perf_counter() - t0 - opened,
                     "total_s": time.perf_counter() - t0, "stats": {k: v for k, v in db.stats().items() if k != "path"}}
        t1 = time.perf_counter()
        db.search(q, k=10)
        res[step]["batch_of_20_s"] = time.perf_counter() - t1
        assert hits
        db.close()
        print(f"{step}: open {opened:.1f} s, first search {res[step]['first_search_s']:.2f} s; "
              f"build {res[step]['stats']['build_seconds']}", flush=True)
    shutil.rmtree(args.path, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"first-open-{args.docs}-{dev}.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
