"""Long queries: the default call with the query split across programs (fused.QCHUNK_ROWS, for
any document length) and without it (QCHUNK_ROWS = 0), on shapes beyond benchmarks/kernels.py's
case b, scores checked against each other and the fp32 reference first. What the split costs on
short documents set fused.QCHUNK_MIN_LD, below which the default call does not split.

    python benchmarks/long_query.py [--smoke] [--shapes b,rerank] [--out DIR]    # JSON long-query-<device>.json

Shapes (seeded synthetic corpora, benchmarks/synthetic.py): (b) one ColPali query of 1,024 tokens
x 1,000 pages of 1,024, padded, bf16 and int8; (b600) the same with a 600-token query (three
chunks, the last one short); (rerank) 16 queries of 1,030 tokens x 100 candidates each from 2,000
pages of 1,030 tokens in a CSR store, fp16 and int8 (maxsim_candidates); (short-docs) one query of
1,024 tokens x 10k documents of 64-300 tokens, varlen fp16 (documents short enough that one
program's passes over them stay in L2: does the split cost anything there?).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import median_ms, with_attr  # noqa: E402
from synthetic import make_corpus, make_queries  # noqa: E402

from mvdb.kernels import maxsim, maxsim_candidates, maxsim_varlen, quantize_int8  # noqa: E402
from mvdb.kernels.maxsim import fused, naive  # noqa: E402


def shapes(dev, smoke):
    n, L = (4, 40) if smoke else (1000, 1024)
    corpus = make_corpus(n, L, L, 128, dtype=torch.bfloat16, device=dev, seed=3)
    D = corpus.tokens.view(n, L, 128)
    D8, s8 = quantize_int8(D)
    for lq in (L, 600 if not smoke else 30):
        Q, _ = make_queries(corpus, 1, lq, seed=5)
        Q = Q.bfloat16()
        ref = naive.maxsim_padded(Q.float(), D.float(), dtype=torch.float32, budget=1 << 28)
        tag = "b" if lq == L else f"b{lq}"
        yield f"{tag} bf16", lambda Q=Q: maxsim(Q, D), ref, 2 * lq * L * 128 * n
        yield f"{tag} int8", lambda Q=Q: maxsim(Q, D8, d_scales=s8), ref, 2 * lq * L * 128 * n
    n_docs, nq, k, L = (50, 2, 5, 40) if smoke else (2000, 16, 100, 1030)
    corpus = make_corpus(n_docs, L, L, 128, device=dev, seed=19)
    Q, src = make_queries(corpus, nq, L, seed=23)
    g = torch.Generator(device=dev).manual_seed(29)
    cand = torch.randint(0, n_docs, (nq, k), device=dev, generator=g)
    cand[:, 0] = src
    q = Q.half().reshape(-1, 128).contiguous()
    cu_q = torch.arange(0, (nq + 1) * L, L, dtype=torch.int32, device=dev)
    tok, off = corpus.tokens, corpus.offsets
    ref = naive.maxsim_csr(q.float(), cu_q, tok.float(), off, cand, dtype=torch.float32)
    t8, s8 = quantize_int8(tok)
    yield "rerank fp16", lambda: maxsim_candidates(q, cu_q, tok, off, cand, check=False), ref, 2 * L * L * 128 * nq * k
    yield "rerank int8", lambda: maxsim_candidates(q, cu_q, t8, off, cand, s8, check=False), ref, \
        2 * L * L * 128 * nq * k
    n, lq = (50, 40) if smoke else (10_000, 1024)
    corpus = make_corpus(n, 64 if not smoke else 4, 300 if not smoke else 40, 128, device=dev, seed=n)
    Q, _ = make_queries(corpus, 1, lq, seed=7)
    q = Q[0].half()
    cu_q = torch.tensor([0, lq], dtype=torch.int32, device=dev)
    tok, cu_d = corpus.tokens, corpus.offsets.int()
    ref = naive.maxsim_csr(q.float(), cu_q, tok.float(), cu_d.long(), dtype=torch.float32)
    yield "short-docs fp16", lambda: maxsim_varlen(q, cu_q, tok, cu_d, check=False), ref, \
        2 * lq * int(corpus.lengths.sum()) * 128


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", str(HERE / "results")))
    ap.add_argument("--shapes", default="", help="only shapes whose name starts with one of these (comma-separated)")
    args = ap.parse_args()
    only = tuple(x for x in args.shapes.split(",") if x)
    dev = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    if args.smoke:
        fused.QCHUNK_ROWS, fused.QCHUNK_MIN_LQ = 16, 17
    rows_on = fused.QCHUNK_ROWS
    rows = []
    for name, fn, ref, flops in shapes(dev, args.smoke):
        if only and not name.startswith(only):
            continue
        res = {}
        for label, rows_ in (("split", rows_on), ("whole", 0)):
            # split: whatever the documents' length (QCHUNK_MIN_LD 0), to time both sides of the rule
            call = with_attr(fused, "QCHUNK_MIN_LD", 0, with_attr(fused, "QCHUNK_ROWS", rows_, fn))
            got = call()
            err = ((got.float() - ref).abs().max() / ref.abs().max()).item()
            res[label] = got
            row = {"shape": name, "variant": label, "qchunk_rows": rows_, "max_rel_err": err,
                   "correct": err < (3e-2 if "int8" in name else 1e-2),
                   "ms": median_ms(call) if dev == "cuda" else None}
            if row["ms"]:
                row["tflops"] = flops / row["ms"] / 1e9
            rows.append(row)
            print(json.dumps(row), flush=True)
        diff = ((res["split"] - res["whole"]).abs().max() / res["whole"].abs().max()).item()
        print(f"== {name}: split vs whole max rel diff {diff:.2e}", flush=True)
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (smoke)",
           "torch": torch.__version__, "triton": __import__("triton").__version__,
           "autotune": os.environ.get("MVDB_AUTOTUNE", "1"), "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "long-query-smoke.json" if args.smoke else f"long-query-{res['device'].replace(' ', '_')}.json"
    (out / name).write_text(json.dumps(res, indent=1))
    print(f"wrote {out / name}")


if __name__ == "__main__":
    main()
