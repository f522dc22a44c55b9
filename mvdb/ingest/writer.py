"""The bulk writer the CLI and Ray's ingest share: skip what a store already holds, add the rest."""

from __future__ import annotations

import numpy as np

from mvdb.shards.placement import membership


def add_new(store, ids: list, tokens: np.ndarray, lengths: np.ndarray, also_known=None,
            metadata: list | None = None) -> tuple[int, int, int]:
    """Add the documents of one packed batch whose ids ``store`` does not hold yet; returns
    (documents added, documents skipped, tokens added). ``store`` is anything with ``contains``, ``__len__`` and ``add_packed`` (a
    Store, or a set of shards placing documents). ``also_known``: other ids the same documents may
    be stored under (an older id scheme), one per document. ``metadata``: one entry per document
    (dict or None), stored with those added."""
    lengths = np.asarray(lengths, dtype=np.int64)
    found = membership(store, ids)
    if also_known is not None:
        found |= membership(store, also_known)
    keep = ~found
    if keep.any():
        kept = [i for i, k in zip(ids, keep) if k]
        meta = None if metadata is None else [m for m, k in zip(metadata, keep) if k]
        store.add_packed(tokens[np.repeat(keep, lengths)], lengths[keep], ids=kept, metadata=meta)
    return int(keep.sum()), int((~keep).sum()), int(lengths[keep].sum())


class Pooled:
    """A store (a Store, or shards placing documents) whose batches are pooled (``mvdb.pool``)
    before they are added: ``mvdb ingest --pool-factor``, and the Ray ingest into a database that
    pools. ``rec``: the pooling; ``device``: where the clustering runs; ``already``: the batches
    are pooled that way already (``mvdb export`` of a pooled database); ``record``: the stores
    (``stores``) take the pooling's record with the first batch stored (not before: an ingest that
    stores nothing leaves no record). ``tokens`` counts the pooled tokens stored."""

    def __init__(self, store, rec: dict, device, record: bool = False, stores: list | None = None,
                 already: bool = False):
        self.store, self.rec, self.device, self.already = store, rec, device, already
        self.pending = list(stores or [store]) if record else []
        self.dtype = getattr(store, "dtype", None) or (stores[0].dtype if stores else "float16")
        self.tokens = 0

    def __len__(self) -> int:
        return len(self.store)

    def contains(self, ids) -> np.ndarray:
        return self.store.contains(ids)

    def add_packed(self, tokens, lengths, ids, metadata=None, **kw) -> None:
        from mvdb.pooling import pool_checked, with_pooling
        from mvdb.storage import validate

        tokens, lengths, _ = validate.packed(tokens, lengths, None)
        if not self.already:  # else pooled before (an export of a pooled database): stored as they are
            tokens, lengths = pool_checked(tokens, lengths, self.rec, self.dtype, device=self.device)
        self.store.add_packed(tokens, lengths, ids=ids, metadata=metadata, **kw)
        self.tokens += int(lengths.sum())
        for st in self.pending:
            st.commit_config(with_pooling(st.config, self.rec))
        self.pending = []


def open_pooling(stores: list, asked: dict | None, path, encoder=None) -> tuple[dict | None, bool]:
    """The pooling of an ingest into ``stores`` (``--pool-factor``, else the recorded one), checked
    against the record (and the model, which must not pool itself): (the pooling or None, whether
    it is new to record; :class:`Pooled` records it with the first batch)."""
    from mvdb.pooling import POOLING_KEY, resolve_open

    recorded = next((st.config.get(POOLING_KEY) for st in stores if st.config.get(POOLING_KEY)), None)
    return resolve_open(asked, recorded, path, sum(len(st) for st in stores), encoder)
