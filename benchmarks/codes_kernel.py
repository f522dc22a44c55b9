"""Launch configs of the approximate MaxSim kernel over residual codes (mvdb.kernels.codes), timed on
candidate pools of the size the codes tier ranks (issue #45): checked against the torch reference first.

    python benchmarks/codes_kernel.py --queries 100 --pool 8192
    TRITON_INTERPRET=1 python benchmarks/codes_kernel.py --docs 200 --queries 2 --pool 16 --nlist 64 --configs 2 \
        --check-width 8                                                   # smoke: tiny, in Triton's CPU interpreter

Times are triton.testing.do_bench's on a GPU; on the CPU (the interpreter: a smoke run, where the
launch settings change nothing) the median of timed calls.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

import torch
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median_ms, write_json  # noqa: E402

from mvdb.kernels.codes import ops  # noqa: E402
from mvdb.kernels.codes.naive import approx_candidates_torch, encode, list_dtype, narrow_lists, train_buckets  # noqa: E402
from mvdb.testing.synthetic import _lengths  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=200_000)
    p.add_argument("--queries", type=int, default=100)
    p.add_argument("--pool", type=int, default=8192)
    p.add_argument("--nlist", type=int, default=16384)
    p.add_argument("--bits", type=int, default=2)
    p.add_argument("--qlen", default="32", help='query lengths: a fixed length or "4-64" (log-uniform)')
    p.add_argument("--grid", default="block_d=16,32,64;warps=2,4;group=4,8",
                   help='launch configs swept: "name=values;..." of block_d, warps, stages, group, half')
    p.add_argument("--configs", type=int, default=None, help="only the first N launch configs of the grid")
    p.add_argument("--check-width", type=int, default=61, help="candidates of each query of the correctness check")
    p.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    a = p.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(0)
    lens = torch.randint(16, 201, (a.docs,), device=dev, generator=g)
    mean_len = float(lens.float().mean())
    off = torch.zeros(a.docs + 1, dtype=torch.int64, device=dev)
    off[1:] = lens.cumsum(0)
    T = int(off[-1])
    cent = torch.nn.functional.normalize(torch.randn(a.nlist, 128, device=dev, generator=g), dim=1)
    lists = torch.randint(0, a.nlist, (T,), device=dev, generator=g, dtype=torch.int32)
    def tokens(a0, a1):  # stored tokens near their list's centroid, made in chunks
        return torch.nn.functional.normalize(cent[lists[a0:a1].long()] + 0.3 * torch.randn(a1 - a0, 128, device=dev,
                                                                                           generator=g), dim=1)

    x = tokens(0, min(T, 200_000))
    cut, w = train_buckets(x - cent[lists[: x.shape[0]].long()], a.bits)
    step = 1 << 22
    codes = torch.cat([encode(tokens(i, min(T, i + step)), lists[i:i + step], cent, cut, a.bits) for i in range(0, T, step)])
    del x
    lists = narrow_lists(lists, list_dtype(a.nlist))  # as the codes tier stores them
    if "-" in a.qlen:  # log-uniform, as the generators' document lengths
        lo, hi = map(int, a.qlen.split("-"))
        q_lens = _lengths(("loguniform", lo, hi), a.queries, "cpu", torch.Generator().manual_seed(1))
    else:
        q_lens = torch.full((a.queries,), int(a.qlen))
    cu = torch.zeros(a.queries + 1, dtype=torch.int32)
    cu[1:] = q_lens.cumsum(0)
    cu = cu.to(dev)
    q = torch.nn.functional.normalize(torch.randn(int(cu[-1]), 128, device=dev, generator=g), dim=1)
    max_lq = int(q_lens.max())
    cand = torch.randint(0, a.docs, (a.queries, a.pool), device=dev, generator=g)
    # the reference on a slice (a query longer than one tile among them), then every config
    qc = torch.nn.functional.normalize(torch.randn(144, 128, device=dev, generator=g), dim=1)
    cuc = torch.tensor([0, 32, 64, 144], dtype=torch.int32, device=dev)
    sub = torch.randint(0, a.docs, (3, a.check_width), device=dev, generator=g)
    ref = approx_candidates_torch(qc, cuc, cent, lists, codes, w, off, sub, a.bits)
    rows = []
    axes = {"block_d": [ops.BLOCK_D], "warps": [ops.WARPS], "stages": [ops.STAGES],
            "group": [ops.GROUP], "half": [ops.HALF]}
    for part in a.grid.split(";"):
        name, values = part.split("=")
        axes[name] = [int(v) for v in values.split(",")]
    grid = list(itertools.product(*axes.values()))[: a.configs]
    for values in grid:
        cfg = dict(zip(axes, values))
        ops.BLOCK_D, ops.WARPS, ops.STAGES, ops.GROUP, ops.HALF = (
            cfg["block_d"], cfg["warps"], cfg["stages"], cfg["group"], bool(cfg["half"]))
        try:
            got = ops.approx_maxsim_candidates(qc, cuc, cent, lists, codes, w, off, sub, a.bits)
            err = float((got - ref).abs().max())
            ok = err <= 0.3
            def run():
                return ops.approx_maxsim_candidates(q, cu, cent, lists, codes, w, off, cand, a.bits, max_seqlen_q=max_lq)

            ms = triton.testing.do_bench(run, warmup=5, rep=30) if dev == "cuda" else median_ms(run, cpu_runs=1)
        except Exception as e:  # noqa: BLE001 - a config that does not compile is a row too
            rows.append({**cfg, "error": str(e)[:120]})
            continue
        tokens = a.queries * a.pool * mean_len
        code_bytes = tokens * (codes.shape[1] + lists.element_size())
        rows.append({**cfg, "correct": ok, "max_err": err, "ms": ms, "ms_per_query": ms / a.queries,
                     "gtokens_s": tokens / ms / 1e6, "gb_s": code_bytes / ms / 1e6})
        print(json.dumps(rows[-1]), flush=True)
    good = [r for r in rows if r.get("correct")]
    best = min(good, key=lambda r: r["ms"]) if good else None
    print("best", json.dumps(best))
    write_json(a.out, f"codes-kernel-{a.pool}-q{a.qlen}.json", {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "args": vars(a),
                                                 "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                                 "tokens": T, "rows": rows, "best": best})


if __name__ == "__main__":
    main()
