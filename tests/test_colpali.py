"""mvdb.integrations.colpali.patch(): colpali-engine's scoring and ColBERT losses on mvdb's kernels
give the same values and gradients as colpali-engine's own code."""

import importlib.util
import sys
import types

import pytest
import torch
from conftest import INTERPRET, TRITON_DEVICES

if importlib.util.find_spec("colpali_engine") is None:
    pytest.skip("colpali-engine is not installed", allow_module_level=True)


def _load_colpali():
    """colpali_engine's scoring and loss modules. Its package __init__ imports the model zoo, which
    needs a torchvision built for this torch; PyPI has none for the CPU build used in CI, so when
    that import fails the modules are loaded under a bare package (they need only torch)."""
    try:
        import colpali_engine  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure of the model zoo import
        for name in [n for n in sys.modules if n == "colpali_engine" or n.startswith("colpali_engine.")]:
            del sys.modules[name]
        pkg = types.ModuleType("colpali_engine")
        pkg.__path__ = list(importlib.util.find_spec("colpali_engine").submodule_search_locations)
        sys.modules["colpali_engine"] = pkg
    import colpali_engine.loss.late_interaction_losses as losses
    import colpali_engine.utils.maxsim as ms

    return ms, losses


MS, LOSSES = _load_colpali()


@pytest.fixture(autouse=True)
def _torch_reference(monkeypatch):
    """colpali-engine's own code on its torch path (with late-interaction-kernels installed its
    default would run that package's kernels instead)."""
    monkeypatch.setenv("COLPALI_SCORES_BACKEND", "torch")


def _batch(device, b=4, lq=5, ld=7, n_neg=3, dim=16, seed=0):
    """Zero-padded embeddings as colpali-engine makes them (pad tokens are exact zeros)."""
    g = torch.Generator().manual_seed(seed)

    def emb(*shape):
        x = torch.nn.functional.normalize(torch.randn(*shape, dim, generator=g), dim=-1)
        keep = torch.rand(*shape, generator=g) > 0.25
        keep[..., 0] = True
        return (x * keep[..., None]).to(device)

    return emb(b, lq), emb(b, ld), emb(b, n_neg, ld)


def _run(fn, tensors, patched: bool, device):
    from mvdb.integrations import colpali

    if patched:
        colpali.patch(devices=(device,))
    try:
        leaves = [t.clone().requires_grad_() for t in tensors]
        out = fn(*leaves)
        weights = torch.arange(out.numel(), dtype=out.dtype, device=out.device).reshape(out.shape).cos()
        (out * weights).sum().backward()
        return out.detach().float(), [t.grad for t in leaves]
    finally:
        colpali.unpatch()


def _same(device, fn, tensors):
    want, want_grads = _run(fn, tensors, False, device)
    got, got_grads = _run(fn, tensors, True, device)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for t, a, b in zip(tensors, got_grads, want_grads):
        # pad (zero) tokens tie: torch's amax splits a tie's gradient evenly, the kernel gives it to
        # the first token. colpali-engine's models zero those positions, so they reach no
        # parameter; every real token's gradient must match.
        real = t.abs().sum(-1, keepdim=True) != 0
        torch.testing.assert_close(a * real, b * real, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_scores_equal_colpali_engine(device):
    q, d, neg = _batch(device)
    _same(device, lambda a, b: MS.maxsim_inbatch(a, b), (q, d))
    _same(device, lambda a, b: MS.maxsim_kd(a, b), (q, neg))


LOSS_CASES = [
    ("ColbertLoss", {}, False),
    ("ColbertLoss", {"normalize_scores": True, "pos_aware_negative_filtering": True}, False),
    ("ColbertPairwiseCELoss", {}, False),
    ("ColbertSigmoidLoss", {}, False),
    ("ColbertNegativeCELoss", {}, True),
    ("ColbertNegativeCELoss", {"in_batch_term_weight": 0.0, "normalize_scores": False}, True),
    ("ColbertPairwiseNegativeCELoss", {}, True),
]


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("name,kwargs,negatives", LOSS_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(LOSS_CASES)])
def test_losses_equal_colpali_engine(device, name, kwargs, negatives):
    loss = getattr(LOSSES, name)(**kwargs).to(device)
    q, d, neg = _batch(device)
    if negatives:
        _same(device, lambda a, b, c: loss(a, b, c), (q, d, neg))
    else:
        _same(device, lambda a, b: loss(a, b), (q, d))


@pytest.mark.skipif(not INTERPRET, reason="the CPU test runs the Triton kernels under TRITON_INTERPRET=1")
def test_patch_routes_and_unpatch_restores(monkeypatch):
    from mvdb.integrations import colpali
    from mvdb.kernels.maxsim import ops

    before = (MS.maxsim_inbatch, LOSSES.maxsim_inbatch, LOSSES.maxsim_kd, LOSSES.ColbertNegativeCELoss.forward)
    calls = []
    monkeypatch.setattr(colpali, "maxsim", lambda q, d: calls.append(tuple(d.shape)) or ops.maxsim(q, d))
    colpali.patch(devices=("cpu",))
    colpali.patch(devices=("cpu",))  # idempotent
    try:
        assert LOSSES.maxsim_inbatch is MS.maxsim_inbatch is not before[0]
        q, d, neg = _batch("cpu")
        LOSSES.ColbertNegativeCELoss()(q, d, neg)
        # explicit positives [B, 1, Ld, d] and negatives [B, N, Ld, d] per query, then the in-batch grid
        assert calls == [(4, 1, 7, 16), (4, 3, 7, 16), (4, 7, 16)]
        calls.clear()
        LOSSES.ColbertLoss(use_smooth_max=True)(q, d)  # smooth-max keeps colpali-engine's einsum
        assert calls == []
    finally:
        colpali.unpatch()
    colpali.patch()  # the default routes CUDA tensors only: CPU tensors keep colpali-engine's code
    try:
        LOSSES.ColbertNegativeCELoss()(q, d, neg)
        assert calls == []
    finally:
        colpali.unpatch()
    assert (MS.maxsim_inbatch, LOSSES.maxsim_inbatch, LOSSES.maxsim_kd, LOSSES.ColbertNegativeCELoss.forward) == before
