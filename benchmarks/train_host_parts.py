"""Where a MaxSim training step's host time goes (issue #17): real host microseconds, not a
profiler's, of the step and of its parts, on the GPU host.

    python benchmarks/train_host_parts.py [--out DIR]

Per shape: the whole step (``training.step``: fwd + cross-entropy + backward) with mvdb's default
call, naive autograd and late-interaction-kernels' lowmem where importable; mvdb's forward alone
(building the graph); the loss and backward of a leaf score tensor alone (what the step costs
without MaxSim). Then single host operations the launchers use: a launch of a cached kernel
through ``fused.launch_kernel`` and through the compiled kernel's launcher directly, the current
stream's handle two ways, ``interpreting()``, allocations. Each figure: median over rounds of the
mean of 50 calls (the GPU waited for between rounds, untimed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time
from pathlib import Path

import torch
import triton

from mvdb.kernels import maxsim
from mvdb.kernels.maxsim import fused
from mvdb.kernels.maxsim.train.fused import _hold_kernel
from training import loss_of, make_shape, naive, step  # noqa: E402  (benchmarks/ is the script's folder)

SHAPES = {
    "small16": dict(b=16, lq=32, ld=180, neg=0),
    "colbert": dict(b=256, lq=32, ld=180, neg=0),
    "hardneg": dict(b=256, lq=32, ld=1030, neg=16),
}


def host_us(fn, rounds: int = 15, n: int = 50) -> float:
    means = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        means.append((time.perf_counter() - t0) / n * 1e6)
    torch.cuda.synchronize()
    return round(statistics.median(means), 2)


def backward_alone(Q, D) -> dict:
    """mvdb's backward launcher called on this thread, outside autograd (the winners from one
    forward), and a cProfile of it: what the backward's host code costs without the engine."""
    import cProfile
    import importlib
    import pstats

    tops = importlib.import_module("mvdb.kernels.maxsim.train.ops")
    nq, lq, dim = Q.shape
    per_query = D.dim() == 4
    n_k, ld = D.shape[-3], D.shape[-2]
    n_docs = D.shape[0] * (D.shape[1] if per_query else 1)
    q, d = Q.reshape(-1, dim), D.reshape(-1, dim)
    q_off, d_off = tops._steps(nq, lq, q.device), tops._steps(n_docs, ld, q.device)
    out, arg, _, _ = tops.forward(q, q_off, d, d_off, nq, n_k, lq, per_query, equal_lengths=True)
    grad = torch.ones_like(out)
    def run():
        return tops.backward("lowmem", grad, q, q_off, d, arg, nq, n_k, True, True, None, True, per_query, None)
    row = {"backward launcher alone, lowmem (this thread)": host_us(run, rounds=7, n=20)}
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(100):
        run()
    prof.disable()
    torch.cuda.synchronize()
    top = sorted(pstats.Stats(prof).stats.items(), key=lambda kv: -kv[1][2])[:15]  # own time
    row["backward launcher cProfile (own us per call)"] = [
        (f"{Path(k[0]).name}:{k[1]}:{k[2]}", round(v[2] / 100 * 1e6, 1), round(v[3] / 100 * 1e6, 1)) for k, v in top]
    return row


