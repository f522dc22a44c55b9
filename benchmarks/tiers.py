"""Each tier forced in turn on one corpus, same queries: recall@10 against exhaustive MaxSim over
every document, batched QPS, single-query p50, GPU memory in use, open time (issue #45), for
each query set of ``--qlen``: by default queries of 4-64 tokens (log-uniform, as real ones run),
then the fixed 32 tokens of earlier figures.

    python benchmarks/tiers.py --docs 1000000 --gen dups --tiers device,host
    python benchmarks/tiers.py --docs 20000 --sweep "pool=4096,8192;exact=256,512"   # defaults study
    python benchmarks/tiers.py --docs 1000000 --dtype int8 --tiers device,host --code-bits 1
    python benchmarks/tiers.py --docs 1000000 --dtype int8 --tiers device,host:b2,host:b1   # rates side by side
    python benchmarks/tiers.py --docs 1000000 --tiers device,device+codes --sweep "pool=8192,16384;exact=128,256"

Tiers: ``device`` (exact tokens on the GPU), ``host`` (codes on the GPU, exact tokens in pinned
host memory read in place), ``disk`` (codes on the GPU, exact tokens read from the segments: the
page cache is warm after the ingest), ``disk-cold`` (the disk tier, with one batched pass timed first
right after the segments left the page cache). The corpus comes from mvdb/testing/synthetic.py (``--gen``: one of
``GENERATORS``); the reference is the fused MaxSim kernel over
every generated document before anything is stored.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bulk_ingest, device_used_gb, measure, sync  # noqa: E402
from grow import structured_case  # noqa: E402
from mvdb.testing.synthetic import GENERATORS  # noqa: E402

import mvdb  # noqa: E402
from mvdb.engine import codes as codes_tier  # noqa: E402


def sweep_settings(spec: str | None) -> list[dict]:
    """"pool=4096,8192;exact=256,512;nprobe=20,40" -> the grid of settings (empty: the defaults)."""
    if not spec:
        return [{}]
    axes = {}
    for part in spec.split(";"):
        name, values = part.split("=")
        axes[name] = [int(v) for v in values.split(",")]
    grid = [{}]
    for name, values in axes.items():
        grid = [dict(g, **{name: v}) for g in grid for v in values]
    return grid


def apply(setting: dict) -> None:
    if "pool" in setting:
        codes_tier.POOL_MIN = codes_tier.POOL_MAX = setting["pool"]
    if "exact" in setting:
        codes_tier.EXACT_MIN = setting["exact"]


def search_kw(setting: dict) -> dict:
    """The search arguments of a setting (the rest are module defaults, set by :func:`apply`)."""
    return {"k": 10, **({"nprobe": setting["nprobe"]} if "nprobe" in setting else {}),
            **({"n_candidates": setting["cand"]} if "cand" in setting else {})}


def stage_timer(out: dict, dev, n_queries: int, reps: int = 3):
    """``timed(name, fn)``: runs ``fn`` once to warm, then ``reps`` times, and records its
    milliseconds per query in ``out[name]``; returns its last result."""
    def timed(name, fn):
        fn()
        sync(dev)
        t0 = time.perf_counter()
        for _ in range(reps):
            r = fn()
        sync(dev)
        out[name] = (time.perf_counter() - t0) * 1e3 / reps / n_queries
        return r
    return timed


def parts(db, q: list, setting: dict) -> dict:
    """Milliseconds per query of each stage of a codes-tier search over the batch ``q``: the lists'
    pool, the codes' approximate ranking of it, and the exact rerank (where the tokens are)."""
    from mvdb.engine import search as S

    dev = q[0].device
    with db._pub.read() as st:
        qs = S.prepare(q, st.dim, dev)
        k = 10
        pool = min(codes_tier.default_pool(st.snap.n_live), st.snap.n_live)
        n_exact = min(codes_tier.default_exact(k), pool)
        nprobe = setting.get("nprobe", S.DEFAULT_LISTS_PROBE)
        out = {}
        timed = stage_timer(out, dev, qs.n)
        cand = timed("pool_ms", lambda: st.index.candidates(qs.q, qs.cu_host, st.live, pool, nprobe, cu_dev=qs.cu,
                                                             qid=qs.qid, ordered=False))
        approx = timed("codes_ms", lambda: st.residuals.score(qs.q, qs.cu, st.tokens.offsets, cand, qs.longest))
        top = approx.topk(n_exact, dim=1).indices
        exact_cand = cand.gather(1, top)
        timed("exact_ms", lambda: st.tokens.score(qs.q, qs.cu, exact_cand, qs.longest))
        if st.tokens.mapped:  # the other read of pinned host pages, for the A/B
            from mvdb.engine import resident

            default = resident.HOST_READ
            resident.HOST_READ = "in_place" if default == "gather" else "gather"
            timed(f"exact_{resident.HOST_READ}_ms", lambda: st.tokens.score(qs.q, qs.cu, exact_cand, qs.longest))
            resident.HOST_READ = default
        out.update(pool=pool, exact=n_exact)
    out["kernels_us"] = kernel_times(lambda: db.search(q, k=10), dev, len(q))
    return out


