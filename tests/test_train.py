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
    """The static rule, fitted to kernel times (each case below is a measured shape), for padded
    batches: lowmem, except an in-batch cross product of >= 512 pairs with queries of <= 128
    tokens and documents long enough that lowmem's pass over every 64-row block costs more than
    unified's atomics; varlen keeps the rule measured with the sort."""
    from mvdb.kernels.maxsim.train import choose_backward

    assert choose_backward("auto", False, 32, 180, n_q=256, n_k=256) == "lowmem"  # ColBERT in-batch
    assert choose_backward("auto", False, 1024, 1024, n_q=64, n_k=64) == "lowmem"  # ColPali in-batch
    assert choose_backward("auto", True, 32, 1030, n_q=256, n_k=16) == "lowmem"  # hard negatives
    assert choose_backward("auto", False, 32, 1024, n_q=64, n_k=64) == "lowmem"  # 16 blocks x 32 = 16 x 32
    assert choose_backward("auto", False, 64, 1024, n_q=32, n_k=32) == "lowmem"  # 16 blocks x 64 = 16 x 64
    assert choose_backward("auto", False, 32, 512, n_q=128, n_k=128) == "lowmem"
    assert choose_backward("auto", False, 40, 700, n_q=40, n_k=40) == "unified"  # 11 blocks x 64 slots > 16 x 40
    assert choose_backward("auto", False, 100, 800, n_q=80, n_k=80) == "unified"  # 13 x 128 > 16 x 100
    assert choose_backward("auto", False, 20, 900, n_q=24, n_k=24) == "unified"  # 576 pairs: 15 x 32 > 16 x 20
    assert choose_backward("auto", False, 20, 900, n_q=12, n_k=12) == "lowmem"  # small batch
    assert choose_backward("auto", False, 32, 1024) == "lowmem"  # no batch size given: the small-batch side
    assert choose_backward("auto", False, 256, 4096, n_q=64, n_k=64) == "lowmem"  # long queries: sorted dD
    assert choose_backward("unified", True, 32, 180) == "unified"  # an explicit choice stands
    # varlen: lowmem sorts the winners there; the rule measured with the sort
    assert choose_backward("auto", False, 32, 180, padded=False, n_hits=16 * 16 * 32, doc_elems=16 * 180 * 128) \
        == "unified"
    assert choose_backward("auto", False, 32, 180, padded=False, n_hits=256 * 256 * 32, doc_elems=0) == "lowmem"


