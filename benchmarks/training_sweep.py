"""Tuning data for the training kernels (issue #5): where the time of a fwd+bwd step goes, how
the launch parameters move it, and which backward wins on which shape (the ``auto`` rule).

    python benchmarks/training_sweep.py [--cases colbert,hardneg,colpali] [--grid] [--out DIR]

For each case of benchmarks/training.py (bf16): the step (forward, loss, backward) at the
defaults, its parts (forward; dQ-only and dD-only lowmem backwards from the saved winners), the
step with each launch parameter of ``train.TUNE`` changed one at a time (each variant's gradients
checked against the defaults' first), and normalize=True fused vs F.normalize in torch.
``--no-variants``: skip the parameter sweep. ``--device``: time by the GPU's kernel time.
``--grid [issue,fit,holdout]``: unified vs lowmem (and what ``auto`` measures and picks) over sets
of in-batch and per-query shapes (``issue``: the 19 of issue #17; ``fit``: the static rule's data;
``holdout``: other sizes, other seed). ``--cases ""`` skips the cases. Writes training_sweep.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).parent))
from training import CASES, device_breakdown, loss_of, make, make_shape  # noqa: E402

from mvdb.kernels import maxsim  # noqa: E402
from mvdb.kernels.maxsim import train  # noqa: E402
from mvdb.kernels.maxsim.train.policy import _gpu_ms  # noqa: E402

VARIANTS = {
    "fwd_bd": [32, 128],
    "fwd_warps": [4, 8],
    "fwd_stages": [2, 4],
    "fwd_rows": [64],
    "dd_perdoc": [0],
    "dd_cross": [0],
    "cross_bj": [32, 128],
    "cross_warps": [8],
    "cross_stages": [2],
    "perdoc_bj": [32, 128],
    "perdoc_warps": [2, 8],
    "dq_bq": [8, 16],
    "dq_splits": [1, 2, 4, 16],
    "dq_warps": [1, 4],
    "dd_bj": [16, 64, 128],
    "dd_light": [64, 1024],
    "dd_bh": [32, 128],
    "dd_warps": [2, 8],
}


DEVICE_TIME = False  # --device: time steps by the GPU's own kernel time (robust to a busy host)


def bench(fn) -> float:
    if DEVICE_TIME:
        return device_breakdown(fn)["device_ms"]
    return triton.testing.do_bench(fn, warmup=5, rep=40, return_mode="median")


def step(Q, D, kind="lowmem", normalize=False):
    Qg, Dg = Q.detach().requires_grad_(), D.detach().requires_grad_()
    loss_of(maxsim(Qg, Dg, backward=kind, normalize=normalize)).backward()
    return Qg.grad, Dg.grad


def parts(Q, D):
    """ms of the forward alone and of dQ-only / dD-only lowmem backwards from its saved winners."""
    nq, lq, dim = Q.shape
    per_query = D.dim() == 4
    n_k, ld = D.shape[-3], D.shape[-2]
    n_docs = D.shape[0] * (D.shape[1] if per_query else 1)
    q, d = Q.reshape(-1, dim).contiguous(), D.reshape(-1, dim).contiguous()
    q_off = torch.arange(nq + 1, device=Q.device) * lq
    d_off = torch.arange(n_docs + 1, device=Q.device) * ld
    out, arg, _, _ = train.forward(q, q_off, d, d_off, nq, n_k, lq, per_query, equal_lengths=True)
    g = torch.randn_like(out)
    res = {"fwd": bench(lambda: train.forward(q, q_off, d, d_off, nq, n_k, lq, per_query, equal_lengths=True)),
           "zero_fill_dD": bench(lambda: torch.zeros_like(d))}
    keys = arg.view(-1)
    res["sort"] = bench(lambda: torch.sort(keys, stable=True))
    for name, need in (("bwd_dq", (True, False)), ("bwd_dd", (False, True)), ("bwd_unified", None)):
        kind = "unified" if need is None else "lowmem"
        need = need or (True, True)
        res[name] = bench(lambda kind=kind, need=need: train.backward(kind, g, q, q_off, d, arg, nq, n_k, *need,
                                                                      covered=True, per_query=per_query))
    return res


def close(a, b) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30)).item()


def tune_case(case: str, variants: dict = VARIANTS) -> dict:
    Q, D = make(case, "cuda")
    row = {"shape": CASES[case], "parts": parts(Q, D)}
    train.TUNE.clear()
    ref = step(Q, D)
    row["default_ms"] = bench(lambda: step(Q, D))
    row["unified_ms"] = bench(lambda: step(Q, D, "unified"))
    print(case, "parts", row["parts"], "default", row["default_ms"], "unified", row["unified_ms"], flush=True)
    row["variants"] = {}
    for key, values in variants.items():
        for v in values:
            name = f"{key}={v}"
            try:
                train.TUNE.clear()
                train.TUNE[key] = v
                got = step(Q, D)
                err = max(close(got[0], ref[0]), close(got[1], ref[1]))
                # alternate with the defaults: the ratio is robust to the machine's drift
                times = {"default": [], "variant": []}
                for _ in range(3):
                    for which in ("default", "variant"):
                        train.TUNE.clear()
                        if which == "variant":
                            train.TUNE[key] = v
                        times[which].append(bench(lambda: step(Q, D)))
                med = {k: sorted(t)[1] for k, t in times.items()}
                row["variants"][name] = {"ms": med["variant"], "default_ms": med["default"],
                                         "ratio": med["variant"] / med["default"], "rel_diff_vs_default": err}
            except Exception as e:  # noqa: BLE001 - a variant that does not compile is a data point
                row["variants"][name] = {"error": f"{type(e).__name__}: {str(e)[:160]}"}
            print(case, name, row["variants"][name], flush=True)
    train.TUNE.clear()
    # normalize=True: fused in the kernels vs torch's F.normalize before unnormalised kernels (bf16
    # timing and memory; agreement checked in fp32, where bf16 rounding cannot move argmax rows)
    Qn, Dn = Q.float().mul(3).bfloat16(), D.float().mul(0.5).bfloat16()

    def unfused(Qn, Dn):
        Qg, Dg = Qn.detach().requires_grad_(), Dn.detach().requires_grad_()
        f = torch.nn.functional.normalize
        loss_of(maxsim(f(Qg, dim=-1), f(Dg, dim=-1))).backward()
        return Qg.grad, Dg.grad

    def peak(fn):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 1e9

    a, b = step(Qn.float(), Dn.float(), normalize=True), unfused(Qn.float(), Dn.float())
    row["normalize"] = {"rel_diff_dq_fp32": close(a[0], b[0]), "rel_diff_dd_fp32": close(a[1], b[1])}
    del a, b
    row["normalize"].update({
        "fused_peak_gb": peak(lambda: step(Qn, Dn, normalize=True)),
        "torch_normalize_peak_gb": peak(lambda: unfused(Qn, Dn)),
        "fused_ms": bench(lambda: step(Qn, Dn, normalize=True)),
        "torch_normalize_ms": bench(lambda: unfused(Qn, Dn)),
    })
    print(case, "normalize", row["normalize"], flush=True)
    return row


def _issue_shapes() -> list:
    """The 19 shapes of the issue #17 sweep (training-sweep-H100-device.json)."""
    shapes = []
    for b in (16, 64, 256, 1024):
        for lq, ld in ((32, 180), (32, 1024), (256, 256), (1024, 1024)):
            if b * ld * 128 * 2 > 2e9 or b * b * lq * 4 > 2e9 or (lq == 1024 and b > 64):
                continue
            shapes.append(dict(b=b, lq=lq, ld=ld, neg=0))
    for b, neg, ld in ((32, 16, 1030), (256, 4, 180), (256, 16, 180), (64, 64, 300), (256, 16, 1030)):
        shapes.append(dict(b=b, lq=32, ld=ld, neg=neg))
    return shapes


