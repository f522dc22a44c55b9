"""Search defaults study (issue #13): recall@10 against exhaustive MaxSim and batched QPS of the
IVF path on each structurally different generator, for several k-means trainings (tokens sampled
per list, iterations, list count) and search settings (lists probed per query token, documents
reranked per query).

    python benchmarks/defaults.py --docs 1000000 --generators dups,topics,mixed96 \
        --train 40x10,160x10,160x25 --settings 4:2048,8:2048,8:4096,16:4096,16:8192
    python benchmarks/defaults.py --docs 1000000 --generators dups --train 160x10,160x10~torch-fp16

Per generator the corpus is ingested once (``Store.add_packed``); each training variant then
opens the database as a user would (``mvdb.open``) after the manifest is reset to the bare ingest,
so every variant trains and assigns from scratch under the same code path. JSON per generator to
--out as it completes.
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
from common import bulk_ingest, measure  # noqa: E402
from grow import settings, structured_case  # noqa: E402
from mvdb.testing.synthetic import GENERATORS  # noqa: E402

import mvdb  # noqa: E402
from mvdb.engine import ivf  # noqa: E402


TRAIN_MAX = ivf.TRAIN_MAX  # the library's, before any variant sets its own


def variants(spec: str) -> list[dict]:
    """"40x10,160x25@2,160x10~torch-fp16,160x10^6~torch-fp16" -> per-list tokens x k-means
    iterations [@ list-count multiplier] [^ millions of tokens in the sample at most:
    ivf.TRAIN_MAX] [~ what trains on the GPU: ivf.KMEANS_GPU]."""
    out = []
    for s in spec.split(","):
        s, _, how = s.partition("~")
        s, _, cap = s.partition("^")
        s, _, mult = s.partition("@")
        per, niter = s.split("x")
        if how and how not in ("faiss", "torch-fp16"):
            raise SystemExit(f"--train {s}~{how}: expected ~faiss or ~torch-fp16 (ivf.KMEANS_GPU), got {how!r}")
        out.append({"per_list": int(per), "niter": int(niter), "nlist_mult": float(mult or 1),
                    "train_max": int(float(cap) * 1e6) if cap else TRAIN_MAX, "kmeans": how or "faiss"})
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=300_000)
    p.add_argument("--generators", default="dups,topics,mixed96")
    p.add_argument("--train", default="40x10,160x10,160x25")
    p.add_argument("--settings", default="default,8:2048,8:4096,16:4096,16:8192")
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--qlen", default="4-64", help='query tokens: "4-64" (log-uniform lengths) or one number')
    p.add_argument("--latency-queries", type=int, default=50)
    p.add_argument("--seed", type=int, default=41)
    p.add_argument("--path", default="/tmp/mvdb-defaults.mvdb")
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = p.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for gen in args.generators.split(","):
        res = {"docs": args.docs, "generator": gen, "spec": GENERATORS[gen],
               "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "faiss_gpu": mvdb.engine.gpu_available(), "variants": []}
        sets, tokens, lengths = structured_case(gen, args.docs, args.queries, args.seed, dev, (args.qlen,))
        q, ref, res["exhaustive_qps"] = sets[args.qlen]
        res["qlen"] = args.qlen
        res["tokens"] = int(lengths.sum())
        res["ingest_s"] = bulk_ingest(args.path, tokens, lengths)
        del tokens
        bare = (Path(args.path) / "MANIFEST.json").read_bytes()
        print(f"{gen}: {args.docs} docs, {res['tokens']:,} tokens; exhaustive {res['exhaustive_qps']:.0f} QPS; "
              f"ingest {res['ingest_s']:.1f} s", flush=True)
        for v in variants(args.train):
            shutil.rmtree(Path(args.path) / "index", ignore_errors=True)
            for record in (Path(args.path) / "segments").glob("commit-*.json"):  # the last variant's settings
                record.unlink()
            (Path(args.path) / "MANIFEST.json").write_bytes(bare)
            ivf.TRAIN_PER_LIST, ivf.KMEANS_NITER, ivf.KMEANS_GPU = v["per_list"], v["niter"], v["kmeans"]
            ivf.TRAIN_PER_LIST_GPU, ivf.TRAIN_MAX = v["per_list"], v["train_max"]
            nlist = None
            if v["nlist_mult"] != 1:
                nlist = int(ivf.default_nlist(res["tokens"]) * v["nlist_mult"])
            t0 = time.perf_counter()
            db = mvdb.open(args.path, device=dev, index="ivf", nlist=nlist, progress=False)
            row = {**v, "open_s": time.perf_counter() - t0, "nlist": db.stats()["nlist"],
                   "build_seconds": db.stats().get("build_seconds"), "search": []}
            for kw in settings(args.settings):
                row["search"].append(measure(db, q, ref, kw, args.latency_queries))
                s = row["search"][-1]
                print(f"  {v} nlist {row['nlist']} open {row['open_s']:.1f} s {kw}: recall {s['recall10']:.4f} "
                      f"QPS {s['batch_qps']:.0f} p50 {s.get('single_p50_ms', 0):.2f} ms", flush=True)
            db.close()
            res["variants"].append(row)
            (out_dir / f"defaults-{gen}-{args.docs}.json").write_text(json.dumps(res, indent=1))
        shutil.rmtree(args.path, ignore_errors=True)


if __name__ == "__main__":
    main()
