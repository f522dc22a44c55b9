"""Training benchmark (issue #5, first cut): forward + backward of MaxSim with a contrastive loss,
bf16, median ms (triton.testing.do_bench) and peak extra GPU memory, for naive autograd (einsum +
max) and mvdb's fused kernels with the default (``auto``) and both backwards. Gradients are checked against naive first.

    python benchmarks/training.py [--cases colbert,hardneg,colpali] [--out DIR]
    TRITON_INTERPRET=1 python benchmarks/training.py --device cpu --cases tiny,tiny-hardneg   # smoke

Cases: ColBERT in-batch B=256 (Lq=32, Ld=180, d=128); hard negatives B=256 x 16 negatives of
ColPali shape (Lq=32, Ld=1030) as per-query candidates [B, 16, Ld, d]; ColPali in-batch B=64
(Lq=1024, Ld=1024). late-interaction-kernels 0.4.5 (its wheel in .whl/, installed by
gpu_session.sh) runs beside when importable, with its own unified and lowmem backwards.
``--device cpu`` (the tiny cases, the kernels in Triton's interpreter) checks the script: times are
medians of timed calls, no memory figures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median_ms  # noqa: E402

from mvdb.kernels import maxsim  # noqa: E402

CASES = {
    "colbert": dict(b=256, lq=32, ld=180, neg=0),
    "hardneg": dict(b=256, lq=32, ld=1030, neg=16),
    "colpali": dict(b=64, lq=1024, ld=1024, neg=0),
    # shapes small enough for Triton's CPU interpreter (smoke runs)
    "tiny": dict(b=4, lq=8, ld=24, neg=0),
    "tiny-hardneg": dict(b=3, lq=8, ld=24, neg=2),
}


def naive(Q, D):
    """einsum + max under autograd, in the inputs' dtype (bf16 similarities, as users write it)."""
    if D.dim() == 4:
        return torch.einsum("qid,qkjd->qkij", Q, D).amax(-1).sum(-1).float()
    return torch.einsum("qid,njd->qnij", Q, D).amax(-1).sum(-1).float()


def make(case, device, seed=0):
    return make_shape(CASES[case], device, seed)


def make_shape(c, device, seed=0):
    """bf16 Q [b, lq, 128] and D [b, ld, 128] (or [b, neg, ld, 128]), L2-normalised tokens."""
    g = torch.Generator(device=device).manual_seed(seed)
    Q = torch.nn.functional.normalize(torch.randn(c["b"], c["lq"], 128, device=device, generator=g), dim=-1)
    shape = (c["b"], c["neg"], c["ld"], 128) if c["neg"] else (c["b"], c["ld"], 128)
    D = torch.nn.functional.normalize(torch.randn(*shape, device=device, generator=g), dim=-1)
    return Q.bfloat16(), D.bfloat16()


def loss_of(scores):
    # in-batch: the positive is the diagonal; hard negatives: the first candidate
    target = torch.arange(scores.shape[0], device=scores.device) if scores.shape[0] == scores.shape[1] else \
        torch.zeros(scores.shape[0], dtype=torch.long, device=scores.device)
    return torch.nn.functional.cross_entropy(scores * 10, target)


def step(fn, Q, D):
    Qg, Dg = Q.detach().requires_grad_(), D.detach().requires_grad_()
    loss_of(fn(Qg, Dg)).backward()
    return Qg.grad, Dg.grad


def device_breakdown(fn, n: int = 10) -> dict:
    """The GPU's own time per step (torch.profiler, summed over the kernels and copies it ran),
    the number of kernels per step and the five longest: a step slower than its device time
    waited on the host's launches."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    top = sorted(events, key=lambda e: -e.device_time_total)[:5]
    return {"device_ms": sum(e.device_time_total for e in events) / n / 1e3,
            "kernels_per_step": sum(e.count for e in events) / n,
            "top_us": {e.key[:50]: round(e.device_time_total / n, 1) for e in top}}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="colbert,hardneg,colpali")
    p.add_argument("--device", default="cuda",
                   help="cuda (the benchmark) or cpu (with TRITON_INTERPRET=1: a smoke run)")
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = p.parse_args()
    dev = args.device
    cuda = dev.startswith("cuda")
    res = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
           "triton": triton.__version__,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "cases": {}}
    impls = {
        "naive": naive,
        "mvdb-auto": lambda Q, D: maxsim(Q, D),
        "mvdb-unified": lambda Q, D: maxsim(Q, D, backward="unified"),
        "mvdb-lowmem": lambda Q, D: maxsim(Q, D, backward="lowmem"),
    }
    try:
        import late_interaction_kernels as lik

        if cuda:
            res["late_interaction_kernels"] = lik.__version__
            impls["lik-unified"] = lambda Q, D: lik.maxsim(Q, D, backward="unified")
            impls["lik-lowmem"] = lambda Q, D: lik.maxsim(Q, D, backward="lowmem")
        else:
            res["late_interaction_kernels"] = f"skipped: {lik.__version__} runs on CUDA only"
    except ImportError as e:
        res["late_interaction_kernels"] = f"not importable: {e}"
    for case in args.cases.split(","):
        Q, D = make(case, dev)
        row = {"shape": CASES[case]}
        # the gradient reference: naive on fp32 copies of the same bf16 inputs (bf16 similarities
        # would round near-ties differently and move whole argmax rows)
        try:
            gq, gd = step(naive, Q.float(), D.float())
            ref = (gq.float(), gd.float())
            del gq, gd
        except torch.cuda.OutOfMemoryError:
            ref = None
            row["reference"] = "fp32 naive did not fit; no gradient check"
        torch.cuda.empty_cache() if cuda else None
        for name, fn in impls.items():
            r = {}
            try:
                if cuda:
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
                    base = torch.cuda.memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                gq, gd = step(fn, Q, D)
                if cuda:
                    torch.cuda.synchronize()
                    r["peak_extra_gb"] = (torch.cuda.max_memory_allocated() - base) / 1e9
                if ref is not None:
                    r["max_err_dq"] = (gq.float() - ref[0]).abs().max().item()
                    r["max_err_dd"] = (gd.float() - ref[1]).abs().max().item()
                    r["rel_err_dq"] = r["max_err_dq"] / max(ref[0].abs().max().item(), 1e-12)
                    r["rel_err_dd"] = r["max_err_dd"] / max(ref[1].abs().max().item(), 1e-12)
                del gq, gd
                r["ms"] = median_ms(lambda fn=fn, Q=Q, D=D: step(fn, Q, D), warmup=5, rep=50, cpu_runs=1)
                if cuda:
                    r["device"] = device_breakdown(lambda fn=fn, Q=Q, D=D: step(fn, Q, D))
                Qg, Dg = Q.detach().requires_grad_(), D.detach().requires_grad_()
                r["fwd_ms"] = median_ms(lambda fn=fn, Qg=Qg, Dg=Dg: fn(Qg, Dg), warmup=5, rep=50,
                                        cpu_runs=1)  # forward only, saving what backward needs
                del Qg, Dg
            except torch.cuda.OutOfMemoryError as e:
                r["error"] = f"out of memory: {str(e)[:120]}"
            row[name] = r
            print(case, name, json.dumps(r), flush=True)
        res["cases"][case] = row
        del Q, D
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "training.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