def _fit_shapes() -> list:
    """Small and mid-sized batches, where the two backwards are close: the shapes the rule is
    derived from."""
    shapes = [dict(b=b, lq=lq, ld=ld, neg=0) for b in (4, 8, 16, 32, 48, 64, 96, 128)
              for lq, ld in ((32, 64), (32, 128), (32, 180), (32, 300), (32, 512), (64, 180), (64, 300),
                             (128, 256), (32, 1024), (64, 1024))]
    shapes += [dict(b=b, lq=32, ld=ld, neg=neg) for b in (4, 16, 64) for neg in (1, 4, 16) for ld in (180, 1030)]
    return shapes


def _holdout_shapes() -> list:
    """Shapes off the fit grid (other sizes, other seed): the rule is checked here, not tuned."""
    shapes = [dict(b=b, lq=lq, ld=ld, neg=0) for b in (6, 12, 24, 40, 80, 160)
              for lq, ld in ((24, 150), (48, 220), (16, 400), (40, 700), (24, 600), (32, 760), (48, 500), (20, 900),
                             (100, 800), (64, 640))]
    shapes += [dict(b=b, lq=lq, ld=ld, neg=neg) for b in (8, 48) for neg in (2, 8)
               for lq, ld in ((32, 240), (24, 800))]
    return shapes


