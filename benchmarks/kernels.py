"""Kernel benchmark: mvdb's fused MaxSim against naive PyTorch, late-interaction-kernels and flash-maxsim.

    python benchmarks/kernels.py                 # all cases, GPU; JSON to benchmarks/results/
    python benchmarks/kernels.py --cases a,b     # a subset
    python benchmarks/kernels.py --sweep         # autotune over the full config list, report winners
    python benchmarks/kernels.py --smoke         # tiny shapes on the CPU, each call timed once, no peers
                                                 # (the Triton kernels with TRITON_INTERPRET=1, else torch)

Every implementation is checked against an fp32 reference on the same inputs before it is timed;
a failed check is reported and its time is not. Times are medians of triton.testing.do_bench
(which flushes L2 between runs); memory is the peak allocated during one call beyond the inputs.
Cases (from issue #2): (a) 1 query, Lq=32, d=128 vs 1k / 10k docs of 64-300 tokens (varlen);
(b) ColPali, Lq=1024 vs 1000 docs of 1024 tokens (bf16); (c) 32 queries x 1000 candidates each from
a CSR store of 1M docs (plus a 150k-doc store the peers can address); (d) int8 of each.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
ARGS = None


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="a,b,c", help="comma-separated subset of a,b,c (int8 runs inside each)")
    p.add_argument("--sweep", action="store_true", help="autotune over every config (MVDB_AUTOTUNE=full)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU, no peers: checks the script")
    p.add_argument("--no-peers", action="store_true")
    p.add_argument("--out", default=str(HERE / "results"), help="folder for the JSON results")
    return p.parse_args()


if __name__ == "__main__":
    ARGS = _parse()
    if ARGS.sweep:
        os.environ["MVDB_AUTOTUNE"] = "full"

import torch  # noqa: E402

import peers  # noqa: E402
from common import median_ms  # noqa: E402
from mvdb.testing.synthetic import candidate_lists, colpali_inputs, one_query_inputs  # noqa: E402

from mvdb.kernels import maxsim, maxsim_candidates, maxsim_varlen, quantize_int8  # noqa: E402
from mvdb.kernels.maxsim import naive, tuning  # noqa: E402

ROWS: list[dict] = []
CPU_RUNS, HOST_CALLS = 3, 50  # timed calls of a row on the CPU, back-to-back calls of host_us (--smoke: 1, 0)


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def bench(fn) -> float:
    """Median milliseconds of fn()."""
    return median_ms(fn, cpu_runs=CPU_RUNS)


def peak_extra_mb(fn) -> float | None:
    if not torch.cuda.is_available():
        return None
    _sync()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    _sync()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def host_us(fn, n: int | None = None) -> float:
    """Wall microseconds per call of n back-to-back calls (launch overhead when the GPU is faster)."""
    n = n or HOST_CALLS
    _sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t = time.perf_counter() - t0
    _sync()
    return t / n * 1e6


def ceilings() -> dict:
    """Measured HBM copy bandwidth and tensor-core rates (the roofline ceilings)."""
    if not torch.cuda.is_available():
        return {"hbm_gbps": 50.0, "bf16_tflops": 1.0, "int8_tops": 1.0, "note": "CPU placeholders"}
    n = 1 << 30
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    t = bench(lambda: y.copy_(x))
    bw = 2 * n / (t * 1e-3) / 1e9
    del x, y
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t = bench(lambda: a @ b)
    tf = 2 * 8192**3 / (t * 1e-3) / 1e12
    a8 = torch.randint(-127, 128, (8192, 8192), device="cuda", dtype=torch.int8)
    b8 = torch.randint(-127, 128, (8192, 8192), device="cuda", dtype=torch.int8).T
    try:
        t = bench(lambda: torch._int_mm(a8, b8))
        tops = 2 * 8192**3 / (t * 1e-3) / 1e12
    except RuntimeError:
        tops = 2 * tf
    return {"hbm_gbps": bw, "bf16_tflops": tf, "int8_tops": tops}


def topk_agreement(got: torch.Tensor, ref: torch.Tensor, k: int = 10) -> float:
    """Mean overlap of the top-k per row."""
    k = min(k, ref.shape[-1])
    g = got.reshape(-1, got.shape[-1]).topk(k, dim=-1).indices
    r = ref.reshape(-1, ref.shape[-1]).topk(k, dim=-1).indices
    hits = (g[:, :, None] == r[:, None, :]).any(-1).float().sum(-1)
    return float((hits / k).mean())


def run(case: str, impl: str, fn, ref: torch.Tensor, *, nbytes: float, flops: float, ceil: dict,
        int8: bool = False, tol: float | None = None, note: str = "") -> dict:
    """Check fn against ref, then time it; append and return the row."""
    row = {"case": case, "impl": impl, "note": note}
    try:
        got = fn()
        _sync()
        rel = float(((got.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item())
        row["max_rel_err"] = rel
        row["top10_agreement"] = topk_agreement(got.float(), ref)
        tol = tol if tol is not None else (3e-2 if int8 else 1e-2)
        row["correct"] = bool(rel <= tol and torch.isfinite(got).all().item())
    except Exception as e:  # noqa: BLE001 - a peer failing is a result, not a crash
        row.update(correct=False, error=f"{type(e).__name__}: {str(e)[:300]}")
        ROWS.append(row)
        print(f"{case:>14} {impl:<28} ERROR {row['error'][:120]}", flush=True)
        return row
    if row["correct"]:
        row["ms"] = bench(fn)
        row["peak_extra_mb"] = peak_extra_mb(fn)
        if HOST_CALLS:
            row["host_us"] = host_us(fn)
        rate = ceil["int8_tops"] if int8 else ceil["bf16_tflops"]
        floor_mem = nbytes / (ceil["hbm_gbps"] * 1e9) * 1e3
        floor_mma = flops / (rate * 1e12) * 1e3
        row.update(bytes=nbytes, flops=flops, floor_mem_ms=floor_mem, floor_mma_ms=floor_mma,
                   pct_of_roofline=100 * max(floor_mem, floor_mma) / row["ms"],
                   achieved_gbps=nbytes / (row["ms"] * 1e-3) / 1e9)
    ROWS.append(row)
    ms = f"{row['ms']:.3f} ms" if "ms" in row else "   (not timed: wrong)"
    pct = f"{row['pct_of_roofline']:5.1f}% roof" if "ms" in row else ""
    mem = f"{row['peak_extra_mb']:.1f} MB extra" if row.get("peak_extra_mb") is not None else ""
    mem += f" host {row['host_us']:.0f} us" if "host_us" in row else ""
    print(f"{case:>14} {impl:<28} {ms:>12} {pct:>12} err {row['max_rel_err']:.1e} top10 {row['top10_agreement']:.3f} {mem}",
          flush=True)
    return row


def _varlen_case(n_docs: int, dev, ceil, peers_ok: bool, scale: float):
    """(a) one query of 32 tokens against n_docs docs of 64-300 tokens, fp16 and int8."""
    name = f"a-{n_docs // 1000}k" if n_docs >= 1000 else f"a-{n_docs}"
    corpus, q, cu_q, tok, cu_d = one_query_inputs(n_docs, device=dev)
    off = corpus.offsets
    max_len = int(corpus.lengths.max())
    ref = naive.maxsim_csr(q.float(), cu_q, tok.float(), off, dtype=torch.float32)[0]  # [n]
    T = tok.shape[0]
    nbytes = T * 128 * 2 + 32 * 128 * 2 + 4 * (n_docs + 1) + 4 * n_docs
    flops = 2 * 32 * T * 128
    padded, mask = peers._pad(tok, cu_d, max_len)
    run(name, "mvdb varlen", lambda: maxsim_varlen(q, cu_q, tok, cu_d, max_seqlen_q=32, check=False)[0], ref,
        nbytes=nbytes, flops=flops, ceil=ceil)
    run(name, "mvdb varlen (default call)", lambda: maxsim_varlen(q, cu_q, tok, cu_d, check=False)[0], ref,
        nbytes=nbytes, flops=flops, ceil=ceil, note="check=False, no max_seqlen_q: the call as users write it")
    run(name, "mvdb varlen (check=True)", lambda: maxsim_varlen(q, cu_q, tok, cu_d)[0], ref,
        nbytes=nbytes, flops=flops, ceil=ceil, note="validates offsets: one device sync per call")
    run(name, "naive torch (padded)", lambda: peers.naive_padded(q[None], padded, mask)[0], ref,
        nbytes=nbytes, flops=flops, ceil=ceil, note=f"docs pre-padded to {max_len}; fp16 einsum + masked max")
    if peers_ok:
        run(name, "flash-maxsim packed", lambda: peers.fm_varlen_1q(q, tok, cu_d, max_len), ref,
            nbytes=nbytes, flops=flops, ceil=ceil)
        run(name, "late-interaction-kernels", lambda: peers.lik_varlen_1q(q, tok, cu_d, max_len), ref,
            nbytes=nbytes, flops=flops, ceil=ceil)
    del padded, mask
    tok8, sc8 = quantize_int8(tok)
    nbytes8 = T * (128 + 4) + 32 * 128 * 2 + 4 * (n_docs + 1) + 4 * n_docs
    run(name + "-int8", "mvdb varlen int8", lambda: maxsim_varlen(q, cu_q, tok8, cu_d, d_scales=sc8, max_seqlen_q=32,
        check=False)[0], ref, nbytes=nbytes8, flops=flops, ceil=ceil, int8=True)
    run(name + "-int8", "mvdb varlen int8 (default call)", lambda: maxsim_varlen(q, cu_q, tok8, cu_d, d_scales=sc8,
        check=False)[0], ref, nbytes=nbytes8, flops=flops, ceil=ceil, int8=True, note="check=False, no max_seqlen_q")
    if peers_ok:
        D8, s8, lens = peers.fm_prepare_int8_varlen(tok, cu_d, max_len)
        run(name + "-int8", "flash-maxsim int8x8 (padded)", lambda: peers.fm_int8_varlen_1q(q, D8, s8, lens), ref,
            nbytes=nbytes8, flops=flops, ceil=ceil, int8=True, note=f"docs padded to {max_len} (no packed int8)")
        del D8, s8
    del tok8, sc8, corpus


def _colpali_case(dev, ceil, peers_ok: bool, scale: float):
    """(b) ColPali: one query of 1024 tokens vs 1000 docs of 1024 tokens, bf16 and int8."""
    n, L = max(2, int(1000 * scale)), max(16, int(1024 * scale))
    Q, D = colpali_inputs(n, L, device=dev)
    ref = naive.maxsim_padded(Q.float(), D.float(), dtype=torch.float32, budget=1 << 28)  # [1, n]
    flops = 2 * L * L * 128 * n
    nbytes = D.numel() * 2 + Q.numel() * 2 + 4 * n
    run("b-colpali", "mvdb maxsim", lambda: maxsim(Q, D), ref, nbytes=nbytes, flops=flops, ceil=ceil)
    run("b-colpali", "naive torch (einsum)", lambda: peers.naive_padded(Q, D), ref, nbytes=nbytes, flops=flops, ceil=ceil)
    if peers_ok:
        run("b-colpali", "flash-maxsim", lambda: peers.fm_dense(Q, D), ref, nbytes=nbytes, flops=flops, ceil=ceil)
        run("b-colpali", "late-interaction-kernels", lambda: peers.lik_dense(Q, D), ref, nbytes=nbytes, flops=flops,
            ceil=ceil)
    D8, s8 = quantize_int8(D)
    nbytes8 = D8.numel() + s8.numel() * 4 + Q.numel() * 2 + 4 * n
    run("b-colpali-int8", "mvdb maxsim int8", lambda: maxsim(Q, D8, d_scales=s8), ref, nbytes=nbytes8, flops=flops,
        ceil=ceil, int8=True)
    del D8, s8
    if peers_ok:
        D8, s8 = peers.fm_prepare_int8(D)
        run("b-colpali-int8", "flash-maxsim int8x8", lambda: peers.fm_int8_dense(Q, D8, s8), ref, nbytes=nbytes8,
            flops=flops, ceil=ceil, int8=True)
        del D8, s8
        F8, f8s = peers.lik_prepare_fp8(D)
        run("b-colpali-int8", "late-interaction-kernels fp8", lambda: peers.lik_fp8_dense(Q, F8, f8s), ref,
            nbytes=nbytes8, flops=flops, ceil=ceil, int8=True, note="fp8 e4m3 (it has no int8 path)")
        del F8, f8s
    del D


def _candidates_case(n_docs: int, dev, ceil, peers_ok: bool, label: str, nq: int = 32):
    """(c) 32 queries x 1000 candidates each, gathered from a CSR store of n_docs docs of 64-128 tokens."""
    k = min(1000, n_docs)
    corpus, Q, q, cu_q, cand = candidate_lists(n_docs, nq, k, device=dev)
    tok, off = corpus.tokens, corpus.offsets
    ref = naive.maxsim_csr(q.float(), cu_q, tok, off, cand, dtype=torch.float32)
    lens = corpus.lengths[cand]
    gathered_tok = float(lens.sum())
    nbytes = gathered_tok * 128 * 2 + nq * k * 8 * 3 + q.numel() * 2 + nq * k * 4
    flops = 2 * 32 * gathered_tok * 128
    name = f"c-{label}"
    run(name, "mvdb candidates", lambda: maxsim_candidates(q, cu_q, tok, off, cand, max_seqlen_q=32, check=False), ref,
        nbytes=nbytes, flops=flops, ceil=ceil)
    run(name, "mvdb candidates (default call)", lambda: maxsim_candidates(q, cu_q, tok, off, cand, check=False), ref,
        nbytes=nbytes, flops=flops, ceil=ceil, note="check=False, no max_seqlen_q")
    run(name, "mvdb candidates (check=True)", lambda: maxsim_candidates(q, cu_q, tok, off, cand), ref,
        nbytes=nbytes, flops=flops, ceil=ceil, note="validates offsets and candidate range: one sync")

    def naive_gather():
        lmax = 128
        pos = torch.arange(lmax, device=dev)
        st = off[cand]  # [nq, k]
        ok = pos < (off[cand + 1] - st)[..., None]  # [nq, k, lmax]
        D = tok[(st[..., None] + pos).clamp_max(tok.shape[0] - 1)]  # [nq, k, lmax, d] padded copy
        s = torch.einsum("qid,qkjd->qkij", Q.half(), D).masked_fill(~ok[:, :, None, :], float("-inf"))
        return s.amax(-1).float().sum(-1)

    run(name, "naive torch (gather+einsum)", naive_gather, ref, nbytes=nbytes, flops=flops, ceil=ceil,
        note="padded copy of the candidates")
    fits_int32 = tok.shape[0] * 128 < 2**31
    if peers_ok and fits_int32:
        off32, max_len = peers.prepare_packed(off)
        run(name, "flash-maxsim rerank_direct", lambda: peers.fm_candidates(Q.half(), tok, off32, cand, max_len), ref,
            nbytes=nbytes, flops=flops, ceil=ceil, note="one call per query")
        run(name, "late-interaction-kernels pairs", lambda: peers.lik_candidates(Q.half(), tok, off32, cand, max_len),
            ref, nbytes=nbytes, flops=flops, ceil=ceil)
    elif peers_ok:
        ROWS.append({"case": name, "impl": "peers", "note": "not run: both address tokens with int32 arithmetic and "
                     f"this store has {tok.shape[0] * 128:,} elements (> 2**31)"})
    tok8, sc8 = quantize_int8(tok)
    nbytes8 = gathered_tok * (128 + 4) + nq * k * 8 * 3 + q.numel() * 2 + nq * k * 4
    run(name + "-int8", "mvdb candidates int8",
        lambda: maxsim_candidates(q, cu_q, tok8, off, cand, sc8, max_seqlen_q=32, check=False), ref,
        nbytes=nbytes8, flops=flops, ceil=ceil, int8=True)
    run(name + "-int8", "mvdb candidates int8 (default call)",
        lambda: maxsim_candidates(q, cu_q, tok8, off, cand, sc8, check=False), ref,
        nbytes=nbytes8, flops=flops, ceil=ceil, int8=True, note="check=False, no max_seqlen_q")
    del tok8, sc8, corpus


def _peers_skipped(asked: bool) -> dict:
    """Why each peer is not run: --no-peers, not importable, or no GPU (their kernels need CUDA)."""
    out = {}
    for name, v in peers.versions().items():  # a version, or the error its import raised
        why = "--no-peers" if asked else f"not importable ({v})" if ": " in v else f"{name} {v} needs CUDA"
        out[name] = f"skipped: {why}"
    return out


def main():
    global CPU_RUNS, HOST_CALLS
    args = ARGS or _parse()
    dev = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    peers_ok = dev == "cuda" and not args.no_peers
    if args.smoke:
        CPU_RUNS, HOST_CALLS = 1, 0
    scale = 0.02 if args.smoke else 1.0
    ceil = ceilings()
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if dev == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "python": platform.python_version(),
        "peers": peers.versions() if peers_ok else _peers_skipped(args.no_peers),
        "ceilings": ceil,
        "autotune": os.environ.get("MVDB_AUTOTUNE", "1"),
    }
    print(json.dumps(info), flush=True)
    cases = set(args.cases.split(","))
    t0 = time.time()
    if "a" in cases:
        for n in ((8,) if args.smoke else (1000, 10_000)):
            _varlen_case(n, dev, ceil, peers_ok, scale)
            torch.cuda.empty_cache() if dev == "cuda" else None
    if "b" in cases:
        _colpali_case(dev, ceil, peers_ok, scale)
        torch.cuda.empty_cache() if dev == "cuda" else None
    if "c" in cases:
        sizes = [(16, "16")] if args.smoke else [(150_000, "150k"), (1_000_000, "1M")]
        for n, label in sizes:
            _candidates_case(n, dev, ceil, peers_ok, label, nq=2 if args.smoke else 32)
            torch.cuda.empty_cache() if dev == "cuda" else None
    configs = {str(k): str(v) for k, v in getattr(tuning._tuned, "cache", {}).items()}
    result = {"info": info, "rows": ROWS, "autotune_choices": configs, "seconds": time.time() - t0}
    out = Path(os.environ.get("OUT", args.out))
    out.mkdir(parents=True, exist_ok=True)
    tag = "smoke" if args.smoke else ("sweep" if args.sweep else "kernels")
    path = out / f"{tag}-{info['device'].replace(' ', '_')}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"\nwrote {path}")
    print("\nautotune choices:")
    for k, v in configs.items():
        print(f"  {k}: {v}")


if __name__ == "__main__":
    main()
