"""What the LangChain and LlamaIndex adapters share: a text database, its string ids, its filters.

Both frameworks name documents by str ids; an mvdb database holds all-str or all-int ids
(``stats()["id_type"]``). :class:`TextStore` keeps the id a user gives the id they get back:

- a database with str ids (or an empty one) stores the str as it is; ids not given are new
  ``uuid4`` strings, as LangChain's own stores make them;
- a database with int ids (filled by ``db.add`` / ``db.add_texts`` without ids) is read and written
  through the decimal form of its ids: ``"17"`` is the id 17, an id not given is the database's
  next int, and a str that is not the canonical decimal of an int is refused (``"007"`` would
  come back as ``"7"``).

The text of a document is the one ``add_texts(store_text=True)`` keeps in its metadata under
``"text"`` (:data:`mvdb.encoders.TEXT_KEY`); the frameworks' metadata is the rest of the dict.
"""

from __future__ import annotations

import uuid

import numpy as np

from mvdb.encoders import TEXT_KEY, Encoder, as_encoder
from mvdb.errors import InvalidInputError, InvalidTypeError

__all__ = ["FIELD_OPS", "LOGICAL", "TEXT_KEY", "TextStore", "mongo_where"]

FIELD_OPS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists")  # mvdb's where language
LOGICAL = ("$and", "$or", "$not")
SEARCH_OPTIONS = ("n_candidates", "nprobe", "k_tokens", "exact")  # search's options a framework may pass on


def _canonical_int(s: str) -> int | None:
    """The int whose decimal form is exactly ``s`` (None when there is none: "007", "1.0", "x")."""
    try:
        v = int(s)
    except ValueError:
        return None
    return v if str(v) == s else None


class TextStore:
    """A database-shaped object (``mvdb.open(...)``, a sharded database, the Ray cluster, the
    HTTP client) and the multi-vector encoder of its texts, seen through str ids."""

    def __init__(self, db, encoder, who: str):
        for name in ("add_texts", "search_text", "metadata", "contains", "delete", "stats"):
            if not callable(getattr(db, name, None)):
                raise InvalidTypeError(f"{who}: expected an mvdb database (mvdb.open(...)), got "
                                       f"{type(db).__name__} (no {name})")
        if encoder is None:
            encoder = getattr(db, "encoder", None)
            if encoder is None:
                raise InvalidInputError(f"{who}: no encoder: pass encoder= (an mvdb.Encoder or a model) or open "
                                        f"the database with mvdb.open(path, encoder=model)")
        self.db = db
        self.encoder: Encoder = as_encoder(encoder)
        self.who = who
        self._id_type: str | None = None

    # ---- ids

    def id_type(self) -> str | None:
        """"str", "int", or None for a database that never held a document (then asked again)."""
        if self._id_type is None:
            self._id_type = self.db.stats().get("id_type")
        return self._id_type

    def new_keys(self, ids, n: int) -> list | None:
        """The database ids for ``n`` new texts given the framework's ``ids`` (None, or a list of str
        or None per text); None lets the database number them (an int-id database)."""
        int_ids = self.id_type() == "int"
        if ids is None:
            return None if int_ids else [str(uuid.uuid4()) for _ in range(n)]
        if isinstance(ids, (str, bytes)) or not isinstance(ids, (list, tuple)):
            raise InvalidTypeError(f"ids: expected a list of str (one per text), got {type(ids).__name__}")
        if len(ids) != n:
            raise InvalidInputError(f"ids: expected {n} ids (one per text), got {len(ids)}")
        out = []
        for i, v in enumerate(ids):
            if v is None:
                if int_ids:
                    raise InvalidInputError(f"ids[{i}]: this database uses int ids: give every id (the decimal "
                                            f"form of an int) or none, got None among given ones")
                out.append(str(uuid.uuid4()))
                continue
            if not isinstance(v, str):
                raise InvalidTypeError(f"ids[{i}]: expected a str (the frameworks' ids are strings), got "
                                       f"{type(v).__name__} {v!r:.40}")
            if int_ids:
                k = _canonical_int(v)
                if k is None:
                    raise InvalidInputError(f"ids[{i}]: this database uses int ids: expected the decimal form of an "
                                            f"int such as '17', got {v!r:.60}")
                out.append(k)
            else:
                out.append(v)
        return out

    def keys(self, ids, what: str = "ids", strict: bool = False) -> list:
        """The database ids for the framework's str ids. Over an int-id database a str that is no
        int's decimal form names no document: left out, or with ``strict`` (a delete, which must
        find every id) an error."""
        if isinstance(ids, (str, bytes)) or not isinstance(ids, (list, tuple)):
            raise InvalidTypeError(f"{what}: expected a list of str, got {type(ids).__name__}")
        bad = [v for v in ids if not isinstance(v, str)]
        if bad:
            raise InvalidTypeError(f"{what}: expected str ids, got {type(bad[0]).__name__} {bad[0]!r:.40}")
        if self.id_type() != "int":
            return list(ids)
        keys = [_canonical_int(v) for v in ids]
        if strict and None in keys:
            bad = ids[keys.index(None)]
            raise InvalidInputError(f"{what}: this database uses int ids: expected the decimal form of an int such "
                                    f"as '17', got {bad!r:.60}")
        return [k for k in keys if k is not None]

    def present(self, keys: list) -> list:
        """The ``keys`` that are stored, in order, each once."""
        keys = list(dict.fromkeys(keys))
        if not keys:
            return []
        return [k for k, there in zip(keys, np.asarray(self.db.contains(keys))) if there]

    # ---- writing and reading

    def add(self, texts, metadatas, keys) -> list[str]:
        """``add_texts(store_text=True)`` in one commit (all or nothing) -> the str ids."""
        got = self.db.add_texts(texts, ids=keys, metadata=metadatas, store_text=True, encoder=self.encoder)
        if self._id_type is None:
            self._id_type = "int" if got and not isinstance(got[0], str) else ("str" if got else None)
        return [str(k) for k in got]

    def records(self, keys: list) -> list[tuple[str, str, dict]]:
        """(str id, stored text, the rest of the metadata) of stored ``keys``; a document stored
        without text comes back with ``""``."""
        if not keys:
            return []
        out = []
        for k, meta in zip(keys, self.db.metadata(keys)):
            meta = dict(meta or {})
            text = meta.pop(TEXT_KEY, "")
            out.append((str(k), text if isinstance(text, str) else str(text), meta))
        return out

    def search(self, query: str, k: int, where, options: dict) -> list:
        """``search_text`` of one query -> [Hit]."""
        if not isinstance(query, str):
            raise InvalidTypeError(f"query: expected a str, got {type(query).__name__}")
        self.check_options(options)
        return self.db.search_text(query, k=k, where=where, encoder=self.encoder, **options)

    def check_options(self, options: dict) -> None:
        unknown = sorted(set(options) - set(SEARCH_OPTIONS))
        if unknown:
            raise InvalidTypeError(f"{self.who}: unexpected search options {unknown}; expected a filter and mvdb's "
                                   f"search options {', '.join(SEARCH_OPTIONS)}")

    def keys_where(self, where) -> list:
        """Every stored id whose metadata matches ``where`` (None: every stored id), through an
        exact search with a zero query (each match scores 0)."""
        n = len(self.db)
        dim = self.db.dim
        if n == 0 or dim is None:
            return []
        hits = self.db.search(np.zeros((1, dim), dtype=np.float32), k=n, where=where, exact=True)
        return [h.id for h in hits]


