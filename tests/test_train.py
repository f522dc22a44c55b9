"""Differentiable MaxSim (issue #5): values and gradients against fp64 autograd of the reference."""

import pytest
import torch

from mvdb import InvalidInputError
from mvdb.kernels import maxsim, maxsim_varlen
from mvdb.kernels.maxsim import naive

from conftest import TRITON_DEVICES

KINDS = ("unified", "lowmem", "auto")


def _ref_padded(Q, D, qm, dm, G, normalize=False):
    Qr, Dr = Q.double().requires_grad_(), D.double().requires_grad_()
    a, b = (torch.nn.functional.normalize(Qr, dim=-1), torch.nn.functional.normalize(Dr, dim=-1)) if normalize else (Qr, Dr)
    out = naive.maxsim_padded(a, b, qm, dm, dtype=torch.float64)
    (out * G.double()).sum().backward()
    return out.detach(), Qr.grad, Dr.grad


def _close(got, want, dtype):
    tol = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}[dtype]
    torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol)


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("per_query", [False, True])
def test_padded_gradients(device, kind, per_query):
    g = torch.Generator().manual_seed(1)
    Q = torch.randn(3, 5, 16, generator=g)
    D = torch.randn(*((3, 4) if per_query else (4,)), 7, 16, generator=g)
    qm = torch.rand(3, 5, generator=g) > 0.2
    dm = torch.rand(D.shape[:-1], generator=g) > 0.3
    dm[(1, 2) if per_query else (2,)] = False  # a document with every token masked: scores 0, no gradient
    G = torch.randn(3, 4, generator=g)
    want, dq, dd = _ref_padded(Q, D, qm, dm, G)
    Qt, Dt = Q.to(device).requires_grad_(), D.to(device).requires_grad_()
    out = maxsim(Qt, Dt, qm.to(device), dm.to(device), backward=kind, backend="triton")
    (out * G.to(device)).sum().backward()
    _close(out.cpu(), want, torch.float32)
    _close(Qt.grad.cpu(), dq, torch.float32)
    _close(Dt.grad.cpu(), dd, torch.float32)
    masked_doc = Dt.grad[1, 2] if per_query else Dt.grad[2]
    assert (masked_doc == 0).all()
    assert (Qt.grad.cpu()[~qm] == 0).all()  # masked query tokens get no gradient


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("kind", KINDS)
def test_varlen_gradients_odd_lengths_and_empty_documents(device, kind):
    g = torch.Generator().manual_seed(2)
    q, d = torch.randn(9, 24, generator=g), torch.randn(20, 24, generator=g)
    cu_q = torch.tensor([0, 1, 9], dtype=torch.int32)  # lengths 1 and 8
    cu_d = torch.tensor([0, 5, 5, 18, 20], dtype=torch.int32)  # an empty document
    G = torch.randn(2, 4, generator=g)
    qr, dr = q.double().requires_grad_(), d.double().requires_grad_()
    want = naive.maxsim_csr(qr, cu_q, dr, cu_d)
    (want * G.double()).sum().backward()
    qt, dt = q.to(device).requires_grad_(), d.to(device).requires_grad_()
    out = maxsim_varlen(qt, cu_q.to(device), dt, cu_d.to(device), backward=kind, backend="triton")
    (out * G.to(device)).sum().backward()
    _close(out.cpu(), want.detach(), torch.float32)
    _close(qt.grad.cpu(), qr.grad, torch.float32)
    _close(dt.grad.cpu(), dr.grad, torch.float32)


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_ties_go_to_the_first_token(device):
    """Two identical document tokens: the gradient goes to the first, as torch's argmax does."""
    Q = torch.ones(1, 2, 16)
    D = torch.ones(1, 3, 16)
    for kind in ("unified", "lowmem"):
        Dt = D.to(device).clone().requires_grad_()
        maxsim(Q.to(device), Dt, backward=kind, backend="triton").sum().backward()
        assert (Dt.grad.cpu()[0, 0] == 2).all() and (Dt.grad.cpu()[0, 1:] == 0).all()


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_lowmem_is_bitwise_reproducible_and_half_precision(device):
    g = torch.Generator().manual_seed(3)
    dtype = torch.float16 if device != "cpu" else torch.float32
    Q = torch.randn(6, 9, 32, generator=g).to(device, dtype)
    D = torch.randn(10, 13, 32, generator=g).to(device, dtype)
    G = torch.randn(6, 10, generator=g).to(device)
    grads = []
    for _ in range(3):
        Qt, Dt = Q.clone().requires_grad_(), D.clone().requires_grad_()
        (maxsim(Qt, Dt, backward="lowmem", backend="triton") * G).sum().backward()
        assert Qt.grad.dtype == dtype and Dt.grad.dtype == dtype  # written in the input dtype
        grads.append((Qt.grad, Dt.grad))
    for a, b in grads[1:]:
        assert torch.equal(a, grads[0][0]) and torch.equal(b, grads[0][1])
    want, dq, dd = _ref_padded(Q.float().cpu(), D.float().cpu(), None, None, G.cpu())
    _close(grads[0][0].cpu(), dq, dtype)
    _close(grads[0][1].cpu(), dd, dtype)


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("kind", ["unified", "lowmem"])
@pytest.mark.parametrize("per_query", [False, True])
def test_normalize_is_fused_with_the_right_jacobian(device, kind, per_query, monkeypatch):
    """normalize=True inside the kernels: values and gradients of F.normalize's composition, with
    masks and a near-zero token (below F.normalize's eps the clamp is active)."""
    g = torch.Generator().manual_seed(4)
    Q = torch.randn(3, 4, 16, generator=g) * 3
    D = torch.randn(*((3, 2) if per_query else (5,)), 6, 16, generator=g) * 0.5
    D[0, 1] *= 1e-14  # below eps: d / eps, whose gradient is 1 / eps (scaled down by G below)
    qm, dm = torch.rand(3, 4, generator=g) > 0.2, torch.rand(D.shape[:-1], generator=g) > 0.2
    G = torch.randn(3, D.shape[1] if per_query else 5, generator=g) * 1e-6
    want, dq, dd = _ref_padded(Q, D, qm, dm, G, normalize=True)
    # the kernels must not see normalised copies: F.normalize is off limits on this path
    monkeypatch.setattr(torch.nn.functional, "normalize", lambda *a, **k: pytest.fail("normalised in torch"))
    Qt, Dt = Q.to(device).requires_grad_(), D.to(device).requires_grad_()
    out = maxsim(Qt, Dt, qm.to(device), dm.to(device), normalize=True, backward=kind, backend="triton")
    (out * G.to(device)).sum().backward()
    _close(out.cpu(), want, torch.float32)
    _close(Qt.grad.cpu() * 1e6, dq * 1e6, torch.float32)
    _close(Dt.grad.cpu() * 1e6, dd * 1e6, torch.float32)
    with torch.no_grad():  # inference takes the fused path as well
        _close(maxsim(Q.to(device), D.to(device), qm.to(device), dm.to(device), normalize=True).cpu(), want,
               torch.float32)


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_normalize_varlen_and_half_precision(device):
    g = torch.Generator().manual_seed(6)
    dtype = torch.bfloat16 if device != "cpu" else torch.float32
    q, d = torch.randn(9, 32, generator=g), torch.randn(20, 32, generator=g) * 4
    cu_q = torch.tensor([0, 3, 9], dtype=torch.int32)
    cu_d = torch.tensor([0, 5, 5, 18, 20], dtype=torch.int32)
    G = torch.randn(2, 4, generator=g)
    qr, dr = q.double().requires_grad_(), d.double().requires_grad_()
    want = naive.maxsim_csr(torch.nn.functional.normalize(qr, dim=-1), cu_q, torch.nn.functional.normalize(dr, dim=-1),
                            cu_d)
    (want * G.double()).sum().backward()
    grads = []
    for _ in range(2):
        qt, dt = q.to(device, dtype).clone().requires_grad_(), d.to(device, dtype).clone().requires_grad_()
        out = maxsim_varlen(qt, cu_q.to(device), dt, cu_d.to(device), normalize=True, backward="lowmem")
        (out * G.to(device)).sum().backward()
        grads.append((qt.grad, dt.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
    _close(out.cpu(), want.detach(), dtype)
    _close(grads[0][0].float().cpu(), qr.grad, dtype)
    _close(grads[0][1].float().cpu(), dr.grad, dtype)


def test_torch_backend_is_differentiable_too():
    Q = torch.randn(2, 3, 8, requires_grad=True)
    D = torch.randn(4, 5, 8)
    maxsim(Q, D, backend="torch").sum().backward()
    assert Q.grad is not None and Q.grad.shape == Q.shape


def test_bad_backward_and_normalize_values():
    Q, D = torch.randn(2, 3, 8), torch.randn(4, 5, 8)
    with pytest.raises(InvalidInputError, match=r"backward: expected one of \('auto', 'unified', 'lowmem'\), got 'fast'"):
        maxsim(Q, D, backward="fast")
    with pytest.raises(ValueError):
        maxsim_varlen(Q[0], torch.tensor([0, 3], dtype=torch.int32), D[0], torch.tensor([0, 5], dtype=torch.int32),
                      backward=None)
    with pytest.raises(InvalidInputError, match="normalize: expected a bool, got str"):
        maxsim(Q, D, normalize="yes")
    Qg = Q.clone().requires_grad_()
    with pytest.raises(InvalidInputError, match="out: not supported when computing gradients"):
        maxsim(Qg, D, out=torch.empty(2, 4))


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_grouped_forward_with_a_partial_last_group(device):
    """Short equal-length queries share document tiles in groups; the last group may be partial."""
    g = torch.Generator().manual_seed(5)
    Q, D = torch.randn(4, 5, 16, generator=g), torch.randn(3, 7, 16, generator=g)
    qm, dm = torch.rand(4, 5, generator=g) > 0.2, torch.rand(3, 7, generator=g) > 0.3
    G = torch.randn(4, 3, generator=g)
    want, dq, dd = _ref_padded(Q, D, qm, dm, G)
    Qt, Dt = Q.to(device).requires_grad_(), D.to(device).requires_grad_()
    out = maxsim(Qt, Dt, qm.to(device), dm.to(device), backend="triton")
    (out * G.to(device)).sum().backward()
    _close(out.cpu(), want, torch.float32)
    _close(Qt.grad.cpu(), dq, torch.float32)
    _close(Dt.grad.cpu(), dd, torch.float32)


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("kind", ["lowmem", "unified"])
def test_a_token_every_query_picks(device, kind):
    """dD of a document token that wins for every query token (more hits than the backward's
    per-step rows take, so it is summed on its own in chunks), next to ordinary tokens."""
    g = torch.Generator().manual_seed(7)
    Q = torch.rand(5, 8, 16, generator=g) + 0.1  # all positive
    D = torch.randn(3, 6, 16, generator=g)
    D[1, 2] = 5.0  # a large positive token: every query token of every query picks it in document 1
    G = torch.randn(5, 3, generator=g)
    want, dq, dd = _ref_padded(Q, D, None, None, G)
    Qt, Dt = Q.to(device).requires_grad_(), D.to(device).requires_grad_()
    (maxsim(Qt, Dt, backward=kind, backend="triton") * G.to(device)).sum().backward()
    _close(Qt.grad.cpu(), dq, torch.float32)
    _close(Dt.grad.cpu(), dd, torch.float32)
    assert (Dt.grad[1, [0, 1, 3, 4, 5]] == 0).all()


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("normalize", [False, True])
def test_hard_negatives_layout_with_few_hits(device, normalize):
    """Per-query negatives with long documents: fewer winners than document tokens (dD is filled
    with zeros and only the rows picked are written), one token picked by every query token."""
    g = torch.Generator().manual_seed(8)
    Q = torch.rand(3, 8, 16, generator=g) + 0.1
    D = torch.randn(3, 2, 40, 16, generator=g)
    D[2, 1, 33] = 5.0
    qm = torch.ones(3, 8, dtype=torch.bool)
    qm[0, 5:] = False
    G = torch.randn(3, 2, generator=g)
    want, dq, dd = _ref_padded(Q, D, qm, None, G, normalize=normalize)
    grads = []
    for _ in range(2):
        Qt, Dt = Q.to(device).clone().requires_grad_(), D.to(device).clone().requires_grad_()
        out = maxsim(Qt, Dt, qm.to(device), normalize=normalize, backward="lowmem", backend="triton")
        (out * G.to(device)).sum().backward()
        grads.append((Qt.grad, Dt.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
    _close(out.detach().cpu(), want, torch.float32)
    _close(grads[0][0].cpu(), dq, torch.float32)
    _close(grads[0][1].cpu(), dd, torch.float32)


def test_auto_picks_the_backward_measured_faster():
    """The rule from benchmarks/results/training-sweep-H100-device.json (kernel time) for padded
    batches: lowmem, except a cross product whose documents are at least 16x longer than the
    queries; varlen keeps the rule measured with the sort."""
    from mvdb.kernels.maxsim.train import choose_backward

    assert choose_backward("auto", False, 32, 180) == "lowmem"  # ColBERT in-batch
    assert choose_backward("auto", False, 1024, 1024) == "lowmem"  # ColPali in-batch
    assert choose_backward("auto", True, 32, 1030) == "lowmem"  # hard negatives
    assert choose_backward("auto", False, 32, 1024) == "unified"  # short queries, long documents
    assert choose_backward("unified", True, 32, 180) == "unified"  # an explicit choice stands
    # varlen: lowmem sorts the winners there; the rule measured with the sort
    assert choose_backward("auto", False, 32, 180, padded=False, n_hits=16 * 16 * 32, doc_elems=16 * 180 * 128) \
        == "unified"
    assert choose_backward("auto", False, 32, 180, padded=False, n_hits=256 * 256 * 32, doc_elems=0) == "lowmem"


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("tune", [{}, {"dd_perdoc": 0, "dd_cross": 0}, {"dq_bq": 8}],
                         ids=["defaults", "sorted-dD", "dq-blocks-of-8"])
@pytest.mark.parametrize("normalize", [False, True])
def test_launch_alternatives_are_exact(device, tune, normalize, monkeypatch):
    """Both ways of computing lowmem dD (from the sorted winners, or, sort-free, one program per
    per-query document or per cross-product document block; benchmarks/training_sweep.py measures
    them) give the
    reference's values and gradients (grouped cross product and per-query layouts with masks, a
    token every query token picks, documents of several tiles and a tail), and a tie goes to the
    first token even when its copies lie in later tiles."""
    from mvdb.kernels.maxsim import train

    for key, value in tune.items():
        monkeypatch.setitem(train.TUNE, key, value)
    g = torch.Generator().manual_seed(9)
    for per_query in (False, True):
        Q = torch.rand(3, 20, 16, generator=g) + 0.05
        D = torch.randn(*((3, 2) if per_query else (4,)), 37, 16, generator=g)
        D[(0, 1, 7) if per_query else (1, 7)] = 4.0  # one token every query token picks
        qm = torch.rand(3, 20, generator=g) > 0.2
        dm = torch.rand(D.shape[:-1], generator=g) > 0.2
        G = torch.randn(3, D.shape[1] if per_query else 4, generator=g)
        want, dq, dd = _ref_padded(Q, D, qm, dm, G, normalize=normalize)
        Qt, Dt = Q.to(device).requires_grad_(), D.to(device).requires_grad_()
        out = maxsim(Qt, Dt, qm.to(device), dm.to(device), normalize=normalize, backward="lowmem", backend="triton")
        (out * G.to(device)).sum().backward()
        _close(out.detach().cpu(), want, torch.float32)
        _close(Qt.grad.cpu(), dq, torch.float32)
        _close(Dt.grad.cpu(), dd, torch.float32)
    for shape in ((1, 40, 16), (1, 1, 40, 16)):  # identical tokens across tiles: the first wins
        Dt = torch.ones(shape, device=device).requires_grad_()
        q = torch.linspace(0.5, 1.5, 16, device=device).expand(1, 2, 16)
        maxsim(q, Dt, backward="lowmem", normalize=normalize, backend="triton").sum().backward()
        grad = Dt.grad.reshape(40, 16).cpu()
        assert (grad[1:] == 0).all() and grad[0].abs().sum() > 0


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("tune", [{}, {"dd_perdoc": 0, "dd_cross": 0}], ids=["defaults", "sorted-dD"])
def test_empty_queries_and_nan_padding_in_lowmem(device, tune, monkeypatch):
    """Queries of zero tokens (no winner to gather) and NaN in masked query padding: dD is zero
    where nothing picked a row, and never NaN, on every dD path."""
    from mvdb.kernels.maxsim import train

    for key, value in tune.items():
        monkeypatch.setitem(train.TUNE, key, value)
    Q = torch.rand(2, 0, 16, device=device, requires_grad=True)
    D = torch.randn(3, 7, 16, device=device, requires_grad=True)
    maxsim(Q, D, backward="lowmem", backend="triton").sum().backward()
    assert (D.grad == 0).all()
    g = torch.Generator().manual_seed(10)
    Q = torch.rand(3, 6, 16, generator=g)
    qm = torch.ones(3, 6, dtype=torch.bool)
    qm[:, 4:] = False
    Q[:, 4:] = float("nan")  # padding behind the mask
    for shape in ((4, 9, 16), (3, 2, 9, 16)):
        D = torch.randn(*shape, generator=g)
        G = torch.randn(3, shape[-3], generator=g)
        want, dq, dd = _ref_padded(Q[:, :4], D, None, None, G)
        Qt, Dt = Q.to(device).clone().requires_grad_(), D.to(device).clone().requires_grad_()
        (maxsim(Qt, Dt, qm.to(device), backward="lowmem", backend="triton") * G.to(device)).sum().backward()
        _close(Dt.grad.cpu(), dd, torch.float32)
        _close(Qt.grad.cpu()[:, :4], dq, torch.float32)
