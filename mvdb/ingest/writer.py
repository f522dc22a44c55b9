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
