"""Where a search of a few queries spends its time (issue #16: a server's batches are small).

    python benchmarks/small_batch.py --docs 1000000          # the lent H100

The corpus and queries of benchmarks/serve.py (seeded "dups", 32-token queries, fp16 as they
travel), built with ``Store.add_packed`` and opened with the defaults. Then, with the queries
given as host fp16 arrays (as the server hands them over):

1. ``db.search`` of B queries at the defaults for B in ``--batches``: median milliseconds and the
   QPS it implies, recall@10 against exhaustive MaxSim on the first 200 queries;
2. the stages of one search of B queries, each timed alone with the device synchronised around
   it: queries to the device, the centroid GEMM and probe top-k, the fixed-point gains, the
   list-crediting kernel with the rows split into 1, 2, 4, 8, 16 parts per token (the tables
   must equal the one-part table), masking, the candidate top-k (torch.topk, and a two-pass
   top-k: the best of 16 column segments, then the best of those; same candidates required),
   the exact rerank, and the hits back to the host;
3. ``torch.profiler`` and ``cProfile`` of searches of 5 queries: the busiest operators and Python
   functions.

JSON to --out (small-batch-<docs>-<device>.json) as each part completes.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import json
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import sync  # noqa: E402
from synthetic import make_queries, make_structured  # noqa: E402

import mvdb  # noqa: E402
from mvdb.engine import ivf  # noqa: E402
from mvdb.engine.search import hits, prepare  # noqa: E402
from mvdb.kernels.lists import credit_lists_fixed, fixed_gains, list_bounds, token_queries  # noqa: E402


REPS = 20  # timed calls per stage (--reps caps it)
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def timed(fn, reps: int | None = None) -> tuple[float, object]:
    """(median ms over ``reps`` calls after one warm-up, the last result), synchronised."""
    reps = REPS if reps is None else min(reps, REPS)
    out = fn()
    times = []
    for _ in range(reps):
        sync(DEV)
        t0 = time.perf_counter()
        out = fn()
        sync(DEV)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), out


def two_pass_topk(score: torch.Tensor, n: int, seg: int = 16):
    nq, rows = score.shape
    width = -(-rows // seg)
    if width * seg != rows:
        score = torch.nn.functional.pad(score, (0, width * seg - rows), value=torch.iinfo(score.dtype).min)
    part = score.reshape(nq, seg, width).topk(min(n, width), dim=2)
    flat_v = part.values.reshape(nq, -1)
    flat_i = (part.indices + torch.arange(seg, device=score.device)[None, :, None] * width).reshape(nq, -1)
    t = flat_v.topk(n, dim=1)
    return t.values, flat_i.gather(1, t.indices)


def stages(db, state, qh: np.ndarray, n_cand: int, nprobe: int) -> dict:
    """The stages of one search of the queries ``qh`` [B, Lq, dim] (host fp16), timed alone."""
    dev = db.device
    index, live = state.index, state.live
    row = {"batch": int(qh.shape[0])}
    row["prepare_ms"], qs = timed(lambda: prepare(qh, state.dim, dev))
    row["live_sum_ms"], _ = timed(lambda: int(live.sum()))

    def probe():
        sim = qs.q.to(index.centroids.dtype) @ index.centroids.T
        sv, probes = sim.topk(nprobe, dim=1)
        return sv, probes

    row["probe_ms"], (sv, probes) = timed(probe)

    def gains_of():
        gains = sv.float() - sv[:, -1:].float()
        g, _ = fixed_gains(gains, torch.tensor(qs.cu_host, device=dev))
        return g, token_queries(qs.cu_host, qs.q.shape[0], dev)

    row["gains_ms"], (gq, qid) = timed(gains_of)
    bounds = list_bounds(index.list_offsets, index.list_rows, index.n_rows, 16)
    row["bounds_ms"], _ = timed(lambda: list_bounds(index.list_offsets, index.list_rows, index.n_rows, 16), reps=3)
    base = None
    row["credit_ms"] = {}
    for parts in (1, 2, 4, 8, 16):
        ms, score = timed(lambda p=parts: credit_lists_fixed(index.list_offsets, index.list_rows, index.n_rows, probes,
                                                             gq, qs.cu_host, qid, parts=p, bounds=bounds))
        if base is None:
            base = score
        row["credit_ms"][parts] = ms
        row.setdefault("credit_equal", {})[parts] = bool(torch.equal(score, base))
    dead = ~live
    low = torch.iinfo(torch.int32).min
    row["mask_ms"], _ = timed(lambda: base.clone().masked_fill_(dead[None], low))
    score = base.clone().masked_fill_(dead[None], low)
    n = min(n_cand, index.n_rows)
    row["topk_ms"], top = timed(lambda: score.topk(n, dim=1))
    row["topk_two_pass_ms"], (v2, _) = timed(lambda: two_pass_topk(score, n))
    row["two_pass_same_values"] = bool(torch.equal(v2, top.values))
    cand = top.indices.masked_fill(top.values == low, -1)
    row["rerank_ms"], scores = timed(lambda: state.tokens.score(qs.q, qs.cu, cand, qs.longest))
    keys = state.snap.row_keys()
    row["hits_ms"], _ = timed(lambda: hits(scores, cand, keys, 10))
    row["sum_ms"] = (row["prepare_ms"] + row["live_sum_ms"] + row["probe_ms"] + row["gains_ms"] + row["credit_ms"][1]
                     + row["mask_ms"] + row["topk_ms"] + row["rerank_ms"] + row["hits_ms"])
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--generator", default="dups")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--batches", default="1,2,5,10,11,20,32,64,256,1000")
    ap.add_argument("--stage-batches", default="1,5,20,64")
    ap.add_argument("--big", default="256,1000", help="large batches on the device whose stages are timed")
    ap.add_argument("--reps", type=int, default=60, help="timed searches per batch size at most")
    ap.add_argument("--index", default=None, help="the index to open with (default: the database's own)")
    ap.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = ap.parse_args()
    global REPS
    REPS = min(REPS, args.reps)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = "H100" if dev == "cuda" and "H100" in torch.cuda.get_device_name() else dev
    out_file = out_dir / f"small-batch-{args.docs}-{name}.json"
    res = {"docs": args.docs, "generator": args.generator,
           "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}

    def save():
        out_file.write_text(json.dumps(res, indent=1))

    tmp = tempfile.mkdtemp(prefix="mvdb-small-batch-")
    path = os.path.join(tmp, "db")
    corpus = make_structured(args.generator, args.docs, device=dev, seed=31)
    Q, _ = make_queries(corpus, args.queries, 32, seed=32)
    qh = Q.half().cpu().numpy()
    tokens, lengths = corpus.tokens.cpu().numpy(), corpus.lengths.cpu().numpy()
    del corpus
    off = np.concatenate(([0], np.cumsum(lengths)))
    t0 = time.perf_counter()
    with mvdb.storage.Store(path, dim=tokens.shape[1]) as st:
        for d0 in range(0, args.docs, 50_000):
            st.add_packed(tokens[off[d0] : off[min(args.docs, d0 + 50_000)]], lengths[d0 : d0 + 50_000])
    del tokens
    db = mvdb.open(path, device=dev, progress=False, index=args.index)
    res["build_s"] = time.perf_counter() - t0
    res["stats"] = {k: v for k, v in db.stats().items() if isinstance(v, (int, float, str))}
    print(f"built in {res['build_s']:.1f} s: {res['stats']}", flush=True)
    try:
        n_ref = min(200, args.queries)
        ref = [{h.id for h in hs} for hs in db.search(qh[:n_ref], k=10, exact=True)]
        got = db.search(qh[:n_ref], k=10)
        res["recall10_200"] = float(np.mean([len({h.id for h in g} & r) / 10 for g, r in zip(got, ref)]))
        res["search"] = []
        for b in [int(x) for x in args.batches.split(",")]:
            reps = max(1, min(args.reps, 2000 // b))
            times = []
            db.search(qh[:b], k=10)
            for i in range(reps):
                a = (i * b) % max(1, args.queries - b)
                sync(dev)
                t0 = time.perf_counter()
                db.search(qh[a : a + b], k=10)
                sync(dev)
                times.append((time.perf_counter() - t0) * 1e3)
            ms = statistics.median(times)
            res["search"].append({"batch": b, "ms": ms, "qps": b / ms * 1e3})
            print(json.dumps(res["search"][-1]), flush=True)
        save()
        res["stages"] = []
        with db._pub.read() as state:
            assert isinstance(state.index, ivf.Lists), "expected the IVF index at this size"
            for b in [int(x) for x in args.stage_batches.split(",") if x]:
                try:
                    row = stages(db, state, qh[:b], 4096, 20)
                except Exception as e:  # noqa: BLE001 - recorded; the profiles still run
                    row = {"batch": b, "error": f"{type(e).__name__}: {e}"}
                res["stages"].append(row)
                print(json.dumps(row), flush=True)
                save()
        # a large batch on the device (as the in-process batched QPS is measured): its stages
        qd = torch.from_numpy(qh).to(dev)
        res["big"] = []
        with db._pub.read() as state:
            for b in [int(x) for x in args.big.split(",") if x]:
                row = {"batch": b}
                row["search_ms"], _ = timed(lambda b=b: db.search(qd[:b], k=10), reps=3)
                qs = prepare(qd[:b], state.dim, torch.device(dev))
                for ordered in (False, True):
                    row[f"candidates_ms_ordered_{ordered}"], cand = timed(
                        lambda o=ordered: state.index.candidates(qs.q, qs.cu_host, state.live, 4096, 20, cu_dev=qs.cu,
                                                                 qid=qs.qid, ordered=o), reps=3)
                row["rerank_ms"], scores = timed(lambda c=cand: state.tokens.score(qs.q, qs.cu, c, qs.longest), reps=3)
                row["hits_ms"], _ = timed(lambda c=cand, s=scores: hits(s, c, state.snap.row_keys(), 10), reps=3)
                res["big"].append(row)
                print(json.dumps(row), flush=True)
                save()
        # profiles of searches of 5 queries
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
        with profile(activities=acts) as prof:
            for i in range(min(10, args.reps)):
                db.search(qh[5 * i : 5 * i + 5], k=10)
            sync(dev)
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
        res["torch_profile_b5_by_cpu"] = table.splitlines()
        table = prof.key_averages().table(sort_by="self_cuda_time_total" if dev == "cuda" else "cpu_time_total",
                                          row_limit=30)
        res["torch_profile_b5_by_device"] = table.splitlines()
        pr = cProfile.Profile()
        pr.enable()
        for i in range(min(50, args.reps)):
            db.search(qh[5 * i : 5 * i + 5], k=10)
        sync(dev)
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
        res["cprofile_b5_50_searches"] = s.getvalue().splitlines()
        save()
    finally:
        db.close()
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({k: res[k] for k in ("recall10_200", "search")}), flush=True)


if __name__ == "__main__":
    main()
