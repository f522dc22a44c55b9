"""What the GPU's memory moves per second on the issue #17 hard-negative training shape, to bound
its step from below: the documents [256 x 16, 1,030, 128] bf16 (1.08 GB) are read once by the
forward and their gradient (the same size, mostly zeros) is written once by the backward.

    python benchmarks/hbm_floor.py --out DIR     # GPU; JSON hbm-floor.json

Times (medians of triton's do_bench, L2 flushed between runs) of a read (``amax``), a write
(``fill_``) and a copy (read + write) of that tensor, their bandwidths, and the step's floor:
read time + write time, against the issue's 1.2x-of-LIK target (LIK lowmem's GPU time in
README's training table divided by 1.2).
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import triton.testing


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--lik-ms", type=float, default=0.82, help="LIK lowmem's GPU ms on the shape (README table)")
    args = ap.parse_args()
    x = torch.randn(256 * 16, 1030, 128, device="cuda").bfloat16()
    y = torch.empty_like(x)
    gb = x.numel() * x.element_size() / 1e9

    def ms(fn):
        return float(triton.testing.do_bench(fn, warmup=25, rep=300, return_mode="median"))

    read, write, copy = ms(lambda: x.amax()), ms(lambda: y.fill_(0)), ms(lambda: y.copy_(x))
    res = dict(device=torch.cuda.get_device_name(), gb=gb, read_ms=read, write_ms=write, copy_ms=copy,
               read_tb_s=gb / read, write_tb_s=gb / write, copy_tb_s=2 * gb / copy,
               step_floor_ms=read + write, target_ms=args.lik_ms / 1.2, lik_lowmem_ms=args.lik_ms)
    print(json.dumps(res, indent=1))
    with open(os.path.join(args.out, "hbm-floor.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
