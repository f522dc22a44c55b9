"""The benchmark runner (``python -m benchmarks``): its list, every registered script present and
answering ``--help`` on a CPU machine, and one small run writing its results file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).absolute().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.registry import SUITES  # noqa: E402

IDS = [s.name for s in SUITES]
# the scripts as users run them: conftest turns the Triton interpreter on for the tests' kernels
ENV = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
GPU = {"no": "no", "optional": "optional", "1": "yes", "2": "2 GPUs"}


def _runner(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=ENV)


def _help(suite) -> subprocess.CompletedProcess:
    run = ["bash"] if suite.script.endswith(".sh") else [sys.executable]
    try:
        return subprocess.run([*run, str(suite.path), "--help"], cwd=ROOT, capture_output=True, text=True,
                              timeout=120, env=ENV)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(e.cmd, -1, "", f"timed out after {e.timeout} s")


@pytest.fixture(scope="module")
def helps() -> dict:
    """Every registered script's ``--help``, a few at a time (each imports torch)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(IDS, pool.map(_help, SUITES)))


def test_list_names_every_suite_with_its_command_and_gpu():
    r = _runner("list")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 3 * len(SUITES)
    for i, s in enumerate(SUITES):
        name, measures, command = lines[3 * i : 3 * i + 3]
        assert name.split() == [s.name, "GPU:", *GPU[s.gpu].split()]
        assert measures.strip() == s.measures
        assert command.strip() == f"$ {s.command}"


def test_registry_names_are_unique_and_cover_the_docs_suites():
    assert len(IDS) == len(set(IDS))
    for name in ("kernels", "e2e", "grow", "tiers", "large", "serve", "multigpu", "quality", "cpu", "install"):
        assert name in IDS


@pytest.mark.heavy
@pytest.mark.parametrize("suite", SUITES, ids=IDS)
def test_registered_script_exists_and_answers_help(suite, helps):
    assert suite.path.is_file(), suite.path
    r = helps[suite.name]
    assert r.returncode == 0, f"{suite.script} --help: {r.stderr[-2000:]}"
    assert "usage" in r.stdout.lower() or suite.script.endswith(".sh")
    assert r.stdout.strip()


def test_run_unknown_suite_says_which_exist():
    r = _runner("run", "nope")
    assert r.returncode == 2
    assert r.stderr.strip() == f"unknown suite 'nope'; expected one of: {', '.join(IDS)}"


def test_run_refuses_out():
    r = _runner("run", "e2e", "--out", "x")
    assert r.returncode == 2
    assert r.stderr.strip() == "the runner chooses --out; use --results DIR before the suite's name"


@pytest.mark.heavy
def test_run_writes_latest_results_with_machine_versions_and_date(tmp_path):
    r = _runner("--results", str(tmp_path), "run", "first-open", "--docs", "200", timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    path = tmp_path / "first-open-cpu.json"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    res = json.loads(path.read_text())
    assert res["suite"] == "first-open"
    assert res["command"] == "python benchmarks/first_open.py --docs 40000 --docs 200"
    assert res["machine"]["tag"] == "cpu" and res["machine"]["cpu_count"] >= 1
    assert {"python", "torch", "numpy"} <= set(res["versions"])
    assert res["date"].endswith("+00:00")
    assert list(res["results"]) == ["first-open-200-cpu.json"]
