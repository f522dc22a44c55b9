"""The DB and ids arguments of the commands: which store directories DB names, whether it is a
database, ids as the database stores them."""

from __future__ import annotations

import os

from mvdb.errors import InvalidInputError


def shard_paths(db: str, create: int = 0) -> list[str]:
    """The store directories of DB: its shards when it is sharded (``create`` > 0 makes a new
    sharded layout), else DB itself."""
    from mvdb.shards.layout import resolve

    return resolve(db, create, option="--shards")


def require_database(db: str, command: str) -> None:
    """FileNotFoundError unless DB is a database (or a file, which the library then refuses), so a
    writable open does not create an empty one."""
    from mvdb.shards.layout import is_sharded
    from mvdb.storage.manifest import MANIFEST

    if os.path.isfile(db) or is_sharded(db) or os.path.isfile(os.path.join(db, MANIFEST)) \
            or os.path.isdir(os.path.join(db, "segments")):  # a lost manifest: the library says what to do
        return
    where = "no such directory" if not os.path.lexists(db) else f"no {MANIFEST} here"
    raise FileNotFoundError(f"{db}: no database here ({where}; {command} does not create one)")


def ids_arg(d, ids: tuple[str, ...]) -> list:
    """Ids from the command line, as the database stores them (ints or strings)."""
    if (d.stats().get("id_type") or "int") != "int":
        return list(ids)
    out = []
    for x in ids:
        try:
            out.append(int(x))
        except ValueError:
            raise InvalidInputError(f"ids: this database uses int ids, got {x!r}") from None
    return out

