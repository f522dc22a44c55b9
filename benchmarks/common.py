"""Shared measurement helpers of the benchmarks (e2e.py, grow.py, multigpu.py, kernels.py,
kernel_variants.py), and the text benchmarks' model (hybrid.py, quality.py, text_api.py)."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from mvdb.testing.synthetic import make_queries, varlen_queries


def sync(dev) -> None:
    if torch.device(dev).type == "cuda":
        torch.cuda.synchronize()


def with_attr(obj, name: str, value, fn):
    """fn, called with ``obj.<name>`` set to ``value`` (restored afterwards, also on error)."""

    def call():
        old = getattr(obj, name)
        setattr(obj, name, value)
        try:
            return fn()
        finally:
            setattr(obj, name, old)

    return call


def captured_calls(module, names: tuple[str, ...], fn) -> dict[str, list]:
    """Run fn() with ``module``'s functions ``names`` wrapped to record each call's (args, kwargs)
    before making it; returns name -> the calls in order (the functions are restored after)."""
    seen = {name: [] for name in names}
    real = {name: getattr(module, name) for name in names}

    def spy(name):
        def call(*a, **k):
            seen[name].append((a, k))
            return real[name](*a, **k)
        return call

    for name in names:
        setattr(module, name, spy(name))
    try:
        fn()
    finally:
        for name, f in real.items():
            setattr(module, name, f)
    return seen


def write_json(out_dir, name: str, res: dict) -> Path:
    """res as indented JSON in out_dir/name (the folder made if missing); prints and returns the path."""
    path = Path(out_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1))
    print("wrote", path)
    return path


def median_ms(fn, warmup: int = 25, rep: int = 200, cpu_runs: int = 3) -> float:
    """Median milliseconds of fn(): triton.testing.do_bench on a GPU (L2 flushed between runs;
    ``warmup`` / ``rep`` in ms), else the median of ``cpu_runs`` timed calls (after one untimed
    call when there are several)."""
    if torch.cuda.is_available():
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    if cpu_runs > 1:
        fn()
    times = []
    for _ in range(cpu_runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def gpu_header(**extra) -> dict:
    """The start of a GPU probe's JSON: the date (UTC), the device ("cpu" without CUDA), torch and
    triton versions, then ``extra``."""
    import triton

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": device,
            "torch": torch.__version__, "triton": triton.__version__, **extra}


def alternating_rounds(calls: dict, rounds: int, warmup: int = 10, rep: int = 100,
                       cpu_runs: int = 3) -> tuple[dict, dict]:
    """({name: [ms per round]}, {name: median ms}): each call timed once per round (median_ms),
    the calls in turn, so that a drift of the machine's speed falls on all of them alike."""
    ms = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            ms[name].append(median_ms(fn, warmup=warmup, rep=rep, cpu_runs=cpu_runs))
    return ms, {name: statistics.median(v) for name, v in ms.items()}


def exhaustive_reference(db, q, k: int = 10, batch: int = 64) -> tuple[list[set], float]:
    """Exhaustive MaxSim over every document (``search(exact=True)``) -> (top-k id sets, QPS).
    ``q``: a list of [Lq_i, dim] queries, or one [n, Lq, dim] tensor."""
    db.search(q[:1], k=k, exact=True)  # warm-up
    sync(q[0].device)
    t0 = time.perf_counter()
    ref = []
    for a in range(0, len(q), batch):
        ref += [{h.id for h in hs} for hs in db.search(q[a : a + batch], k=k, exact=True)]
    sync(q[0].device)
    return ref, len(q) / (time.perf_counter() - t0)


def make_query_set(corpus, n_queries: int, qlen: str, seed: int) -> list:
    """``n_queries`` queries drawn from stored documents: ``qlen`` "32" (that many tokens each)
    or "4-64" (lengths log-uniform over the range, as real queries run) -> [Lq_i, dim] tensors."""
    if "-" in qlen:
        lo, hi = (int(x) for x in qlen.split("-"))
        return varlen_queries(corpus, n_queries, lo, hi, seed=seed)
    return list(make_queries(corpus, n_queries, int(qlen), seed=seed)[0])


def measure(db, q, ref: list, kw: dict, latency_queries: int = 100, passes: int = 3,
            batch: int | None = None) -> dict:
    """Batched QPS (median of ``passes`` over all queries, in batches of ``batch``: all at once
    where None, after a first pass timed on its own: ``first_pass_qps``, what the process's first
    searches of this setting get), single-query p50/p99 and recall@k against ``ref`` for one
    search setting. ``q``:
    a list of [Lq_i, dim] queries, or one [n, Lq, dim] tensor."""
    n, dev = len(q), q[0].device
    step = batch or n
    t0 = time.perf_counter()  # the first pass, before anything warms this setting
    for a in range(0, n, step):
        db.search(q[a : a + step], **kw)
    sync(dev)
    first = n / (time.perf_counter() - t0)
    times = []
    for _ in range(passes):
        t0 = time.perf_counter()
        hits = [h for a in range(0, n, step) for h in db.search(q[a : a + step], **kw)]
        sync(dev)
        times.append(time.perf_counter() - t0)
    row = {**kw, "batch_qps": n / statistics.median(times), "first_pass_qps": first,
           **({"batch": batch} if batch else {})}
    lat = []
    for i in range(min(latency_queries, n)):
        t0 = time.perf_counter()
        db.search(q[i], **kw)
        sync(dev)
        lat.append((time.perf_counter() - t0) * 1e3)
    lat.sort()
    if lat:
        row["single_p50_ms"], row["single_p99_ms"] = statistics.median(lat), lat[int(0.99 * (len(lat) - 1))]
    k = kw.get("k", 10)
    row[f"recall{k}"] = float(np.mean([len({h.id for h in g} & r) / k for g, r in zip(hits, ref)]))
    return row


def bulk_ingest(path, tokens: np.ndarray, lengths: np.ndarray, dtype: str = "float16", chunk_docs: int = 50_000) -> float:
    """A fresh directory at ``path`` filled with ``Store.add_packed`` in chunks of documents (the
    bulk path the growth and defaults studies compare against) -> seconds."""
    import shutil

    import mvdb

    shutil.rmtree(path, ignore_errors=True)
    off = np.concatenate(([0], np.cumsum(lengths)))
    t0 = time.perf_counter()
    with mvdb.storage.Store(path, dim=tokens.shape[1], dtype=dtype) as st:
        for d0 in range(0, len(lengths), chunk_docs):
            d1 = min(len(lengths), d0 + chunk_docs)
            st.add_packed(tokens[off[d0] : off[d1]], lengths[d0:d1])
    return time.perf_counter() - t0


def device_used_gb(dev: str = "cuda") -> float | None:
    """GB in use on the CUDA device ``dev`` (the whole device: every process, CUDA context and
    caches included), None off CUDA."""
    if not str(dev).startswith("cuda"):
        return None
    free, total = torch.cuda.mem_get_info(dev)
    return (total - free) / 1e9


def text_model(name: str, device: str = "cpu", path: str | None = None):
    """``--encoder`` of the text benchmarks: "minilm" (mvdb.embed.MiniLM, the figures) or "words"
    (``mvdb.testing.words.Words``, a stand-in that needs no model)."""
    if name == "words":
        from mvdb.testing.words import Words


        return Words(device)
    from mvdb.embed import MiniLM

    return MiniLM(device=device, path=path)
