"""Pipeline depth of the int8 short-query kernel where the queries are quantized by a launch of
their own (issue #17): one warp with 1, 2 or 3 stages (``num_stages``), pinned through
``fused.launch(config=...)``, against the default call (the autotuner's pick from its short list,
recorded), in alternating rounds on the shapes that take this path by default.

    python benchmarks/stages_ab.py --out DIR --rounds 7     # GPU; JSON stages-ab.json
    bash benchmarks/gpu_session.sh py:stages_ab             # on the lent GPU (PY_ARGS for options)

Shapes (int8 documents with per-token scales, fp16 queries of 32 tokens):
- c-1M / c-150k: 32 queries x 1,000 candidates from a CSR store of 1M / 150k documents of 64-128
  tokens (the kernel table's case c);
- c16-1M: the first 16 of those queries;
- c-long: 32 x 1,000 candidates from 150k documents of 64-300 tokens;
- a-50k: one query against 50k documents of 64-300 tokens, varlen (every document).
Each arm's scores are checked against the float32 reference first; times are medians of triton's
do_bench (L2 flushed by zeroing 256 MB before each call), one per arm per round, and the JSON keeps
every round's figure and the median over rounds.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from common import alternating_rounds, gpu_header, write_json  # noqa: E402
from synthetic import candidate_lists, one_query_inputs  # noqa: E402

from mvdb.kernels import maxsim_candidates, maxsim_varlen, quantize_int8  # noqa: E402
from mvdb.kernels.maxsim import fused, naive  # noqa: E402

STAGES = (1, 2, 3)


def arms(q, cu_q, tok, sc, offsets, cand, n_q, n_k, layout):
    """name -> callable: the default call and the pinned one-warp configs."""
    out = torch.empty(n_q, n_k, device=tok.device)

    def pinned(st):
        cfg = {"BLOCK_Q": 32, "BLOCK_D": 32, "RUNMAX": 0, "num_warps": 1, "num_stages": st, "QUANT": 0}
        return lambda: fused.launch(out, q, None, cu_q, 0, tok, sc, None, offsets, cand, 0, n_q, n_k, layout, 32,
                                    config=cfg)

    if cand is not None:
        default = lambda: maxsim_candidates(q, cu_q, tok, offsets, cand, sc, check=False)  # noqa: E731
    else:
        default = lambda: maxsim_varlen(q, cu_q, tok, offsets.int(), d_scales=sc, check=False)  # noqa: E731
    return {"default": default, **{f"1 warp, {st} stage{'s' * (st > 1)}": pinned(st) for st in STAGES}}


def shapes(dev, only):
    """(label, inputs) one at a time (the big stores are freed before the next is built)."""
    for n_docs in (1_000_000, 150_000):
        label = "c-1M" if n_docs == 1_000_000 else "c-150k"
        if not only & {label, "c16-1M"}:
            continue
        corpus, _, q, cu_q, cand = candidate_lists(n_docs, 32, 1000, device=dev)
        tok, sc = quantize_int8(corpus.tokens)
        off = corpus.offsets
        del corpus
        if label in only:
            yield label, (q, cu_q, tok, sc, off, cand, 32, 1000, fused.CSR_CAND)
        if n_docs == 1_000_000 and "c16-1M" in only:
            yield "c16-1M", (q[: 16 * 32], cu_q[:17], tok, sc, off, cand[:16], 16, 1000, fused.CSR_CAND)
        del tok, sc, off
        torch.cuda.empty_cache()
    if "c-long" in only:
        corpus, _, q, cu_q, cand = candidate_lists(150_000, 32, 1000, device=dev, lengths=(64, 300),
                                                   seeds=(23, 29, 31))
        tok, sc = quantize_int8(corpus.tokens)
        off = corpus.offsets
        del corpus
        yield "c-long", (q, cu_q, tok, sc, off, cand, 32, 1000, fused.CSR_CAND)
        del tok, sc, off
        torch.cuda.empty_cache()
    if "a-50k" in only:
        corpus, q, cu_q, tok, _ = one_query_inputs(50_000, device=dev)
        tok8, sc = quantize_int8(tok)
        off = corpus.offsets
        del corpus, tok
        yield "a-50k", (q, cu_q, tok8, sc, off, None, 1, 50_000, fused.CSR_CROSS)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--shapes", default="c-1M,c-150k,c16-1M,c-long,a-50k")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    dev = "cuda"
    res = gpu_header(rounds=args.rounds, shapes={})
    for label, (q, cu_q, tok, sc, off, cand, n_q, n_k, layout) in shapes(dev, set(args.shapes.split(","))):
        ref = naive.maxsim_csr(q.float(), cu_q, tok, off, cand, sc, dtype=torch.float32)
        scale = ref.abs().max().clamp_min(1e-30)
        calls = arms(q, cu_q, tok, sc, off, cand, n_q, n_k, layout)
        before = set(fused._BEST)
        row = {"pairs": n_q * n_k, "max_rel_err": {}}
        for name, fn in calls.items():
            err = float(((fn().float().reshape(ref.shape) - ref).abs().max() / scale).item())
            row["max_rel_err"][name] = err
            if err > 3e-2:
                raise SystemExit(f"{label} {name}: max relative error {err:.3g}")
        row["autotune_pick"] = [str(fused._BEST[k]) for k in set(fused._BEST) - before]
        row["ms"], row["median_ms"] = alternating_rounds(calls, args.rounds)
        res["shapes"][label] = row
        print(label, row["autotune_pick"], {k: round(v, 4) for k, v in row["median_ms"].items()}, flush=True)
        del ref, calls
    write_json(args.out, "stages-ab.json", res)


if __name__ == "__main__":
    main()
