"""Sparton (issue #7) against the PyTorch eager SPLADE head, bf16, on the GPU.

    python benchmarks/sparton.py [--vocab 30522,250002] [--batches 32,64,128,256]
    TRITON_INTERPRET=1 python benchmarks/sparton.py --device cpu --dtype float32 --vocab 200 --batches 2 --batch 2 \
        --seq 16 --hidden 32

Per vocabulary size: B=32, S=256, D=768 forward and forward+backward (gradients of hidden,
weight and bias; the loss is the sum of the outputs times fixed random weights), median ms
(triton.testing.do_bench) and peak extra memory, for the eager head (logits, relu, log1p, mask,
amax) and mvdb.kernels.sparton. Correctness first: both against the eager head in fp32 on the same
inputs. Then, per vocabulary, the batch sizes at which each one still runs fwd+bwd. JSON to --out.
``--device cpu`` with tiny shapes (the kernels in Triton's interpreter) checks the script: times
are medians of timed calls, no memory figures; float32 there, since the interpreter of triton 3.9
computes bf16 dots wrongly.
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

from mvdb.kernels import sparton  # noqa: E402
from mvdb.kernels.sparton import reference  # noqa: E402


def make(B, S, D, V, dtype, seed=0, device="cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    h = torch.randn(B, S, D, device=device, generator=g, dtype=torch.float32).to(dtype)
    w = (torch.randn(V, D, device=device, generator=g) * 0.05).to(dtype)
    b = (torch.randn(V, device=device, generator=g) * 0.1 - 0.5).to(dtype)
    m = torch.ones(B, S, dtype=torch.int64, device=device)
    lens = torch.randint(S // 4, S + 1, (B,), device=device, generator=g)
    m[torch.arange(S, device=device)[None, :] >= lens[:, None]] = 0
    G = torch.randn(B, V, device=device, generator=g)
    return h, w, b, m, G


def eager(h, w, b, m):
    return reference(h, w, b, m)


def step(fn, h, w, b, m, G):
    hh, ww, bb = (x.detach().requires_grad_() for x in (h, w, b))
    (fn(hh, ww, bb, m).float() * G).sum().backward()
    return hh.grad, ww.grad, bb.grad


def peak(fn):
    """(fn(), peak extra GB on the GPU during it; None on the CPU)."""
    if not torch.cuda.is_available():
        return fn(), None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    return out, (torch.cuda.max_memory_allocated() - base) / 1e9


def rel(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30)).item()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", default="30522,250002")
    p.add_argument("--batches", default="32,64,128,256")
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    p.add_argument("--sweep", action="store_true", help="time launch-parameter variants instead (V=30522)")
    p.add_argument("--batch", type=int, default=32, help="B of the timed case")
    p.add_argument("--seq", type=int, default=256, help="S, tokens a sequence")
    p.add_argument("--hidden", type=int, default=768, help="D, the hidden size")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--device", default="cuda",
                   help="cuda (the benchmark) or cpu (with TRITON_INTERPRET=1: a smoke run)")
    args = p.parse_args()
    S, D, B, dev, dtype = args.seq, args.hidden, args.batch, args.device, getattr(torch, args.dtype)
    if args.sweep:
        return sweep(S, D, args.out)
    cuda = dev.startswith("cuda")
    res = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
           "triton": triton.__version__, "dtype": args.dtype,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "cases": []}
    impls = {"eager": eager, "sparton": lambda h, w, b, m: sparton(h, w, b, m)}
    for V in [int(v) for v in args.vocab.split(",")]:
        row = {"V": V, "B": B, "S": S, "D": D, "flops_fwd": 2 * B * S * V * D}
        h, w, b, m, G = make(B, S, D, V, dtype, device=dev)
        try:  # fp32 eager reference on the same (bf16-rounded) inputs
            ref_out = eager(h.float(), w.float(), b.float(), m)
            ref_g = step(eager, h.float(), w.float(), b.float(), m, G)
        except torch.cuda.OutOfMemoryError:
            ref_out = ref_g = None
        torch.cuda.empty_cache() if cuda else None
        for name, fn in impls.items():
            r = {}
            try:
                out, r["fwd_peak_gb"] = peak(lambda: fn(h, w, b, m))
                grads, r["fwd_bwd_peak_gb"] = peak(lambda: step(fn, h, w, b, m, G))
                if ref_out is not None:
                    r["rel_err_out"] = rel(out, ref_out)
                    r["rel_err_d_hidden"], r["rel_err_d_weight"], r["rel_err_d_bias"] = (
                        rel(a, b_) for a, b_ in zip(grads, ref_g))
                del out, grads
                with torch.no_grad():
                    r["fwd_ms"] = median_ms(lambda: fn(h, w, b, m), warmup=5, rep=50, cpu_runs=1)
                r["fwd_bwd_ms"] = median_ms(lambda: step(fn, h, w, b, m, G), warmup=3, rep=30, cpu_runs=1)
                r["fwd_tflops"] = row["flops_fwd"] / r["fwd_ms"] / 1e9
            except torch.cuda.OutOfMemoryError as e:
                r["error"] = f"out of memory: {str(e)[:100]}"
            torch.cuda.empty_cache() if cuda else None
            row[name] = r
            print(V, name, json.dumps(r), flush=True)
        if "fwd_ms" in row["eager"] and "fwd_ms" in row["sparton"]:
            row["speedup_fwd"] = row["eager"]["fwd_ms"] / row["sparton"]["fwd_ms"]
            row["speedup_fwd_bwd"] = row["eager"]["fwd_bwd_ms"] / row["sparton"]["fwd_bwd_ms"]
            if cuda:
                row["memory_ratio_fwd_bwd"] = row["eager"]["fwd_bwd_peak_gb"] / row["sparton"]["fwd_bwd_peak_gb"]
        del h, w, b, m, G, ref_out, ref_g
        torch.cuda.empty_cache() if cuda else None
        # which batch sizes still run fwd+bwd
        row["batches"] = {}
        for nb in [int(x) for x in args.batches.split(",")]:
            h, w, b, m, G = make(nb, S, D, V, dtype, device=dev)
            for name, fn in impls.items():
                try:
                    _, gb = peak(lambda: step(fn, h, w, b, m, G))
                    row["batches"].setdefault(name, {})[nb] = {"fwd_bwd_peak_gb": gb}
                except torch.cuda.OutOfMemoryError:
                    row["batches"].setdefault(name, {})[nb] = "out of memory"
                torch.cuda.empty_cache() if cuda else None
            print(V, nb, json.dumps({k: v.get(nb) for k, v in row["batches"].items()}), flush=True)
            del h, w, b, m, G
            torch.cuda.empty_cache() if cuda else None
        res["cases"].append(row)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sparton.json").write_text(json.dumps(res, indent=1))


SWEEP = [
    {}, {"fwd_warps": 4}, {"fwd_warps": 4, "fwd_stages": 4}, {"fwd_warps": 4, "BLOCK_K": 32},
    {"fwd_warps": 4, "BLOCK_S": 256, "BLOCK_K": 32}, {"fwd_warps": 4, "BLOCK_V": 64},
    {"fwd_warps": 4, "BLOCK_S": 64, "BLOCK_V": 256}, {"fwd_warps": 4, "BLOCK_K": 128, "fwd_stages": 2},
    {"fwd_warps": 4, "dh_s": 128, "dh_v": 64}, {"fwd_warps": 4, "dh_s": 128, "dh_v": 32},
    {"fwd_warps": 4, "dh_s": 128, "dh_v": 64, "dh_stages": 4},
]


def sweep(S, D, out_dir):
    """fwd and fwd+bwd ms of Sparton per launch-parameter variant, V=30522, B=32, bf16."""
    import importlib

    mod = importlib.import_module("mvdb.kernels.sparton")
    h, w, b, m, G = make(32, S, D, 30522, torch.bfloat16)
    base = None
    rows = []
    for cfg in SWEEP:
        mod.TUNE.clear()
        mod.TUNE.update(cfg)
        try:
            out = sparton(h, w, b, m)
            base = out if base is None else base
            r = {"cfg": cfg, "max_diff": (out - base).abs().max().item(),
                 "fwd_ms": triton.testing.do_bench(lambda: sparton(h, w, b, m), warmup=5, rep=40, return_mode="median"),
                 "fwd_bwd_ms": triton.testing.do_bench(lambda: step(impl_sparton, h, w, b, m, G), warmup=3, rep=30,
                                                       return_mode="median")}
        except Exception as e:  # noqa: BLE001 - a config that does not compile or fit is a data point
            r = {"cfg": cfg, "error": f"{type(e).__name__}: {str(e)[:150]}"}
        rows.append(r)
        print(json.dumps(r), flush=True)
    mod.TUNE.clear()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sparton_sweep.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


def impl_sparton(h, w, b, m):
    return sparton(h, w, b, m)


if __name__ == "__main__":
    main()
