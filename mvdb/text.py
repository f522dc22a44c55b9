"""Text in, text out: ``add_texts`` and ``search_text`` of :class:`mvdb.Database` and
:class:`mvdb.shards.local.ShardedDatabase` (the :class:`TextMethods` mixin), and the encoder record.

    db = mvdb.open("my.mvdb", encoder=model)      # a model object or an mvdb.Encoder
    ids = db.add_texts(["a text", ...], store_text=True)
    hits = db.search_text("a question", k=10)

The record: the first ``add_texts`` commits ``encoder.record()`` (:mod:`mvdb.encoders`) under the
key ``"encoder"`` of the manifest's ``config`` (every shard's, for a sharded database). From then on
the vectors must not be mixed: opening with ``encoder=`` a model that differs from the record in
one of :data:`mvdb.encoders.IDENTITY` (name, kind, dim, document_max_tokens, normalize,
adapter_version), or passing one to ``add_texts`` / ``search_text``, raises
:class:`mvdb.EncoderMismatchError` naming both. A database without live documents takes a new
record (there is nothing to mix). ``query_max_tokens`` is recorded but may differ (it shapes the
queries only).

``db.add(embeddings)`` stays allowed on a database with a record: mvdb cannot tell which model
made given vectors, so they must come from the recorded one (``db.encoder.encode(texts)`` makes
them), as the vectors of a database filled through ``add`` alone (no record; the first
``add_texts`` records its encoder) are the user's to keep consistent. A database opened without an
encoder searches by embeddings as before; ``stats()["encoder"]`` names the recorded model.
"""

from __future__ import annotations

import numpy as np

from mvdb.encoders import IDENTITY, TEXT_KEY, Encoder, as_encoder, differences, texts_arg
from mvdb.pooling import check_pooling_encoder, pooling_arg
from mvdb.errors import (
    DuplicateIdError,
    EncoderMismatchError,
    InvalidInputError,
    InvalidTypeError,
)

__all__ = ["TEXT_KEY", "TextMethods", "check_encoder", "check_record", "record_config", "recorded_encoder"]



def recorded_encoder(stores) -> dict | None:
    """The encoder record of a database (the first of its stores that has one)."""
    return next((s.config["encoder"] for s in stores if s.config.get("encoder")), None)


def _describe(rec: dict) -> str:
    return (f"{rec.get('name')!r} ({rec.get('kind')}, dim {rec.get('dim')}, document_max_tokens "
            f"{rec.get('document_max_tokens')}, normalize {rec.get('normalize')!r}, adapter "
            f"v{rec.get('adapter_version')})")


def check_encoder(encoder: Encoder | None, recorded: dict | None, path, n_live: int) -> None:
    """EncoderMismatchError when ``encoder`` would mix its vectors with those of the record."""
    if encoder is not None:
        check_record(encoder.record(), recorded, path, n_live)


def check_record(record: dict, recorded: dict | None, path, n_live: int) -> None:
    """EncoderMismatchError when vectors of the encoder ``record`` would mix with those of ``recorded``."""
    if recorded is None or n_live == 0:
        return
    diff = differences(record, recorded)
    if diff:
        raise EncoderMismatchError(
            f"{path}: its {n_live:,} documents were encoded by {_describe(recorded)}; the encoder given is "
            f"{_describe(record)} (differs in {', '.join(diff)}). Vectors of different models "
            f"must not be mixed: open it with the recorded model and settings (mvdb.Encoder(model, "
            f"name=..., document_max_tokens=...)), or encode into a new database")


def record_config(config: dict, record: dict | None) -> dict | None:
    """The config a store whose config is ``config`` commits with its next batch so that it
    records the encoder ``record``; None when there is nothing to record (no record, or one that
    differs from the store's only where records may differ)."""
    if record is None:
        return None
    had = config.get("encoder")
    if had is not None and not differences(record, had):
        return None
    return dict(config, encoder=dict(record))


