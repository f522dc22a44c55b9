"""INT8 calls with the query quantization launch as the MaxSim launch's programmatic dependent
launch (PDL, fused.PDL) against the current placements (issue #17, cases a and c).

    python benchmarks/pdl_probe.py [--rounds 7] [--out DIR]      # GPU (sm_90)

Case (a): 1 query of 32 tokens x 10k documents of 64-300 tokens (varlen); case (b): ColPali, one
query of 1,024 tokens x 1,000 pages of 1,024 (padded ``maxsim``, PDL on and off); case (c): 32
queries x 1,000 candidates from a 150k-document CSR store. Arms: the default call with PDL off
(the rule's placement), the quantization launch before the MaxSim launch, and the same with PDL.
(Runs before PDL became opt-in labelled case (b)'s PDL arm "default".)
Scores are checked first (PDL against the plain launch: bit for bit). Then ``--rounds`` rounds, the arms in
alternating order, each arm's median of triton.testing.do_bench (L2 flushed between runs); the
median over rounds is reported, with each arm's kernel time (torch.profiler) and host time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import triton  # noqa: E402
from common import median_ms, with_attr  # noqa: E402
from int8_call import _at, host_us, kernels_us  # noqa: E402
from synthetic import candidate_lists, colpali_inputs, make_corpus, make_queries  # noqa: E402

from mvdb.kernels import maxsim, maxsim_candidates, maxsim_varlen, quantize_int8  # noqa: E402
from mvdb.kernels.maxsim import fused  # noqa: E402


def with_pdl(on: bool, placement: str | None, fn):
    """fn with fused.PDL set to ``on``, and the int8 query quantization at ``placement`` (None: the rule's)."""
    return with_attr(fused, "PDL", on, fn if placement is None else _at(placement, fn))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out", default=os.environ.get("OUT", str(HERE / "results")))
    args = p.parse_args()
    dev = "cuda"
    corpus = make_corpus(10_000, 64, 300, 128, device=dev, seed=10_000)
    Q, _ = make_queries(corpus, 1, 32, seed=7)
    q = Q[0].half()
    cu_q = torch.tensor([0, 32], dtype=torch.int32, device=dev)
    t8, sc = quantize_int8(corpus.tokens)
    cu_d = corpus.offsets.int()
    a = lambda: maxsim_varlen(q, cu_q, t8, cu_d, d_scales=sc, check=False)  # noqa: E731
    cc, _, qc, cuc, cand = candidate_lists(150_000, 32, 1000, device=dev)
    c8, csc = quantize_int8(cc.tokens)
    c = lambda: maxsim_candidates(qc, cuc, c8, cc.offsets, cand, csc, check=False)  # noqa: E731
    Qb, Db = colpali_inputs(1000, 1024, device=dev)
    Db8, sb8 = quantize_int8(Db)
    del Db
    b = lambda: maxsim(Qb, Db8, d_scales=sb8)  # noqa: E731
    cases = {
        "b: ColPali 1 x 1024 vs 1000 x 1024, int8": {"PDL": with_pdl(True, None, b),
                                                     "no PDL": with_pdl(False, None, b)},
        "a: 1 x 10k varlen, int8": {"default": with_pdl(False, None, a), "launch": with_pdl(False, "launch", a),
                                    "launch + PDL": with_pdl(True, "launch", a)},
        "c: 32 x 1000 candidates of 150k, int8": {"default": with_pdl(False, None, c),
                                                  "launch + PDL": with_pdl(True, "launch", c)},
    }
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "rule": {"a": fused.quant_placement(10_000, 32), "c": fused.quant_placement(32_000, 32)}, "cases": {}}
    for name, arms in cases.items():
        outs = {arm: f().clone() for arm, f in arms.items()}
        torch.cuda.synchronize()
        ref = outs["launch"] if "launch" in outs else outs["no PDL"] if "no PDL" in outs else outs["default"]
        row = {"bit_identical_to_reference":
               {arm: bool(torch.equal(o, ref)) for arm, o in outs.items()},
               "max_rel_diff": max(float(((o - ref).abs() / ref.abs().clamp_min(1e-30)).max()) for o in outs.values())}
        assert torch.equal(outs["launch + PDL"] if "launch + PDL" in outs else outs["PDL"], ref), \
            f"{name}: PDL changed the scores"
        times = {arm: [] for arm in arms}
        for r in range(args.rounds):
            order = list(arms) if r % 2 == 0 else list(reversed(arms))
            for arm in order:
                times[arm].append(median_ms(arms[arm], warmup=10, rep=100))
        row["do_bench_ms_median_of_rounds"] = {arm: statistics.median(t) for arm, t in times.items()}
        row["do_bench_ms_rounds"] = times
        row["kernels_us"] = {arm: kernels_us(f) for arm, f in arms.items()}
        row["host_us"] = {arm: host_us(f, 300) for arm, f in arms.items()}
        res["cases"][name] = row
        print(name, json.dumps({k: v for k, v in row.items() if k != "do_bench_ms_rounds"}), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pdl-probe.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
