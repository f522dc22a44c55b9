"""mvdb as a PyLate index: ``pylate.retrieve.ColBERT(index=MvdbIndex("my.mvdb"))``.

An end-to-end index (PyLate hands it the query embeddings and gets ranked results back): mvdb's
token index finds the candidates and the fused kernel scores them exactly. Ids are strings, kept
as given (never renumbered); adding an id that is already stored replaces that document (the new
documents are checked first; the delete and the add are two commits, so a crash between them
loses the replaced documents).
"""

from __future__ import annotations

import shutil

import numpy as np
import torch

try:
    from pylate.indexes.base import Base
except ImportError as e:  # pragma: no cover - the message says what to install
    raise ImportError(f"mvdb.integrations.pylate needs PyLate: pip install pylate ({e})") from None

import mvdb
from mvdb.storage import _validate


def _arrays(embeddings) -> list[np.ndarray]:
    """PyLate embeddings (array [n, L, d], tensor, or list of [L, d] arrays / tensors / lists) -> arrays."""
    if isinstance(embeddings, (np.ndarray, torch.Tensor)) and embeddings.ndim == 2:
        embeddings = [embeddings]
    out = []
    for e in embeddings:
        if isinstance(e, torch.Tensor):
            e = e.detach().float().cpu().numpy()
        out.append(np.asarray(e, dtype=np.float32))
    return out


class MvdbIndex(Base):
    """A PyLate index backed by an mvdb database directory."""

    is_end_to_end_index = True

    def __init__(self, index_folder: str = "indexes", index_name: str = "mvdb", override: bool = False,
                 dtype: str | None = None, device: str = "auto"):
        self.path = f"{index_folder}/{index_name}.mvdb"
        if override:
            shutil.rmtree(self.path, ignore_errors=True)
        self.db = mvdb.open(self.path, dtype=dtype, device=device)

    def add_documents(self, documents_ids, documents_embeddings, batch_size: int = 2000, **kwargs) -> "MvdbIndex":
        ids = [str(i) for i in documents_ids]
        docs = _arrays(documents_embeddings)
        if len(ids) != len(docs):
            raise mvdb.InvalidInputError(f"documents_ids: expected {len(docs)} ids (one per embedding), got {len(ids)}")
        # Check every document before the replaced ones are deleted: a bad batch must not lose them.
        tokens, lengths, _ = _validate.documents(docs, self.db.store.dim)
        _validate.convert(tokens, lengths, self.db.store.dtype)
        present = [i for i, there in zip(ids, self.db.store.contains(ids)) if there]
        if present:
            self.db.delete(present)
        for b0 in range(0, len(ids), batch_size):
            self.db.add(docs[b0 : b0 + batch_size], ids=ids[b0 : b0 + batch_size])
        return self

    def remove_documents(self, documents_ids) -> "MvdbIndex":
        self.db.delete([str(i) for i in documents_ids])
        return self

    def __call__(self, queries_embeddings, k: int = 10, subset=None) -> list[list[dict]]:
        queries = _arrays(queries_embeddings)
        if subset is None:
            hits = self.db.search(queries, k=k)
        else:
            per_query = subset if subset and isinstance(subset[0], (list, tuple)) else [subset] * len(queries)
            hits = []
            for q, allowed in zip(queries, per_query):
                allowed = [str(i) for i in allowed]
                allowed = [i for i, there in zip(allowed, self.db.store.contains(allowed)) if there]
                hits.append(self.db.rerank(q, allowed, k=k) if allowed else [])
        return [[{"id": h.id, "score": h.score} for h in row] for row in hits]

    def get_documents_embeddings(self, documents_ids) -> list[list[np.ndarray]]:
        return [self.db.get([str(i) for i in ids]) if len(ids) else [] for ids in documents_ids]
