"""MANIFEST.json: the committed state of a database. Replacing it atomically IS the commit."""

from __future__ import annotations

import copy
import json
import os
import zlib

from mvdb.kernels.errors import CorruptionError, FormatError
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
        "retired": [],  # segments the last commit dropped (a compaction): garbage if still on disk
        "record": None,  # the commit record of the last delete or settings commit (see files.py)
    }


def checksum(body: dict) -> int:
    return zlib.crc32(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def read_manifest(db_path: str) -> dict:
    """Load and check the committed manifest; FormatError for other formats or newer versions."""
    path = os.path.join(db_path, MANIFEST)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except (IsADirectoryError, NotADirectoryError):
        raise CorruptionError(f"{path}: is not a file; expected the database's manifest (`mvdb verify` "
                              f"lists every problem; `mvdb recover` rebuilds it from the segments)") from None
    return parse_manifest(raw, path, db_path)


def parse_manifest(raw: bytes, path: str, db_path: str) -> dict:
    """A manifest's (or a commit record's) body from its bytes, checked like :func:`read_manifest`."""
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
    if doc.get("checksum") != checksum(body):
        raise CorruptionError(f"{path}: manifest checksum mismatch")
    problem = manifest_problem(body)
    if problem:
        raise CorruptionError(f"{path}: {problem}")
    return body


def plain_name(name, suffix: str) -> bool:
    """A file name inside its folder: no separators, no leading dot, no '..', the given suffix."""
    return (isinstance(name, str) and name.endswith(suffix) and not name.startswith(".") and "/" not in name
            and "\\" not in name and os.sep not in name and "\x00" not in name and len(name) <= 255)


def _int(v, lo=None) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and (lo is None or v >= lo)


def manifest_problem(m: dict) -> str | None:
    """What is structurally wrong with a manifest (None when nothing): types, ranges, and every
    file name being a plain name inside the database (never a path that leads elsewhere)."""
    if not (m.get("dim") is None or _int(m.get("dim"), 1)):
        return f"dim: expected a positive int or null, got {m.get('dim')!r}"
    if m.get("dtype") not in ("float16", "int8"):
        return f"dtype: expected 'float16' or 'int8', got {m.get('dtype')!r}"
    if m.get("id_type") not in (None, "int", "str"):
        return f"id_type: expected 'int', 'str' or null, got {m.get('id_type')!r}"
    for key in ("next_id", "generation", "segment_counter"):
        if not _int(m.get(key)):
            return f"{key}: expected an int, got {m.get(key)!r}"
    segs = m.get("segments")
    if not isinstance(segs, list):
        return f"segments: expected a list, got {type(segs).__name__}"
    seen = set()
    for i, seg in enumerate(segs):
        if not isinstance(seg, dict):
            return f"segments[{i}]: expected an object, got {type(seg).__name__}"
        name = seg.get("name")
        if not plain_name(name, ".h5"):
            return f"segments[{i}]: name {name!r} is not a plain .h5 file name inside segments/"
        if name in seen:
            return f"segments[{i}]: {name} is listed twice"
        seen.add(name)
        for key in ("n_docs", "n_tokens", "file_size"):
            if not _int(seg.get(key), 0):
                return f"segments[{i}] ({name}): {key} expected a non-negative int, got {seg.get(key)!r}"
        deleted = seg.get("deleted")
        if not isinstance(deleted, list) or not all(_int(x) for x in deleted):
            return f"segments[{i}] ({name}): deleted expected a list of ints"
        if deleted and (min(deleted) < 0 or max(deleted) >= seg["n_docs"] or len(set(deleted)) != len(deleted)):
            return (f"segments[{i}] ({name}): deleted rows out of range or repeated "
                    f"(the segment holds {seg['n_docs']} documents)")
    config = m.get("config", {})
    if not isinstance(config, dict):
        return f"config: expected an object, got {type(config).__name__}"
    index = config.get("index")
    if index is not None and not (isinstance(index, dict) and index.get("kind") in ("auto", "flat", "ivf")
                                  and (index.get("nlist") is None or _int(index.get("nlist"), 1))):
        return f"config.index: expected {{'kind': 'auto'|'flat'|'ivf', 'nlist': a positive int or null}}, got {index!r}"
    if config.get("encoder") is not None and not isinstance(config["encoder"], dict):
        return f"config.encoder: expected an object, got {type(config['encoder']).__name__}"
    retired = m.get("retired", [])
    if not isinstance(retired, list) or not all(plain_name(n, ".h5") for n in retired):
        return "retired: expected a list of plain .h5 file names inside segments/"
    if seen & set(retired):
        return f"retired: {sorted(seen & set(retired))[0]} is also a live segment"
    record = m.get("record")
    if record is not None and not plain_name(record, ".json"):
        return f"record: expected null or a plain .json file name inside segments/, got {record!r}"
    files = m.get("index_files", [])
    if not isinstance(files, list):
        return f"index_files: expected a list, got {type(files).__name__}"
    for i, e in enumerate(files):
        if not isinstance(e, dict) or not plain_name(e.get("name"), ".npy"):
            return f"index_files[{i}]: name {e.get('name') if isinstance(e, dict) else e!r} is not a plain .npy file name inside index/"
        if not _int(e.get("nbytes"), 0) or not _int(e.get("crc32"), 0):
            return f"index_files[{i}] ({e['name']}): nbytes / crc32 expected non-negative ints"
    return None


def next_manifest(manifest: dict) -> tuple[dict, bytes]:
    """The body the next commit of ``manifest`` writes (generation + 1), and its bytes."""
    body = copy.deepcopy(manifest)
    body["generation"] = manifest["generation"] + 1
    doc = dict(body, checksum=checksum(body))
    return body, json.dumps(doc, indent=1).encode()


def write_manifest(db_path: str, manifest: dict) -> dict:
    """Commit a new manifest (generation + 1); returns what was committed."""
    body, data = next_manifest(manifest)
    atomic_write(os.path.join(db_path, MANIFEST), data)
    return body
