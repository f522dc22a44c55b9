"""The DB, ids and --model arguments of the commands: which store directories DB names, whether
it is a database, ids as the database stores them, the text model --model names."""

from __future__ import annotations

import contextlib
import os
import sys

from mvdb.errors import EncoderMismatchError, InvalidInputError


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


def load_model(spec: str, device: str, batch_size: int | None = None):
    """The :class:`mvdb.Encoder` that ``--model SPEC`` names (:func:`mvdb.embed.load_encoder`),
    run on ``--device`` ("auto": cuda when present). A ``module:attr`` imports from the current
    directory too, as ``python -m`` would."""
    from mvdb.embed import load_encoder
    from mvdb.engine.args import device_arg

    if batch_size is not None and batch_size < 1:
        raise InvalidInputError(f"--batch-size: expected 1 or more texts, got {batch_size}")
    if ":" in spec and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return load_encoder(spec, device=str(device_arg(device)), batch_size=batch_size or 32)


@contextlib.contextmanager
def model_checked(spec: str):
    """An EncoderMismatchError (the database holds another model's vectors) names --model."""
    try:
        yield
    except EncoderMismatchError as e:
        raise EncoderMismatchError(f"--model {spec}: {e}") from None


def recorded_model(db: str) -> str | None:
    """The name of the text model whose vectors DB holds (None: no record)."""
    from mvdb.storage import Store

    for p in shard_paths(db):
        with Store(p, read_only=True) as st:
            rec = st.config.get("encoder")
        if rec:
            return rec.get("name")
    return None
