"""The first query of a new process (issue #57): what a user waits for before the warm speed.

A database is built once (``--phase build``), with queries of varying length and their exact
top 10 (exhaustive MaxSim). Each ``--phase run`` is then a new Python process that times, from
the moment its parent launched it: the imports, the CUDA context, ``mvdb.open``, the first single
search; then the first batched pass over every query (what a fresh process meets), a second
(warm) pass, recall@10 of both; then single queries of every length 1..64: the first call of each
length and the median of later calls. ``--phase all`` builds, then runs the process in the states
a user meets it in:

- ``cold``: empty Triton and mvdb caches (a machine where mvdb never ran);
- ``second``: the same caches again (a machine where mvdb has run before);
- ``warmed``: empty caches, then ``mvdb warmup DB`` in a process of its own, then the run;
- ``serve``: ``mvdb serve DB --read-only`` on empty caches (it warms up before ``/ready``
  answers 200), then 16 clients searching one query at a time: the first 10 s after ready
  against the last 10.

Corpora: ``--corpus manpages`` (passages of the man pages, embedded per token by all-MiniLM-L6-v2
through ``db.add_texts``; queries: the pages' one-line summaries through the same model, 4-46
tokens) or a ``mvdb.testing.synthetic`` generator (``dups``, ``topics``, ``mixed96``; queries of
4-64 tokens drawn log-uniformly, from stored documents).

    python benchmarks/first_query.py --corpus manpages --model .minilm --data .data/manpages
    python benchmarks/first_query.py --corpus dups --docs 1000000

``--profile`` adds, per run, the seconds spent compiling each Triton kernel and autotuning.
JSON to --out (first-query-<corpus>-<docs>.json).
"""

from __future__ import annotations

import time

T_IMPORT = time.time()  # noqa: E402 - before the heavy imports, to time them

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent


def since_launch() -> float:
    """Seconds since the parent launched this process (MVDB_BENCH_T0), else since this module began."""
    return time.time() - float(os.environ.get("MVDB_BENCH_T0", T_IMPORT))


# ---------------------------------------------------------------- build


def build(args) -> dict:
    import numpy as np
    import torch

    import mvdb

    path = Path(args.path)
    shutil.rmtree(path, ignore_errors=True)
    info = {"corpus": args.corpus}
    t0 = time.perf_counter()
    if args.corpus == "manpages":
        sys.path.insert(0, str(HERE))
        from text_ingest import passages

        import gzip

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(args.model, device="cuda" if torch.cuda.is_available() else "cpu")
        if torch.cuda.is_available():
            model.half()
        enc = mvdb.Encoder(model, name="all-MiniLM-L6-v2", batch_size=256, document_max_tokens=256)
        texts = passages(Path(args.data), args.docs)[: args.docs]
        with mvdb.open(path, encoder=enc, progress=False) as db:
            db.add_texts(texts)
        summaries = []
        for f in ("dev.jsonl.gz", "gcloud.jsonl.gz"):
            with gzip.open(Path(args.data) / f, "rt") as fh:
                summaries += [json.loads(line)["summary"] for line in fh]
        queries = enc.encode(summaries[: args.queries], is_query=True)
        info["docs"] = len(texts)
        del model
    else:
        from mvdb.testing.synthetic import GENERATORS, make_structured, varlen_queries

        dev = "cuda" if torch.cuda.is_available() else "cpu"
        corpus = make_structured(args.corpus, args.docs, device=dev, seed=71)
        queries = varlen_queries(corpus, args.queries, 4, 64, seed=72)
        sys.path.insert(0, str(HERE))
        from common import bulk_ingest

        bulk_ingest(path, corpus.tokens.cpu().numpy(), corpus.lengths.cpu().numpy())
        info.update(docs=args.docs, generator=GENERATORS[args.corpus])
        del corpus
        queries = [q.cpu().numpy() for q in queries]
    info["build_s"] = time.perf_counter() - t0
    lengths = np.array([len(q) for q in queries])
    np.save(path.parent / (path.name + ".q.npy"), np.concatenate(queries).astype(np.float32))
    np.save(path.parent / (path.name + ".ql.npy"), lengths)
    # open once (trains and persists the token index), then the exhaustive reference
    t0 = time.perf_counter()
    with mvdb.open(path, progress=False) as db:
        info["first_open_s"] = time.perf_counter() - t0
        info["stats"] = {k: v for k, v in db.stats().items() if k in ("documents", "tokens", "index", "index_backend",
                                                                       "residency", "dim", "dtype")}
        ref = []
        for a in range(0, len(queries), 64):
            ref += [[h.id for h in hs] for hs in db.search(queries[a : a + 64], k=10, exact=True)]
    (path.parent / (path.name + ".ref.json")).write_text(json.dumps([[str(i) for i in r] for r in ref]))
    info["query_lengths"] = {"min": int(lengths.min()), "median": float(np.median(lengths)), "max": int(lengths.max())}
    return info


