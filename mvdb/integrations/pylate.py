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
from mvdb.integrations._patching import Patches
from mvdb.storage import validate


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
        tokens, lengths, _ = validate.documents(docs, self.db.store.dim)
        validate.convert(tokens, lengths, self.db.store.dtype)
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


# ---- training: route PyLate's ColBERT scores to the fused, differentiable kernels (issue #5)

_PATCHED = Patches()


def _fused_scores(original, per_query: bool, devices: tuple):
    from mvdb.kernels.maxsim import train

    def scores(queries_embeddings, documents_embeddings, queries_mask=None, documents_mask=None, backend=None):
        q, d = queries_embeddings, documents_embeddings
        usable = (
            backend in (None, "auto", "mvdb")
            and isinstance(q, torch.Tensor) and isinstance(d, torch.Tensor)
            and q.device.type in devices and d.device == q.device
            and q.dim() == 3 and d.dim() == (4 if per_query else 3)
            and q.is_floating_point() and d.dtype == q.dtype
            and q.shape[-1] == d.shape[-1] and (not per_query or d.shape[0] == q.shape[0])
            and (queries_mask is None or tuple(torch.as_tensor(queries_mask).shape) == tuple(q.shape[:-1]))
            and (documents_mask is None or tuple(torch.as_tensor(documents_mask).shape) == tuple(d.shape[:-1]))
        )  # anything else (shapes the kernels do not take) gets PyLate's own code and its errors
        if not usable:
            return original(queries_embeddings, documents_embeddings, queries_mask, documents_mask, backend=backend)
        qm = None if queries_mask is None else torch.as_tensor(queries_mask, device=q.device) != 0
        dm = None if documents_mask is None else torch.as_tensor(documents_mask, device=q.device) != 0
        # PyLate multiplies similarities by the masks: a masked document token counts as 0
        return train.padded(q, d, qm, dm, "auto", mask_zero=True)

    scores.__wrapped__ = original
    scores.__doc__ = f"mvdb's fused MaxSim in place of PyLate's {original.__name__} on {', '.join(devices)} tensors."
    return scores


def patch(devices=("cuda",)) -> None:
    """Route PyLate's ``colbert_scores`` and ``colbert_kd_scores`` (and so ``ColBERTScores``, the
    contrastive and distillation losses that use them) to mvdb's fused, differentiable MaxSim for
    tensors on ``devices``; everything else keeps PyLate's own code. Undo with :func:`unpatch`."""
    import pylate.scores.colbert as colbert

    if _PATCHED:
        return
    devices = tuple(devices)
    _PATCHED.rebind("pylate", {
        "colbert_scores": (colbert.colbert_scores, _fused_scores(colbert.colbert_scores, False, devices)),
        "colbert_kd_scores": (colbert.colbert_kd_scores, _fused_scores(colbert.colbert_kd_scores, True, devices)),
    }, defaults=True)  # every module that imported them by name; Distillation(score_metric=...) defaults


def unpatch() -> None:
    """Restore PyLate's original scoring functions."""
    _PATCHED.undo()