def kernel_times(fn, dev, n_queries: int, top: int = 14) -> dict:
    """Microseconds per query of GPU time in each kernel a call of ``fn`` launches (torch.profiler,
    one warm call), the ``top`` longest by name, plus ``gpu_busy`` (their sum) and ``wall`` (the
    call's own time: what exceeds gpu_busy is the device waiting for the host)."""
    from torch.profiler import ProfilerActivity, profile

    if dev.type != "cuda":
        return {}
    fn()
    sync(dev)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        fn()
        sync(dev)
        wall = time.perf_counter() - t0
    rows = {}
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None)
        if us is None:
            us = e.self_cuda_time_total
        if us > 0:
            rows[e.key[:90]] = rows.get(e.key[:90], 0.0) + us / n_queries
    out = dict(sorted(rows.items(), key=lambda kv: -kv[1])[:top])
    out.update(gpu_busy=sum(rows.values()), wall=wall * 1e6 / n_queries)
    return out


HBM_BYTES_PER_S = {"H100": 3.0e12, "H200": 4.8e12}  # the roofline's bandwidth, by GPU model


def device_parts(db, q: list, reps: int = 3) -> dict:
    """Where a device-tier search of the batch ``q`` spends its time, milliseconds per query:
    preparing the queries (to the device), the candidate stage (the index's probe, crediting and
    selection), the exact MaxSim of the candidates, turning scores into hits (the host round
    trip), and the whole search; with the bytes the exact stage reads (each candidate's tokens)
    and that read's time at the GPU's memory bandwidth (``exact_roofline_ms``)."""
    from mvdb.engine import search as S
    from mvdb.engine.state import _token_bytes

    dev = q[0].device
    out = {}
    timed = stage_timer(out, dev, len(q), reps)
    with db._pub.read() as st:
        qs = timed("prepare_ms", lambda: S.prepare(q, st.dim, dev))
        cand = timed("candidates_ms", lambda: S.candidates(st, qs, 10, st.live, n_live=st.snap.n_live))
        scores = timed("exact_ms", lambda: st.tokens.score(qs.q, qs.cu, cand, qs.longest))
        keys = st.snap.row_keys()
        timed("hits_ms", lambda: S.hits(scores, cand, keys, 10))
        rows = cand[cand >= 0].to(st.tokens.offsets.device)
        exact_bytes = int(st.tokens.lengths(rows).sum()) * _token_bytes(st.snap) / len(q)
    timed("search_ms", lambda: db.search(q, k=10))
    out["kernels_us"] = kernel_times(lambda: db.search(q, k=10), dev, len(q))
    gpu = next((g for g in HBM_BYTES_PER_S if dev.type == "cuda" and g in torch.cuda.get_device_name(dev)), None)
    out.update(candidates_per_query=float((cand >= 0).sum()) / len(q), exact_bytes_per_query=exact_bytes,
               exact_roofline_ms=exact_bytes / HBM_BYTES_PER_S[gpu] * 1e3 if gpu else None)
    return out


def evict(path: str) -> int:
    """Drop the segment files' pages from the page cache (posix_fadvise DONTNEED: no root needed
    for clean pages) -> bytes advised."""
    n = 0
    for f in Path(path).glob("segments/seg-*.h5"):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n += f.stat().st_size
        finally:
            os.close(fd)
    return n


def cold_pass(db, path: str, q: list, ref: list) -> dict:
    """One batched pass over every query right after the segments left the page cache (the disk
    tier's cold figure: nothing warmed first), then one single query, again cold."""
    out = {"evicted_gb": evict(path) / 1e9}
    t0 = time.perf_counter()
    hits = db.search(q, k=10)
    sync(q[0].device)
    out["batch_qps"] = len(q) / (time.perf_counter() - t0)
    out["recall10"] = float(sum(len({h.id for h in g} & r) for g, r in zip(hits, ref)) / (10 * len(ref)))
    evict(path)
    t0 = time.perf_counter()
    db.search(q[0], k=10)
    sync(q[0].device)
    out["single_ms"] = (time.perf_counter() - t0) * 1e3
    return out


