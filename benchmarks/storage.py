"""Storage benchmark: ingest throughput, open time, random gathers, loading everything to the GPU.

    python benchmarks/storage.py --docs 1000000 --dim 128 --path /tmp/bench.mvdb

Writes a seeded store of --docs documents of 80-120 tokens (fp16 embeddings, added packed in
batches), then measures: ingest GB/s of fp16 embeddings (validation, checksums, HDF5 writes,
fsync and commits included); opening the database (manifest + segment headers + ids, no tokens);
gathering 1,000 random documents (median of repeats, page cache warm or not, as it comes);
load_all() to the GPU (or to pinned host memory without one). JSON to --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import time
from pathlib import Path

import numpy as np

from mvdb.storage import Store


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=40_000, help="documents per add_packed call")
    p.add_argument("--path", default="/tmp/mvdb-bench.mvdb")
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    p.add_argument("--keep", action="store_true", help="keep the database afterwards")
    p.add_argument("--no-load", action="store_true", help="skip load_all (when the store exceeds memory)")
    p.add_argument("--probe-mb", type=int, default=1024,
                   help="MiB of each of the disk probe's two writes, at most 1024 and the pool's size")
    args = p.parse_args()
    shutil.rmtree(args.path, ignore_errors=True)
    rng = np.random.default_rng(0)
    lengths = rng.integers(80, 121, args.docs)
    pool = rng.standard_normal((1 << 20, args.dim), dtype=np.float32).astype(np.float16)  # reused, shifted
    res = {"docs": args.docs, "dim": args.dim, "tokens": int(lengths.sum()), "machine": platform.node(),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}

    # The disk's own ceiling for ingest: two blocks of the pool written with pwrite, then fsync.
    probe = args.path + ".probe"
    block = memoryview(pool[: 1 << 22].view(np.uint8).reshape(-1))[: min(1 << 30, args.probe_mb << 20)]
    t0 = time.perf_counter()
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for i in range(2):
        os.pwrite(fd, block, i * len(block))
    os.fsync(fd)
    os.close(fd)
    res["disk_write_fsync_gbps"] = 2 * len(block) / (time.perf_counter() - t0) / 1e9
    os.unlink(probe)
    print(f"disk: {2 * len(block) / 2**20:.0f} MiB pwrite + fsync at {res['disk_write_fsync_gbps']:.2f} GB/s",
          flush=True)

    t_add, nbytes = 0.0, 0
    with Store(args.path, dim=args.dim, dtype="float16") as st:
        for b0 in range(0, args.docs, args.batch):
            lens = lengths[b0 : b0 + args.batch]
            n_tok = int(lens.sum())
            start = (b0 * 7919) % (len(pool) - 1)
            idx = (start + np.arange(n_tok)) % len(pool)
            tokens = pool[idx]
            t0 = time.perf_counter()
            st.add_packed(tokens, lens)
            t_add += time.perf_counter() - t0
            nbytes += tokens.nbytes
    res["ingest_seconds"] = t_add
    res["ingest_gbps"] = nbytes / t_add / 1e9
    res["store_bytes"] = sum(f.stat().st_size for f in Path(args.path, "segments").iterdir())
    print(f"ingest: {nbytes / 1e9:.2f} GB of fp16 in {t_add:.1f} s = {res['ingest_gbps']:.2f} GB/s", flush=True)

    opens = []
    for _ in range(5):
        t0 = time.perf_counter()
        st = Store(args.path, read_only=True)
        opens.append(time.perf_counter() - t0)
        st.close()
    res["open_seconds_median"] = statistics.median(opens)
    print(f"open (read-only, {args.docs:,} docs): median {res['open_seconds_median'] * 1e3:.0f} ms", flush=True)

    with Store(args.path, read_only=True) as st:
        t0 = time.perf_counter()
        st.gather([0])  # builds the id lookup
        res["id_index_build_seconds"] = time.perf_counter() - t0
        times = []
        for r in range(30):
            ids = np.random.default_rng(r).choice(args.docs, 1000, replace=False).tolist()
            t0 = time.perf_counter()
            pk = st.gather(ids)
            times.append(time.perf_counter() - t0)
        res["gather_1000_ms_median"] = statistics.median(times) * 1e3
        res["gather_1000_ms_first"] = times[0] * 1e3
        res["gather_1000_mb"] = pk.tokens.nbytes / 2**20
        print(f"gather 1000 random docs: median {res['gather_1000_ms_median']:.1f} ms (first {times[0] * 1e3:.1f} ms)",
              flush=True)
        # The alternative the layout was chosen against: HDF5 reads of each document's slice.
        import h5py

        readers = st.snapshot().readers
        h5 = [h5py.File(r.path, "r", locking=False)["tokens"] for r in readers]
        times = []
        for r in range(5):
            rows = np.random.default_rng(100 + r).choice(args.docs, 1000, replace=False)
            seg, local = st.snapshot().locate(rows)
            t0 = time.perf_counter()
            parts = [h5[s][readers[s].offsets[l] : readers[s].offsets[l + 1]] for s, l in zip(seg, local)]
            np.concatenate(parts)
            times.append(time.perf_counter() - t0)
        res["gather_1000_ms_h5py_slices"] = statistics.median(times) * 1e3
        print(f"  same through h5py slice reads: {res['gather_1000_ms_h5py_slices']:.1f} ms", flush=True)
        try:
            if args.no_load:
                raise ImportError
            import torch

            device = "cuda" if torch.cuda.is_available() else None
            t0 = time.perf_counter()
            whole = st.load_all(device=device, pin=device is None)
            t = time.perf_counter() - t0
            res["load_all_target"] = device or "pinned host"
            res["load_all_gbps"] = whole.tokens.numel() * whole.tokens.element_size() / t / 1e9
            res["load_all_seconds"] = t
            print(f"load_all -> {res['load_all_target']}: {res['load_all_gbps']:.2f} GB/s ({t:.1f} s)", flush=True)
            del whole
        except ImportError:
            pass
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"storage-{args.docs}-{platform.node()}.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res))
    if not args.keep:
        shutil.rmtree(args.path, ignore_errors=True)


if __name__ == "__main__":
    main()
