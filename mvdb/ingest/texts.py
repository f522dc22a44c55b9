"""Reading documents as text for ``mvdb ingest --model``: the text sources.

Formats:
- JSON lines (``.jsonl``, ``.jsonl.gz``): one object per line, its text under ``text_field``
  (default "text"), its id under ``id_field`` (default "id"; every line has one or none does), every
  other field its metadata;
- plain text (``.txt``): one document per non-empty line;
- a directory of ``.txt`` and ``.md`` files, searched recursively (hidden ones left out): one
  document per file, named by its path relative to the directory (``guides/intro.md``).

Documents without ids are named ``<content key>#<row>``, as the embedding sources' are
(:mod:`mvdb.ingest.sources`): the key hashes all of the file's text (decompressed) and the text
field, never the path, so re-running an interrupted ingest skips what is already stored however
the path is spelled, and a file whose text changed gets new ids.

:func:`open_text_sources` reads every document once and checks it (UTF-8, JSON, the fields and
their types, an empty text, metadata the database can store, ids: their type and that none
repeats in or across the sources), raising InvalidInputError that names the file and line, so
that nothing is written unless every source is good; :meth:`TextSource.batches` reads the file
again, ``batch_docs`` documents at a time, and refuses a document that differs from the one
checked (a digest of each is kept) before its batch is written.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from mvdb.encoders import TEXT_KEY
from mvdb.errors import InvalidInputError, MvdbError
from mvdb.ingest.sources import _reading
from mvdb.storage import validate

TEXT_FILES = (".jsonl", ".jsonl.gz", ".txt")
DIR_FILES = (".txt", ".md")
KEY_VERSION = b"mvdb-text-v1"
_NO_ID = object()

TextBatch = tuple[list, list[str], list | None]


@dataclass
class TextSource:
    """One opened and checked text source: ``n`` documents, ids of one ``id_type`` ("int" or
    "str"), either given (``given``: id -> where it is, "file, line N") or ``<key>#<row>``."""

    path: str
    n: int
    key: str | None
    id_type: str
    given: dict | None = field(repr=False)
    _read: Callable[[], Iterator[tuple]] = field(repr=False)
    _document: Callable[[str, str, dict], dict | None] = field(repr=False)
    _digests: bytes = field(repr=False, default=b"")  # each document's 8-byte digest when it was checked

    def batches(self, batch_docs: int = 10_000) -> Iterator[TextBatch]:
        """(ids, texts, metadata or None) of ``batch_docs`` documents at a time, in file order."""
        ids, texts, metas = [], [], []
        row = 0
        for where, doc_id, text, meta in self._read():
            if row == self.n:
                self._changed("more")
            if self._digests and _digest(doc_id, text, meta) != self._digests[8 * row : 8 * row + 8]:
                raise InvalidInputError(f"{where}: changed since the sources were checked (documents before it are "
                                        f"stored; run the ingest again once the file is final)")
            ids.append(f"{self.key}#{row}" if self.key is not None else doc_id)
            texts.append(text)
            metas.append(self._document(where, text, meta))
            row += 1
            if len(ids) == batch_docs:
                yield ids, texts, (None if all(m is None for m in metas) else metas)
                ids, texts, metas = [], [], []
        if row != self.n:
            self._changed(f"{row:,}")
        if ids:
            yield ids, texts, (None if all(m is None for m in metas) else metas)

    def _changed(self, now: str):
        raise InvalidInputError(f"{self.path}: changed while being ingested ({self.n:,} documents when it was "
                                f"checked, {now} now)")


def is_text_source(path) -> bool:
    """Whether ``path`` is a text source: a ``.jsonl``, ``.jsonl.gz`` or ``.txt`` file, or a
    directory holding ``.txt`` / ``.md`` files and no ``.npy`` (a directory of embeddings)."""
    path = os.fspath(path)
    if path.endswith(TEXT_FILES):
        return True
    p = Path(path)
    if not p.is_dir() or any(f.suffix == ".npy" for f in p.iterdir()):
        return False
    return next(iter(_dir_files(p)), None) is not None


def _json_type(x) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null",
             int: "a number", float: "a number"}
    return names.get(type(x), type(x).__name__)


