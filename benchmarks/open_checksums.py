"""What checking the tokens' CRC-32 on load costs (issue #14): reopen time of a database with
``checksums=True`` (the default) and ``False``, median of --repeat opens each, page cache warm.

    python benchmarks/open_checksums.py --docs 40000 --out benchmarks/results
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
from mvdb.testing.synthetic import make_structured  # noqa: E402

import mvdb  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=40_000)
    p.add_argument("--generator", default="topics")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--path", default="/tmp/mvdb-open-checksums.mvdb")
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = p.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    corpus = make_structured(args.generator, args.docs, device=dev, seed=5)
    tokens, lengths = corpus.tokens.cpu().numpy(), corpus.lengths.cpu().numpy()
    shutil.rmtree(args.path, ignore_errors=True)
    off = np.concatenate(([0], np.cumsum(lengths)))
    with mvdb.storage.Store(args.path, dim=tokens.shape[1]) as st:
        for d0 in range(0, len(lengths), 50_000):
            d1 = min(len(lengths), d0 + 50_000)
            st.add_packed(tokens[off[d0] : off[d1]], lengths[d0:d1])
    mvdb.open(args.path, device=dev, index="ivf", progress=False).close()  # train and persist the index
    res = {"docs": args.docs, "tokens": int(off[-1]), "bytes": int(tokens.nbytes), "device": dev,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    for check in (True, False, True, False):
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            mvdb.open(args.path, device=dev, progress=False, checksums=check, read_only=True).close()
            times.append(time.perf_counter() - t0)
        res.setdefault(f"open_s_checksums_{check}", []).append(statistics.median(times))
    on, off_ = min(res["open_s_checksums_True"]), min(res["open_s_checksums_False"])
    res["overhead"] = on / off_ - 1
    res["crc_gb_per_s"] = tokens.nbytes / 1e9 / max(1e-9, on - off_)
    print(json.dumps(res, indent=1))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"open-checksums-{args.docs}-{dev}.json").write_text(json.dumps(res, indent=1))
    shutil.rmtree(args.path, ignore_errors=True)


if __name__ == "__main__":
    main()
