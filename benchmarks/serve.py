"""Load benchmark of ``mvdb serve`` (issue #16): QPS and latency against concurrent clients.

    python benchmarks/serve.py --docs 1000000 --clients 1,4,16,64 --seconds 10     # the lent H100
    python benchmarks/serve.py --docs 4000 --clients 1,4,16,64 --seconds 8          # the 2-core CPU

1. Builds a database of ``--docs`` documents from a seeded synthetic corpus
   (mvdb/testing/synthetic.py ``--generator``, default "dups": lengths 16-200, topic and private
   words, 10% near-duplicates) with ``Store.add_packed`` and a first ``mvdb.open``.
2. In process: batched QPS over ``--queries`` queries (median of 3 passes) and single-query
   p50, at the default search settings; the answers are kept as the reference. Queries: ``--qlen``
   tokens (4-64, log-uniform, by default), drawn from stored documents.
3. Closes it and starts ``mvdb serve`` as a separate process on loopback; checks that the first
   100 answers through ``mvdb.connect`` equal the in-process ones (ids; scores to 1e-3).
4. For each client count C: C client threads spread over P processes (``mvdb.connect`` each,
   single-query ``search(q, k=10)`` in a loop, fp16 queries on the wire) for ``--seconds`` after
   a warm-up; QPS is completed searches / seconds, latency is per request as the client saw it.
   The server's batch counters give the mean batch size at each level.

JSON to ``--out`` (serve-<docs>-<device>.json).
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import make_query_set, sync  # noqa: E402
from mvdb.testing.synthetic import GENERATORS, make_structured  # noqa: E402

import mvdb  # noqa: E402


def _save_queries(qfile: str, qs: list) -> None:
    """Queries of varying length ([Lq_i, dim] fp16 arrays) into one .npz: tokens and offsets."""
    np.savez(qfile, tokens=np.concatenate(qs), offsets=np.cumsum([0] + [len(x) for x in qs]))


def _load_queries(qfile: str) -> list:
    with np.load(qfile) as f:
        tokens, off = f["tokens"], f["offsets"]
    return [tokens[a:b] for a, b in zip(off[:-1], off[1:])]


def _client_proc(url: str, qfile: str, threads: int, start_at: float, seconds: float, seed: int, out) -> None:
    """One client process: ``threads`` threads sharing one client, each searching in a loop; only
    requests sent between ``start_at`` (wall clock, the same for every process) and ``seconds``
    later count."""
    c = mvdb.connect(url)
    q = _load_queries(qfile)
    start = time.monotonic() + (start_at - time.time())
    stop = start + seconds
    lats: list[list[float]] = [[] for _ in range(threads)]
    errors = []

    def loop(t):
        rng = np.random.default_rng(seed * 1000 + t)
        try:
            while True:
                i = int(rng.integers(len(q)))
                t0 = time.monotonic()
                if t0 >= stop:
                    return
                c.search(q[i], k=10)
                t1 = time.monotonic()
                if t0 >= start:
                    lats[t].append((t1 - t0) * 1e3)
        except Exception as e:  # noqa: BLE001 - reported to the parent
            errors.append(f"{type(e).__name__}: {e}")

    ts = [threading.Thread(target=loop, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    c.close()
    out.put(([x for xs in lats for x in xs], errors))


def load(url: str, qfile: str, clients: int, procs: int, warmup: float, seconds: float, stats=None) -> dict:
    """C client threads over P processes for ``seconds`` after a warm-up; ``stats`` (the server's
    stats()) is read at the start and the end of the measured window, for the engine's batches and
    its seconds inside db.search in exactly that window."""
    ctx = mp.get_context("spawn")
    procs = max(1, min(procs, clients))
    per = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    q = ctx.Queue()
    start_at = time.time() + warmup + 8.0  # time for every process to start (torch import) and warm up
    ps = [ctx.Process(target=_client_proc, args=(url, qfile, n, start_at, seconds, i, q)) for i, n in enumerate(per)]
    for p in ps:
        p.start()
    window = []

    def snapshots():
        for at in (start_at, start_at + seconds):
            time.sleep(max(0.0, at - time.time()))
            t0 = time.perf_counter()
            counters = stats()["server"]
            t1 = time.perf_counter()
            window.append(((t0 + t1) / 2, counters, t1 - t0))  # read somewhere in between

    watcher = threading.Thread(target=snapshots, daemon=True) if stats is not None else None
    if watcher is not None:
        watcher.start()
    lats, errors = [], []
    for _ in ps:
        lat, err = q.get(timeout=warmup + seconds + 320)
        lats += lat
        errors += err
    for p in ps:
        p.join(timeout=60)
    if watcher is not None:
        watcher.join(timeout=30)
    lats.sort()
    row = {"clients": clients, "processes": procs, "searches": len(lats), "qps": len(lats) / seconds}
    if len(window) == 2:
        (t0, s0, d0), (t1, s1, d1) = window
        row["stats_call_ms"] = [d0 * 1e3, d1 * 1e3]
        db_b, db_q = s1["batches"] - s0["batches"], s1["batched_queries"] - s0["batched_queries"]
        row["mean_batch"] = db_q / db_b if db_b else None
        if db_b and "search_s" in s1:  # the engine's time inside db.search in the window
            row["engine_search_ms_per_batch"] = (s1["search_s"] - s0["search_s"]) / db_b * 1e3
            row["engine_batches_per_s"] = db_b / (t1 - t0)
            row["engine_busy"] = (s1["search_s"] - s0["search_s"]) / (t1 - t0)
        if db_b and "run_s" in s1:  # the search loop's other time: reading calls, answering them
            row["engine_calls_per_batch"] = (s1["calls"] - s0["calls"]) / db_b
            row["engine_take_share"] = (s1["take_s"] - s0["take_s"]) / (t1 - t0)
            row["engine_answer_share"] = ((s1["run_s"] - s0["run_s"]) - (s1["search_s"] - s0["search_s"])) / (t1 - t0)
    if lats:
        row.update(p50_ms=statistics.median(lats), p99_ms=lats[int(0.99 * (len(lats) - 1))], mean_ms=float(np.mean(lats)))
    if errors:
        row["errors"] = errors[:5]
    return row


def start_server(path: str, device: str, extra: list[str]) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, MVDB_PROGRESS="0", PYTHONUNBUFFERED="1")
    p = subprocess.Popen([sys.executable, "-m", "mvdb", "serve", os.path.abspath(path), "--port", "0", "--device", device, *extra],
                         stdout=subprocess.PIPE, text=True, env=env, cwd=tempfile.gettempdir())  # not a checkout
    t0 = time.monotonic()
    while True:
        line = p.stdout.readline()
        if "listening on" in line:
            return p, line.split("listening on ")[1].split()[0]
        if p.poll() is not None or time.monotonic() - t0 > 600:
            p.kill()
            raise RuntimeError("the server did not start")


def run_server(path, dev, server_args: str, qh, want, qfile, args, in_process_qps: float) -> dict:
    """Start ``mvdb serve`` with ``server_args``, check its answers, load it at each client count."""
    run = {"server_args": server_args}
    t0 = time.perf_counter()
    proc, url = start_server(path, dev, server_args.split())
    run["server_start_s"] = time.perf_counter() - t0
    try:
        with mvdb.connect(url) as c:  # correctness first: the served answers are the in-process ones
            bad = 0
            for i in range(100):
                got = c.search(qh[i], k=10)
                ids_equal = [h.id for h in got] == [h.id for h in want[i]]
                close = all(abs(a.score - b.score) < 1e-3 for a, b in zip(got, want[i]))
                bad += not (ids_equal and close)
            run["served_equals_in_process"] = f"{100 - bad}/100"
            print(f"server {server_args!r}: served answers equal the in-process ones: {100 - bad}/100", flush=True)
            procs = args.procs or max(1, (os.cpu_count() or 2) // 2)
            run["load"] = []
            for n in [int(x) for x in args.clients.split(",")]:
                row = load(url, qfile, n, procs, args.warmup, args.seconds, stats=c.stats)
                row["share_of_in_process_batched"] = row["qps"] / in_process_qps
                run["load"].append(row)
                print(json.dumps(row), flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        run["server_exit"] = proc.wait(timeout=120)
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=4000)
    ap.add_argument("--generator", default="dups", choices=sorted(GENERATORS))
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--qlen", default="4-64", help='query tokens: "4-64" (log-uniform lengths, as real queries) or one number')
    ap.add_argument("--clients", default="1,4,16,64")
    ap.add_argument("--procs", type=int, default=0, help="client processes (0: half the cores, at least 1)")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--path", default=None)
    ap.add_argument("--server-args", default=os.environ.get("MVDB_SERVE_VARIANTS", ""),
                    help="extra arguments of mvdb serve, e.g. '--batch-window-ms 1'; several server settings, each "
                         "measured in turn on the same database: separate them with ';' (an empty one: the defaults)")
    ap.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    tmp = tempfile.mkdtemp(prefix="mvdb-serve-bench-")
    path = args.path or os.path.join(tmp, "db")
    shutil.rmtree(path, ignore_errors=True)
    res = {"docs": args.docs, "generator": args.generator, "device": torch.cuda.get_device_name() if dev == "cuda"
           else "cpu", "cpus": os.cpu_count(), "seconds": args.seconds,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "server_args": args.server_args, "qlen": args.qlen}

    corpus = make_structured(args.generator, args.docs, device=dev, seed=31)
    # the queries as they travel (fp16), so in-process and served answers compare exactly
    Q = [x.half().float().cpu() for x in make_query_set(corpus, args.queries, args.qlen, seed=32)]
    tokens, lengths = corpus.tokens.cpu().numpy(), corpus.lengths.cpu().numpy()
    del corpus
    res["tokens"] = int(lengths.sum())
    t0 = time.perf_counter()
    off = np.concatenate(([0], np.cumsum(lengths)))
    with mvdb.storage.Store(path, dim=tokens.shape[1]) as st:
        for d0 in range(0, args.docs, 50_000):
            st.add_packed(tokens[off[d0] : off[min(args.docs, d0 + 50_000)]], lengths[d0 : d0 + 50_000])
    del tokens
    db = mvdb.open(path, device=dev)
    res["build_s"] = time.perf_counter() - t0
    res["index"], res["nlist"] = db.stats()["index"], db.stats()["nlist"]
    q = [x.to(dev) for x in Q]

    # in process, the defaults
    db.search(q[:8], k=10)
    times = []
    for _ in range(3):
        sync(dev)
        t0 = time.perf_counter()
        want = db.search(q, k=10)
        sync(dev)
        times.append(time.perf_counter() - t0)
    res["in_process_batched_qps"] = args.queries / statistics.median(times)
    times64 = []
    for _ in range(3):  # the batch sizes the server sees under load
        sync(dev)
        t0 = time.perf_counter()
        for a in range(0, args.queries, 64):
            db.search(q[a : a + 64], k=10)
        sync(dev)
        times64.append(time.perf_counter() - t0)
    res["in_process_batch64_qps"] = args.queries / statistics.median(times64)
    res["in_process_ms_per_batch"] = {}
    for b in (4, 16, 32):  # to set beside the engine's time per batch under load
        ts = []
        for a in range(0, min(args.queries, 50 * b), b):
            sync(dev)
            t0 = time.perf_counter()
            db.search(q[a : a + b], k=10)
            sync(dev)
            ts.append((time.perf_counter() - t0) * 1e3)
        res["in_process_ms_per_batch"][b] = statistics.median(ts)
    res["in_process_host_ms_per_batch"] = {}
    qh16 = [x.half().numpy() for x in Q]
    for b in (1, 5, 20):  # as the server's engine gets them: host fp16 arrays
        ts = []
        for a in range(0, min(args.queries, 50 * b), b):
            sync(dev)
            t0 = time.perf_counter()
            db.search(qh16[a : a + b], k=10)
            sync(dev)
            ts.append((time.perf_counter() - t0) * 1e3)
        res["in_process_host_ms_per_batch"][b] = statistics.median(ts)
    lat = []
    for i in range(min(200, args.queries)):
        t0 = time.perf_counter()
        db.search(q[i], k=10)
        sync(dev)
        lat.append((time.perf_counter() - t0) * 1e3)
    res["in_process_single_p50_ms"] = statistics.median(lat)
    print(f"in process: batched {res['in_process_batched_qps']:.0f} QPS ({res['in_process_batch64_qps']:.0f} in "
          f"batches of 64), single p50 "
          f"{res['in_process_single_p50_ms']:.2f} ms ({res['index']}, {res['tokens']} tokens)", flush=True)
    db.close()
    del q
    torch.cuda.empty_cache() if dev == "cuda" else None

    qfile = os.path.join(tmp, "queries.npz")
    qh = [x.half().numpy() for x in Q]
    _save_queries(qfile, qh)
    res["servers"] = []
    try:
        for server_args in args.server_args.split(";"):
            res["servers"].append(run_server(path, dev, server_args, qh, want, qfile, args, res["in_process_batched_qps"]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"serve-{args.docs}-{'H100' if 'H100' in res['device'] else res['device'].replace(' ', '_')}.json"
    (out / name).write_text(json.dumps(res, indent=1))
    print(json.dumps(res))


if __name__ == "__main__":
    main()
