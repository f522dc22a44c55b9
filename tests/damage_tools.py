"""Ways to damage a database on disk, shared by the reliability, audit and damage tests."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
from mvdb.storage.manifest import checksum


def edit_manifest(path, fn) -> None:
    """Rewrite the manifest through ``fn`` with a valid checksum (damage the checksum cannot see)."""
    p = Path(path) / "MANIFEST.json"
    doc = json.loads(p.read_text())
    body = {k: v for k, v in doc.items() if k != "checksum"}
    fn(body)
    p.write_text(json.dumps(dict(body, checksum=checksum(body))))


def flip(seg: Path, dataset: str, nbytes: int = 8) -> None:
    """Flip ``nbytes`` bytes in the middle of a contiguous dataset of a segment, in place."""
    with h5py.File(seg, "r") as f:
        at, size = f[dataset].id.get_offset(), f[dataset].id.get_storage_size()
    with open(seg, "r+b") as f:
        f.seek(at + size // 2)
        raw = f.read(nbytes)
        f.seek(at + size // 2)
        f.write(bytes(b ^ 0xA5 for b in raw))


def rewrite(db_path, seg: Path, fn) -> None:
    """Change a segment through h5py (``fn(file)``), then record its new size in the manifest, so
    that only the change itself is left to find."""
    with h5py.File(seg, "r+") as f:
        fn(f)
    name = seg.name
    edit_manifest(db_path, lambda m: [s.update(file_size=seg.stat().st_size) for s in m["segments"] if s["name"] == name])
