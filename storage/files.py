"""The files of a database directory: their names, and which of them are whose.

    MANIFEST.json            the committed state (mvdb.storage.manifest)
    segments/seg-C-gG-U.h5   a committed segment: C its counter, G the generation of the manifest
                             that first named it, U random
    segments/.tmp-seg-...    a segment being written, or written and named by a committed manifest
                             whose writer has not renamed it yet (the commit is the manifest rename;
                             the segment's own rename follows, and the next writer finishes it)
    segments/commit-G-U.json the commit record of generation G: a copy of the manifest written by
                             every commit that changes only the manifest (a delete, a setting)
    index/*.npy              derived token-index files

A segment only gets its final name after a manifest names it, so a final name not in the manifest
is never an orphan of a crashed write: it is a segment the manifest's own commit dropped (listed
under "retired": a compaction rewrote it; removed right after the commit, or by the next writer
after a crash), or data of a newer manifest that this one replaced (a restored backup, an older
copy put back), which no writer may delete. A compaction's output also lists the segments it
supersedes in its header, so that a recovery without a manifest leaves them out.

A delete or a setting changes only the manifest, so an older manifest put back would undo it
without a trace in segments/. Such a commit first writes its commit record under a temp name; the
manifest it commits names the record, which then gets its final name and replaces the previous
one. A record newer than the manifest means the manifest was put back: writers refuse and
``mvdb recover`` starts from the record, keeping every committed delete.
"""

from __future__ import annotations

import os
import re
import uuid
import zlib
from dataclasses import dataclass, field

from mvdb.kernels.errors import CorruptionError
from mvdb.storage._io import fsync_dir
from mvdb.storage.manifest import MANIFEST

SEGMENTS = "segments"
INDEX = "index"
TMP_PREFIX = ".tmp-"
_NAME = re.compile(r"^seg-(\d+)-g(\d+)-[0-9a-f]+\.h5$")
_LEGACY = re.compile(r"^seg-(\d+)-[0-9a-f]+\.h5$")
_RECORD = re.compile(r"^commit-(\d+)-[0-9a-f]+\.json$")


def segment_name(counter: int, generation: int) -> str:
    """The final name of a new segment: its counter, the generation of the commit naming it."""
    return f"seg-{counter:08d}-g{generation:08d}-{uuid.uuid4().hex[:8]}.h5"


def name_counter(name: str) -> int:
    """A segment's counter from its name (0 for a name mvdb did not make)."""
    m = _NAME.match(name) or _LEGACY.match(name)
    return int(m.group(1)) if m else 0


def name_generation(name: str) -> int | None:
    """The generation recorded in a segment's name (None: a name without one, from mvdb < 0.2)."""
    m = _NAME.match(name)
    return int(m.group(2)) if m else None


def record_name(generation: int) -> str:
    """The name of the commit record of the commit at ``generation``."""
    return f"commit-{generation:08d}-{uuid.uuid4().hex[:8]}.json"


def record_generation(name: str) -> int | None:
    """The generation in a commit record's name (None: not a record's name)."""
    m = _RECORD.match(name)
    return int(m.group(1)) if m else None


def segment_path(db_path: str, name: str) -> str:
    """Where a committed segment's bytes are: its final name, or its temp name while the writer that
    committed it has not renamed it yet. The final path when neither exists."""
    final = os.path.join(db_path, SEGMENTS, name)
    if os.path.exists(final):
        return final
    tmp = os.path.join(db_path, SEGMENTS, TMP_PREFIX + name)
    return tmp if os.path.exists(tmp) else final


def index_bytes(db_path: str, entry: dict) -> bytes:
    """An index file's bytes, checked against the size and CRC-32 its manifest entry records
    (CorruptionError; OSError when it cannot be read)."""
    path = os.path.join(db_path, INDEX, entry["name"])
    with open(path, "rb") as f:
        data = f.read()
    if len(data) != entry["nbytes"] or zlib.crc32(data) != entry["crc32"]:
        raise CorruptionError(f"{path}: size or checksum does not match the manifest")
    return data


def data_files(path: str) -> list[str]:
    """Segment files (and index files) under a database directory, as relative names."""
    out = []
    for sub, suffix in ((SEGMENTS, ".h5"), (INDEX, ".npy")):
        d = os.path.join(path, sub)
        if os.path.isdir(d):
            out += [f"{sub}/{n}" for n in sorted(os.listdir(d)) if n.endswith(suffix) and not n.startswith(TMP_PREFIX)]
    return out


