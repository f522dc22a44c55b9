"""Sparton (issue #7): the fused SPLADE head against the naive composition, values and gradients."""

import pytest
import torch

from conftest import TRITON_DEVICES
from mvdb import InvalidInputError, InvalidTypeError
from mvdb.kernels import SpartonHead, sparton
from mvdb.kernels.sparton import reference


def _case(B=2, S=7, D=24, V=37, seed=0, bias=True, mask=True):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(B, S, D, generator=g)
    w = torch.randn(V, D, generator=g) * 0.3
    b = torch.randn(V, generator=g) if bias else None
    m = None
    if mask:
        m = torch.ones(B, S, dtype=torch.int64)
        m[0, 4:] = 0  # padding
    return h, w, b, m


def _grads(fn, h, w, b, m, G):
    hh, ww = h.clone().double().requires_grad_(), w.clone().double().requires_grad_()
    bb = None if b is None else b.clone().double().requires_grad_()
    out = fn(hh, ww, bb, m)
    (out * G.double()).sum().backward()
    return out.detach(), hh.grad, ww.grad, None if bb is None else bb.grad


@pytest.mark.parametrize("device", TRITON_DEVICES + ["torch"])
@pytest.mark.parametrize("bias", [True, False])
def test_values_and_gradients_match_the_naive_head(device, bias):
    h, w, b, m = _case(bias=bias)
    G = torch.randn(2, 37, generator=torch.Generator().manual_seed(1))
    want = _grads(reference, h, w, b, m, G)
    backend, dev = ("torch", "cpu") if device == "torch" else ("triton", device)
    hh, ww = h.to(dev).requires_grad_(), w.to(dev).requires_grad_()
    bb = None if b is None else b.to(dev).requires_grad_()
    out = sparton(hh, ww, bb, None if m is None else m.to(dev), backend=backend)
    (out * G.to(dev)).sum().backward()
    got = (out.detach(), hh.grad, ww.grad, None if bb is None else bb.grad)
    for name, x, y in zip(("out", "d_hidden", "d_weight", "d_bias"), got, want):
        if y is None:
            assert x is None
            continue
        torch.testing.assert_close(x.double().cpu(), y, rtol=1e-4, atol=1e-4, msg=name)
    assert (hh.grad[0, 4:] == 0).all()  # padded positions get no gradient


@pytest.mark.parametrize("device", TRITON_DEVICES + ["torch"])
def test_all_negative_rows_and_fully_masked_sequences_output_zero(device):
    h, w, b, _ = _case(B=3, S=5, V=20, seed=2)
    b = torch.full((20,), -100.0)  # every logit negative: relu kills them all
    b[3] = 100.0  # one positive vocabulary row
    m = torch.ones(3, 5, dtype=torch.bool)
    m[2] = False  # a sequence with every position masked
    backend, dev = ("torch", "cpu") if device == "torch" else ("triton", device)
    hh = h.to(dev).requires_grad_()
    out = sparton(hh, w.to(dev), b.to(dev), m.to(dev), backend=backend)
    assert (out.cpu()[:, [i for i in range(20) if i != 3]] == 0).all() and (out.cpu()[:2, 3] > 0).all()
    assert (out.cpu()[2] == 0).all()
    out.sum().backward()
    assert (hh.grad[2] == 0).all()


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_odd_sizes_span_several_tiles(device):
    h, w, b, m = _case(B=3, S=37, D=40, V=70, seed=3)
    G = torch.randn(3, 70, generator=torch.Generator().manual_seed(4))
    want = _grads(reference, h, w, b, m, G)
    hh, ww, bb = h.to(device).requires_grad_(), w.to(device).requires_grad_(), b.to(device).requires_grad_()
    (sparton(hh, ww, bb, m.to(device)) * G.to(device)).sum().backward()
    for x, y in zip((hh.grad, ww.grad, bb.grad), want[1:]):
        torch.testing.assert_close(x.double().cpu(), y, rtol=1e-4, atol=1e-4)


def test_head_wraps_a_masked_lm_head():
    torch.manual_seed(0)

    class Pred(torch.nn.Module):  # BERT's BertLMPredictionHead layout
        def __init__(self):
            super().__init__()
            self.transform = torch.nn.Sequential(torch.nn.Linear(24, 24), torch.nn.GELU(), torch.nn.LayerNorm(24))
            self.decoder = torch.nn.Linear(24, 37)

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.predictions = Pred()

    mlm = Head()
    head = SpartonHead.from_mlm_head(mlm)
    h, _, _, m = _case()
    logits = mlm.predictions.decoder(mlm.predictions.transform(h))
    want = (torch.log1p(torch.relu(logits)) * m[:, :, None]).amax(1)
    torch.testing.assert_close(head(h, m), want, rtol=1e-5, atol=1e-5)
    assert head.weight is mlm.predictions.decoder.weight  # shared, so training the head trains the model
    with pytest.raises(InvalidInputError, match="Linear decoder"):
        SpartonHead.from_mlm_head(torch.nn.Linear(3, 3))


def test_bad_inputs():
    h, w, b, m = _case()
    with pytest.raises(InvalidInputError, match=r"weight: expected shape \[V, 24\]"):
        sparton(h, w[:, :10])
    with pytest.raises(InvalidTypeError, match="weight: expected dtype float32, got float16"):
        sparton(h, w.half())
    with pytest.raises(InvalidInputError, match="hidden: expected a 3-D tensor"):
        sparton(h[0], w)
    with pytest.raises(InvalidInputError, match="bias"):
        sparton(h, w, b[:5])
    with pytest.raises(InvalidInputError, match="attention_mask"):
        sparton(h, w, b, m[:, :3])
    with pytest.raises(InvalidInputError, match="backend: expected one of"):
        sparton(h, w, backend="cuda")
