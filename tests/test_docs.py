"""The documentation builds and the README stays a front door (issue #46).

``mkdocs build --strict`` (every warning an error: broken links and anchors, pages outside the nav,
API names mkdocstrings cannot find) runs into a temporary directory. The code blocks of README.md
and docs/ run in tests/test_readme.py. The docs tools come with the ``docs`` extra, which
``make install`` installs, so a missing tool is a failure here, not a skip.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.heavy
def test_mkdocs_build_strict(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", MVDB_PROGRESS="0")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"mkdocs build --strict failed (pip install -e '.[docs]'):\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").read_text().count("mvdb ingest") >= 1


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; the rest belongs in docs/"


def test_readme_links_resolve():
    for target in LINK.findall(README.read_text()):
        if target.startswith(("http://", "https://", "#")):
            continue
        path = target.split("#", 1)[0]
        assert (ROOT / path).exists(), f"README.md links to {target}, which does not exist"


def test_readme_has_no_history():
    text = README.read_text()
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "README.md: dates belong in git, not the README"
    assert not re.search(r"\b[0-9a-f]{7,40}\b", text), "README.md: commit hashes belong in git"
    assert "make demo" in text and "make test" in text


def test_no_team_workflow_or_outside_paths():
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            where = f"{page.relative_to(ROOT)}:{n}"
            assert "gpu_session" not in line and ".gpu/" not in line, f"{where}: the GPU-machine workflow is in CONTRIBUTING.md"
            assert "../shared" not in line and "/work/" not in line, f"{where}: a path outside the repository"
