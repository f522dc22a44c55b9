"""Where documents go, and where they are: the one placement policy of every sharded writer
(:class:`mvdb.ShardedDatabase`, ``mvdb ingest --shards``, :mod:`mvdb.shards.cluster`) and the
membership routing of every sharded reader.

- Placement (``least-loaded``): each new document goes, in turn, to the shard holding the fewest
  tokens at that moment (tokens of every committed segment, deleted documents included, as they
  occupy the shard until a compaction). Nothing about a document's id decides its shard, so ids of
  any type balance evenly and a shard count can differ between writers of the same data.
- Membership: a document is found by asking every shard which of the ids it holds (``owners``).
  The layout records the policy (:mod:`mvdb.shards.layout`) only for writers; readers never
  depend on it.

Everything here works on plain numbers and masks, or on objects with the ``Store`` calls
``contains``, ``__len__`` and ``manifest``, so local stores and remote (Ray) shards share it.
"""

from __future__ import annotations

import numpy as np

from mvdb.errors import UnknownIdError

POLICY = "least-loaded"


def tokens_of(store) -> int:
    """The load of a store: the tokens of its committed segments."""
    return int(sum(seg["n_tokens"] for seg in store.manifest["segments"]))


def assign(lengths, loads) -> list[list[int]]:
    """Documents (their token counts) assigned in turn to the shard with the smallest load (ties:
    the first), each assignment adding to that load: positions per shard."""
    load = [int(x) for x in loads]
    parts = [[] for _ in load]
    for i, length in enumerate(lengths):
        si = int(np.argmin(load))
        parts[si].append(i)
        load[si] += int(length)
    return parts


def place(lengths, stores) -> list[list[int]]:
    """``assign`` over stores, their loads read from their manifests: positions per store."""
    return assign(lengths, [tokens_of(st) for st in stores])


def split_packed(tokens, lengths, parts):
    """Packed tokens ([T, dim] with per-document ``lengths``) cut into the given parts: one
    (positions, tokens, lengths) per non-empty part, with the shard's index first."""
    lengths = np.asarray(lengths, dtype=np.int64)
    off = np.concatenate(([0], np.cumsum(lengths)))
    for si, part in enumerate(parts):
        if part:
            rows = np.concatenate([np.arange(off[i], off[i + 1]) for i in part])
            yield si, part, tokens[rows], lengths[part]


def membership(store, ids: list) -> np.ndarray:
    """Bool mask: which of ``ids`` the store holds (an empty store holds none)."""
    return store.contains(ids) if len(store) else np.zeros(len(ids), dtype=bool)


def contains_any(stores, ids: list) -> np.ndarray:
    """Bool mask: which of ``ids`` are stored in any of ``stores``."""
    ids = list(ids)
    found = np.zeros(len(ids), dtype=bool)
    for st in stores:
        found |= membership(st, ids)
    return found


def owners(masks, ids: list, *, missing: str = "raise") -> list[list[int]]:
    """Route by owner: from each shard's membership mask over ``ids``, the positions of ``ids``
    per shard (an id held twice goes to the first shard holding it). An id no shard holds raises
    UnknownIdError (``missing="raise"``) or is left out (``missing="skip"``)."""
    ids = list(ids)
    where = []
    found = np.zeros(len(ids), dtype=bool)
    for mask in masks:
        hit = np.asarray(mask, dtype=bool) & ~found
        where.append(np.flatnonzero(hit).tolist())
        found |= hit
    if missing == "raise" and not found.all():
        raise UnknownIdError(f"ids: not in the database: {[ids[i] for i in np.flatnonzero(~found)[:5]]}")
    return where


def route(stores, ids) -> list[list[int]]:
    """Positions of ``ids`` per store, every id stored (else UnknownIdError)."""
    ids = list(ids)
    return owners([membership(st, ids) for st in stores], ids)


class PlacedStores:
    """Several shard stores behind the Store calls a bulk ingest makes (``mvdb ingest --shards``):
    ids are looked up in every shard, and each document goes to the shard holding the fewest
    tokens, as :class:`~mvdb.shards.local.ShardedDatabase` and :mod:`mvdb.shards.cluster` place them."""

    def __init__(self, stores):
        self.stores = stores

    def __len__(self) -> int:
        return sum(len(st) for st in self.stores)

    def contains(self, ids) -> np.ndarray:
        return contains_any(self.stores, list(ids))

    def add_packed(self, tokens, lengths, ids, metadata=None, encoder_record: dict | None = None) -> None:
        """``encoder_record`` (``mvdb ingest --model``): every store records the text encoder, with
        its part of the batch or, after them, alone (as :class:`~mvdb.shards.local.ShardedDatabase`)."""
        from mvdb.text import record_config

        parts = place(lengths, self.stores)
        for si, part, toks, lens in split_packed(tokens, lengths, parts):
            meta = None if metadata is None else [metadata[i] for i in part]
            st = self.stores[si]
            st.add_packed(toks, lens, ids=[ids[i] for i in part], metadata=meta,
                          config=record_config(st.config, encoder_record))
        for st, part in zip(self.stores, parts):
            config = None if part else record_config(st.config, encoder_record)
            if config is not None:
                st.commit_config(config)
