"""The read side of the segment store: a mixin over the store's current snapshot.

``Store`` (mvdb.storage.store) opens the snapshot and moves it forward on every commit and
``refresh()``; every read here goes through it, so a read sees one committed state. The mixin
uses the store's ``path``, ``segment_tokens``, ``_snap`` and ``_catch_up``.
"""

from __future__ import annotations

import numpy as np

from mvdb.kernels.errors import InvalidInputError
from mvdb.storage import validate
from mvdb.storage.packed import Packed
from mvdb.storage.snapshot import Snapshot


class StoreReader:
    """Reads of a :class:`~mvdb.storage.store.Store`: its manifest, membership, documents by id,
    metadata, sparse vectors, and every live document in storage order."""

    @property
    def manifest(self) -> dict:
        if self._snap is None:
            raise InvalidInputError(f"{self.path}: the store is closed")
        return self._snap.manifest

    @property
    def dim(self) -> int | None:
        return self._snap.manifest["dim"]

    @property
    def dtype(self) -> str:
        return self._snap.manifest["dtype"]

    @property
    def generation(self) -> int:
        return self._snap.manifest["generation"]

    def __len__(self) -> int:
        return self._snap.n_live

    def __contains__(self, doc_id) -> bool:
        key = self._keys([doc_id], check_type=False)
        return bool(key is not None and self._snap.find(key)[1].all())

    def contains(self, ids) -> np.ndarray:
        """Bool mask: which of ``ids`` are live (ids of the other type are simply absent)."""
        return self._snap.contains(ids)

    def snapshot(self) -> Snapshot:
        """The current committed state as an immutable read view (see :class:`Snapshot`)."""
        if self._snap is None:
            raise InvalidInputError(f"{self.path}: the store is closed")
        self._catch_up()
        return self._snap

    def _keys(self, ids, check_type: bool = True) -> np.ndarray | None:
        return self._snap.keys(ids, check_type)

    def _rows(self, ids) -> np.ndarray:
        return self._snap.rows(ids)

    def _gather_rows(self, rows: np.ndarray):
        return self._snap.gather(rows)

    def gather(self, ids) -> Packed:
        """The documents of ``ids`` packed in request order (tokens as stored: float16, or int8 + scales)."""
        return self._gather_rows(self._rows(ids))

    def get(self, ids) -> list[np.ndarray]:
        """Each document as a float32 [L, dim] array (int8 dequantized)."""
        p = self.gather(ids)
        tokens = p.tokens.astype(np.float32)
        if p.scales is not None:
            tokens *= p.scales[:, None]
        return [tokens[p.offsets[i] : p.offsets[i + 1]] for i in range(len(p.offsets) - 1)]

    def _metadata_rows(self, rows: np.ndarray) -> list[str]:
        return self._snap.metadata(rows)

    def sparse_rows(self, rows: np.ndarray):
        """Sparse vectors of snapshot rows as (offsets, terms, weights)."""
        return self._snap.sparse(rows)

    def sparse(self, ids) -> list[dict]:
        """Each document's sparse vector as a {term: weight} dict (empty where none was stored)."""
        off, t, w = self.sparse_rows(self._rows(ids))
        return [dict(zip(t[off[i] : off[i + 1]].tolist(), w[off[i] : off[i + 1]].tolist())) for i in range(len(off) - 1)]

    def metadata(self, ids) -> list:
        """Each document's metadata dict (None where none was given)."""
        return self._snap.metadata_values(self._rows(ids))

    def ids(self) -> list:
        """Live ids in storage order."""
        snap = self._snap
        if not snap.readers:
            return []
        keys = np.concatenate([r.ids for r in snap.readers])[snap.live]
        return [validate.decode_id(x) for x in keys]

    def iter_batches(self, max_tokens: int = 1 << 20):
        """Stream every live document in storage order as Packed batches of at most ~max_tokens tokens."""
        snap = self._snap
        for s, r in enumerate(snap.readers):
            rows = snap.doc_start[s] + np.flatnonzero(snap.live[snap.doc_start[s] : snap.doc_start[s + 1]])
            lens = (r.offsets[1:] - r.offsets[:-1])[rows - snap.doc_start[s]]
            ends = np.cumsum(lens)
            d0 = 0
            while d0 < len(rows):
                d1 = int(np.searchsorted(ends, (ends[d0 - 1] if d0 else 0) + max_tokens, side="right"))
                d1 = min(max(d1, d0 + 1), len(rows))
                yield self._gather_rows(rows[d0:d1])
                d0 = d1

    def load_all(self, device=None, pin: bool = False, *, include_deleted: bool = False,
                 from_segment: int = 0, snap: Snapshot | None = None, out: list | None = None) -> Packed:
        """Every live document in one contiguous buffer (storage order), with offsets and ids.

        ``include_deleted`` keeps deleted documents too (every row of every segment, the row order
        the database's token index uses); ``from_segment`` starts at that segment of the snapshot
        (``snap``, by default the current one). ``out``: consecutive (tokens, scales) buffers on one
        device whose rows add up to the load's, written in place (the result then holds no tokens).

        ``device`` (e.g. "cuda") copies through pinned staging buffers, overlapping disk reads with
        host-to-device copies; ``pin=True`` without a device returns pinned host tensors (plain host
        tensors where there is no CUDA driver). Without either, numpy arrays.
        """
        if device is None and not pin and not include_deleted and not from_segment and snap is None and out is None:
            parts = list(self.iter_batches(self.segment_tokens))
            if not parts:
                return Packed(np.zeros((0, self.dim or 0), np.float16), np.zeros(1, np.int64), None, [])
            return _concat(parts)
        from mvdb.storage._load import load_to_device

        return load_to_device(self, device, pin, include_deleted, from_segment, snap=snap, out=out)


def _concat(parts: list[Packed]) -> Packed:
    tokens = np.concatenate([p.tokens for p in parts])
    scales = np.concatenate([p.scales for p in parts]) if parts[0].scales is not None else None
    lens = np.concatenate([np.diff(p.offsets) for p in parts])
    offsets = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
    return Packed(tokens, offsets, scales, [i for p in parts for i in p.ids])
