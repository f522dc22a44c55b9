"""Where a batched IVF search spends its time at 1M documents, and what the candidate stage's
alternatives buy (issue #13: recall@10 >= 0.98 at >= 5,000 batched QPS with the defaults).

    python benchmarks/search_profile.py --docs 1000000 --generator dups

One seeded corpus (benchmarks/synthetic.py), ingested in bulk (fp16; also timed as int8 into a
second directory), opened with the defaults. Then, over the same 1,000 queries:

- the end-to-end search at the default settings and at nprobe=16 (recall@10 against exhaustive
  MaxSim, batched QPS);
- the stages of one batched search, each timed alone (CUDA synchronised around it): centroid GEMM
  and probe top-k, the score tables' allocation, the list-crediting kernel, masking and top-k of
  the candidates, the exact rerank;
- variants of the list-crediting stage, each with its candidates' recall and overlap with the
  library's (a program per token with its own bitmap, fixed-point atomic adds): launch shape
  (warps, block), scratch (queries per chunk), the kernel it replaced (one
  program per query, marker and score in one int64 word per row), and an experiment of one
  program per (token, list) with plain atomics, which credits every probed list holding a row
  instead of each token's best (the int16-marker kernel is in the run-1 file);
- the int8 quantizer of the ingest path (mvdb.kernels.quant.quantize_array): on the GPU (pinned
  double buffers, the Triton quantizer), on the CPU threads, and the chunked torch path it replaced;
- optionally (``--nlist-mult 2,4``) the database reopened with 2x / 4x the default list count.

JSON to --out as each part completes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bulk_ingest, measure, sync
from credit_kernels import _credit_packed_kernel, _credit_red_kernel
from grow import settings, structured_case
from mvdb.kernels.lists import credit_lists_fixed, fixed_gains, token_queries
from mvdb.kernels.quant import quantize_array
from synthetic import GENERATORS

import mvdb
from mvdb.engine import ivf
from mvdb.engine.search import prepare

def timed(fn, reps: int = 3):
    """(median seconds over reps, last result) with the device synchronised around each call."""
    times, out = [], None
    for _ in range(reps):
        sync("cuda" if torch.cuda.is_available() else "cpu")
        t0 = time.perf_counter()
        out = fn()
        sync("cuda" if torch.cuda.is_available() else "cpu")
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def credit(index, probes, gains, cu_chunk, nq, variant, gains_fixed=None):
    """One chunk's [nq, n_rows] scores under ``variant`` (dict: kernel, warps, block); the library's
    kernel takes the batch's fixed-point gains (``gains_fixed``, one scale for the batch as
    Lists.candidates uses)."""
    dev = probes.device
    n_rows = index.n_rows
    cu32 = cu_chunk.to(dev, torch.int32)
    p = probes.shape[1]
    if variant["kernel"] == "tokens":  # the library's kernel (mvdb.kernels.lists)
        cu_l = cu_chunk.tolist()
        return credit_lists_fixed(index.list_offsets, index.list_rows, n_rows, probes, gains_fixed, cu_l,
                                  token_queries(cu_l, probes.shape[0], dev), block=variant["block"],
                                  warps=variant["warps"])
    if variant["kernel"] == "packed":  # the library's kernel until the token-parallel one
        word = torch.zeros(nq, n_rows, dtype=torch.int64, device=dev)
        _credit_packed_kernel[(nq,)](word, n_rows, index.list_offsets, index.list_rows, probes, gains, cu32,
                                     P=p, BLOCK=variant["block"], num_warps=variant["warps"])
        return word.view(torch.int32)[..., 0::2].view(torch.float32)
    if variant["kernel"] == "red":
        score = torch.zeros(nq, n_rows, dtype=torch.float32, device=dev)
        t_a, t_b = int(cu_chunk[0]), int(cu_chunk[-1])
        qid = token_queries(cu_chunk.tolist(), probes.shape[0], dev)
        _credit_red_kernel[((t_b - t_a) * p,)](score, n_rows, index.list_offsets, index.list_rows, probes, gains,
                                                 qid, t_a, P=p, BLOCK=variant["block"], num_warps=variant["warps"])
        return score
    raise ValueError(f"unknown kernel variant {variant['kernel']!r}")


def select(score, n, how):
    """(values, indices) of the n best per row: torch.topk in float32 or float16, or in two passes
    (the best n of each of 16 column segments, then the best n of those)."""
    if how == "fp16":
        top = score.half().topk(n, dim=1)
    elif how == "two-pass":
        nq, rows = score.shape
        seg = 16
        width = -(-rows // seg)
        if width * seg != rows:
            score = torch.nn.functional.pad(score, (0, width * seg - rows), value=float("-inf"))
        part = score.reshape(nq, seg, width).topk(min(n, width), dim=2)
        flat_v = part.values.reshape(nq, -1)
        flat_i = (part.indices + torch.arange(seg, device=score.device)[None, :, None] * width).reshape(nq, -1)
        t = flat_v.topk(n, dim=1)
        return t.values, flat_i.gather(1, t.indices)
    else:
        top = score.topk(n, dim=1)
    return top.values, top.indices


def candidates_variant(index, q, cu_host, live, n_cand, nprobe, variant, stages=None):
    """Lists.candidates with the variant's kernel, scratch and top-k; ``stages`` collects seconds."""
    dev = q.device
    nq = len(cu_host) - 1

    def lap(name, t0):
        if stages is not None:
            sync(dev)
            stages[name] = stages.get(name, 0.0) + time.perf_counter() - t0
        return time.perf_counter()

    t = time.perf_counter()
    sim = q.to(index.centroids.dtype) @ index.centroids.T
    sv, probes = sim.topk(nprobe, dim=1)
    del sim
    gains = (sv.float() - sv[:, -1:].float()).contiguous()
    probes = probes.to(torch.int32).contiguous()
    t = lap("probe_gemm_topk", t)
    gains_fixed = fixed_gains(gains, torch.tensor(cu_host, device=dev))[0] if variant["kernel"] == "tokens" else None
    per_query = index.n_rows * {"packed": 8, "red": 4, "tokens": 4}[variant["kernel"]]
    chunk = max(1, int(variant["scratch_gb"] * 2**30) // per_query)
    n_cand = min(n_cand, index.n_rows)
    out = torch.full((nq, n_cand), -1, dtype=torch.int64, device=dev)
    dead = ~live
    for a in range(0, nq, chunk):
        b = min(nq, a + chunk)
        cu = torch.tensor(cu_host[a : b + 1], device=dev)
        t = time.perf_counter()
        score = credit(index, probes, gains, cu, b - a, variant, gains_fixed)
        t = lap("credit_alloc_kernel", t)
        low = torch.iinfo(torch.int32).min if score.dtype == torch.int32 else float("-inf")
        score.masked_fill_(dead[None], low)
        t = lap("mask", t)
        values, indices = select(score, n_cand, variant.get("topk", "fp32"))
        out[a:b] = indices.masked_fill(values == low, -1)
        t = lap("topk", t)
        del score
    return out


def candidate_recall(cand, keys, ref):
    got = [set(keys[r[r >= 0]].tolist()) for r in cand.cpu().numpy()]
    return float(np.mean([len(g & r) / len(r) for g, r in zip(got, ref)]))


def quantize_chunked(x: np.ndarray):
    """The ingest quantizer's GPU path before the pipelined one (for comparison): pageable chunks
    copied over, quantized with torch ops, copied back, one after another."""
    q = np.empty(x.shape, dtype=np.int8)
    sc = np.empty(x.shape[0], dtype=np.float32)
    t = torch.from_numpy(x)
    step = max(1, (1 << 26) // max(1, x.shape[1]))
    for r0 in range(0, x.shape[0], step):
        xf = t[r0 : r0 + step].to("cuda").float()
        amax = xf.abs().amax(dim=-1)
        s = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
        y = xf / s[:, None]
        q[r0 : r0 + step] = torch.trunc(y + 0.5 * torch.sign(y)).clamp_(-127, 127).to(torch.int8).cpu().numpy()
        sc[r0 : r0 + step] = s.cpu().numpy()
    return q, sc


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=1_000_000)
    p.add_argument("--generator", default="dups", choices=sorted(GENERATORS))
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--seed", type=int, default=41)
    p.add_argument("--nlist-mult", default="", help="e.g. 2,4: reopen with that many times the default lists")
    p.add_argument("--mult-settings", default="8:4096,12:4096,16:4096,16:2048,24:4096,32:4096")
    p.add_argument("--skip-int8", action="store_true")
    p.add_argument("--index", default=None, help="the index kind to open with (default: the database's own)")
    p.add_argument("--probe-adds", type=int, default=10, help="late adds profiled after the search profile")
    p.add_argument("--probe-batch", type=int, default=5000, help="documents per profiled add")
    p.add_argument("--path", default="/tmp/mvdb-profile.mvdb")
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = p.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    out_file = out_dir / f"search-profile-{args.generator}-{args.docs}.json"
    res = {"docs": args.docs, "generator": args.generator, "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "torch": torch.__version__, "faiss_gpu": mvdb.engine.gpu_available()}

    def save():
        out_file.write_text(json.dumps(res, indent=1))

    q, ref, tokens, lengths, res["exhaustive_qps"] = structured_case(args.generator, args.docs, args.queries,
                                                                      args.seed, dev)
    res["tokens"] = int(lengths.sum())
    off = np.concatenate(([0], np.cumsum(lengths)))

    res["ingest_fp16_s"] = bulk_ingest(args.path, tokens, lengths, "float16")
    print(f"{args.generator}: {args.docs} docs, {res['tokens']:,} tokens; ingest fp16 {res['ingest_fp16_s']:.1f} s", flush=True)
    if not args.skip_int8:
        p8 = args.path + "-int8"
        res["ingest_int8_s"] = bulk_ingest(p8, tokens, lengths, "int8")
        shutil.rmtree(p8, ignore_errors=True)
        print(f"  ingest int8 {res['ingest_int8_s']:.1f} s", flush=True)
        part = tokens[: min(len(tokens), 8 << 20)]
        qz = {"rows": int(part.shape[0])}
        ref_q, ref_s = quantize_array(part, gpu=False)
        qz["cpu_threads_s"], _ = timed(lambda: quantize_array(part, gpu=False), reps=2)
        if dev == "cuda":
            qz["gpu_chunked_before_s"], (gq, gs) = timed(lambda: quantize_chunked(part), reps=2)
            qz["gpu_chunked_before_identical"] = bool(np.array_equal(gq, ref_q) and np.array_equal(gs, ref_s))
            qz["gpu_pipelined_s"], (pq, ps) = timed(lambda: quantize_array(part, gpu=True), reps=2)
            qz["gpu_pipelined_identical"] = bool(np.array_equal(pq, ref_q) and np.array_equal(ps, ref_s))
        res["quantize"] = qz
        print(f"  quantize {qz}", flush=True)
        save()
    n_probe = min(args.probe_adds * args.probe_batch, len(lengths))
    probe = (tokens[: off[n_probe]].copy(), lengths[:n_probe].copy())
    del tokens
    bare = (Path(args.path) / "MANIFEST.json").read_bytes()

    t0 = time.perf_counter()
    db = mvdb.open(args.path, device=dev, index=args.index, progress=False)
    res["open_s"] = time.perf_counter() - t0
    st = db.stats()
    res["nlist"], res["build_seconds"] = st["nlist"], st.get("build_seconds")
    print(f"  open {res['open_s']:.1f} s nlist {res['nlist']} {res['build_seconds']}", flush=True)
    res["search"] = [measure(db, q, ref, kw, 50) for kw in settings("default,16:4096")]
    print(f"  search {res['search']}", flush=True)
    save()

    with db._pub.read() as state:
        index, live = state.index, state.live
        keys = state.snap.row_keys()
        qs = prepare(q, state.dim, torch.device(dev))
        base = {"kernel": "tokens", "warps": 16, "block": 2048, "scratch_gb": 1.0, "topk": "fp32"}
        res["list_entries"] = int(index.list_rows.numel())
        res["mean_list_entries"] = index.list_rows.numel() / index.nlist
        for nprobe in (8, 16):
            stages: dict = {}
            candidates_variant(index, qs.q, qs.cu_host, live, 4096, nprobe, base)  # warm-up, compile
            for _ in range(3):
                cand = candidates_variant(index, qs.q, qs.cu_host, live, 4096, nprobe, base, stages)
            stages = {k: v / 3 for k, v in stages.items()}
            stages["rerank"], _ = timed(lambda c=cand: state.tokens.score(qs.q, qs.cu, c, qs.longest))
            stages["candidate_recall"] = candidate_recall(cand, keys, ref)
            res[f"stages_nprobe{nprobe}"] = stages
            print(f"  stages nprobe {nprobe}: {stages}", flush=True)
        save()
        variants = [dict(base, **v) for v in (
            {}, {"warps": 8, "block": 1024}, {"warps": 16, "block": 4096}, {"warps": 32, "block": 4096},
            {"scratch_gb": 0.25}, {"scratch_gb": 4.0}, {"kernel": "packed", "warps": 8, "block": 1024},
            {"kernel": "red", "warps": 8, "block": 1024})]
        res["variants"] = []
        for nprobe in (8, 16, 32):
            base_cand = None
            for v in variants:
                try:
                    candidates_variant(index, qs.q, qs.cu_host, live, 4096, nprobe, v)
                    s, cand = timed(lambda n=nprobe, v=v: candidates_variant(index, qs.q, qs.cu_host, live, 4096, n, v))
                    if base_cand is None:
                        base_cand = [set(r.tolist()) for r in cand.cpu().numpy()]
                    same = np.mean([len(set(r.tolist()) & b) / max(1, len(b))
                                    for r, b in zip(cand.cpu().numpy(), base_cand)])
                    row = {**v, "nprobe": nprobe, "candidates_ms": s * 1e3,
                           "candidate_recall": candidate_recall(cand, keys, ref), "same_as_base": float(same)}
                except Exception as e:  # noqa: BLE001 (a variant that fails is reported, not fatal)
                    row = {**v, "nprobe": nprobe, "error": repr(e)[:300]}
                res["variants"].append(row)
                print(f"  {row}", flush=True)
                if dev == "cuda":
                    torch.cuda.empty_cache()
            save()
    # what one late add of a grown database costs: the same documents again as new ones, each add
    # timed and profiled (cProfile, CUDA synchronised at the end of each add)
    import cProfile
    import io
    import pstats

    ptok, plen = probe
    poff = np.concatenate(([0], np.cumsum(plen)))
    prof, times = cProfile.Profile(), []
    for a in range(0, len(plen), args.probe_batch):
        b = min(len(plen), a + args.probe_batch)
        docs = [ptok[poff[i] : poff[i + 1]] for i in range(a, b)]
        t0 = time.perf_counter()
        prof.enable()
        db.add(docs)
        sync(dev)
        prof.disable()
        times.append(time.perf_counter() - t0)
    if times:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(40)
        res["late_adds"] = {"batch_docs": args.probe_batch, "seconds": times, "profile": buf.getvalue()[-12000:]}
        print(f"  late adds of {args.probe_batch} docs: {[round(t, 3) for t in times]}", flush=True)
        save()
    db.close()
    del db
    if dev == "cuda":
        torch.cuda.empty_cache()

    res["nlist_study"] = []
    for mult in [float(m) for m in args.nlist_mult.split(",") if m]:
        shutil.rmtree(Path(args.path) / "index", ignore_errors=True)
        (Path(args.path) / "MANIFEST.json").write_bytes(bare)
        nlist = int(res["nlist"] * mult)
        per_list = ivf.TRAIN_PER_LIST_GPU
        ivf.TRAIN_PER_LIST_GPU = max(40, int(per_list / mult))  # the same k-means sample size
        t0 = time.perf_counter()
        db = mvdb.open(args.path, device=dev, index="ivf", nlist=nlist, progress=False)
        row = {"nlist_mult": mult, "nlist": db.stats()["nlist"], "open_s": time.perf_counter() - t0,
               "train_per_list": ivf.TRAIN_PER_LIST_GPU, "build_seconds": db.stats().get("build_seconds"), "search": []}
        ivf.TRAIN_PER_LIST_GPU = per_list
        for kw in settings(args.mult_settings):
            row["search"].append(measure(db, q, ref, kw, 50))
            print(f"  nlist x{mult} ({row['nlist']}) {kw}: {row['search'][-1]}", flush=True)
        res["nlist_study"].append(row)
        save()
        db.close()
        del db
        if dev == "cuda":
            torch.cuda.empty_cache()
    shutil.rmtree(args.path, ignore_errors=True)
    save()


if __name__ == "__main__":
    main()
