"""fast-plaid on the same seeded synthetic corpus as benchmarks/e2e.py (issue #4 comparison).

    bash benchmarks/gpu_session.sh fastplaid:1000000      # installs .whl_fp/*.whl, then runs this
    python benchmarks/e2e_fastplaid.py --docs 1000000     # with fast_plaid importable

Generates the e2e corpus and queries on the GPU from the same seeds (make_corpus(n, 64, 128, 128,
seed=21), make_queries(corpus, 1000, 32, seed=22)), computes the exhaustive MaxSim top-10 reference
exactly as e2e.py does (mvdb.kernels.maxsim_varlen over the packed fp16 tokens, one query at a
time), then builds a fast-plaid index on the same documents (one tensor per document, views of the
packed corpus moved to host memory) and measures: build (create, then the first search, which loads
the index onto the GPU), batched search QPS over the queries, single-query p50/p99 over 100 queries,
recall@10 against the exhaustive reference, source_at_1, and peak GPU memory, for fast-plaid's
default search parameters and a few settings around them. JSON to --out, rewritten after every
phase, so a run cut short still leaves what it measured.

fast-plaid numbers documents by their position in the list given to create(); the script checks
this by rescoring the returned ids exactly (id_check in the JSON).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import inspect
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mvdb.testing.synthetic import make_corpus, make_queries  # noqa: E402

# (n_ivf_probe, n_full_scores); "default" = fast-plaid's own defaults (8, 4096 in 1.7), the headline row
SETTINGS = "default,4:1024,16:8192,32:16384"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=1_000_000)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--index-dir", default="/tmp/fastplaid-idx")
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    p.add_argument("--settings", default=SETTINGS,
                   help=f"comma-separated n_ivf_probe:n_full_scores, or 'default' (default: {SETTINGS})")
    p.add_argument("--nbits", type=int, default=None, help="create(nbits=...); default: fast-plaid's (4)")
    p.add_argument("--docs-device", choices=("cpu", "cuda"), default="cpu",
                   help="where the per-document tensors given to create() live (default: host memory)")
    p.add_argument("--device", default="cuda",
                   help="'cuda' (the benchmark); 'cpu' only for a tiny smoke test of this script")
    p.add_argument("--keep-index", action="store_true", help="leave the index directory behind")
    p.add_argument("--missing-ok", action="store_true",
                   help="without fast_plaid: still build the corpus and the reference, write the JSON with "
                        "'skipped' saying why, exit 0 (smoke runs)")
    args = p.parse_args()
    settings = _parse_settings(args.settings)
    dev = args.device
    if dev.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("e2e_fastplaid.py: no CUDA device (torch.cuda.is_available() is False); this benchmark "
                 "runs on the GPU machine (bash benchmarks/gpu_session.sh fastplaid:N). "
                 "--device cpu runs a tiny smoke test instead.")
    if dev == "cpu" and args.docs_device == "cuda":
        sys.exit("e2e_fastplaid.py: --docs-device cuda needs --device cuda")
    try:
        from fast_plaid import search as fp_search
    except Exception as e:  # noqa: BLE001 - say what is missing, then stop (or skip: --missing-ok)
        missing = f"cannot import fast_plaid ({type(e).__name__}: {e})"
        if not args.missing_ok:
            sys.exit(f"e2e_fastplaid.py: {missing}; install the wheels in .whl_fp (pip install --no-deps "
                     "--no-index --target /tmp/site-fp .whl_fp/*.whl) and put the target on PYTHONPATH")
        fp_search = None
    from mvdb.kernels import maxsim_varlen

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    out_file = out / f"e2e-fastplaid-{args.docs}.json"
    res = {"docs": args.docs, "queries": args.queries, "device": _device_name(dev),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "fast_plaid": _version("fast-plaid"), "torch": torch.__version__,
           "versions": {k: _version(k) for k in ("fastkmeans", "usearch", "numkong", "joblib", "filelock")},
           "corpus": "make_corpus(docs, 64, 128, 128, seed=21), make_queries(corpus, queries, 32, seed=22)",
           "docs_device": args.docs_device}
    if fp_search is None:
        res["skipped"] = f"fast-plaid: {missing}"
    else:
        FastPlaid = fp_search.FastPlaid
        res.update(create_defaults=_defaults(FastPlaid.create, ("kmeans_niters", "max_points_per_centroid", "nbits",
                                                                "n_samples_kmeans", "batch_size", "seed")),
                   search_defaults=_defaults(FastPlaid.search, ("top_k", "batch_size", "n_full_scores", "n_ivf_probe")),
                   init_defaults=_defaults(FastPlaid.__init__, ("index_gpu_memory", "index_memory_fraction",
                                                                "search_memory_fraction")))
    res["phase"] = "start"
    _dump(res, out_file)

    # the corpus and queries of e2e.py, and its exhaustive reference
    wall0 = t0 = time.perf_counter()
    corpus = make_corpus(args.docs, 64, 128, 128, device=dev, seed=21)
    Q, src = make_queries(corpus, args.queries, 32, seed=22)
    _sync(dev)
    res["corpus_s"] = time.perf_counter() - t0
    res["tokens"] = int(corpus.offsets[-1])
    print(f"corpus: {args.docs} docs, {res['tokens']} tokens in {res['corpus_s']:.1f} s", flush=True)
    q = Q.to(dev)
    cu_d = corpus.offsets.int()
    cu1 = torch.tensor([0, 32], dtype=torch.int32, device=dev)
    maxsim_varlen(q[0], cu1, corpus.tokens, cu_d, max_seqlen_q=32, check=False)
    _sync(dev)
    t0 = time.perf_counter()
    ref = [maxsim_varlen(q[i], cu1, corpus.tokens, cu_d, max_seqlen_q=32, check=False)[0].topk(10).indices
           for i in range(args.queries)]
    _sync(dev)
    res["exhaustive_qps"] = args.queries / (time.perf_counter() - t0)
    ref = [set(r.tolist()) for r in ref]
    src = [int(s) for s in src.tolist()]
    print(f"exhaustive fused MaxSim (reference): {res['exhaustive_qps']:.0f} QPS", flush=True)
    res["phase"] = "reference"
    _dump(res, out_file)
    if fp_search is None:
        print(f"skipped: {res['skipped']}", flush=True)
        return

    # one tensor per document, views of one packed buffer (fast-plaid's create takes a list)
    t0 = time.perf_counter()
    tokens = corpus.tokens if args.docs_device == "cuda" else corpus.tokens.cpu()
    offsets = corpus.offsets.cpu()
    lengths = (offsets[1:] - offsets[:-1]).tolist()
    del corpus, cu_d, Q
    docs = list(torch.split(tokens, lengths))
    assert docs[-1].data_ptr() == tokens[int(offsets[-2])].data_ptr()  # views, no copies
    if dev.startswith("cuda"):
        torch.cuda.empty_cache()
    res["docs_to_list_s"] = time.perf_counter() - t0
    print(f"{len(docs)} document views on {tokens.device} in {res['docs_to_list_s']:.1f} s", flush=True)

    shutil.rmtree(args.index_dir, ignore_errors=True)  # FastPlaid(index=...) would load an old index
    mem = _DeviceMemory(dev)
    if dev.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    mem.start()
    create_kw = {} if args.nbits is None else {"nbits": args.nbits}
    res["create_kwargs"] = create_kw
    try:
        t0 = time.perf_counter()
        fp = FastPlaid(index=args.index_dir, device=dev)
        fp.create(documents_embeddings=docs, **create_kw)
        _sync(dev)
        res["create_s"] = time.perf_counter() - t0
        res["create_device_mem_gb"] = mem.peak_gb()
        res["index_meta"] = _index_meta(args.index_dir)
        res["index_disk_gb"] = _du(args.index_dir) / 1e9
        print(f"create: {res['create_s']:.1f} s, index {res['index_disk_gb']:.2f} GB on disk, "
              f"{res['index_meta']}", flush=True)
        res["phase"] = "create"
        _dump(res, out_file)
        # create() leaves the index unloaded; the first search loads it onto the device
        t0 = time.perf_counter()
        fp.search(queries_embeddings=q[:8], show_progress=False)
        _sync(dev)
        res["load_and_first_search_s"] = time.perf_counter() - t0
        res["build_s"] = res["create_s"] + res["load_and_first_search_s"]
        res["build_note"] = ("build_s = create() (k-means, compression, IVF, files written to --index-dir) + the "
                             "first search, which loads the index onto the device; documents given as "
                             f"{args.docs_device} tensors")
        print(f"load + first search: {res['load_and_first_search_s']:.1f} s; build {res['build_s']:.1f} s",
              flush=True)
    except Exception as e:  # noqa: BLE001 - recorded, the JSON says where it stopped
        res["error"] = f"create/load: {type(e).__name__}: {e}"
        res["traceback"] = traceback.format_exc()
        print(res["traceback"], flush=True)
        _finish(res, mem, dev, out_file)
        sys.exit(1)
    res["phase"] = "loaded"
    if dev.startswith("cuda"):
        res["create_and_load_gpu_peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
        res["index_resident_gpu_gb"] = torch.cuda.memory_allocated() / 1e9
    _dump(res, out_file)

    res["sweep"] = []
    n_single = min(100, args.queries)
    for kw in settings:
        row = {"setting": f"{kw['n_ivf_probe']}:{kw['n_full_scores']}" if kw else "default",
               **{k: kw.get(k, v) for k, v in res["search_defaults"].items()}}
        try:
            kwargs = dict(kw, show_progress=False)
            fp.search(queries_embeddings=q[:8], **kwargs)  # warm-up
            _sync(dev)
            t0 = time.perf_counter()
            hits = fp.search(queries_embeddings=q, **kwargs)
            _sync(dev)
            row["batch_qps"] = args.queries / (time.perf_counter() - t0)
            lat = []
            for i in range(n_single):
                t0 = time.perf_counter()
                fp.search(queries_embeddings=q[i : i + 1], **kwargs)
                _sync(dev)
                lat.append((time.perf_counter() - t0) * 1e3)
            lat.sort()
            row["single_p50_ms"], row["single_p99_ms"] = statistics.median(lat), lat[int(0.99 * (len(lat) - 1))]
            ids = [[int(pid) for pid, _ in h] for h in hits]
            row["returned_per_query_min"] = min(len(i) for i in ids)
            row["queries_with_no_results"] = sum(not i for i in ids)  # fast-plaid turns a failed query into []
            row["recall10_vs_exhaustive"] = float(np.mean([len(set(i[:10]) & r) / 10 for i, r in zip(ids, ref)]))
            row["source_at_1"] = float(np.mean([bool(i) and i[0] == s for i, s in zip(ids, src)]))
            row["id_check"] = _id_check(q, hits, tokens, offsets)
        except Exception as e:  # noqa: BLE001 - one failed setting must not lose the others
            row["error"] = f"{type(e).__name__}: {e}"
            print(traceback.format_exc(), flush=True)
            if dev.startswith("cuda"):
                torch.cuda.empty_cache()
        res["sweep"].append(row)
        print(json.dumps(row), flush=True)
        _dump(res, out_file)
    res["phase"] = "done"
    res["wall_s"] = time.perf_counter() - wall0
    fp.close()
    _finish(res, mem, dev, out_file)
    if not args.keep_index:
        shutil.rmtree(args.index_dir, ignore_errors=True)
    print(json.dumps(res), flush=True)


def _parse_settings(text: str) -> list[dict]:
    out = []
    for item in text.split(","):
        item = item.strip()
        if item == "default":
            out.append({})
        elif item:
            probe, full = item.split(":")
            out.append({"n_ivf_probe": int(probe), "n_full_scores": int(full)})
    return out


def _id_check(q, hits, tokens, offsets, n: int = 20) -> dict:
    """Exact MaxSim (fp32, on the host) of the ids fast-plaid returned, against the scores it returned.

    fast-plaid scores decompressed (4-bit residual) tokens, so the two differ by a little; ids read as
    anything but positions in the create() list would differ by a lot (the shifted-by-one column shows
    how much).
    """
    diffs, shifted = [], []
    n_docs = offsets.numel() - 1
    for qi in range(min(n, len(hits))):
        qv = q[qi].float().cpu()
        for pid, score in hits[qi]:
            for j, acc in ((int(pid), diffs), ((int(pid) + 1) % n_docs, shifted)):
                d = tokens[int(offsets[j]) : int(offsets[j + 1])].float().cpu()
                acc.append(abs(float((qv @ d.T).amax(1).sum()) - float(score)))
    return {"queries": min(n, len(hits)), "mean_abs_diff": float(np.mean(diffs)) if diffs else None,
            "mean_abs_diff_ids_plus_1": float(np.mean(shifted)) if shifted else None}


class _DeviceMemory:
    """Peak device-wide used memory above the level at start(), from `nvidia-smi -lms 50` running in its
    own process (fast-plaid's Rust calls may hold the GIL for minutes, so a Python sampling thread
    could miss the peak). Unlike torch.cuda.max_memory_allocated it also counts what is allocated
    outside PyTorch's caching allocator (fast-plaid's libtorch side, if it does) and the allocator's
    reserved slack."""

    def __init__(self, dev):
        self.cuda = dev.startswith("cuda")
        self.proc = self.log = None
        self.base_mib = None

    def start(self):
        if not self.cuda or shutil.which("nvidia-smi") is None:
            return
        self.log = open(f"/tmp/e2e_fastplaid-mem-{os.getpid()}.csv", "w+")  # noqa: SIM115
        gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0] or str(torch.cuda.current_device())
        self.proc = subprocess.Popen(["nvidia-smi", "-i", gpu, "--query-gpu=memory.used",
                                      "--format=csv,noheader,nounits", "-lms", "50"],
                                     stdout=self.log, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        samples = self._samples()
        self.base_mib = samples[0] if samples else None

    def _samples(self) -> list[int]:
        self.log.flush()
        self.log.seek(0)
        return [int(x) for x in self.log.read().split() if x.isdigit()]

    def peak_gb(self) -> float | None:
        """Peak so far minus the level at start(), GB (1e9 bytes)."""
        if self.proc is None or self.base_mib is None:
            return None
        return (max(self._samples()) - self.base_mib) * 2**20 / 1e9

    def stop(self):
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()
            self.log.close()
            os.unlink(self.log.name)
            self.proc = None


def _finish(res, mem, dev, out_file):
    if dev.startswith("cuda"):
        res["gpu_peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
        res["gpu_peak_gb_note"] = ("gpu_peak_gb: torch.cuda.max_memory_allocated from the start of create() "
                                   "(the corpus is in host memory by then), PyTorch's caching allocator only; "
                                   "device_peak_gb: device-wide used memory (nvidia-smi, every 50 ms) above the "
                                   "level before create(), which also counts reserved and non-PyTorch memory")
        res["device_peak_gb"] = mem.peak_gb()
    mem.stop()
    _dump(res, out_file)


def _index_meta(path) -> dict:
    try:
        meta = json.loads((Path(path) / "metadata.json").read_text())
        return {k: meta.get(k) for k in ("num_partitions", "num_embeddings", "num_documents", "nbits",
                                         "num_chunks", "avg_doclen")}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"}


def _du(path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def _defaults(fn, names) -> dict:
    params = inspect.signature(fn).parameters
    return {n: params[n].default for n in names if n in params}


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _device_name(dev) -> str:
    return torch.cuda.get_device_name() if dev.startswith("cuda") else "cpu"


def _dump(res, out_file):
    out_file.write_text(json.dumps(res, indent=1, default=str))


def _sync(dev):
    if dev.startswith("cuda"):
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
