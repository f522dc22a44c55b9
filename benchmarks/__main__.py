"""One runner for the benchmark suites of docs/benchmarks.md.

    python -m benchmarks list                    # name, what it measures, command, GPU
    python -m benchmarks run NAME [ARGS...]      # the suite's script with its default arguments, then ARGS
    python -m benchmarks run NAME --smoke        # its smoke run instead: tiny, on a CPU, in seconds

``run`` executes the suite's script with its JSON going to a scratch folder, then writes
``benchmarks/results/<suite>-<machine>.json`` (the latest run per suite and machine): the suite,
the command, the date (UTC), the machine, the versions and every JSON file the script wrote.
``--results DIR`` (before NAME) writes it elsewhere; ``--label LABEL`` (before NAME) names it
``<suite>-<LABEL>-<machine>.json``, for runs of one suite with different arguments. Where the
tree is a copy on another machine (whose git, if any, may be stale), ``MVDB_GIT_COMMIT`` names its commit. ``--smoke`` runs the script with the suite's
smoke arguments and environment (benchmarks/registry.py) in place of its default arguments, and
names the file ``<suite>-<machine>-smoke.json`` (git-ignored): a check that the script runs end to
end, not a measurement.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

if __package__:
    from .registry import BY_NAME, SUITES, Suite
else:  # python benchmarks/__main__.py
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from registry import BY_NAME, SUITES, Suite

HERE = Path(__file__).resolve().parent


def _gpu_label(gpu: str) -> str:
    return {"no": "no", "optional": "optional", "1": "yes", "2": "2 GPUs"}[gpu]


def cmd_list() -> int:
    width = max(len(s.name) for s in SUITES)
    for s in SUITES:
        print(f"{s.name:<{width}}  GPU: {_gpu_label(s.gpu)}")
        print(f"{'':<{width}}  {s.measures}")
        print(f"{'':<{width}}  $ {s.command}")
    return 0


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine(suite: Suite) -> dict:
    """The machine a run measured: host, CPU, GPUs, and a short tag for the results file's name."""
    info = {"host": platform.node(), "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "platform": platform.platform(), "gpus": []}
    try:
        import torch

        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        pass
    if not info["gpus"] or suite.gpu == "no":
        info["tag"] = "cpu"
    else:
        m = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", info["gpus"][0])
        name = m.group(1) if m else re.sub(r"[^A-Za-z0-9]+", "_", info["gpus"][0])
        info["tag"] = f"{len(info['gpus'])}x{name}" if suite.gpu == "2" else name
    return info


def versions() -> dict:
    out = {"python": platform.python_version()}
    for dist in ("mvdb", "torch", "triton", "numpy", "faiss-cpu", "faiss-gpu"):
        v = _version(dist)
        if v:
            out[dist] = v
    out["git"] = os.environ.get("MVDB_GIT_COMMIT") or None  # a copy of the tree: its git may be stale
    if out["git"] is None:
        try:
            out["git"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                                        text=True, timeout=10).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            pass
    return out


def cmd_run(name: str, extra: list[str], results: Path, label: str | None = None) -> int:
    suite = BY_NAME.get(name)
    if suite is None:
        print(f"unknown suite {name!r}; expected one of: {', '.join(BY_NAME)}", file=sys.stderr)
        return 2
    if label is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", label):
        print(f"--label: expected letters, digits, '.', '_' or '-' (a file name part), got {label!r}",
              file=sys.stderr)
        return 2
    if any(a == "--out" or a.startswith("--out=") for a in extra):
        print("the runner chooses --out; use --results DIR before the suite's name", file=sys.stderr)
        return 2
    smoke = extra[:1] == ["--smoke"]
    if smoke:
        extra = extra[1:]
    with tempfile.TemporaryDirectory(prefix=f"mvdb-bench-{name}-") as tmp, \
            tempfile.TemporaryDirectory(prefix=f"mvdb-bench-{name}-scratch-") as scratch:
        args = [a.replace("{tmp}", scratch) for a in suite.smoke] if smoke else list(suite.args)
        env = {**os.environ, "OUT": tmp}
        if smoke:
            env.update((k, v.replace("{tmp}", scratch)) for k, v in suite.smoke_env)
        if suite.script.endswith(".sh"):
            env.setdefault("PY", sys.executable)  # a script's venvs come from this interpreter, not the PATH's
            argv = ["bash", str(suite.path), *args, *extra]
        else:
            argv = [sys.executable, str(suite.path), *args, *extra, "--out", tmp]
        print("$", " ".join(argv), flush=True)
        date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        t0 = time.perf_counter()
        rc = subprocess.call(argv, cwd=HERE.parent, env=env)
        seconds = time.perf_counter() - t0
        if rc != 0:
            print(f"{suite.script} exited with {rc}; no results written", file=sys.stderr)
            return rc
        files = {}
        for p in sorted(Path(tmp).rglob("*.json")):
            try:
                files[str(p.relative_to(tmp))] = json.loads(p.read_text())
            except ValueError:
                continue
    if not files:
        print(f"{suite.script} wrote no JSON; no results written", file=sys.stderr)
        return 1
    mach = machine(suite)
    command = suite.smoke_command if smoke else suite.command
    res = {"suite": suite.name, "command": " ".join([command, *extra]), "date": date,
           **({"label": label} if label is not None else {}),
           "seconds": round(seconds, 1), "machine": mach, "versions": versions(), "results": files}
    if smoke:
        res["smoke"] = True
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{suite.name}{'' if label is None else '-' + label}-{mach['tag']}{'-smoke' if smoke else ''}.json"
    path.write_text(json.dumps(res, indent=1, default=str) + "\n")
    print("wrote", path)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0],
                                epilog="example: python -m benchmarks run e2e --docs 100000")
    p.add_argument("--results", type=Path, default=HERE / "results", help="folder of the results files")
    p.add_argument("--label", default=None, help="a name part of the results file: <suite>-<LABEL>-<machine>.json")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="the suites: name, what it measures, command, GPU")
    r = sub.add_parser("run", help="run a suite; arguments after NAME go to its script (--smoke first: its "
                                   "smoke run)")
    r.add_argument("name", metavar="NAME")
    r.add_argument("extra", nargs=argparse.REMAINDER, metavar="ARGS")
    a = p.parse_args(argv)
    if a.cmd == "list":
        return cmd_list()
    return cmd_run(a.name, a.extra, a.results, a.label)


if __name__ == "__main__":
    sys.exit(main())
