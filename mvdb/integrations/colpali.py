"""colpali-engine on mvdb's fused, differentiable MaxSim: ``mvdb.integrations.colpali.patch()``.

colpali-engine (0.3.x) scores through ``colpali_engine.utils.maxsim.maxsim_inbatch`` (in-batch
grid, also behind ``score_multi_vector``) and ``maxsim_kd`` (per-query negatives), and computes
the explicit positives of its negative losses with an inline einsum. :func:`patch` routes all
three to mvdb's kernels for tensors on ``devices`` (CUDA by default); other devices, and the
smooth-max (logsumexp) variants, keep colpali-engine's code.

colpali-engine pads with zero vectors instead of masks; a zero token scores 0 against anything
in both implementations, so the results are the same. Scores come back in float32.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F  # noqa: N812

from mvdb.integrations._patching import Patches
from mvdb.kernels.maxsim import maxsim

_PATCHED = Patches()
# loss classes whose forward computes the explicit positives inline, and their in-batch term
_NEGATIVE_LOSSES = {"ColbertNegativeCELoss": "inner_loss", "ColbertPairwiseNegativeCELoss": "inner_pairwise"}


def _usable(devices: tuple, q, *docs, doc_dim: int) -> bool:
    return (
        isinstance(q, torch.Tensor) and q.dim() == 3 and q.is_floating_point() and q.device.type in devices
        and all(
            isinstance(d, torch.Tensor) and d.dim() == doc_dim and d.dtype == q.dtype and d.device == q.device
            and d.shape[-1] == q.shape[-1]
            for d in docs
        )
    )


def _fused(original, doc_dim: int, devices: tuple):
    def scores(query, doc):
        if _usable(devices, query, doc, doc_dim=doc_dim):
            return maxsim(query, doc)
        return original(query, doc)

    scores.__wrapped__ = original
    scores.__name__ = original.__name__
    scores.__doc__ = f"mvdb's fused MaxSim in place of colpali-engine's {original.__name__} on {', '.join(devices)}."
    return scores


def _negatives_forward(original, inner: str, devices: tuple):
    """forward(query, doc, neg_doc, offset) of a negative loss with the positives on the kernel:
    softplus((negative - positive) / temperature), mixed with the in-batch term by its weight."""

    def forward(self, query_embeddings, doc_embeddings, neg_doc_embeddings, offset: int = 0):
        q, neg = query_embeddings, neg_doc_embeddings
        if self.use_smooth_max or not (
            _usable(devices, q, doc_embeddings, doc_dim=3) and _usable(devices, q, neg, doc_dim=4)
        ):
            return original(self, query_embeddings, doc_embeddings, neg_doc_embeddings, offset)
        pos_scores = maxsim(q, doc_embeddings[offset : offset + q.size(0)].unsqueeze(1))[:, 0]
        neg_scores = maxsim(q, neg)
        if self.normalize_scores:
            lengths = (q[:, :, 0] != 0).sum(dim=1)
            pos_scores = self._apply_normalization(pos_scores, lengths)
            neg_scores = self._apply_normalization(neg_scores, lengths)
        loss = F.softplus((neg_scores - pos_scores.unsqueeze(1)) / self.temperature).mean()
        w = self.in_batch_term_weight
        if w > 0:
            loss = loss * (1 - w) + getattr(self, inner)(q, doc_embeddings, offset) * w
        return loss

    forward.__wrapped__ = original
    return forward


def patch(devices=("cuda",)) -> None:
    """Route colpali-engine's MaxSim scoring and ColBERT losses to mvdb's kernels for tensors on
    ``devices``. Idempotent; undo with :func:`unpatch`."""
    from importlib.metadata import PackageNotFoundError, version

    import colpali_engine.loss.late_interaction_losses as losses
    import colpali_engine.utils.maxsim as ms

    if _PATCHED:
        return
    try:  # score_multi_vector's module needs PIL and transformers; the losses do not
        import colpali_engine.utils.processing_utils  # noqa: F401
    except ImportError:
        pass
    devices = tuple(devices)
    _PATCHED.rebind("colpali_engine", {
        "maxsim_inbatch": (ms.maxsim_inbatch, _fused(ms.maxsim_inbatch, 3, devices)),
        "maxsim_kd": (ms.maxsim_kd, _fused(ms.maxsim_kd, 4, devices)),
    })
    try:
        ver = version("colpali-engine")
    except PackageNotFoundError:
        ver = "unknown"
    if not ver.startswith("0.3."):
        warnings.warn(
            f"mvdb.integrations.colpali: explicit positives are routed for colpali-engine 0.3.x, found {ver}; "
            "the negative losses keep their own positives (in-batch and negative scores are still routed)",
            stacklevel=2,
        )
        return
    for cls_name, inner in _NEGATIVE_LOSSES.items():
        cls = getattr(losses, cls_name, None)
        if cls is not None:
            _PATCHED.set(cls, "forward", _negatives_forward(cls.forward, inner, devices))


def unpatch() -> None:
    """Restore colpali-engine's own scoring and losses."""
    _PATCHED.undo()
