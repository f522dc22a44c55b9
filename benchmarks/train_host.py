"""Host cost of a MaxSim training step (issue #17): how long the host takes to queue one fwd + bwd
step of a cross-entropy loss (bf16, d=128), for the previous code (the package ``--old``, made by
benchmarks/old_tree.sh from .old), this tree, and late-interaction-kernels (LIK) lowmem where
importable, in one process, alternating in rounds (the machine's drift hits all alike).

    bash benchmarks/old_tree.sh /tmp/oldpk && PYTHONPATH=/tmp/oldpk python benchmarks/train_host.py --label L

Per shape and backward (auto, lowmem; LIK's lowmem in both rows): the median over ``--rounds`` of
each arm's median host time of 20 steps (``step()`` returns once autograd has queued the backward;
the GPU is waited for every 10 steps, untimed). Gradients are checked against naive autograd on
fp32 copies first. Then a cProfile of this tree's steps (where the host time goes).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import statistics
import time
from pathlib import Path

import torch
import triton

from mvdb.kernels import maxsim
from training import make_shape, naive, step  # noqa: E402  (benchmarks/ is the script's folder)

SHAPES = {
    "colbert": dict(b=256, lq=32, ld=180, neg=0),
    "hardneg": dict(b=256, lq=32, ld=1030, neg=16),
    "small16": dict(b=16, lq=32, ld=180, neg=0),
    "small64": dict(b=64, lq=32, ld=300, neg=0),
    "neg8": dict(b=8, lq=32, ld=180, neg=8),
}


def host_us(fn, Q, D, n=60):
    times = []
    for i in range(n):
        if i % 10 == 0:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step(fn, Q, D)
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def paired(args):
    """The rounds and the profile (module docstring)."""
    import cProfile
    import importlib
    import pstats

    old = importlib.import_module(args.old + ".kernels").maxsim
    arms = {"old": old, "new": maxsim}
    try:
        import late_interaction_kernels as lik

        arms["lik"] = lambda Q, D, backward: lik.maxsim(Q, D, backward=backward)
    except ImportError:
        pass
    res = {"mode": "paired", "old": args.old, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "shapes": {}}
    for name in args.shapes.split(","):
        Q, D = make_shape(SHAPES[name], "cuda")
        gq, gd = step(naive, Q.float(), D.float())
        row = {}
        for kind in ("auto", "lowmem"):
            # LIK has no auto: its lowmem in both rows
            fns = {arm: functools.partial(f, backward="lowmem" if arm == "lik" else kind) for arm, f in arms.items()}
            for arm, f in fns.items():
                aq, ad = step(f, Q, D)
                err = max(((aq.float() - gq).abs().max() / gq.abs().max()).item(),
                          ((ad.float() - gd).abs().max() / gd.abs().max()).item())
                assert err < 0.02, (name, kind, arm, err)
                for _ in range(5):
                    step(f, Q, D)
            times = {arm: [] for arm in fns}
            for _ in range(args.rounds):
                for arm, f in fns.items():
                    times[arm].append(host_us(f, Q, D, n=20))
            row[kind] = {arm: statistics.median(t) for arm, t in times.items()} | {"rounds": times}
            print("paired", name, kind, {arm: round(statistics.median(t), 1) for arm, t in times.items()}, flush=True)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            step(maxsim, Q, D)
        prof.disable()
        torch.cuda.synchronize()
        stats = pstats.Stats(prof)
        top = sorted(stats.stats.items(), key=lambda kv: -kv[1][3])[:40]  # cumulative time
        row["profile_us_per_step"] = [(f"{Path(k[0]).name}:{k[1]}:{k[2]}", round(v[3] / 200 * 1e6, 1),
                                       round(v[2] / 200 * 1e6, 1)) for k, v in top]
        res["shapes"][name] = row
        del Q, D, gq, gd
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"train-host-paired-{args.label}.json").write_text(json.dumps(res, indent=1))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--label", required=True)
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--old", default="mvdb_old", help="the previous code's package (benchmarks/old_tree.sh)")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = p.parse_args()
    paired(args)

if __name__ == "__main__":
    main()