def merge_text(texts: list[str], metadata, store_text: bool) -> list | None:
    """The metadata ``add`` gets: the user's, each with ``TEXT_KEY`` set to its text when
    ``store_text`` (an error when the user's dict already holds a different value there)."""
    n = len(texts)
    if metadata is not None:
        if not isinstance(metadata, (list, tuple)):
            raise InvalidTypeError(f"metadata: expected a list of dicts (one per text), got {type(metadata).__name__}")
        if len(metadata) != n:
            raise InvalidInputError(f"metadata: expected {n} entries (one per text), got {len(metadata)}")
    if not isinstance(store_text, bool):
        raise InvalidTypeError(f"store_text: expected a bool, got {type(store_text).__name__}")
    if not store_text:
        return None if metadata is None else list(metadata)
    out = []
    for i, text in enumerate(texts):
        m = None if metadata is None else metadata[i]
        if m is None:
            out.append({TEXT_KEY: text})
            continue
        if not isinstance(m, dict):
            raise InvalidTypeError(f"metadata[{i}]: expected a dict or None, got {type(m).__name__}")
        if TEXT_KEY in m and m[TEXT_KEY] != text:
            raise InvalidInputError(f"metadata[{i}]: store_text=True puts the text under {TEXT_KEY!r}, which "
                                    f"already holds a different value ({str(m[TEXT_KEY])[:40]!r}); rename that "
                                    f"key or pass store_text=False")
        out.append(dict(m, **{TEXT_KEY: text}))
    return out