def test_auto_measures_each_bucket_once(monkeypatch):
    """``auto`` on a GPU: the first backward of a shape bucket compiles both backwards, times them
    alternately, keeps the faster (by the smaller of two timings each) and returns its gradients;
    later calls of the bucket reuse the choice; the cache is bounded; where it cannot measure it
    takes the static rule and stores nothing; deterministic mode takes lowmem without timing."""
    from mvdb.kernels.maxsim.train import policy

    monkeypatch.setattr(policy, "AUTO_CHOICES", type(policy.AUTO_CHOICES)())
    monkeypatch.setattr(policy, "AUTO_CACHE_SIZE", 2)
    monkeypatch.setattr(policy, "can_measure", lambda device: True)
    calls = []
    cost = {"lowmem": [3.0, 2.0], "unified": [2.5, 2.4]}  # ms per timed run: unified's best 2.4 > 2.0

    def run(kind):
        calls.append(kind)
        return f"grads of {kind}"

    def timer(run_, kind):
        run_(kind)
        return cost[kind][sum(c == kind for c in calls) - 2]  # the warm run is not timed

    dev = torch.device("cpu")
    assert policy.measured_backward("a", run, "unified", dev, timer) == "grads of lowmem"
    assert calls == ["lowmem", "unified", "lowmem", "unified", "lowmem", "unified", "lowmem"]
    assert dict(policy.AUTO_CHOICES) == {"a": "lowmem"}
    calls.clear()
    assert policy.measured_backward("a", run, "unified", dev, timer) == "grads of lowmem"
    assert calls == ["lowmem"]  # cached: no timing
    cost.update(lowmem=[5.0, 5.0], unified=[1.0, 9.0])
    for key in ("b", "c"):
        calls.clear()
        assert policy.measured_backward(key, run, "lowmem", dev, timer) == "grads of unified"
    assert list(policy.AUTO_CHOICES) == ["b", "c"]  # bounded: "a" (least recently used) went first
    cost.update(lowmem=[1.0, 1.0], unified=[1.0, 1.0])  # a tie keeps the static rule's pick
    calls.clear()
    assert policy.measured_backward("tie", run, "unified", dev, timer) == "grads of unified"

    def short_of_memory(kind):
        if kind == "unified":
            raise torch.cuda.OutOfMemoryError("unified's fp32 buffers")
        return run(kind)

    calls.clear()
    assert policy.measured_backward("oom", short_of_memory, "unified", dev, timer) == "grads of lowmem"
    assert policy.AUTO_CHOICES["oom"] == "lowmem"

    monkeypatch.setattr(policy, "can_measure", lambda device: False)
    calls.clear()
    assert policy.measured_backward("d", run, "unified", dev, timer) == "grads of unified"
    assert calls == ["unified"] and "d" not in policy.AUTO_CHOICES
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    calls.clear()
    assert policy.measured_backward("tie", run, "unified", dev, timer) == "grads of lowmem"  # even if cached
    assert calls == ["lowmem"]
    assert policy.choose_backward("auto", False, 32, 1024, n_q=64, n_k=64) == "lowmem"
    assert policy.choose_backward("unified", False, 32, 1024) == "unified"  # an explicit choice stands


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_auto_measures_in_batch_products_only(device, monkeypatch):
    """``auto`` hands in-batch padded products to the measurement (with their shape bucket) and
    returns the gradients of the backward it runs; per-query negatives keep the static rule
    (lowmem), as do empty batches."""
    from mvdb.kernels.maxsim.train import ops

    seen = []

    def spy(key, run, fallback, dev):  # as if unified had measured faster
        seen.append((key, fallback))
        return run("unified")

    monkeypatch.setattr(ops, "measured_backward", spy)
    g = torch.Generator().manual_seed(2)
    Q = torch.randn(3, 5, 16, generator=g)
    for D, want in ((torch.randn(4, 70, 16, generator=g), "unified"),
                    (torch.randn(3, 2, 70, 16, generator=g), "lowmem"), (torch.randn(0, 70, 16, generator=g), "lowmem")):
        got = []
        for kind in ("auto", want):
            Qt, Dt = Q.to(device).requires_grad_(), D.to(device).requires_grad_()
            maxsim(Qt, Dt, backward=kind, backend="triton").sum().backward()
            got.append((Qt.grad.cpu(), Dt.grad.cpu()))
        torch.testing.assert_close(got[0], got[1], rtol=1e-6, atol=1e-6)
    assert len(seen) == 1  # the in-batch call only
    key, fallback = seen[0]
    # 3 x 4 pairs, Lq 5, Ld 70 -> 2 blocks, no masks, no overrides; dQ and dD needed
    assert fallback == "lowmem" and key[4:] == (3, 4, 5, 2, False, False, (), True, True)


def test_auto_key_separates_what_changes_the_faster_backward():
    from mvdb.kernels.maxsim.train import policy

    def key(**kw):
        args = dict(device=torch.device("cuda"), dtype=torch.bfloat16, dim=128, normalize=False, n_q=64, n_k=64,
                    lq=32, ld=700, q_masked=False, d_masked=False)
        return policy.auto_key(**{**args, **kw})

    assert key(ld=650) == key(ld=700)  # one 64-row block: documents padded to a batch's longest
    for other in (dict(lq=17), dict(ld=760), dict(n_k=63), dict(q_masked=True), dict(normalize=True),
                  dict(dtype=torch.float16), dict(device=torch.device("cuda:1"))):
        assert key(**other) != key(), other