GRIDS = {"issue": _issue_shapes, "fit": _fit_shapes, "holdout": _holdout_shapes}


def grid(which: str = "issue", seed: int = 0, variants: tuple = ()) -> list:
    """unified vs lowmem fwd+bwd step over the shapes of ``which`` (bf16): per backward the median
    of three alternating measurements (``bench``), the wall time (do_bench) and the kernels per
    step, and the backward ``auto`` picks: measured (``auto``, its step time ``auto_ms``) and by
    the static rule used where it cannot measure (``auto_static``). ``variants``: ("key=value",
    ...) of ``train.TUNE``, each timed as lowmem too (``lowmem[key=value]``)."""
    rows = []
    for c in GRIDS[which]():
        Q, D = make_shape(c, "cuda", seed)
        n_k = c["neg"] or c["b"]
        r = dict(c, auto_static=train.choose_backward("auto", bool(c["neg"]), c["lq"], c["ld"], n_q=c["b"], n_k=n_k))
        times = {"unified": [], "lowmem": []}
        try:
            for _ in range(3):
                for kind in times:
                    fn = lambda kind=kind, Q=Q, D=D: step(Q, D, kind)  # noqa: E731
                    if DEVICE_TIME:
                        dev = device_breakdown(fn)
                        times[kind].append(dev["device_ms"])
                        r[kind + "_kernels"] = dev["top_us"]
                    else:
                        times[kind].append(bench(fn))
            for kind in times:
                r[kind] = sorted(times[kind])[1]
                # the GPU's elapsed time (kernels and the gaps between them, not the host's launches):
                # what auto measures
                r[kind + "_gpu"] = sorted(_gpu_ms(lambda k, Q=Q, D=D: step(Q, D, k), kind) for _ in range(3))[1]
                r[kind + "_wall"] = triton.testing.do_bench(lambda kind=kind, Q=Q, D=D: step(Q, D, kind), warmup=5,
                                                            rep=40, return_mode="median")
            # auto: measured afresh for this shape (the first call times both), then timed like the others
            train.AUTO_CHOICES.clear()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step(Q, D, "auto")  # the measured first step (its kernels compiled by the runs above)
            torch.cuda.synchronize()
            r["auto_first_ms"] = (time.perf_counter() - t0) * 1e3
            r["auto"] = next(reversed(train.AUTO_CHOICES.values()), r["auto_static"])
            r["auto_ms"] = bench(lambda Q=Q, D=D: step(Q, D, "auto"))
            for v in variants:
                key, val = v.split("=")
                train.TUNE[key] = int(val)
                try:
                    r[f"lowmem[{v}]"] = bench(lambda Q=Q, D=D: step(Q, D, "lowmem"))
                finally:
                    train.TUNE.clear()
        except torch.cuda.OutOfMemoryError:
            r["oom"] = True
        if "unified" in r and "lowmem" in r:
            r["faster"] = "unified" if r["unified"] < r["lowmem"] else "lowmem"
            r["margin"] = max(r["unified"], r["lowmem"]) / min(r["unified"], r["lowmem"]) - 1
        print("grid", which, r, flush=True)
        rows.append(r)
        del Q, D
        torch.cuda.empty_cache()
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="colbert,hardneg,colpali")
    p.add_argument("--grid", nargs="?", const="issue", default="",
                   help="comma-separated shape sets to sweep unified vs lowmem over: " + ", ".join(GRIDS))
    p.add_argument("--grid-variants", default="", help="comma-separated TUNE key=value, timed as lowmem on the grid")
    p.add_argument("--no-variants", action="store_true", help="parts and normalize only")
    p.add_argument("--only", default="", help="comma-separated TUNE keys to sweep (default: all)")
    p.add_argument("--device", action="store_true", help="time by the GPU's kernel time (torch.profiler), not wall")
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = p.parse_args()
    global DEVICE_TIME
    DEVICE_TIME = args.device
    res = {"timing": "device (torch.profiler kernel time)" if args.device else "wall (triton do_bench)","device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "cases": {}}
    for case in [c for c in args.cases.split(",") if c]:
        only = [k for k in args.only.split(",") if k]
        variants = {} if args.no_variants else {k: v for k, v in VARIANTS.items() if not only or k in only}
        res["cases"][case] = tune_case(case, variants)
        torch.cuda.empty_cache()
    variants = tuple(v for v in args.grid_variants.split(",") if v)
    for which in [w for w in args.grid.split(",") if w]:
        res["grid" if which == "issue" else f"grid_{which}"] = grid(which, 1 if which == "holdout" else 0, variants)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "training_sweep.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