# ---------------------------------------------------------------- one run (a new process)


class CompileTimer:
    """Seconds spent compiling each Triton kernel of mvdb (per kernel name), and autotuning."""

    def __init__(self):
        import triton

        from mvdb.kernels.maxsim import tuning

        self.compiles: dict[str, list] = {}
        self.tune_s = 0.0
        self.tunes = 0
        seen = set()
        for mod in list(sys.modules.values()):
            if not getattr(mod, "__name__", "").startswith("mvdb"):
                continue
            for obj in list(vars(mod).values()):
                if isinstance(obj, triton.runtime.JITFunction) and id(obj) not in seen and hasattr(obj, "compile"):
                    seen.add(id(obj))
                    obj.compile = self._wrap(obj.compile, obj.__name__)
        run = tuning._tuned.run

        def tuned_run(*a, **kw):
            t0 = time.perf_counter()
            try:
                return run(*a, **kw)
            finally:
                self.tune_s += time.perf_counter() - t0
                self.tunes += 1

        tuning._tuned.run = tuned_run

    def _wrap(self, fn, name):
        def compile_(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.compiles.setdefault(name, []).append(time.perf_counter() - t0)

        return compile_

    def take(self) -> dict:
        out = {"compile_s": {k: round(sum(v), 3) for k, v in self.compiles.items()},
               "compiles": {k: len(v) for k, v in self.compiles.items()},
               "autotune_calls": self.tunes, "autotune_s_incl_compiles": round(self.tune_s, 3)}
        self.compiles, self.tune_s, self.tunes = {}, 0.0, 0
        return out


class Stages:
    """Seconds in each stage of db.search (each call synchronised): the candidates (and within
    them the token index's), the exact rerank, the top-k to hits."""

    def __init__(self, cuda: bool):
        import torch

        import mvdb.database as database
        from mvdb.engine import ivf, resident, search

        self.s: dict[str, float] = {}

        def wrap(owner, name, label):
            fn = getattr(owner, name)

            def timed(*a, **kw):
                if cuda:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = fn(*a, **kw)
                if cuda:
                    torch.cuda.synchronize()
                self.s[label] = self.s.get(label, 0.0) + time.perf_counter() - t0
                return out

            setattr(owner, name, timed)

        wrap(database, "prepare", "prepare")
        wrap(search, "candidates", "candidates")
        wrap(ivf.Lists, "candidates", "candidates.lists")
        wrap(resident.Tokens, "score", "rerank")
        wrap(search, "hits", "hits")

    def take(self) -> dict:
        out, self.s = {k: round(v, 4) for k, v in self.s.items()}, {}
        return out


def run(args) -> dict:
    res = {"launch_to_script_s": since_launch() - (time.time() - T_IMPORT)}
    import numpy as np

    res["import_numpy_s"] = since_launch()
    import torch

    res["import_torch_s"] = since_launch()
    import mvdb

    res["import_mvdb_s"] = since_launch()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
    res["cuda_context_s"] = since_launch()
    timer = CompileTimer() if args.profile else None
    path = Path(args.path)
    qcat = np.load(path.parent / (path.name + ".q.npy"))
    lengths = np.load(path.parent / (path.name + ".ql.npy"))
    bounds = np.concatenate(([0], np.cumsum(lengths)))
    queries = [qcat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    ref = [set(r) for r in json.loads((path.parent / (path.name + ".ref.json")).read_text())]
    res["load_queries_s"] = since_launch()
    db = mvdb.open(path, read_only=True, progress=False)
    res["open_s"] = since_launch()
    hit = db.search(queries[0], k=10)
    if cuda:
        torch.cuda.synchronize()
    res["first_hit_s"] = since_launch()
    res["first_hit_ok"] = bool(hit)
    if timer:
        res["profile_first_hit"] = timer.take()

    def recall(hits):
        return float(np.mean([len({str(h.id) for h in hs} & r) / 10 for hs, r in zip(hits, ref)]))

    stages = Stages(cuda) if args.stages else None
    for name in ("first_pass", "second_pass"):
        t0 = time.perf_counter()
        hits = []
        for a in range(0, len(queries), args.batch):
            hits += db.search(queries[a : a + args.batch], k=10)
        if cuda:
            torch.cuda.synchronize()
        s = time.perf_counter() - t0
        res[name] = {"seconds": s, "qps": len(queries) / s, "recall10": recall(hits)}
        if timer:
            res[name]["profile"] = timer.take()
        if stages:
            res[name]["stages_s"] = stages.take()
        print(name, json.dumps(res[name]), flush=True)
    # single queries of every length 1..64, cut from the stored queries (their first tokens): each
    # length's first call, then rounds over every length (so that a slow spell of the machine
    # falls on every length alike)
    pool = [q for q in queries if len(q) >= 64] or [np.concatenate([queries[0]] * (64 // len(queries[0]) + 1))]
    times = {lq: [] for lq in range(1, 65)}
    for i in range(args.singles + 1):
        for lq in times:
            q = pool[(i * 64 + lq) % len(pool)][:lq]
            t0 = time.perf_counter()
            db.search(q, k=10)
            if cuda:
                torch.cuda.synchronize()
            times[lq].append((time.perf_counter() - t0) * 1e3)
    per_len = {lq: {"first_ms": t[0], "p50_ms": statistics.median(t[1:])} for lq, t in times.items()}
    res["singles"] = per_len
    p32 = per_len[32]["p50_ms"]
    res["singles_summary"] = {
        "slowest_first_ms": max(v["first_ms"] for v in per_len.values()),
        "slowest_first_len": max(per_len, key=lambda k: per_len[k]["first_ms"]),
        "p50_32_ms": p32,
        "worst_p50_ratio_to_32": max(v["p50_ms"] for v in per_len.values()) / p32,
    }
    if timer:
        res["profile_singles"] = timer.take()
    res["stats"] = {k: v for k, v in db.stats().items() if k in ("documents", "tokens", "index", "residency")}
    db.close()
    return res


# ---------------------------------------------------------------- orchestration


def child(args, state: str, env: dict) -> dict:
    """One ``--phase run`` in a new process, timed from its launch."""
    out = Path(tempfile.mkstemp(suffix=".json")[1])
    cmd = [sys.executable, __file__, "--phase", "run", "--path", args.path, "--batch", str(args.batch),
           "--singles", str(args.singles), "--json", str(out)] + (["--profile"] if args.profile else []) \
        + (["--stages"] if args.stages else [])
    env = {**os.environ, **env, "MVDB_BENCH_T0": repr(time.time())}
    p = subprocess.run(cmd, env=env, text=True, capture_output=True)
    sys.stdout.write(p.stdout[-4000:])
    if p.returncode:
        sys.stdout.write(p.stderr[-8000:])
        return {"state": state, "error": p.stderr[-2000:]}
    return {"state": state, **json.loads(out.read_text())}


def serve(args, env: dict) -> dict:
    """``mvdb serve DB --read-only`` launched on ``env``'s caches: seconds to listening and to
    ready (``GET /ready`` 200), then ``--clients`` threads sending the queries one search at a
    time through ``mvdb.connect`` for ``--serve-seconds``: searches completed per second from the
    moment it was ready, the first 10 s against the last 10."""
    import threading
    import urllib.request

    import numpy as np

    import mvdb

    path = Path(args.path)
    qcat = np.load(path.parent / (path.name + ".q.npy"))
    bounds = np.concatenate(([0], np.cumsum(np.load(path.parent / (path.name + ".ql.npy")))))
    queries = [qcat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "mvdb", "serve", args.path, "--read-only", "--port", "0"],
                            env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: dict = {}
    try:
        url, said = None, []
        for line in proc.stdout:
            said.append(line)
            if "listening on" in line:
                url = line.split("listening on ")[1].split()[0]
                out["listening_s"] = time.time() - t0
                break
        if url is None:
            return {"error": "the server did not start", "rc": proc.wait(timeout=60), "output": "".join(said)[-3000:]}
        threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # drain its output
        while True:
            try:
                with urllib.request.urlopen(url + "/ready", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.05)
        ready = time.time()
        out["ready_s"] = ready - t0
        done: list[float] = []
        stop = ready + args.serve_seconds

        def client(i):
            c = mvdb.connect(url)
            j = i
            while time.time() < stop:
                c.search(queries[j % len(queries)], k=10)
                done.append(time.time() - ready)
                j += args.clients

        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        per_s = np.bincount(np.asarray(done, dtype=np.int64), minlength=int(args.serve_seconds))[: int(args.serve_seconds)]
        out["searches_per_s"] = per_s.tolist()
        first, last = per_s[:10].mean(), per_s[-10:].mean()
        out.update(first_10s_qps=float(first), last_10s_qps=float(last), first_over_steady=float(first / max(last, 1e-9)))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return out


def warm(args, env: dict) -> dict:
    """``mvdb warmup DB`` in a process of its own (timed whole), told the longest query the runs
    send (as a user whose queries pass the default 64 tokens tells it; a database whose texts
    were added with an encoder knows its query limit itself)."""
    import numpy as np

    path = Path(args.path)
    longest = int(np.load(path.parent / (path.name + ".ql.npy")).max())
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "mvdb", "warmup", args.path, "--max-query-tokens", str(max(64, longest))],
                       env={**os.environ, **env}, text=True, capture_output=True)
    return {"seconds": time.time() - t0, "rc": p.returncode, "stderr": p.stderr[-3000:], "stdout": p.stdout[-2000:]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--phase", default="all", choices=["all", "build", "run"])
    p.add_argument("--corpus", default="dups", help="manpages, or a mvdb.testing.synthetic generator")
    p.add_argument("--docs", type=int, default=None, help="documents (manpages: passages; default 58000)")
    p.add_argument("--queries", type=int, default=2000)
    p.add_argument("--batch", type=int, default=2000, help="queries per db.search call in the passes")
    p.add_argument("--singles", type=int, default=20, help="calls per length after the first")
    p.add_argument("--states", default="cold,second,warmed", help="cold, second, warmed, serve (in order)")
    p.add_argument("--clients", type=int, default=16, help="serve: client threads")
    p.add_argument("--serve-seconds", type=float, default=40.0, help="serve: seconds of load after ready")
    p.add_argument("--model", default=".minilm", help="manpages: a Sentence Transformers folder")
    p.add_argument("--data", default=".data/manpages", help="manpages: the known-item set's folder")
    p.add_argument("--path", default=None)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--reuse", action="store_true", help="keep the database an earlier run built at --path")
    p.add_argument("--stages", action="store_true", help="time the stages of each pass (each synchronised)")
    p.add_argument("--keep-winners", action="store_true", help="copy the stored autotune winners to --out")
    p.add_argument("--json", default=None, help="(run) where the run writes its JSON")
    p.add_argument("--out", default=os.environ.get("OUT", str(HERE / "results")))
    args = p.parse_args()
    if args.docs is None:
        args.docs = 58_000 if args.corpus == "manpages" else 1_000_000
    if args.path is None:
        args.path = str(Path(tempfile.gettempdir()) / f"mvdb-first-{args.corpus}-{args.docs}.mvdb")
    if args.phase == "run":
        Path(args.json).write_text(json.dumps(run(args)))
        return
    import torch

    res = {"suite": "first_query", "command": "python " + " ".join([f"benchmarks/{Path(__file__).name}"] + sys.argv[1:]),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
           "torch": torch.__version__, "triton": __import__("triton").__version__}
    built = Path(args.path + ".build.json")
    if args.reuse and built.exists():
        res["build"] = json.loads(built.read_text())
    else:
        res["build"] = build(args)
        built.write_text(json.dumps(res["build"]))
    print("build", json.dumps(res["build"]), flush=True)
    if args.phase == "build":
        return
    runs = []
    base = Path(tempfile.mkdtemp(prefix="mvdb-caches-"))
    for state in filter(None, args.states.split(",")):
        caches = base / ("second" if state == "second" else state)
        if state == "second":  # the caches the cold run left
            caches = base / "cold"
        env = {"TRITON_CACHE_DIR": str(caches / "triton"), "MVDB_TUNE_CACHE": str(caches / "mvdb")}
        row = {}
        if state == "serve":  # a server started on empty caches: it warms itself before it is ready
            row = {"state": state, **serve(args, env)}
            runs.append(row)
            print(state, json.dumps({k: v for k, v in row.items() if k != "searches_per_s"}), flush=True)
            continue
        if state == "warmed":
            row["warmup"] = warm(args, env)
            print("warmup", json.dumps(row["warmup"])[:600], flush=True)
        row.update(child(args, state, env))
        runs.append(row)
        keep = {k: row.get(k) for k in ("open_s", "first_hit_s")}
        print(state, json.dumps(keep), json.dumps(row.get("singles_summary")), flush=True)
    res["runs"] = runs
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.keep_winners:  # the autotune winners the runs stored: material for mvdb/kernels/winners.json
        for f in sorted(base.glob("*/mvdb/winners-*.json")):
            shutil.copy(f, out / f"winners-{args.corpus}-{f.parent.parent.name}.json")
    name = f"first-query-{args.corpus}-{args.docs}.json"
    (out / name).write_text(json.dumps(res, indent=1))
    print("wrote", out / name)


if __name__ == "__main__":
    main()