def cpu_profile(fn, trace: Path, n: int = 10) -> list:
    """torch.profiler's CPU view of n steps: the 30 largest by self CPU time (us per step), and a
    chrome trace of the last steps (where the host waits shows as gaps or a sync)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    trace.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(trace))
    ev = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:30]
    return [(e.key[:70], round(e.self_cpu_time_total / n, 1), round(e.cpu_time_total / n, 1), e.count // n)
            for e in ev]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--profile", action="store_true", help="also torch.profiler's CPU view and a chrome trace")
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = p.parse_args()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "shapes": {}}
    impls = {"mvdb": maxsim, "naive": naive}
    try:
        import late_interaction_kernels as lik

        impls["lik-lowmem"] = lambda Q, D: lik.maxsim(Q, D, backward="lowmem")
    except ImportError:
        pass
    for name in args.shapes.split(","):
        Q, D = make_shape(SHAPES[name], "cuda")
        row = {}
        for impl, fn in impls.items():
            step(fn, Q, D)
            row[f"step {impl}"] = host_us(lambda fn=fn: step(fn, Q, D), rounds=7, n=20)
        Qg, Dg = Q.detach().requires_grad_(), D.detach().requires_grad_()
        row["forward only (graph built)"] = host_us(lambda: maxsim(Qg, Dg), rounds=7, n=20)
        with torch.no_grad():
            row["forward, no grad (search kernel)"] = host_us(lambda: maxsim(Q, D), rounds=7, n=20)
        row["forward + loss, no backward"] = host_us(lambda: loss_of(maxsim(Qg, Dg)), rounds=7, n=20)
        s = maxsim(Q, D).detach().requires_grad_()
        row["loss + backward of a leaf score"] = host_us(lambda: loss_of(s).backward(), rounds=7, n=20)
        row["leaves (detach + requires_grad_ x2)"] = host_us(
            lambda: (Q.detach().requires_grad_(), D.detach().requires_grad_()))
        with torch.autograd.set_multithreading_enabled(False):  # the backward on this thread
            row["step mvdb, autograd single-threaded"] = host_us(lambda: step(maxsim, Q, D), rounds=7, n=20)
        row.update(backward_alone(Q, D))
        if args.profile:
            row["profile_cpu"] = cpu_profile(lambda: step(maxsim, Q, D), Path(args.out) / f"trace-{name}.json")
        res["shapes"][name] = row
        print(name, json.dumps(row), flush=True)
        del Q, D, Qg, Dg, s
    # single operations
    ops = {}
    dev = torch.cuda.current_device()
    k = _hold_kernel[(1,)](0, num_warps=1)
    fused.launch_kernel(_hold_kernel, (1,), (0,), dict(num_warps=1))
    fused.launch_kernel(_hold_kernel, (1,), (0,), dict(num_warps=1))
    entry = next((v for v in fused._REPLAY.values() if v[3] is _hold_kernel), None)
    ops["direct launcher recognised"] = entry is not None and entry[2] is not None
    ops["launch through fused.launch_kernel (cached)"] = host_us(
        lambda: fused.launch_kernel(_hold_kernel, (1,), (0,), dict(num_warps=1)))
    ops["launch through CompiledKernel[grid](...)"] = host_us(lambda: k[(1, 1, 1)](0))
    ops["launch through triton's JIT (_hold_kernel[grid])"] = host_us(lambda: _hold_kernel[(1,)](0, num_warps=1))
    try:
        from triton import knobs

        enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
        run, fn_handle, meta = k.run, k.function, k.packed_metadata
        raw = fused._stream_handle
        ops["launch through CompiledKernel.run(...) (launcher)"] = host_us(
            lambda: run(1, 1, 1, raw(dev), fn_handle, meta, None, enter, leave, 0))
    except Exception as e:  # noqa: BLE001 - a probe: record what this triton lacks
        ops["launch through CompiledKernel.run(...) (launcher)"] = f"failed: {type(e).__name__}: {e}"[:200]
    ops["torch.cuda.current_stream(dev).cuda_stream"] = host_us(lambda: torch.cuda.current_stream(dev).cuda_stream)
    ops["fused._stream_handle(dev) (raw)"] = host_us(lambda: fused._stream_handle(dev))
    ops["torch.cuda.current_device()"] = host_us(torch.cuda.current_device)
    ops["fused.interpreting()"] = host_us(fused.interpreting)
    ops["torch.empty((256, 17, 32), int32, cuda)"] = host_us(
        lambda: torch.empty((256, 17, 32), dtype=torch.int32, device="cuda"))
    ops["torch.full((256, 17, 32), -1, int32, cuda)"] = host_us(
        lambda: torch.full((256, 17, 32), -1, dtype=torch.int32, device="cuda"))
    ops["torch.is_grad_enabled()"] = host_us(torch.is_grad_enabled)
    ops["torch.cuda.is_current_stream_capturing()"] = host_us(torch.cuda.is_current_stream_capturing)
    ops["torch.compiler.is_compiling()"] = host_us(torch.compiler.is_compiling)
    args12 = tuple([torch.empty(8, device="cuda")] * 8 + [1, 256, 32, 7])
    ops["12 x fused._arg_sig"] = host_us(lambda: tuple(map(fused._arg_sig, args12)))
    res["ops_us"] = ops
    print("ops", json.dumps(ops, indent=1), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "train-host-parts.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