def mongo_where(filter, what: str = "filter"):
    """A LangChain filter dict (the Mongo-style dialect of Chroma, PGVector, ...) -> mvdb ``where``.

    Field conditions ``{"f": value}`` and ``{"f": {"$op": ...}}`` with ``$eq $ne $gt $gte $lt $lte
    $in $nin $exists`` pass as they are, ``$between: [lo, hi]`` becomes ``$gte`` / ``$lte``, and
    ``$and`` / ``$or`` (lists) and ``$not`` combine them. ``None`` and ``{}`` mean no filter. Anything
    else (``$like``, ``$contains``, a callable, ...) is an error naming what was expected."""
    if filter is None or (isinstance(filter, dict) and not filter):
        return None
    return _where(filter, what, top=True)


def _where(f, at: str, top: bool = False) -> dict:
    if not isinstance(f, dict):
        err = InvalidTypeError if top else InvalidInputError
        raise err(f"{at}: expected a dict of metadata conditions (mvdb's where language: {{'field': value}}, "
                  f"{{'field': {{'$op': value}}}} with {', '.join(FIELD_OPS)}, $between, or {', '.join(LOGICAL)}), "
                  f"got {type(f).__name__}")
    if not f:
        raise InvalidInputError(f"{at}: expected a non-empty dict of conditions, got {{}}")
    out = {}
    for key, cond in f.items():
        here = f"{at}[{key!r}]"
        if not isinstance(key, str):
            raise InvalidInputError(f"{here}: expected a str field name or operator, got {type(key).__name__}")
        if key in ("$and", "$or"):
            if not isinstance(cond, (list, tuple)) or not cond:
                raise InvalidInputError(f"{here}: expected a non-empty list of filters, got {cond!r:.60}")
            out[key] = [_where(c, f"{here}[{i}]") for i, c in enumerate(cond)]
        elif key == "$not":
            out[key] = _where(cond, here)
        elif key.startswith("$"):
            raise InvalidInputError(f"{here}: unknown operator {key!r}: mvdb combines filters with "
                                    f"{', '.join(LOGICAL)} only")
        else:
            out[key] = _field(cond, here)
    return out


def _field(cond, at: str):
    if not isinstance(cond, dict):
        return cond  # equality; mvdb checks the value (a JSON value)
    if not cond:
        raise InvalidInputError(f"{at}: expected a value or a dict of operators, got {{}}")
    out = {}
    for op, arg in cond.items():
        if op == "$between":
            if not isinstance(arg, (list, tuple)) or len(arg) != 2:
                raise InvalidInputError(f"{at}['$between']: expected a list [low, high], got {arg!r:.60}")
            out["$gte"], out["$lte"] = arg
        elif op in FIELD_OPS:
            out[op] = arg
        else:
            what = f"the operator {op!r}" if isinstance(op, str) and op.startswith("$") else f"the key {op!r}"
            raise InvalidInputError(f"{at}: mvdb cannot express {what}; expected one of {', '.join(FIELD_OPS)}, "
                                    f"$between (or a plain value for equality; {{'$eq': {{...}}}} for a dict value)")
    return out