@dataclass
class Census:
    """The segments directory against a manifest (see the module docstring)."""

    unfinished: list[str] = field(default_factory=list)  # named, still at the temp name: rename
    garbage: list[str] = field(default_factory=list)  # temp files no manifest names: a crashed write's
    retired: list[str] = field(default_factory=list)  # final names the manifest's last commit dropped
    unnamed: list[str] = field(default_factory=list)  # other final names the manifest does not name
    unexplained: list[str] = field(default_factory=list)  # of those, with a generation in the name: committed
    newer: list[str] = field(default_factory=list)  # of those: first named by a later generation
    newer_records: list[str] = field(default_factory=list)  # commit records of a later generation
    old_records: list[str] = field(default_factory=list)  # records a later commit replaced: garbage

    @property
    def outdated(self) -> bool:
        """Committed state beside the manifest that it does not account for: writers refuse."""
        return bool(self.unexplained or self.newer_records)


def census(db_path: str, manifest: dict) -> Census:
    """Classify the files of segments/ against ``manifest`` (reads names only)."""
    seg_dir = os.path.join(db_path, SEGMENTS)
    named = {s["name"] for s in manifest["segments"]} | ({manifest["record"]} if manifest.get("record") else set())
    retired = set(manifest.get("retired", ()))
    out = Census()
    try:
        files = set(os.listdir(seg_dir))
    except FileNotFoundError:
        return out
    for f in sorted(files):
        if f.startswith(TMP_PREFIX):
            name = f[len(TMP_PREFIX):]
            if name in named and name not in files:
                out.unfinished.append(name)
            else:
                out.garbage.append(f)
        elif record_generation(f) is not None and f not in named:
            (out.newer_records if record_generation(f) > manifest["generation"] else out.old_records).append(f)
        elif f.endswith(".h5") and f in retired:
            out.retired.append(f)
        elif f.endswith(".h5") and f not in named:
            out.unnamed.append(f)
            gen = name_generation(f)
            if gen is not None:
                out.unexplained.append(f)
                if gen > manifest["generation"]:
                    out.newer.append(f)
    return out


def unexplained_message(db_path: str, manifest: dict, found: Census, *, reader: bool = False) -> str:
    """Why a writer refuses to start beside committed segments or commit records its manifest does
    not name."""
    names = found.unexplained + found.newer_records
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    if found.newer or found.newer_records:
        gen = max([name_generation(n) for n in found.newer] + [record_generation(n) for n in found.newer_records])
        why = (f"were committed after it (generation {gen}; the manifest is at {manifest['generation']}): the "
               f"manifest is older than the data (a restored backup or an older copy put back?)")
    else:
        why = "were committed but the manifest does not name them (an edited or mismatched manifest?)"
    what = "segment(s)" if not found.newer_records else "commit record(s)" if not found.unexplained else "segment(s) and commit record(s)"
    then = ("this reader sees the manifest's state, writers refuse" if reader else
            "a writer would lose them, so nothing was changed; readers see the manifest's state")
    return (f"{db_path}: {len(names)} {what} beside MANIFEST.json {why}: {shown}. {then[0].upper()}{then[1:]}. Rebuild the manifest with "
            f"`mvdb recover {db_path}` (mvdb.recover(path)): it keeps every committed document and delete")


def tidy(db_path: str, manifest: dict) -> None:
    """The writer's start: refuse beside committed segments the manifest does not name (nothing
    changed); finish the renames of committed segments; remove temp files no manifest names,
    segments the last commit retired, index files the manifest does not name, manifest temps."""
    seg_dir = os.path.join(db_path, SEGMENTS)
    os.makedirs(seg_dir, exist_ok=True)
    found = census(db_path, manifest)
    if found.outdated:
        raise CorruptionError(unexplained_message(db_path, manifest, found))
    changed = False
    for name in found.unfinished:
        os.replace(os.path.join(seg_dir, TMP_PREFIX + name), os.path.join(seg_dir, name))
        changed = True
    gone = found.garbage + found.retired + found.old_records
    for name in gone:
        os.unlink(os.path.join(seg_dir, name))
        changed = True
    if changed:
        fsync_dir(seg_dir)
    for name in os.listdir(db_path):
        if name.startswith(MANIFEST + ".tmp"):
            os.unlink(os.path.join(db_path, name))
    index_dir = os.path.join(db_path, INDEX)
    if os.path.isdir(index_dir):
        named = {e["name"] for e in manifest.get("index_files", [])}
        stale = [n for n in os.listdir(index_dir) if n not in named]
        for name in stale:
            os.unlink(os.path.join(index_dir, name))
        if stale:
            fsync_dir(index_dir)
