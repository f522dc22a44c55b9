"""The layout file of a sharded database: ``shards.json`` beside one ordinary database per shard.

    {"format": "mvdb-shards", "version": 1, "placement": "least-loaded", "shards": ["shard-000", ...]}

``shards`` names the shard directories, in order; each is a plain directory name inside the
database (never an absolute path or one with ``..``). ``placement`` is the policy new documents
are placed by (:mod:`mvdb.shards.placement`); a file written before it was recorded reads as
``least-loaded``, the only policy any version has written. Reads never depend on it: every shard
is asked which ids it holds.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from mvdb.errors import CorruptionError, FormatError, InvalidInputError
from mvdb.shards.placement import POLICY

SHARDS = "shards.json"
FORMAT = "mvdb-shards"
VERSION = 1
POLICIES = (POLICY,)


@dataclass(frozen=True)
class Layout:
    """What ``shards.json`` records: the shard directory names (in order) and the placement."""

    shards: list[str]
    placement: str = POLICY


def is_sharded(path) -> bool:
    return os.path.exists(os.path.join(os.fspath(path), SHARDS))


def shard_name(i: int) -> str:
    return f"shard-{i:03d}"


def plain_name(name) -> bool:
    """A directory name inside the database: no separators, no leading dot (so no '..'), no NUL."""
    return (isinstance(name, str) and 0 < len(name) <= 255 and not name.startswith(".") and "/" not in name
            and "\\" not in name and os.sep not in name and "\x00" not in name)


def _check(layout, where: str) -> Layout:
    if not isinstance(layout, dict) or layout.get("format") != FORMAT or not isinstance(layout.get("shards"), list):
        raise FormatError(f"{where}: expected {{'format': '{FORMAT}', 'shards': [...]}}, got {layout!r}")
    placement = layout.get("placement", POLICY)  # files from before the key: the policy they were written by
    if placement not in POLICIES:
        raise FormatError(f"{where}: placement {placement!r}: this version places documents by "
                          f"{', '.join(map(repr, POLICIES))} only")
    names = layout["shards"]
    if not names:
        raise CorruptionError(f"{where}: names no shards")
    for i, name in enumerate(names):
        if not plain_name(name):
            raise CorruptionError(f"{where}: shards[{i}]: {name!r} is not a plain directory name inside the "
                                  f"database (no absolute path, no '..', no separator)")
    if len(set(names)) != len(names):
        raise CorruptionError(f"{where}: a shard is named twice: {names!r}")
    return Layout(list(names), placement)


def read(path) -> Layout:
    """The layout of the sharded database at ``path``: FormatError when the file is not a layout
    this version reads, CorruptionError (naming the file) when a shard name leads outside it."""
    path = os.fspath(path)
    where = os.path.join(path, SHARDS)
    try:
        with open(where) as f:
            layout = json.load(f)
    except (OSError, ValueError) as e:
        raise FormatError(f"{path}: unreadable {SHARDS}: {e}") from None
    return _check(layout, where)


def write(path, names: list[str], placement: str = POLICY) -> None:
    """Write ``shards.json`` atomically (temp file, fsync, rename, fsync of the directory)."""
    path = os.fspath(path)
    layout = _check({"format": FORMAT, "version": VERSION, "placement": placement, "shards": list(names)},
                    os.path.join(path, SHARDS))
    tmp = os.path.join(path, SHARDS + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"format": FORMAT, "version": VERSION, "placement": layout.placement, "shards": layout.shards}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(path, SHARDS))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def shard_dirs(path) -> list[str]:
    """The shard directories of the sharded database at ``path``, in order."""
    return [os.path.join(os.fspath(path), n) for n in read(path).shards]


def has_other_files(path) -> bool:
    """``path`` is a directory holding something other than hidden files."""
    return os.path.isdir(path) and any(not n.startswith(".") for n in os.listdir(path))


def resolve(db, create: int = 0, option: str = "shards") -> list[str]:
    """The store directories of ``db``: its shards when it is sharded, else ``db`` itself.
    ``create`` > 0 makes a new sharded layout of that many shards where there is none (``db`` new
    or empty), and must equal the shard count of an existing one; ``option`` names the argument
    in the messages."""
    db = os.fspath(db)
    if isinstance(create, bool) or not isinstance(create, int) or create < 0:
        raise InvalidInputError(f"{option}: expected 0 or more, got {create!r}")
    if create and not is_sharded(db):
        if has_other_files(db):
            raise InvalidInputError(f"{option}: {db} already exists and is not sharded ({SHARDS} missing)")
        os.makedirs(db, exist_ok=True)
        write(db, [shard_name(i) for i in range(create)])
    if is_sharded(db):
        dirs = shard_dirs(db)
        if create and create != len(dirs):
            raise InvalidInputError(f"{option}: {db} has {len(dirs)} shards, got {option} {create}")
        return dirs
    return [db]
