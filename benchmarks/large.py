"""A database larger than one GPU, searched on one GPU (issue #45).

    python benchmarks/large.py --docs 5600000 --gen dups          # on nvidia-h100-x4: ~406M tokens, 104 GB fp16
    python benchmarks/large.py --docs 300 --device cpu --also host,disk   # smoke: every step, tiny, on a CPU

Generates a seeded corpus of a ``mvdb/testing/synthetic.py`` generator on GPU 0 into host memory,
computes the exhaustive MaxSim top-10 of every query (``--qlen``: 4-64 tokens, log-uniform, by
default; drawn from stored documents) with the corpus split over all the machine's GPUs, writes
the database as a bulk ingest (``Store.add_packed`` in chunks), then opens it as a user would,
``mvdb.open(path, device="cuda")`` with every option at its default (the tier is ``auto``'s choice;
``--max-gpu-gb`` caps the database's GPU memory instead, e.g. at an H100's on a larger card) and
measures: the build (ingest, then the first open: index and codes), recall@10
against exhaustive MaxSim, batched QPS (median of 3 passes over all queries) and single-query
p50/p99, GPU memory. ``--also disk`` reopens with ``residency="disk"`` and measures again.
JSON to --out after every phase (a run cut short keeps what it measured); ``--phase build`` stops
after the ingest and leaves the database, the queries and the build's record (beside ``--path``) for a
later ``--phase search``, whose JSON carries that record.
``--device cpu`` runs the same steps on the CPU (the reference in one shard there).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bulk_ingest, device_used_gb, make_query_set, measure  # noqa: E402
from mvdb.testing.synthetic import GENERATORS, make_structured  # noqa: E402

import mvdb  # noqa: E402
from mvdb.kernels import maxsim_varlen  # noqa: E402


def reference_multi_gpu(tokens: torch.Tensor, offsets: torch.Tensor, q: list, k: int = 10,
                        batch: int = 50, device: str = "cuda") -> tuple[list, float]:
    """Exhaustive MaxSim top-k of every query ([Lq_i, dim] each), the documents split into one
    contiguous shard per GPU (tokens [T, dim] on the host; one shard on the host where ``device`` is
    the CPU) -> (top-k sets of document numbers, seconds)."""
    cuda = device.startswith("cuda")
    n_gpu = torch.cuda.device_count() if cuda else 1
    n_docs = offsets.numel() - 1
    off = offsets.cpu()
    # shards of about equal tokens
    cuts = torch.searchsorted(off, torch.linspace(0, int(off[-1]), n_gpu + 1, dtype=torch.int64)).tolist()
    cuts[0], cuts[-1] = 0, n_docs
    results: list = [None] * n_gpu
    errors: list = []

    def work(g: int):
        try:
            d0, d1 = cuts[g], cuts[g + 1]
            dev = f"cuda:{g}" if cuda else "cpu"
            with torch.cuda.device(g) if cuda else contextlib.nullcontext():
                t0, t1 = int(off[d0]), int(off[d1])
                tok = tokens[t0:t1].to(dev)
                cu_d = (off[d0 : d1 + 1] - t0).to(dev, torch.int32)
                vals, idx = [], []
                for a in range(0, len(q), batch):
                    b = min(len(q), a + batch)
                    lens = torch.tensor([0] + [x.shape[0] for x in q[a:b]])
                    cu_q = lens.cumsum(0).to(dev, torch.int32)
                    qq = torch.cat(q[a:b]).to(dev, torch.float16)
                    s = maxsim_varlen(qq, cu_q, tok, cu_d, max_seqlen_q=int(lens.max()), check=False)
                    top = s.topk(min(k, d1 - d0), dim=1)
                    vals.append(top.values.cpu())
                    idx.append(top.indices.cpu() + d0)
                results[g] = (torch.cat(vals), torch.cat(idx))
                del tok
                torch.cuda.empty_cache() if cuda else None
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append((g, repr(e)))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=work, args=(g,)) for g in range(n_gpu)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"reference failed on GPUs {errors}")
    vals = torch.cat([r[0] for r in results], dim=1)
    idx = torch.cat([r[1] for r in results], dim=1)
    best = vals.topk(k, dim=1).indices
    ref = [set(row.tolist()) for row in idx.gather(1, best)]
    return ref, time.perf_counter() - t0


def host_rss_gb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1e6
    return float("nan")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=5_600_000)
    p.add_argument("--gen", default="dups", choices=sorted(GENERATORS))
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--qlen", default="4-64", help='query tokens: "4-64" (log-uniform lengths, as real queries) or one number')
    p.add_argument("--seed", type=int, default=45)
    p.add_argument("--chunk-docs", type=int, default=250_000, help="documents a segment of the bulk ingest")
    p.add_argument("--max-gpu-gb", type=float, default=None, help="the database's GPU memory cap (max_gpu_bytes)")
    p.add_argument("--also", default="", help='tiers measured after the default one, e.g. "disk"')
    p.add_argument("--phase", default="all", choices=["all", "build", "search"])
    p.add_argument("--latency-queries", type=int, default=100)
    p.add_argument("--device", default="cuda", help="cuda (the benchmark) or cpu (the same steps, for a smoke run)")
    p.add_argument("--path", default="/tmp/mvdb-large.mvdb")
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = p.parse_args()
    cuda = args.device.startswith("cuda")
    dev0 = "cuda:0" if cuda else "cpu"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = out / f"large-{args.gen}-{args.docs}.json"
    case = Path(args.path + ".case.pt")
    build_record = Path(args.path + ".build.json")  # the build phase's figures, for a later search phase
    res = json.loads(build_record.read_text()) if args.phase == "search" and build_record.exists() else {}
    if res:
        res["build_date"] = res.get("date")
    res.update({"docs": args.docs, "gen": args.gen, "queries": args.queries, "qlen": args.qlen,
                "gpus": torch.cuda.device_count() if cuda else 0,
                "device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "disk_free_gb": shutil.disk_usage(Path(args.path).parent).free / 1e9})

    def save(phase: str):
        res["phase"] = phase
        name.write_text(json.dumps(res, indent=1, default=str))
        print(f"[{phase}] {json.dumps({k: v for k, v in res.items() if k != 'runs'}, default=str)[:600]}", flush=True)

    if args.phase in ("all", "build"):
        t0 = time.perf_counter()
        corpus = make_structured(args.gen, args.docs, device=dev0, seed=args.seed, store="cpu")
        q = [x.cpu() for x in make_query_set(corpus, args.queries, args.qlen, seed=args.seed + 1)]
        res["generate_s"] = time.perf_counter() - t0
        res["tokens"] = int(corpus.offsets[-1])
        res["fp16_gb"] = res["tokens"] * corpus.tokens.shape[1] * 2 / 1e9
        torch.cuda.empty_cache() if cuda else None
        save("generated")
        ref, res["reference_s"] = reference_multi_gpu(corpus.tokens, corpus.offsets, q, device=args.device)
        save("reference")
        torch.save({"q": q, "ref": [sorted(r) for r in ref]}, case)
        lengths = corpus.lengths.cpu().numpy()
        res["ingest_s"] = bulk_ingest(args.path, corpus.tokens.numpy(), lengths, chunk_docs=args.chunk_docs)
        del corpus
        res["db_disk_gb"] = sum(f.stat().st_size for f in Path(args.path).rglob("*") if f.is_file()) / 1e9
        save("ingested")
        build_record.write_text(json.dumps(res, indent=1, default=str))
        if args.phase == "build":
            return
    saved = torch.load(case)
    q, ref = [x.to(dev0) for x in saved["q"]], [set(r) for r in saved["ref"]]
    res["runs"] = []
    tiers = ["auto"] + [t for t in args.also.split(",") if t]
    for tier in tiers:
        torch.cuda.empty_cache() if cuda else None
        kw = {} if tier == "auto" else {"residency": tier}
        if args.max_gpu_gb:
            kw["max_gpu_bytes"] = int(args.max_gpu_gb * 1e9)
        before = device_used_gb(dev0)
        t0 = time.perf_counter()
        db = mvdb.open(args.path, device=args.device, progress=False, **kw)
        run = {"open": tier, "options": kw, "open_s": time.perf_counter() - t0,
               "stats": {k: v for k, v in db.stats().items() if k not in ("path", "encoder")},
               "gpu_used_gb": device_used_gb(dev0) - before if cuda else None,
               "gpu_allocated_gb": torch.cuda.memory_allocated(0) / 1e9 if cuda else None,
               "host_rss_gb": host_rss_gb()}
        res["runs"].append(run)
        save(f"opened {tier}")
        run["search"] = measure(db, q, ref, {"k": 10}, latency_queries=args.latency_queries)
        run["gpu_peak_gb"] = torch.cuda.max_memory_allocated(0) / 1e9 if cuda else None
        save(f"searched {tier}")
        db.close()
        del db
    save("done")


if __name__ == "__main__":
    main()