def test_auto_cache_is_thread_safe(monkeypatch):
    """Backwards on several threads (DataParallel's per-device autograd threads) share the bounded
    cache: no lookup races an eviction."""
    import threading

    from mvdb.kernels.maxsim.train import policy

    monkeypatch.setattr(policy, "AUTO_CHOICES", type(policy.AUTO_CHOICES)())
    monkeypatch.setattr(policy, "AUTO_CACHE_SIZE", 2)
    monkeypatch.setattr(policy, "can_measure", lambda device: True)
    errors = []

    def work(seed):
        try:
            for i in range(400):
                policy.measured_backward((seed + i) % 7, lambda kind: kind, "lowmem", torch.device("cpu"),
                                         lambda run, kind: run(kind) and (1.0 if kind == "lowmem" else 2.0))
        except Exception as e:  # noqa: BLE001 - any failure is the finding
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(policy.AUTO_CHOICES) <= 2


def test_auto_cannot_measure_on_cpu_or_when_disabled(monkeypatch):
    from mvdb.kernels.maxsim import tuning
    from mvdb.kernels.maxsim.train import policy

    monkeypatch.setattr(tuning, "interpreting", lambda: False)  # as on a GPU machine
    assert not policy.can_measure(torch.device("cpu"))
    monkeypatch.setenv("MVDB_AUTOTUNE", "0")
    assert not policy.can_measure(torch.device("cuda"))
    monkeypatch.setenv("MVDB_AUTOTUNE", "1")
    monkeypatch.setattr(tuning, "interpreting", lambda: True)
    assert not policy.can_measure(torch.device("cuda"))