def _constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _lines(path: str, hasher=None) -> Iterator[tuple[int, str]]:
    """(line number, text) of a text file (gzip-compressed for ``.gz``), hashing its bytes."""
    opener = gzip.open if path.endswith(".gz") else open
    with _reading(path), opener(path, "rb") as f:
        for i, raw in enumerate(f, 1):
            if hasher is not None:
                hasher.update(raw)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InvalidInputError(f"{path}, line {i}: not UTF-8 text ({e.reason} at byte {e.start})") from None
            yield i, (line[1:] if i == 1 and line.startswith("\ufeff") else line)


def _jsonl(path: str, text_field: str, id_field: str, hasher=None) -> Iterator[tuple]:
    for i, line in _lines(path, hasher):
        if not line.strip():
            continue
        where = f"{path}, line {i}"
        try:
            obj = json.loads(line, parse_constant=_constant)
        except ValueError as e:
            raise InvalidInputError(f"{where}: not JSON ({e})") from None
        except RecursionError:
            raise InvalidInputError(f"{where}: JSON nested too deeply to read (more than Python's recursion limit "
                                    f"of {sys.getrecursionlimit()} levels)") from None
        if not isinstance(obj, dict):
            raise InvalidInputError(f"{where}: expected a JSON object, got {_json_type(obj)}")
        if text_field not in obj:
            raise InvalidInputError(f"{where}: no {text_field!r} field (the document's text; --text-field names "
                                    f"another)")
        text = obj.pop(text_field)
        if not isinstance(text, str):
            raise InvalidInputError(f"{where}: expected the text ({text_field!r}) as a string, got {_json_type(text)}")
        yield where, obj.pop(id_field, _NO_ID), text, obj


def _txt(path: str, hasher=None) -> Iterator[tuple]:
    for i, line in _lines(path, hasher):
        text = line.rstrip("\r\n")
        if text.strip():
            yield f"{path}, line {i}", _NO_ID, text, {}


def _dir_files(root: Path) -> list[tuple[str, Path]]:
    """(path relative to ``root``, file) of the ``.txt`` / ``.md`` files under it, sorted. A folder
    that cannot be listed, or a link to a file outside ``root``, is an error (not skipped, not
    followed): a directory source is what is under it."""
    def unreadable(e: OSError):
        raise InvalidInputError(f"{e.filename}: cannot list it ({e.strerror})")

    out = []
    top = root.resolve()
    for d, dirs, names in os.walk(root, onerror=unreadable):
        dirs[:] = [x for x in dirs if not x.startswith(".")]
        for name in names:
            if name.endswith(DIR_FILES) and not name.startswith("."):
                f = Path(d) / name
                if not f.resolve().is_relative_to(top):
                    raise InvalidInputError(f"{f}: a link to {f.resolve()}, outside the directory {root}; "
                                            "expected the directory's own files")
                out.append((f.relative_to(root).as_posix(), f))
    return sorted(out)


