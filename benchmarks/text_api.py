"""The text API against the embeddings path on the man-page dev set (issue #18): same MRR@10.

    python benchmarks/text_api.py --limit 500     # the first 500 dev pages
    python benchmarks/text_api.py                 # all 1,979 (several minutes of CPU encoding per path)
    python benchmarks/text_api.py --data mvdb/data/manpages-sample.jsonl.gz --limit 40 --encoder words  # smoke

Known-item search as in benchmarks/quality.py: each page's one-line summary is a query, its page
body the one relevant document; all-MiniLM-L6-v2 per-token vectors, bodies cut at 256 tokens,
summaries at 32.

- embeddings path: ``MiniLM.encode`` (cached in ~/.cache/mvdb, as benchmarks/quality.py and the
  demo use it), ``db.add(vectors, ids=...)``, ``db.search(query_vectors, k=10)``;
- text path: a fresh database, ``mvdb.open(path, encoder=MiniLM().encoder(cache=False))``,
  ``db.add_texts(bodies, ids=...)``, ``db.search_text(summaries, k=10)`` (encoded afresh).

Both with default settings on the same pages. Printed and written as JSON
(text-api-manpages-dev-<cpu | GPU name>.json) to --out, default $OUT or benchmarks/results: MRR@10
of each, the share of queries whose top-10 id lists are equal, the largest score difference, and
the time of each path.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import text_model  # noqa: E402

import mvdb  # noqa: E402


def mrr10(lists, ids) -> float:
    return float(np.mean([next((1 / (i + 1) for i, h in enumerate(hits) if h.id == want), 0.0)
                          for hits, want in zip(lists, ids)]))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared/data/manpages/dev.jsonl.gz"))
    p.add_argument("--limit", type=int, default=None, help="only the first N pages")
    p.add_argument("--encoder", default="minilm", choices=["minilm", "words"],
                   help="words: a stand-in that needs no model (smoke runs; mvdb.testing.words)")
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = p.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    tag = "cpu" if dev == "cpu" else torch.cuda.get_device_name().replace(" ", "-")
    with gzip.open(args.data, "rt") as f:
        rows = [json.loads(line) for line in f]
    rows = rows[: args.limit] if args.limit else rows
    ids, bodies, summaries = [r["id"] for r in rows], [r["body"] for r in rows], [r["summary"] for r in rows]
    print(f"{len(rows)} man pages from {args.data}; {dev}", flush=True)
    model = text_model(args.encoder, device=dev)
    res = {"benchmark": "text-api-manpages-dev", "model": model.name,
           "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "torch": torch.__version__, "device": tag},
           "pages": len(rows), "limit": args.limit}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        docs = model.encode(bodies, max_tokens=256, progress=True)
        queries = model.encode(summaries, max_tokens=32)
        with mvdb.open(os.path.join(tmp, "emb.mvdb"), device=dev) as db:
            db.add(docs, ids=ids)
            emb = db.search(queries, k=10)
        res["embeddings_path"] = {"mrr10": mrr10(emb, ids), "seconds": time.perf_counter() - t0}
        print(f"embeddings path (MiniLM.encode, db.add, db.search): MRR@10 {res['embeddings_path']['mrr10']:.4f} "
              f"in {res['embeddings_path']['seconds']:.1f} s", flush=True)

        t0 = time.perf_counter()
        with mvdb.open(os.path.join(tmp, "text.mvdb"), device=dev, encoder=model.encoder(cache=False)) as db:
            db.add_texts(bodies, ids=ids)
            txt = db.search_text(summaries, k=10)
            res["encoder_record"] = db.stats()["encoder"]
        res["text_path"] = {"mrr10": mrr10(txt, ids), "seconds": time.perf_counter() - t0}
        print(f"text path (add_texts, search_text): MRR@10 {res['text_path']['mrr10']:.4f} "
              f"in {res['text_path']['seconds']:.1f} s", flush=True)

    res["top10_lists_equal"] = float(np.mean([[h.id for h in a] == [h.id for h in b] for a, b in zip(emb, txt)]))
    res["max_abs_score_diff"] = max(abs(x.score - y.score) for a, b in zip(emb, txt) for x, y in zip(a, b))
    print(f"top-10 id lists equal for {res['top10_lists_equal']:.2%} of the queries; largest score difference "
          f"{res['max_abs_score_diff']:.2e}", flush=True)
    out = Path(args.out) / f"text-api-manpages-dev-{tag}{'-words' if args.encoder == 'words' else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
