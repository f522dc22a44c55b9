"""Bulk-ingest throughput of mvdb.shards.cluster.ingest with 1, 2 and 4 Ray workers (issue #6).

    python benchmarks/ray_ingest.py [--files 8] [--docs-per-file 1000] [--workers 1,2,4]

Writes seeded synthetic npz sources (mvdb/testing/synthetic.py documents, dim 128, float32), then
for each worker count W starts a local Ray cluster with W CPUs and ingests every source into W
shards (W Ray Data tasks reading, validating and converting; W writer actors), without building
the token index. Reports documents and tokens per second. JSON to --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mvdb.testing.synthetic import make_corpus  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--docs-per-file", type=int, default=1000)
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--root", default="/tmp/mvdb-ray-ingest")
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = p.parse_args()
    import ray

    from mvdb.shards import cluster as md

    shutil.rmtree(args.root, ignore_errors=True)
    os.makedirs(args.root)
    sources = []
    for f in range(args.files):
        c = make_corpus(args.docs_per_file, 64, 128, 128, device="cpu", seed=100 + f)
        path = os.path.join(args.root, f"part-{f}.npz")
        ids = np.arange(f * args.docs_per_file, (f + 1) * args.docs_per_file)
        np.savez(path, tokens=c.tokens.float().numpy(), lengths=c.lengths.numpy(), ids=ids)
        sources.append(path)
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "ray": ray.__version__,
           "docs": args.files * args.docs_per_file, "runs": []}
    for w in [int(x) for x in args.workers.split(",")]:
        shards = [os.path.join(args.root, f"w{w}-shard-{i}") for i in range(w)]
        ray.init(num_cpus=w, include_dashboard=False, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        out = md.ingest(sources, shards, concurrency=w, build_index=False, progress=False)
        ray.shutdown()
        run = {"workers": w, "added": out["added"], "tokens": out["tokens"], "seconds": out["write_s"],
               "docs_per_s": out["added"] / out["write_s"], "tokens_per_s": out["tokens"] / out["write_s"]}
        res["runs"].append(run)
        print(json.dumps(run), flush=True)
        for s in shards:
            shutil.rmtree(s, ignore_errors=True)
    shutil.rmtree(args.root, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ray-ingest.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
