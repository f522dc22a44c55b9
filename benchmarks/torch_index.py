"""The pure-torch token index against FAISS on this machine (issue #18): exact flat token search
(TorchFlat vs IndexFlatIP, same k') and spherical k-means (torch vs faiss.Clustering, flat and
two-level), with both checked to agree before any time is reported.

    python benchmarks/torch_index.py --tokens 100000,1000000 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time

import numpy as np
import torch

from mvdb.engine import flat, ivf


def best_of(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def flat_case(n: int, dim: int, nq: int, k: int, reps: int) -> dict:
    import faiss

    g = torch.Generator().manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=1)
    q = torch.nn.functional.normalize(torch.randn(nq, dim, generator=g), dim=1)
    tf = flat.TorchFlat(dim, torch.device("cpu"))
    t0 = time.perf_counter()
    tf.add(x)
    add_t = time.perf_counter() - t0
    fx = faiss.IndexFlatIP(dim)
    t0 = time.perf_counter()
    fx.add(x.numpy())
    add_f = time.perf_counter() - t0
    qn = q.numpy()
    s_t, p_t = tf.search(q, k)
    s_f, p_f = fx.search(qn, k)
    same = float((p_t.numpy() == p_f).mean())  # positions, in order
    assert same > 0.999, f"torch and FAISS disagree on {1 - same:.4%} of the positions"
    return {"case": "flat", "tokens": n, "dim": dim, "query_tokens": nq, "k": k, "same_positions": same,
            "max_abs_sim_diff": float(np.abs(s_t.numpy() - s_f).max()),
            "torch_s": best_of(lambda: tf.search(q, k), reps), "faiss_s": best_of(lambda: fx.search(qn, k), reps),
            "torch_add_s": add_t, "faiss_add_s": add_f}


def kmeans_case(n: int, dim: int, nlist: int, two_level: bool) -> dict:
    g = torch.Generator().manual_seed(1)
    # clustered data (nlist * 4 blobs) so that the objective says something
    blobs = torch.nn.functional.normalize(torch.randn(nlist * 4, dim, generator=g), dim=1)
    x = blobs[torch.randint(0, nlist * 4, (n,), generator=g)] + 0.15 * torch.randn(n, dim, generator=g)
    out = {"case": "kmeans-two-level" if two_level else "kmeans", "points": n, "dim": dim, "nlist": nlist,
           "niter": ivf.KMEANS_NITER}
    saved = ivf.faiss
    for name in ("faiss", "torch"):
        ivf.faiss = saved if name == "faiss" else None
        t0 = time.perf_counter()
        c = ivf.train_centroids(x, nlist, two_level=two_level, device="cpu")
        out[f"{name}_s"] = time.perf_counter() - t0
        # mean similarity of a point to its centroid (spherical k-means objective, higher is better)
        out[f"{name}_objective"] = float((x @ c.T).max(dim=1).values.mean() / x.norm(dim=1).mean())
    ivf.faiss = saved
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="100000,1000000")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--query-tokens", type=int, default=32)
    ap.add_argument("--k", type=int, default=512)  # mvdb.engine.search.DEFAULT_K_TOKENS
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    import faiss

    rows = []
    for n in (int(t) for t in a.tokens.split(",")):
        rows.append(flat_case(n, a.dim, a.query_tokens, a.k, a.reps))
        print(json.dumps(rows[-1]), flush=True)
    for n, nlist, two in ((40 * 256, 256, False), (100 * 2048, 2048, True)):  # the IVF build's sample sizes
        rows.append(kmeans_case(n, a.dim, nlist, two))
        print(json.dumps(rows[-1]), flush=True)
    out = {"date": datetime.date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
           "torch": torch.__version__, "faiss": faiss.__version__, "threads": torch.get_num_threads(),
           "load_avg_start": os.getloadavg(), "rows": rows}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "torch-index-cpu.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