@pytest.mark.gpu
def test_auto_on_the_gpu_returns_the_measured_backwards_gradients(monkeypatch):
    """On CUDA the first ``auto`` step of a bucket measures and caches the faster backward; its
    gradients are that backward's (lowmem's bitwise; unified's to fp32 atomics' rounding), and a
    second step reuses the choice. (Measuring is on whatever MVDB_AUTOTUNE the run has: the GPU
    suite runs with MVDB_AUTOTUNE=0, which would take the static rule.)"""
    from mvdb.kernels.maxsim import train

    monkeypatch.setenv("MVDB_AUTOTUNE", "1")

    g = torch.Generator(device="cuda").manual_seed(4)
    Q = torch.randn(24, 32, 64, device="cuda", generator=g).bfloat16()
    D = torch.randn(24, 700, 64, device="cuda", generator=g).bfloat16()

    def grads(kind):
        Qg, Dg = Q.clone().requires_grad_(), D.clone().requires_grad_()
        maxsim(Qg, Dg, backward=kind).logsumexp(1).sum().backward()
        return Qg.grad, Dg.grad

    train.AUTO_CHOICES.clear()
    got = grads("auto")
    assert len(train.AUTO_CHOICES) == 1
    chosen = next(iter(train.AUTO_CHOICES.values()))
    want = grads(chosen)
    if chosen == "lowmem":
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    else:
        torch.testing.assert_close(got[0].float(), want[0].float(), rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(got[1].float(), want[1].float(), rtol=1e-2, atol=1e-2)
    grads("auto")
    assert list(train.AUTO_CHOICES.values()) == [chosen]


@pytest.mark.heavy
@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("tune", [{}, {"dd_perdoc": 0, "dd_cross": 0}, {"dq_bq": 8}],
                         ids=["defaults", "sorted-dD", "dq-blocks-of-8"])
@pytest.mark.parametrize("normalize", [False, True])
def test_launch_alternatives_are_exact(device, tune, normalize, monkeypatch):
    """Both ways of computing lowmem dD (from the sorted winners, or, sort-free, one program per
    per-query document or per cross-product document block) give the reference's values and
    gradients (grouped cross product and per-query layouts with masks, a token every query token
    picks, documents of several tiles and a tail), and a tie goes to the first token even when its
    copies lie in later tiles."""
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


@pytest.mark.gpu
def test_padded_offsets_are_kept_per_stream_and_never_from_inference_mode(monkeypatch):
    """The padded layout's offsets are made once per (device, stream, n, step) and kept (a step's
    two launches fewer), with a bound; another stream gets its own; inference mode neither reads
    nor fills the cache, so a later training step never saves an inference tensor; nor do CUDA
    graph capture (the graph's pool owns what it allocates) and torch.compile tracing."""
    from mvdb.kernels.maxsim.train import ops

    dev = torch.device("cuda")
    ops._STEPS.clear()
    a = ops._steps(4, 32, dev)
    assert ops._steps(4, 32, dev) is a and a.tolist() == [0, 32, 64, 96, 128]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        b = ops._steps(4, 32, dev)
    assert b is not a and b.tolist() == a.tolist()
    with torch.inference_mode():
        assert ops._steps(5, 7, dev) is not ops._steps(5, 7, dev)
    assert not any(key[2:] == (5, 7) for key in ops._STEPS)
    Q = torch.randn(2, 5, 16, device="cuda", requires_grad=True)
    D = torch.randn(3, 7, 16, device="cuda", requires_grad=True)
    maxsim(Q, D, backward="lowmem").sum().backward()
    assert Q.grad is not None and D.grad is not None
    for n in range(ops._STEPS_MAX + 8):
        ops._steps(n, 3, dev)
    assert len(ops._STEPS) == ops._STEPS_MAX
    ops._STEPS.clear()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = ops._steps(9, 5, dev)
    graph.replay()
    torch.cuda.synchronize()
    assert captured.tolist() == list(range(0, 50, 5)) and not ops._STEPS
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert ops._steps(9, 5, dev).tolist() == list(range(0, 50, 5)) and not ops._STEPS


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["lowmem", "unified"])
@pytest.mark.parametrize("per_query", [False, True])
def test_training_kernels_relaunch_the_compiled_binary(kind, per_query, monkeypatch):
    """The training kernels go through runtime.launch_kernel: after the first step of a shape, the
    forward and both backwards relaunch their compiled binaries (entries in its cache), with the
    same gradients as triton's own launch path (MVDB_FAST_LAUNCH=0)."""
    from mvdb.kernels.maxsim import runtime
    from mvdb.kernels.maxsim.train import fused as tfused

    g = torch.Generator(device="cuda").manual_seed(5)
    Q = torch.randn(6, 24, 64, device="cuda", generator=g).bfloat16()
    D = torch.randn(*((6, 3) if per_query else (5,)), 150, 64, device="cuda", generator=g).bfloat16()

    def grads():
        Qg, Dg = Q.clone().requires_grad_(), D.clone().requires_grad_()
        maxsim(Qg, Dg, backward=kind).logsumexp(-1).sum().backward()
        return Qg.grad, Dg.grad

    monkeypatch.setattr(runtime, "FAST_LAUNCH", False)
    slow = grads()
    monkeypatch.setattr(runtime, "FAST_LAUNCH", True)
    runtime._REPLAY.clear()
    first, again = grads(), grads()
    kernels = {entry[3] for entry in runtime._REPLAY.values()}
    fwd = tfused._fwd_argmax_kernel if per_query else tfused._fwd_argmax_grouped_kernel
    assert fwd in kernels
    if kind == "unified":
        assert tfused._bwd_unified_kernel in kernels
    else:
        assert tfused._bwd_lowmem_dq_kernel in kernels
        assert (tfused._bwd_perdoc_dd_kernel if per_query else tfused._bwd_cross_dd_kernel) in kernels
    for got in (first, again):
        if kind == "lowmem":  # reproducible: bitwise
            assert torch.equal(got[0], slow[0]) and torch.equal(got[1], slow[1])
        else:
            torch.testing.assert_close(got[0].float(), slow[0].float(), rtol=1e-2, atol=1e-2)
            torch.testing.assert_close(got[1].float(), slow[1].float(), rtol=1e-2, atol=1e-2)


def test_host_integer_helpers_match_triton():
    """The launchers' host-side cdiv / pow2 (plain ints; triton's are constexpr functions,
    slow to call from the host) give triton.cdiv's and triton.next_power_of_2's values."""
    import triton

    from mvdb.kernels.maxsim.runtime import cdiv, pow2

    for n in [*range(0, 1100), 2**20 - 1, 2**20, 2**20 + 1, 2**40 + 3]:
        assert pow2(n) == triton.next_power_of_2(n), n
        for b in (1, 3, 16, 64, 1024):
            assert cdiv(n, b) == triton.cdiv(n, b), (n, b)
