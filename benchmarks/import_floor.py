"""The floor under the time from process start to a first hit (issue #57): a new Python process
that only imports torch, one that also makes the CUDA context, and the same with ``import mvdb``.
Each figure is a whole process's wall time, launch to exit; ``--rounds`` of each.

    python benchmarks/import_floor.py --rounds 3 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

CASES = {
    "python": "pass",
    "numpy": "import numpy",
    "torch": "import torch",
    "torch_cuda_ctx": "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()",
    "torch_mvdb": "import torch, mvdb",
    "torch_mvdb_cuda_ctx": "import torch, mvdb; torch.zeros(1, device='cuda'); torch.cuda.synchronize()",
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None, help="a folder for import-floor.json")
    args = p.parse_args()
    import torch

    cases = {k: v for k, v in CASES.items() if torch.cuda.is_available() or "cuda" not in k}
    rounds = []
    for _ in range(args.rounds):
        row = {}
        for name, code in cases.items():
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True)
            row[name] = round(time.perf_counter() - t0, 3)
        rounds.append(row)
        print(json.dumps(row), flush=True)
    res = {"suite": "import_floor", "command": "python " + " ".join(["benchmarks/import_floor.py"] + sys.argv[1:]),
           "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "torch": torch.__version__, "seconds": rounds}
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "import-floor.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
