"""MkDocs hook: lay the package out as it installs, for the API reference.

The wheel maps ``kernels/`` and ``storage/`` into the ``mvdb`` package
(``[tool.setuptools.package-dir]``), which a static reader of the source tree cannot see. This
hook builds ``build/apidoc/mvdb`` from symbolic links (every entry of ``mvdb/`` plus
``kernels`` and ``storage``) so that mkdocstrings reads ``mvdb.kernels`` and ``mvdb.storage``
where ``import`` finds them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from mkdocs.plugins import event_priority

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / "build" / "apidoc"


@event_priority(100)  # before mkdocstrings' own on_config reads the tree's path
def on_config(config, **kwargs):
    pkg = TREE / "mvdb"
    if TREE.exists():
        shutil.rmtree(TREE)
    pkg.mkdir(parents=True)
    for entry in (ROOT / "mvdb").iterdir():
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry)
    for name in ("kernels", "storage"):
        (pkg / name).symlink_to(ROOT / name)
    return config
