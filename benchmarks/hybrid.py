"""Hybrid search on real text (issue #7): the token index alone vs with BM25 sparse vectors as a
second candidate channel, on the man-page dev set embedded with MiniLM (as benchmarks/quality.py).

    python benchmarks/hybrid.py [--limit N]
    python benchmarks/hybrid.py --data mvdb/data/manpages-sample.jsonl.gz --limit 40 --encoder words   # smoke

BM25 term weights come from the MiniLM tokenizer (WordPiece ids, installed offline with the
model): each page body (all of it, not only the 256 embedded tokens) becomes a sparse vector of
idf * tf (k1 + 1) / (tf + k1 (1 - b + b dl / avgdl)) (k1 1.2, b 0.75), each summary a vector of
its term counts, so their dot product is the BM25 score. Per setting, with and without the sparse
channel (its 100 best documents join the candidates before the exact MaxSim rerank), with 100 or
20 token-index candidates: the recall of the candidate set (is the relevant page among the
documents reranked: recall@100 of the 100 token candidates, and of the union with BM25's 100) and
its size, and Recall@10 and MRR@10 of the final ranking; BM25 alone (its recall@100 and MRR@10)
and exhaustive MaxSim for reference. JSON to --out.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import gzip
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import text_model  # noqa: E402

import mvdb  # noqa: E402
from mvdb.engine import search as search_mod  # noqa: E402
from mvdb.testing.words import Words  # noqa: E402

DOC_TOKENS, QUERY_TOKENS = 256, 32
SETTINGS = [
    {"name": "flat, 100 candidates", "index": "flat", "search": {"n_candidates": 100}},
    {"name": "flat, 20 candidates", "index": "flat", "search": {"n_candidates": 20}},
    {"name": "ivf, 100 candidates", "index": "ivf", "search": {"n_candidates": 100}},
    {"name": "ivf, 20 candidates", "index": "ivf", "search": {"n_candidates": 20}},
]


def term_ids(model):
    """text -> its term ids: MiniLM's WordPiece ids without the special ones, or the stand-in's word ids."""
    if isinstance(model, Words):
        return model.token_ids
    tokenizer = model.model.tokenizer
    special = set(tokenizer.all_special_ids)
    return lambda x: [t for t in tokenizer(x, add_special_tokens=False)["input_ids"] if t not in special]


def bm25(terms, bodies, summaries, k1=1.2, b=0.75):
    docs = [terms(x) for x in bodies]
    df = collections.Counter(t for d in docs for t in set(d))
    n, avgdl = len(docs), sum(len(d) for d in docs) / max(1, len(docs))
    idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}
    doc_vecs = []
    for d in docs:
        tf = collections.Counter(d)
        norm = k1 * (1 - b + b * len(d) / avgdl)
        doc_vecs.append({t: idf[t] * c * (k1 + 1) / (c + norm) for t, c in tf.items()})
    q_vecs = [dict(collections.Counter(terms(x))) for x in summaries]
    return doc_vecs, q_vecs


def mrr10(lists, want):
    return float(np.mean([next((1 / (r + 1) for r, i in enumerate(row[:10]) if i == w), 0.0)
                          for row, w in zip(lists, want)]))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared/data/manpages/dev.jsonl.gz"))
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--encoder", default="minilm", choices=["minilm", "words"],
                   help="words: a stand-in that needs no model (smoke runs; mvdb.testing.words)")
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = p.parse_args()
    with gzip.open(args.data, "rt") as f:
        rows = [json.loads(line) for line in f]
    rows = rows[: args.limit] if args.limit else rows
    ids = list(range(len(rows)))
    model = text_model(args.encoder)
    docs = model.encode([r["body"] for r in rows], max_tokens=DOC_TOKENS, progress=True)
    queries = model.encode([r["summary"] for r in rows], max_tokens=QUERY_TOKENS)
    doc_vecs, q_vecs = bm25(term_ids(model), [r["body"] for r in rows], [r["summary"] for r in rows])
    terms = "word ids (crc32)" if isinstance(model, Words) else "MiniLM WordPiece ids"
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "pages": len(rows),
           "device": "cpu", "model": model.name, "bm25": {"k1": 1.2, "b": 0.75, "terms": terms},
           "n_sparse": search_mod.DEFAULT_SPARSE_CANDIDATES, "settings": []}
    with tempfile.TemporaryDirectory() as tmp:
        for st in SETTINGS:
            path = os.path.join(tmp, st["index"])
            db = mvdb.open(path, device="cpu", index=st["index"])
            if not len(db):
                db.add(docs, ids=ids, sparse=doc_vecs)
                db.close()
                db = mvdb.open(path, device="cpu", index=st["index"])
            if "bm25_alone" not in res:
                # BM25 alone, from dense term-weight matrices (a property of the data, not of mvdb)
                vocab = 1 + max(max(v) for v in doc_vecs + q_vecs if v)
                dm, qm = np.zeros((len(doc_vecs), vocab), np.float32), np.zeros((len(q_vecs), vocab), np.float32)
                for m, vecs in ((dm, doc_vecs), (qm, q_vecs)):
                    for i, v in enumerate(vecs):
                        m[i, list(v)] = list(v.values())
                bm = [[ids[j] for j in r] for r in np.argsort(-(qm @ dm.T), axis=1, kind="stable")[:, :100].tolist()]
                res["bm25_alone_mrr10"] = mrr10(bm, ids)
                res["bm25_alone_recall_at_100"] = float(np.mean([w in r for r, w in zip(bm, ids)]))
                ex = db.search(queries, k=10, exact=True)
                res["exhaustive_maxsim_mrr10"] = mrr10([[h.id for h in hs] for hs in ex], ids)
                res["bm25_alone"] = True
                print(f"BM25 alone MRR@10 {res['bm25_alone_mrr10']:.3f}; exhaustive MaxSim "
                      f"{res['exhaustive_maxsim_mrr10']:.3f}", flush=True)
            row = {"name": st["name"], "index": db.stats()["index"], "search": st["search"]}
            for channel in ("tokens", "tokens+bm25"):
                kw = dict(st["search"], **({"sparse": q_vecs} if channel != "tokens" else {}))
                cand_ids = db.candidates(queries, k=10, **kw)
                t0 = time.perf_counter()
                hits = db.search(queries, k=10, **kw)
                dt = time.perf_counter() - t0
                row[channel] = {
                    "candidates_mean": float(np.mean([len(c) for c in cand_ids])),
                    "candidate_recall": float(np.mean([w in c for c, w in zip(cand_ids, ids)])),
                    "recall_at_10": float(np.mean([w in [h.id for h in hs[:10]] for hs, w in zip(hits, ids)])),
                    "mrr10": mrr10([[h.id for h in hs] for hs in hits], ids), "search_s": dt,
                }
                print(st["name"], channel, json.dumps(row[channel]), flush=True)
            res["settings"].append(row)
            db.close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"hybrid-manpages-dev-cpu{'-words' if args.encoder == 'words' else ''}.json"
    (out / name).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
