"""MANIFEST.json: the committed state of a database. Replacing it atomically IS the commit."""

from __future__ import annotations

import copy
import json
import os
import zlib

from mvdb.errors import CorruptionError, FormatError
from mvdb.storage._io import atomic_write

FORMAT = "mvdb"
FORMAT_VERSION = 1
MANIFEST = "MANIFEST.json"


def new_manifest(dim: int, dtype: str) -> dict:
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "dim": dim,
        "dtype": dtype,
        "id_type": None,  # "int" or "str", fixed by the first add
        "next_id": 0,  # the next auto-assigned int id
        "generation": 0,  # bumped by every commit
        "segment_counter": 0,
        "segments": [],  # [{"name", "n_docs", "n_tokens", "file_size", "deleted": [rows]}]
        "index_files": [],  # derived token-index files, versioned with the manifest
    }


def _checksum(body: dict) -> int:
    return zlib.crc32(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def read_manifest(db_path: str) -> dict:
    """Load and check the committed manifest; FormatError for other formats or newer versions."""
    path = os.path.join(db_path, MANIFEST)
    with open(path, "rb") as f:
        raw = f.read()
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise CorruptionError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise FormatError(f"{path}: expected an mvdb manifest (format 'mvdb'), got {str(doc)[:80]!r}")
    version = doc.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise FormatError(
            f"{db_path}: written by a newer mvdb (format version {version}); this version reads up to "
            f"{FORMAT_VERSION}: upgrade mvdb"
        )
    body = {k: v for k, v in doc.items() if k != "checksum"}
    if doc.get("checksum") != _checksum(body):
        raise CorruptionError(f"{path}: manifest checksum mismatch")
    return body


def write_manifest(db_path: str, manifest: dict) -> dict:
    """Commit a new manifest (generation + 1); returns what was committed."""
    body = copy.deepcopy(manifest)
    body["generation"] = manifest["generation"] + 1
    doc = dict(body, checksum=_checksum(body))
    atomic_write(os.path.join(db_path, MANIFEST), json.dumps(doc, indent=1).encode())
    return body
