"""Every code block of the README and of docs/ runs as written (issues #18, #46).

Each ```python block of README.md and docs/**/*.md runs in a fresh interpreter in its own empty directory (so relative paths
such as "my.mvdb" land there), with ``TRITON_INTERPRET=1`` where there is no CUDA. A block may be
preceded by a marker comment:

- ``<!-- readme-test: gpu -->``: runs only where CUDA is present;
- ``<!-- readme-test: server (...) -->``: the test first serves an empty database on
  127.0.0.1:8000 (the address the block connects to);
- ``<!-- readme-test: st6 -->``: runs with Sentence Transformers 6 first on the path (``make
  install`` puts it in ``.st6``, beside the 5.3 that PyLate pins);
- ``<!-- readme-test: skip (reason) -->``: not run; the reason must say why (and is listed by
  ``test_every_block_is_run_or_says_why_not``).

```bash`` blocks without a marker run under bash the same way; ```text and ```mermaid blocks are
not code. The markers are documented in CONTRIBUTING.md.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"(?:<!-- readme-test: (?P<mark>\w+)(?P<why>[^>]*)-->\n)?```(?P<lang>\w*)\n(?P<body>.*?)```", re.S)


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
NOT_CODE = ("text", "mermaid")


def _blocks():
    out = []
    for page in PAGES:
        text = page.read_text()
        name = page.relative_to(ROOT).as_posix()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start("lang")) + 1
            out.append({"where": f"{name}:{line}", "line": line, "lang": m["lang"], "mark": m["mark"],
                        "why": (m["why"] or "").strip(), "body": m["body"]})
    return out


BLOCKS = _blocks()
RUNNABLE = [b for b in BLOCKS if b["lang"] in ("python", "bash") and b["mark"] != "skip"]


def test_every_block_is_run_or_says_why_not():
    for b in BLOCKS:
        assert b["lang"] in ("python", "bash", *NOT_CODE), f"{b['where']}: a code block needs a language"
        assert b["mark"] in (None, "gpu", "server", "st6", "skip"), f"{b['where']}: unknown marker {b['mark']}"
        if b["mark"] == "skip":
            assert b["why"].startswith("(") and len(b["why"]) > 10, f"{b['where']}: skip without a reason"
    for b in RUNNABLE:  # run, it would change the environment the other tests run in
        assert not re.search(r"\bpip3?\s+install\b|-m\s+pip\s+install\b", b["body"]), \
            f"{b['where']}: installs packages; mark it skip (the install test covers installs)"
    assert len(RUNNABLE) >= 15
    skipped = [b for b in BLOCKS if b["mark"] == "skip"]
    assert len(skipped) <= 6, f"keep skipped blocks few: {[b['where'] for b in skipped]}"


def _env():
    # `python` and `mvdb` in a block are this interpreter's (its venv's bin first), not another one
    # the PATH happens to list first
    path = os.pathsep.join((os.path.dirname(sys.executable), os.environ.get("PATH", "")))
    env = dict(os.environ, MVDB_PROGRESS="0", PYTHONUNBUFFERED="1", PATH=path)
    if not torch.cuda.is_available():
        env.setdefault("TRITON_INTERPRET", "1")
    return env


@pytest.mark.heavy
@pytest.mark.parametrize("block", RUNNABLE, ids=[b["where"] for b in RUNNABLE])
def test_readme_block_runs(block, tmp_path):
    if block["mark"] == "gpu" and not torch.cuda.is_available():
        pytest.skip("a GPU-only block")
    for module in ("ray", "pylate"):
        if f"import {module}" in block["body"] or f"from {module} " in block["body"]:
            pytest.importorskip(module)
    server = None
    if block["mark"] == "server":
        pytest.importorskip("fastapi")
        from mvdb.serve import Server

        try:
            server = Server(str(tmp_path / "served.mvdb"), port=8000, device="cpu")
        except Exception as e:  # noqa: BLE001 - the port is taken on this machine
            pytest.skip(f"cannot serve on 127.0.0.1:8000 here: {e}")
    env = _env()
    if block["mark"] == "st6":
        st6 = ROOT / ".st6"
        if not (st6 / "sentence_transformers").is_dir():
            pytest.skip(f"no Sentence Transformers 6 in {st6} (make install puts it there)")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(st6), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-c", block["body"]] if block["lang"] == "python" else ["bash", "-euo", "pipefail", "-c",
                                                                                 block["body"]]
    try:
        r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    finally:
        if server is not None:
            server.stop()
    assert r.returncode == 0, f"{block['where']} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