class TextMethods:
    """``add_texts`` / ``search_text`` over a class with ``search``, ``contains``, ``dim``,
    ``__len__``, ``path`` (or ``store.path``), ``encoder`` and the hooks ``_text_stores()`` (its
    stores; or ``_text_record()`` and ``_text_float16()`` where it has none here),
    ``_text_progress()`` (a Progress), ``_check_writable()`` and
    ``_add(docs, ids, metadata, encoder_record=record)`` (``add`` that records the encoder in the
    commit of the batch)."""

    encoder: Encoder | None = None
    _pools = False  # whether ``_add`` takes ``pooling=`` (a class that pools documents as it stores them)

    def _pooling_kw(self, pool_factor, pool_protected) -> dict:
        """``_add``'s pooling argument, where one was asked for."""
        asked = pooling_arg(pool_factor, pool_protected)
        if asked is None:
            return {}
        if not self._pools:
            raise InvalidInputError(f"pool_factor: {type(self).__name__} does not pool documents as it adds them; "
                                    f"open the database with mvdb.open(path, pool_factor=...) where it is stored "
                                    f"(its recorded pooling then applies to every add)")
        return {"pooling": asked}

    def _text_pooling(self) -> dict | None:
        """The database's pooling: its ``pooling`` where the class has one, else its stats' (a
        server's or a cluster's database, which pools what it is sent)."""
        if hasattr(type(self), "pooling"):
            return self.pooling
        return (self.stats() or {}).get("pooling")

    def _text_path(self):
        return getattr(self, "path", None) or self.store.path

    def _text_record(self) -> dict | None:
        """The database's encoder record."""
        return recorded_encoder(self._text_stores())

    def _text_float16(self) -> bool:
        """Whether the vectors are stored as float16 (then encoded to float16)."""
        return all(s.dtype == "float16" for s in self._text_stores())

    def add_encoded(self, docs, encoder_record: dict, ids=None, metadata=None, *, pool_factor=None,
                    pool_protected=None) -> list:
        """``add`` of vectors that the encoder ``encoder_record`` describes made
        (``Encoder.record()``): refused as ``add_texts`` refuses another model where the database
        holds another's vectors, and recorded with the batch where it has no record. What a client
        that encodes its texts itself sends (``mvdb.connect``, the Ray cluster)."""
        if not isinstance(encoder_record, dict) or any(k not in encoder_record for k in IDENTITY):
            raise InvalidTypeError(f"encoder_record: expected an Encoder.record() dict with {', '.join(IDENTITY)}, "
                                   f"got {encoder_record!r:.80}")
        self._check_writable()
        rec = self._text_record()
        check_record(encoder_record, rec, self._text_path(), len(self))
        own = getattr(self, "encoder", None)  # the model this handle searches with: its queries must match
        diff = differences(own.record(), encoder_record) if own is not None else []
        if diff:
            raise EncoderMismatchError(
                f"{self._text_path()}: this handle encodes queries with {_describe(own.record())}; the vectors "
                f"given were made by {_describe(encoder_record)} (differs in {', '.join(diff)}): they would be "
                f"searched with another model")
        record = dict(encoder_record) if rec is None or differences(encoder_record, rec) else None
        return self._add(docs, ids=ids, metadata=metadata, encoder_record=record,
                         **self._pooling_kw(pool_factor, pool_protected))

    def _text_encoder(self, encoder, what: str) -> Encoder:
        if encoder is None:
            if self.encoder is None:
                rec = self._text_record()
                made = f"; its vectors were made by {_describe(rec)}" if rec else ""
                raise InvalidInputError(f"{what}: no encoder: open the database with mvdb.open(path, encoder=model) "
                                        f"or pass encoder=model{made}")
            return self.encoder
        enc = as_encoder(encoder)
        check_encoder(enc, self._text_record(), self._text_path(), len(self))
        return enc

    def _check_dim(self, enc: Encoder) -> None:
        if self.dim is not None and enc.dim != self.dim:
            raise InvalidInputError(f"encoder {enc.name}: makes {enc.dim}-d vectors; the database at "
                                    f"{self._text_path()} holds {self.dim}-d ones")

    def add_texts(self, texts, ids=None, metadata=None, *, store_text: bool = False, encoder=None,
                  pool_factor=None, pool_protected=None) -> list:
        """Encode ``texts`` (a list of str) as documents and store them; returns their ids (as
        ``add``). ``store_text=True`` keeps each text in its metadata under ``"text"`` (merged with
        ``metadata``; an error if a dict already holds another value there). ``encoder``: this
        call's model (default: the handle's, from ``mvdb.open(..., encoder=)``), checked against
        the database's record. Everything is checked, then every text encoded, then stored in one
        commit: a bad text, a bad output of the model or an id already stored leaves the database
        as it was. The first call on a database records the encoder (``stats()["encoder"]``).
        ``pool_factor`` / ``pool_protected``: token pooling of the documents, as in ``add`` (a
        database created with ``pool_factor`` pools them without being asked)."""
        from mvdb.storage import validate  # the storage layer: not for a client that never adds texts
        from mvdb.storage.packed import Packed

        enc = self._text_encoder(encoder, "add_texts")
        asked = self._pooling_kw(pool_factor, pool_protected).get("pooling")  # refused before the encoding
        check_pooling_encoder(enc, asked or self._text_pooling())
        texts, _ = texts_arg(texts)
        meta = merge_text(texts, metadata, store_text)
        validate.metadata(meta, len(texts))  # JSON values: checked before the encoding, not after
        self._check_writable()
        if ids is not None:
            if isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__"):
                raise InvalidTypeError(f"ids: expected a list (one id per text), got {type(ids).__name__}")
            if len(ids) != len(texts):
                raise InvalidInputError(f"ids: expected {len(texts)} ids (one per text), got {len(ids)}")
            there = np.flatnonzero(self.contains(list(ids)))
            if len(there):
                raise DuplicateIdError(f"ids: already in the database: {[ids[i] for i in there[:5]]}")
        tokens, lengths = enc.encode_packed(texts, is_query=False, progress=self._text_progress(),
                                            dtype=np.float16 if self._text_float16() else np.float32)
        vecs = Packed.of(tokens, lengths)
        self._check_dim(enc)
        # checked against the record now the dim is known, and recorded with the batch where there is none
        pool = {} if asked is None else {"pool_factor": pool_factor, "pool_protected": pool_protected}
        return self.add_encoded(vecs, enc.record(), ids=ids, metadata=meta, **pool)

    def search_text(self, queries, k: int = 10, where=None, *, encoder=None, **options):
        """Encode ``queries`` (one str, or a list) as queries (``is_query=True``) and ``search``
        with them: one str gives a list of Hit, a list one list per query. ``where`` and the
        keyword options are those of ``search``; ``encoder`` as in :meth:`add_texts`."""
        enc = self._text_encoder(encoder, "search_text")
        texts, single = texts_arg(queries, "queries", single=True, queries=True)
        vecs = enc.encode(texts, is_query=True, progress=self._text_progress())
        self._check_dim(enc)
        return self.search(vecs[0] if single else vecs, k, where, **options)
