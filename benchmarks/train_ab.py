"""GPU time of the training backward's dD kernels, previous code against this tree, in one process
(issue #17): the previous code is the package ``--old`` (made by benchmarks/old_tree.sh from .old).

    python benchmarks/train_ab.py [--old mvdb_old] [--out DIR]

For each padded shape (bf16, d=128; in-batch cross products and per-query negatives): the winners
from this tree's forward, then each version's lowmem dD alone (``backward(..., need_dq=False)``),
checked bitwise equal first, then timed with triton.testing.do_bench (median, L2 flushed), the
versions alternating three times; the medians of the three. ``new_masked``: this tree with a
query mask (one that hides nothing), whose rows it zeroes in a copy before the dD kernel. A case
with NaN in masked query padding checks that no NaN reaches dD in either version.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import statistics
from pathlib import Path

import torch
import triton

from mvdb.kernels.maxsim.train import ops as new_ops
from training import make_shape  # noqa: E402  (benchmarks/ is the script's folder)

SHAPES = [  # (B, Lq, Ld, negatives per query; 0 = in-batch)
    (256, 32, 180, 0), (256, 32, 300, 0), (64, 32, 300, 0), (128, 64, 512, 0), (1024, 32, 180, 0),
    (256, 32, 1024, 0), (32, 32, 180, 0), (256, 32, 1030, 16), (64, 32, 300, 64),
]


def inputs(b, lq, ld, neg, seed=0):
    return make_shape(dict(b=b, lq=lq, ld=ld, neg=neg), "cuda", seed)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", default="mvdb_old")
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = p.parse_args()
    old_ops = importlib.import_module(args.old + ".kernels.maxsim.train.ops")
    versions = {"old": old_ops, "new": new_ops}
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "rows": []}
    for b, lq, ld, neg in SHAPES:
        Q, D = inputs(b, lq, ld, neg)
        n_k = neg or b
        q, d = Q.reshape(-1, 128), D.reshape(-1, 128)
        q_off = new_ops._arange_steps(b, lq, q.device)
        d_off = new_ops._arange_steps(b * neg if neg else b, ld, q.device)
        _, arg, _, _ = new_ops.forward(q, q_off, d, d_off, b, n_k, lq, bool(neg), equal_lengths=True)
        grad = torch.randn(b, n_k, device="cuda")

        def dd(v, q_mask=None):  # the previous code has no q_mask argument (its kernel always guarded)
            extra = {} if v == "old" else {"q_mask": q_mask}
            return versions[v].backward("lowmem", grad, q, q_off, d, arg, b, n_k, need_dq=False, covered=True,
                                        per_query=bool(neg), **extra)[1]

        # a query mask hiding nothing, flat bool as padded() passes it
        every = torch.ones(q.shape[0], dtype=torch.bool, device=q.device)

        ref = dd("old")
        row = {"b": b, "lq": lq, "ld": ld, "neg": neg, "bitwise_equal": bool(torch.equal(dd("new"), ref)),
               "masked_bitwise_equal": bool(torch.equal(dd("new", every), ref))}
        fns = {"old": lambda: dd("old"), "new": lambda: dd("new"), "new_masked": lambda: dd("new", every)}
        times = {v: [] for v in fns}
        for _ in range(3):
            for v, fn in fns.items():
                times[v].append(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"))
        row |= {v + "_ms": statistics.median(t) for v, t in times.items()}
        row["speedup"] = row["old_ms"] / row["new_ms"]
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
    # NaN behind a query mask: the masked rows never reach dD (both versions)
    Q, D = inputs(8, 32, 180, 0, seed=1)
    qm = torch.ones(8, 32, dtype=torch.bool, device="cuda")
    qm[:, 20:] = False
    Q[:, 20:] = float("nan")
    for v, ops in versions.items():
        Qg, Dg = Q.clone().requires_grad_(), D.clone().requires_grad_()
        ops.padded(Qg, Dg, qm, None, "lowmem").logsumexp(1).sum().backward()
        res[f"nan_padding_{v}_dd_finite"] = bool(torch.isfinite(Dg.grad).all())
    print({k: v for k, v in res.items() if k.startswith("nan")}, flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "train-ab.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
