"""Every launch config of the fused MaxSim forward, timed one by one on the issue #17 shapes.

    python benchmarks/kernel_variants.py                  # all cases (GPU); JSON to $OUT or benchmarks/results/
    python benchmarks/kernel_variants.py --cases a,c      # a subset
    python benchmarks/kernel_variants.py --smoke          # tiny shapes under TRITON_INTERPRET=1 (checks the script)

Where benchmarks/kernels.py times what the autotuner picks (and the peers), this times each
candidate config (BLOCK_Q, BLOCK_D, RUNMAX, warps, stages) directly through
``fused.launch(config=...)``, after checking it against the fp32 reference, so the short list the
autotuner searches (kernels/maxsim/fused.py ``_prune``) is chosen from measurements. It also times
the default call as users write it (``check=False``, no ``max_seqlen_q``) next to the call with
``max_seqlen_q``.

Cases: (a) 1 query x 10k docs of 64-300 tokens, varlen; (b) ColPali 1024 x 1000 x 1024, padded;
(c) 32 queries x 1000 candidates from a CSR store of 1M docs of 64-128 tokens. Each in fp16 (bf16
for b) and int8.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from common import median_ms  # noqa: E402
from synthetic import candidate_lists, make_corpus, make_queries  # noqa: E402

from mvdb.kernels import maxsim, maxsim_candidates, maxsim_varlen, quantize_int8  # noqa: E402
from mvdb.kernels.maxsim import fused, naive  # noqa: E402


def bench(fn) -> float:
    return median_ms(fn, warmup=10, rep=60, cpu_runs=1)


def short_configs(smoke: bool):
    if smoke:
        return [{"BLOCK_Q": 16, "BLOCK_D": 16, "RUNMAX": r, "num_warps": 4} for r in (0, 1)]
    out = []
    for bd, w, st, r in itertools.product((32, 64, 128, 256), (2, 4, 8), (2, 3), (0, 1)):
        if bd == 256 and w == 2:
            continue
        out.append({"BLOCK_Q": 32, "BLOCK_D": bd, "RUNMAX": r, "num_warps": w, "num_stages": st})
    return out


def long_configs(smoke: bool):
    if smoke:
        return [{"BLOCK_Q": 16, "BLOCK_D": 16, "RUNMAX": r, "num_warps": 4} for r in (0, 1)]
    out = []
    for bq, bd, w, st, r in itertools.product((128, 256), (64, 128, 256), (4, 8), (3, 4), (0, 1)):
        out.append({"BLOCK_Q": bq, "BLOCK_D": bd, "RUNMAX": r, "num_warps": w, "num_stages": st})
    return out


ROWS: list[dict] = []


def sweep(case: str, configs, launch, ref, default_calls: dict, floor_ms: float) -> None:
    """Time launch(config) for each config (after a correctness check) and the named default calls."""
    tol = 3e-2 if "int8" in case else 1e-2
    scale = ref.abs().max().clamp_min(1e-30)
    for name, fn in default_calls.items():
        got = fn()
        err = float(((got.float() - ref).abs().max() / scale).item())
        row = {"case": case, "call": name, "max_rel_err": err, "correct": err <= tol}
        if row["correct"]:
            row["ms"] = bench(fn)
            row["pct_of_floor"] = 100 * floor_ms / row["ms"]
        ROWS.append(row)
        print(json.dumps(row), flush=True)
    for cfg in configs:
        row = {"case": case, "config": cfg}
        try:
            got = launch(cfg)
            err = float(((got.float() - ref).abs().max() / scale).item())
            row.update(max_rel_err=err, correct=err <= tol)
            if row["correct"]:
                row["ms"] = bench(lambda cfg=cfg: launch(cfg))
                row["pct_of_floor"] = 100 * floor_ms / row["ms"]
        except Exception as e:  # noqa: BLE001 - a config that does not compile (registers, shared memory) is a result
            row.update(correct=False, error=f"{type(e).__name__}: {str(e)[:200]}")
        ROWS.append(row)
        print(json.dumps(row), flush=True)
    best = min((r for r in ROWS if r["case"] == case and "config" in r and "ms" in r), key=lambda r: r["ms"], default=None)
    if best:
        print(f"== {case}: best {best['ms']:.4f} ms {best['config']} ({best['pct_of_floor']:.0f}% of floor)", flush=True)


def case_a(dev, smoke, hbm):
    n = 50 if smoke else 10_000
    corpus = make_corpus(n, 64 if not smoke else 4, 300 if not smoke else 40, 128, device=dev, seed=n)
    Q, _ = make_queries(corpus, 1, 32, seed=7)
    q = Q[0].half()
    tok, cu_d = corpus.tokens, corpus.offsets.int()
    cu_q = torch.tensor([0, 32], dtype=torch.int32, device=dev)
    ref = naive.maxsim_csr(q.float(), cu_q, tok.float(), corpus.offsets, dtype=torch.float32)
    T = tok.shape[0]
    for label, (t, sc) in (("a-10k", (tok, None)), ("a-10k-int8", quantize_int8(tok))):
        nbytes = T * (128 + 4 if sc is not None else 256) + 8 * n
        out = torch.empty(1, n, device=dev)
        sweep(label, short_configs(smoke),
              lambda cfg, t=t, sc=sc, out=out: fused.launch(out, q, None, cu_q, 0, t, sc, None, cu_d, None, 0, 1, n,
                                                   fused.CSR_CROSS, 32, config=cfg),
              ref, {"default call (check=False)": lambda t=t, sc=sc: maxsim_varlen(q, cu_q, t, cu_d, d_scales=sc,
                                                                                   check=False),
                    "max_seqlen_q=32": lambda t=t, sc=sc: maxsim_varlen(q, cu_q, t, cu_d, d_scales=sc, max_seqlen_q=32,
                                                                        check=False)},
              nbytes / hbm * 1e3)


def case_b(dev, smoke, hbm):
    n, L = (4, 40) if smoke else (1000, 1024)
    corpus = make_corpus(n, L, L, 128, dtype=torch.bfloat16, device=dev, seed=3)
    Q, _ = make_queries(corpus, 1, L, seed=5)
    Q = Q.bfloat16()
    D = corpus.tokens.view(n, L, 128)
    ref = naive.maxsim_padded(Q.float(), D.float(), dtype=torch.float32, budget=1 << 28)
    mma = 2 * L * L * 128 * n / 989e12 * 1e3  # H100 SXM dense bf16 peak; int8 twice that
    for label, (dd, sc) in (("b-colpali", (D, None)), ("b-colpali-int8", quantize_int8(D))):
        out = torch.empty(1, n, device=dev)
        qc = Q.contiguous()
        sweep(label, long_configs(smoke),
              lambda cfg, dd=dd, sc=sc, out=out: fused.launch(out, qc, None, None, L, dd.contiguous(), sc, None, None, None, L,
                                                     1, n, fused.PADDED_CROSS, L, config=cfg),
              ref, {"maxsim(Q, D)": lambda dd=dd, sc=sc: maxsim(Q, dd, d_scales=sc)},
              mma / (2 if sc is not None else 1))


def case_c(dev, smoke, hbm):
    n_docs, nq, k = (200, 4, 50) if smoke else (1_000_000, 32, 1000)
    corpus, _, q, cu_q, cand = candidate_lists(n_docs, nq, k, device=dev)
    tok, off = corpus.tokens, corpus.offsets
    ref = naive.maxsim_csr(q.float(), cu_q, tok, off, cand, dtype=torch.float32)
    gathered = float(corpus.lengths[cand].sum())
    for label, (t, sc) in (("c-1M", (tok, None)), ("c-1M-int8", quantize_int8(tok))):
        nbytes = gathered * (128 + 4 if sc is not None else 256) + nq * k * 8 * 3
        out = torch.empty(nq, k, device=dev)
        sweep(label, short_configs(smoke),
              lambda cfg, t=t, sc=sc, out=out: fused.launch(out, q, None, cu_q, 0, t, sc, None, off, cand, 0, nq, k,
                                                   fused.CSR_CAND, 32, config=cfg),
              ref, {"default call (check=False)": lambda t=t, sc=sc: maxsim_candidates(q, cu_q, t, off, cand, sc,
                                                                                       check=False),
                    "max_seqlen_q=32": lambda t=t, sc=sc: maxsim_candidates(q, cu_q, t, off, cand, sc, max_seqlen_q=32,
                                                                            check=False)},
              nbytes / hbm * 1e3)
        del t, sc


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="a,c,b")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", str(HERE / "results")))
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    hbm = 3.35e12
    if dev == "cuda":  # measured copy bandwidth, as benchmarks/kernels.py's ceilings()
        x = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
        y = torch.empty_like(x)
        hbm = 2 * x.numel() / (bench(lambda: y.copy_(x)) * 1e-3)
        del x, y
    t0 = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for c in args.cases.split(","):
        {"a": case_a, "b": case_b, "c": case_c}[c](dev, args.smoke, hbm)
        if dev == "cuda":
            torch.cuda.empty_cache()
        # written after every case: a run cut short by its time limit keeps what it measured
        res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (smoke)", "hbm_gbps": hbm / 1e9,
               "torch": torch.__version__, "triton": __import__("triton").__version__, "seconds": time.time() - t0,
               "cases": args.cases, "rows": ROWS}
        name = "variants-smoke.json" if args.smoke else f"variants-{res['device'].replace(' ', '_')}.json"
        (out / name).write_text(json.dumps(res, indent=1))
        print(f"wrote {out / name}")


if __name__ == "__main__":
    main()