def set_kernel(spec: str | None) -> dict:
    """"GROUP=4,HALF=1" -> the codes kernel's launch settings (mvdb.kernels.codes.ops), as set."""
    from mvdb.kernels.codes import ops as codes_ops

    out = {}
    for part in (spec or "").split(","):
        if part:
            name, value = part.split("=")
            setattr(codes_ops, name, type(getattr(codes_ops, name))(int(value)))
    for name in ("BLOCK_D", "WARPS", "STAGES", "GROUP", "HALF"):
        out[name] = getattr(codes_ops, name)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=100_000)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--qlen", default="4-64,32",
                   help='query sets, each measured: "4-64" (log-uniform lengths, as real queries) or a fixed length')
    p.add_argument("--gen", default="dups", choices=sorted(GENERATORS))
    p.add_argument("--dtype", default="float16", choices=["float16", "int8"])
    p.add_argument("--tiers", default="device,host")
    p.add_argument("--sweep", default=None, help='codes tiers: "pool=...;exact=..." grids of the defaults')
    p.add_argument("--device-sweep", default=None, help='device tier: "cand=4096,8192" (n_candidates)')
    p.add_argument("--parts", type=int, default=0, help="time each stage over this many queries (the device tier's stages, or the codes path's)")
    p.add_argument("--code-bits", type=int, default=None, choices=[1, 2, 4],
                   help="codes tiers: bits a dimension of the residual codes (default: mvdb's)")
    p.add_argument("--kernel", default=None, help='codes kernel launch, e.g. "GROUP=4,HALF=1,BLOCK_D=16,WARPS=2"')
    p.add_argument("--batch", type=int, default=None, help="queries a search call (default: all at once)")
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--latency-queries", type=int, default=100)
    p.add_argument("--seed", type=int, default=45)
    p.add_argument("--path", default="/tmp/mvdb-tiers.mvdb")
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = p.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    res = {"command": "python benchmarks/tiers.py " + " ".join(sys.argv[1:]),
           "docs": args.docs, "gen": args.gen, "dtype": args.dtype, "queries": args.queries, "qlen": args.qlen,
           "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": [],
           "kernel": set_kernel(args.kernel), "code_bits": args.code_bits}
    qlens = tuple(args.qlen.split(","))
    sets, tokens, lengths = structured_case(args.gen, args.docs, args.queries, args.seed, dev, qlens)
    sets = {k: ([x.to(dev) for x in q], ref, qps) for k, (q, ref, qps) in sets.items()}
    q, ref, res["exhaustive_qps"] = sets[qlens[0]]  # the first set's: the cold pass, the parts
    res["exhaustive_qps_by_qlen"] = {k: v[2] for k, v in sets.items()}
    res["tokens"] = int(lengths.sum())
    print(f"corpus: {args.docs:,} docs, {res['tokens']:,} tokens; exhaustive {res['exhaustive_qps']:.1f} QPS", flush=True)
    res["ingest_s"] = bulk_ingest(args.path, tokens, lengths, dtype=args.dtype)
    del tokens
    for spec in args.tiers.split(","):
        tier, _, rate = spec.partition(":b")  # "host:b1": the host tier with 1-bit codes
        bits = int(rate) if rate else args.code_bits
        t0 = time.perf_counter()
        residency, _, prerank = tier.removesuffix("-cold").partition("+")  # "device+codes": prerank="codes"
        db = mvdb.open(args.path, device=dev, residency=residency, progress=False, code_bits=bits,
                       prerank=prerank or "auto")
        run = {"tier": tier, "code_bits": bits, "open_s": time.perf_counter() - t0, "stats": {k: v for k, v in db.stats().items()
                                                                           if k not in ("path", "encoder")},
               "gpu_used_gb": device_used_gb(dev), "rows": [],
               # what the database's tensors hold (mem_get_info adds the CUDA context, FAISS's and
               # PyTorch's caches)
               "gpu_allocated_gb": torch.cuda.memory_allocated() / 1e9 if dev == "cuda" else None,
               "gpu_bytes_per_token": torch.cuda.memory_allocated() / res["tokens"] if dev == "cuda" else None}
        print(f"{tier}: open {run['open_s']:.1f} s, tier {run['stats']['tier']}, GPU {run['gpu_used_gb']} GB used, "
              f"{run['gpu_allocated_gb']} GB allocated, "
              f"codes {run['stats']['codes_bytes'] / 1e9:.2f} GB", flush=True)
        if tier == "disk-cold":
            run["cold"] = cold_pass(db, args.path, q, ref)
            print(f"  cold: {json.dumps(run['cold'])}", flush=True)
        for setting in sweep_settings(args.device_sweep if tier == "device" else args.sweep):
            saved = (codes_tier.POOL_MIN, codes_tier.POOL_MAX, codes_tier.EXACT_MIN)
            apply(setting)
            try:
                for qlen, (qs, refs, _) in sets.items():
                    row = {"qlen": qlen, **measure(db, qs, refs, search_kw(setting),
                                                   latency_queries=args.latency_queries, passes=args.passes,
                                                   batch=args.batch)}
                    if args.parts and qlen == qlens[0]:  # the device tier's own stages, or the codes path's
                        row["parts"] = (device_parts(db, q[: args.parts]) if tier == "device"
                                        else parts(db, q[: args.parts], setting))
                    row.update(setting, peak_gb=torch.cuda.max_memory_allocated() / 1e9 if dev == "cuda" else None)
                    run["rows"].append(row)
                    print(f"  {json.dumps(row)}", flush=True)
            finally:
                codes_tier.POOL_MIN, codes_tier.POOL_MAX, codes_tier.EXACT_MIN = saved
        db.close()
        del db
        if dev == "cuda":
            import gc

            gc.collect()
            torch.cuda.empty_cache()
        res["runs"].append(run)
    shutil.rmtree(args.path, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"tiers-{args.gen}-{args.docs}-{args.dtype}{'' if args.code_bits is None else f'-b{args.code_bits}'}.json"
    (out / name).write_text(json.dumps(res, indent=1, default=str))
    print("wrote", out / name)
    sync(dev)


if __name__ == "__main__":
    main()