def _directory(files: list[tuple[str, Path]]) -> Iterator[tuple]:
    for rel, f in files:
        with _reading(str(f)):
            raw = f.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidInputError(f"{f}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        yield str(f), rel, text.removeprefix("\ufeff"), {}


def _check_id(where: str, x) -> str:
    """The kind of a given id ("int" or "str"), or InvalidInputError saying what is wrong with it."""
    if isinstance(x, bool) or not isinstance(x, (int, str)):
        raise InvalidInputError(f"{where}: expected the id as an integer or a string, got {_json_type(x)}")
    if isinstance(x, int):
        if not -(2**63) <= x <= validate.MAX_ID:
            raise InvalidInputError(f"{where}: int ids must fit in 64 bits, got {x}")
        return "int"
    if not x or "\x00" in x:
        raise InvalidInputError(f"{where}: expected a non-empty id without NUL characters, got {x!r}")
    if len(validate.unicode_text(x, where)) > validate.MAX_STR_ID_BYTES:
        raise InvalidInputError(f"{where}: expected at most {validate.MAX_STR_ID_BYTES} UTF-8 bytes per str id")
    return "str"


def _digest(doc_id, text: str, meta: dict) -> bytes:
    """A document as it was read (id, text, metadata), in 8 bytes: what is stored is what was checked."""
    h = hashlib.blake2b(digest_size=8)
    h.update(repr(doc_id if doc_id is not _NO_ID else None).encode() + b"\0" + text.encode("utf-8", "surrogatepass")
             + b"\0" + json.dumps(meta, sort_keys=True, default=repr).encode())
    return h.digest()


def _document(where: str, text: str, meta: dict, store_text: bool, text_field: str) -> dict | None:
    """The metadata stored with one document (its text under TEXT_KEY where ``store_text``),
    checked as the database checks it."""
    if not text.strip():
        raise InvalidInputError(f"{where}: empty text (nothing to encode)")
    validate.unicode_text(text, where)
    if store_text:
        if TEXT_KEY in meta and meta[TEXT_KEY] != text:
            raise InvalidInputError(f"{where}: the text ({text_field!r}) is stored under {TEXT_KEY!r}, where this "
                                    f"line has another value: rename that field, or pass --no-store-text")
        meta = dict(meta, **{TEXT_KEY: text})
    if not meta:
        return None
    try:
        validate.metadata([meta], 1)
    except MvdbError as e:
        raise InvalidInputError(f"{where}: metadata: {str(e).removeprefix('metadata[0]: ')}") from None
    return meta


def open_text_source(path, *, text_field: str = "text", id_field: str = "id", store_text: bool = True) -> TextSource:
    """Open and check one text source (see the module docstring)."""
    path = os.fspath(path)
    p = Path(path)
    if p.is_dir():
        files = _dir_files(p)
        if not files:
            raise InvalidInputError(f"{path}: a directory of .txt / .md files, but it holds none")

        def read(hasher=None):
            return _directory(files)

        hasher = None
    elif not p.exists():
        raise InvalidInputError(f"{path}: no such file or directory")
    elif path.endswith(TEXT_FILES):
        jsonl = not path.endswith(".txt")
        hasher = hashlib.blake2b(digest_size=12, person=KEY_VERSION)
        hasher.update(b"jsonl\0" + text_field.encode() + b"\0" if jsonl else b"txt\0")

        def read(hasher=None):
            return _jsonl(path, text_field, id_field, hasher) if jsonl else _txt(path, hasher)
    else:
        raise InvalidInputError(f"{path}: unknown text format (expected .jsonl, .jsonl.gz, .txt or a directory of "
                                f".txt / .md files)")
    def document(where, text, meta):
        return _document(where, text, meta, store_text, text_field)

    n, given, kind, first, digests = 0, {}, None, None, bytearray()
    for where, doc_id, text, meta in read(hasher):
        document(where, text, meta)
        digests += _digest(doc_id, text, meta)
        if first is None:
            first = (where, doc_id is not _NO_ID)
        elif (doc_id is not _NO_ID) != first[1]:
            has, lacks = (first[0], where) if first[1] else (where, first[0])
            raise InvalidInputError(f"{lacks}: no {id_field!r} field, but {has} has one: give every document an "
                                    f"id, or none")
        if doc_id is not _NO_ID:
            k = _check_id(where, doc_id)
            if kind is not None and k != kind:
                raise InvalidInputError(f"{where}: a {k} id, but the ids before it are {kind}s (one kind per "
                                        f"database)")
            kind = k
            if doc_id in given:
                raise InvalidInputError(f"{where}: id {doc_id!r} appears more than once (also at {given[doc_id]})")
            given[doc_id] = where
        n += 1
    if n == 0:
        raise InvalidInputError(f"{path}: no documents in it")
    if first[1]:
        return TextSource(path, n, None, kind, given, read, document, bytes(digests))
    return TextSource(path, n, hasher.hexdigest(), "str", None, read, document, bytes(digests))


def open_text_sources(paths, *, text_field: str = "text", id_field: str = "id",
                      store_text: bool = True) -> list[TextSource]:
    """Open and check every text source of ``paths``, and that their ids are of one kind and none
    is given by two of them."""
    srcs = [open_text_source(p, text_field=text_field, id_field=id_field, store_text=store_text) for p in paths]
    kinds = {s.id_type for s in srcs}
    if len(kinds) > 1:
        a = next(s for s in srcs if s.id_type == "int")
        b = next(s for s in srcs if s.id_type == "str")
        raise InvalidInputError(f"sources: {a.path} has int ids, {b.path} str ids (a database holds one kind)")
    seen: dict = {}
    for s in srcs:
        for doc_id, where in (s.given or {}).items():
            if doc_id in seen:
                raise InvalidInputError(f"{where}: id {doc_id!r} is also at {seen[doc_id]}")
            seen[doc_id] = where
    return srcs
