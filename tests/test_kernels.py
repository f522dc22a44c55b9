"""Parity of the fused MaxSim kernels against an fp64 reference, edge cases and bad input.

On the CPU the Triton code itself runs under TRITON_INTERPRET=1 (tiny shapes); on a GPU the same
tests run compiled (marked ``gpu``).
"""

import math
import zlib

import numpy as np
import pytest
import torch

from conftest import TRITON_DEVICES
from mvdb import DeviceMismatchError, InvalidInputError, InvalidTypeError, MvdbError
from mvdb.kernels import dequantize_int8, maxsim, maxsim_candidates, maxsim_varlen, quantize_int8
from mvdb.kernels.maxsim import naive

FLOATS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _gen(*key) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def _packed(lengths, dim, g, device, dtype=torch.float32):
    x = torch.randn(sum(lengths), dim, generator=g).to(dtype).to(device)
    cu = torch.tensor([0] + list(torch.tensor(lengths, dtype=torch.long).cumsum(0)), dtype=torch.int32)
    return x, cu.to(device)


def _poison(shape, device):
    return torch.full(shape, float("nan"), dtype=torch.float32, device=device)


def _check_close(got, ref, torch_same_dtype=None, rtol=0.0):
    """got within 2x the error of the same-dtype torch computation (plus a rounding floor)."""
    assert not torch.isnan(got).any(), "NaN in output: an element was never written"
    ref = ref.double().cpu()
    got = got.double().cpu()
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(got), finite), (got, ref)
    assert torch.equal(got[~finite], ref[~finite])
    err = (got[finite] - ref[finite]).abs().max().item() if finite.any() else 0.0
    floor = 1e-5 * max(1.0, ref[finite].abs().max().item() if finite.any() else 1.0)
    bound = floor + rtol * (ref[finite].abs().max().item() if finite.any() else 0.0)
    if torch_same_dtype is not None:
        base = (torch_same_dtype.double().cpu()[finite] - ref[finite]).abs().max().item()
        bound += 2 * base
    assert err <= bound, f"max error {err:.3g} > bound {bound:.3g}"


def _torch_same_dtype_csr(q, cu_q, d, cu_d, cand=None):
    """The naive computation carried out in the inputs' own dtype (what the kernel must beat)."""
    return naive.maxsim_csr(q.cpu(), cu_q.cpu(), d.cpu(), cu_d.cpu().long(), None if cand is None else cand.cpu(),
                            dtype=q.dtype)


DOC_LENGTHS = [1, 3, 63, 113, 0, 17]


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("dim", [48, 96, 128])
@pytest.mark.parametrize("dtype", list(FLOATS), ids=list(FLOATS))
def test_varlen_parity(device, dim, dtype):
    g = _gen("varlen", dim, dtype)
    dt = FLOATS[dtype]
    q, cu_q = _packed([3, 1, 32], dim, g, device, dt)
    d, cu_d = _packed(DOC_LENGTHS, dim, g, device, dt)
    out = _poison((3, len(DOC_LENGTHS)), device)
    got = maxsim_varlen(q, cu_q, d, cu_d, out=out, backend="triton")
    assert got.data_ptr() == out.data_ptr()
    ref = naive.maxsim_csr(q.double().cpu(), cu_q.cpu(), d.double().cpu(), cu_d.cpu())
    _check_close(got, ref, _torch_same_dtype_csr(q, cu_q, d, cu_d))
    assert torch.all(got[:, 4] == 0), "an empty document scores 0"


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("dim", [48, 128, 320], ids=["48", "128", "320-exact-i2f"])
def test_varlen_int8_parity(device, dim):
    g = _gen("varlen-int8", dim)
    q, cu_q = _packed([5, 2], dim, g, device)
    d, cu_d = _packed(DOC_LENGTHS, dim, g, device)
    tok, sc = quantize_int8(d)
    got = maxsim_varlen(q, cu_q, tok, cu_d, d_scales=sc, out=_poison((2, len(DOC_LENGTHS)), device), backend="triton")
    # The dequantized reference: both sides quantized per token, then exact fp64 arithmetic.
    ref = naive.maxsim_csr(q.cpu(), cu_q.cpu(), tok.cpu(), cu_d.cpu().long(), None, sc.cpu(), dtype=torch.float64)
    _check_close(got, ref, rtol=1e-6)
    exact = naive.maxsim_csr(q.double().cpu(), cu_q.cpu(), d.double().cpu(), cu_d.cpu())
    assert (got.cpu().double() - exact).abs().max() < 0.05 * exact.abs().max(), "int8 far from the float scores"


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32", "int8"])
def test_candidates_parity(device, dtype):
    g = _gen("cand", dtype)
    dim = 96
    lengths = [7, 1, 63, 30, 113, 2, 9, 40]
    q, cu_q = _packed([4, 1, 9], dim, g, device)
    d, cu_d = _packed(lengths, dim, g, device)
    offsets = cu_d.long()
    cand = torch.tensor([[7, 2, -1, 2], [-1, -1, -1, -1], [0, 4, 3, 5]], device=device)
    if dtype == "int8":
        tok, sc = quantize_int8(d)
        ref = naive.maxsim_csr(q.cpu(), cu_q.cpu(), tok.cpu(), offsets.cpu(), cand.cpu(), sc.cpu(), dtype=torch.float64)
        same = None
    else:
        tok, sc = d.to(FLOATS[dtype]), None
        qd = q.to(FLOATS[dtype])
        ref = naive.maxsim_csr(qd.double().cpu(), cu_q.cpu(), tok.double().cpu(), offsets.cpu(), cand.cpu())
        same = _torch_same_dtype_csr(qd, cu_q, tok, offsets, cand)
        q = qd
    got = maxsim_candidates(q, cu_q, tok, offsets, cand, sc, out=_poison((3, 4), device), backend="triton")
    _check_close(got, ref, same, rtol=1e-6 if dtype == "int8" else 0.0)
    assert torch.isinf(got[1]).all() and (got[1] < 0).all(), "padding candidates score -inf"
    assert got[0, 1] == got[0, 3], "the same document scores the same"


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_padded_cross_with_masks(device, dtype):
    g = _gen("padded", dtype)
    dt = FLOATS[dtype]
    Q = torch.randn(3, 11, 48, generator=g).to(dt).to(device)
    D = torch.randn(5, 13, 48, generator=g).to(dt).to(device)
    q_mask = (torch.rand(3, 11, generator=g) > 0.3).to(device)
    q_mask[2] = False  # a fully masked query scores 0 everywhere
    d_mask = (torch.rand(5, 13, generator=g) > 0.4).to(device)
    d_mask[1] = False  # a fully masked document scores 0
    got = maxsim(Q, D, q_mask, d_mask, out=_poison((3, 5), device), backend="triton")
    ref = naive.maxsim_padded(Q.double().cpu(), D.double().cpu(), q_mask.cpu(), d_mask.cpu())
    same = naive.maxsim_padded(Q.cpu(), D.cpu(), q_mask.cpu(), d_mask.cpu(), dtype=dt)
    _check_close(got, ref, same)
    assert torch.all(got[:, 1] == 0) and torch.all(got[2] == 0)


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_padded_masked_positions_never_win(device):
    """A masked doc token that would be the best match must not count."""
    Q = torch.ones(1, 2, 32, device=device)
    D = torch.full((1, 4, 32), -1.0, device=device)
    D[0, 3] = 10.0
    d_mask = torch.tensor([[True, True, True, False]], device=device)
    got = maxsim(Q, D, d_mask=d_mask, backend="triton")
    assert got.item() == pytest.approx(2 * -32.0)


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("dtype", ["bf16", "int8"])
def test_padded_per_query_candidates(device, dtype):
    g = _gen("perq", dtype)
    Q = torch.randn(2, 7, 64, generator=g).to(device)
    D = torch.randn(2, 3, 9, 64, generator=g).to(device)
    d_mask = (torch.rand(2, 3, 9, generator=g) > 0.2).to(device)
    if dtype == "int8":
        D, sc = quantize_int8(D)
        ref = naive.maxsim_padded(Q.cpu(), D.cpu(), None, d_mask.cpu(), sc.cpu(), dtype=torch.float64)
        got = maxsim(Q, D, d_mask=d_mask, d_scales=sc, out=_poison((2, 3), device), backend="triton")
        _check_close(got, ref, rtol=1e-6)
    else:
        Q, D = Q.bfloat16(), D.bfloat16()
        ref = naive.maxsim_padded(Q.double().cpu(), D.double().cpu(), None, d_mask.cpu())
        same = naive.maxsim_padded(Q.cpu(), D.cpu(), None, d_mask.cpu(), dtype=torch.bfloat16)
        got = maxsim(Q, D, d_mask=d_mask, out=_poison((2, 3), device), backend="triton")
        _check_close(got, ref, same)


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_single_query_2d(device):
    g = _gen("single")
    Q = torch.randn(5, 32, generator=g).to(device)
    D = torch.randn(4, 6, 32, generator=g).to(device)
    got = maxsim(Q, D, backend="triton")
    assert got.shape == (4,)
    _check_close(got, naive.maxsim_padded(Q[None].double().cpu(), D.double().cpu())[0])


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_long_query_is_chunked_exactly(device):
    """Lq > 512 is split into blocks and summed: same as the reference."""
    g = _gen("long")
    q, cu_q = _packed([530], 32, g, device, torch.float16)
    d, cu_d = _packed([5, 20], 32, g, device, torch.float16)
    got = maxsim_varlen(q, cu_q, d, cu_d, out=_poison((1, 2), device), backend="triton")
    ref = naive.maxsim_csr(q.double().cpu(), cu_q.cpu(), d.double().cpu(), cu_d.cpu())
    _check_close(got, ref, _torch_same_dtype_csr(q, cu_q, d, cu_d))


@pytest.mark.heavy
@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("dtype", ["fp16", "int8", "int8-quant-in-kernel"])
def test_long_queries_split_across_programs(device, dtype, monkeypatch):
    """Long queries split into chunks of QCHUNK_ROWS rows, one program each (chunk sums added after
    the launch), score as the unsplit launch and the reference: on the cross, the candidate (a -1
    candidate stays -inf) and the paged candidate layout, for a longest-query estimate below the
    real longest (the last chunk runs to the query's end), a far too large one (no more chunks than
    the query tokens fill), 0, and chunks that end inside a BLOCK_Q block; through the public calls
    on both padded layouts, with query and document masks on the cross product. The grid has one
    program per pair and chunk. (Autotuning off, so that every launch passes the spy.)"""
    from mvdb.kernels.maxsim import kernel, launcher, runtime, tuning
    from mvdb.kernels.maxsim.launcher import Geometry

    quant = dtype == "int8-quant-in-kernel"
    dtype = "int8" if quant else dtype
    g = _gen("qchunk", dtype)
    dim = 32
    lengths = [5, 16, 37, 0, 48, 1]
    q, cu_q = _packed([70, 3, 33], dim, g, device, torch.float16)
    d, cu_d = _packed(lengths, dim, g, device)
    tok, sc = quantize_int8(d) if dtype == "int8" else (d.half(), None)
    cand = torch.tensor([[5, 0, 2, -1], [4, 1, 3, 2], [2, 2, 0, 1]], device=device)
    starts = cu_d[:-1].long().contiguous()
    grids = []
    real = runtime.launch_kernel

    def spy(fn, grid, args, consts, *rest):
        if fn is kernel._maxsim_fwd_kernel:
            grids.append((grid[0], consts["QCHUNK"]))
        real(fn, grid, args, consts, *rest)

    monkeypatch.setattr(launcher, "launch_kernel", spy)
    monkeypatch.setattr(launcher, "autotuning", lambda: False)
    config = {"BLOCK_Q": 16, "BLOCK_D": 16, "RUNMAX": 1, "num_warps": 4, "QUANT": quant}

    def run(layout, n_k, offsets, cnd, paged, max_lq, rows):
        return launcher.launch(_poison((3, n_k), device), q, tok, Geometry(layout, 3, n_k, max_lq), cu_q=cu_q,
                               d_scales=sc, offsets=offsets, cand=cnd, starts=starts if paged else None,
                               scale_starts=starts if paged and sc is not None else None,
                               config={**config, "QCHUNK": rows})

    for layout, n_k, offsets, cnd, paged in (
        (kernel.CSR_CROSS, len(lengths), cu_d, None, False),
        (kernel.CSR_CAND, 4, cu_d.long(), cand, False),
        (kernel.CSR_CAND, 4, cu_d.long(), cand, True),
    ):
        ccpu = None if cnd is None else cnd.cpu()
        if dtype == "int8":
            ref = naive.maxsim_csr(q.cpu(), cu_q.cpu(), tok.cpu(), cu_d.cpu().long(), ccpu, sc.cpu(), dtype=torch.float64)
            same = None
        else:
            ref = naive.maxsim_csr(q.double().cpu(), cu_q.cpu(), tok.double().cpu(), cu_d.cpu().long(), ccpu)
            same = _torch_same_dtype_csr(q, cu_q, tok, cu_d.long(), cnd)
        whole = run(layout, n_k, offsets, cnd, paged, 70, 0)
        # 24-row chunks end inside 16-row blocks; an estimate of 36 gives 2 chunks for a 70-token query;
        # an estimate of 10**6 no more than the 106 query tokens fill (4 chunks of 32); 0: one program
        for max_lq, rows, chunks in ((70, 32, 3), (70, 24, 3), (36, 32, 2), (10**6, 32, 4), (0, 32, 1)):
            grids.clear()
            got = run(layout, n_k, offsets, cnd, paged, max_lq, rows)
            assert grids == [(3 * n_k * chunks, rows if chunks > 1 else 0)], grids
            _check_close(got, ref, same, rtol=1e-6 if dtype == "int8" else 0.0)
            torch.testing.assert_close(got, whole, rtol=1e-6, atol=1e-4)
            assert torch.equal(torch.isinf(got), torch.isinf(whole))
    # padded layouts through the public call and the module's rule
    Q = torch.randn(2, 40, dim, generator=g).to(device)
    D = torch.randn(3, 20, dim, generator=g).to(device)
    D4 = torch.randn(2, 3, 20, dim, generator=g).to(device)  # per-query candidates
    qm = (torch.rand(2, 40, generator=g) > 0.3).to(device)
    dm = torch.rand(3, 20, generator=g) > 0.3
    dm[1] = False  # a document with no valid token scores 0
    dm = dm.to(device)
    DD, ds = quantize_int8(D) if dtype == "int8" else (D, None)
    DD4, ds4 = quantize_int8(D4) if dtype == "int8" else (D4, None)
    monkeypatch.setattr(tuning, "QCHUNK_ROWS", 16)
    monkeypatch.setattr(tuning, "QCHUNK_MIN_LQ", 17)
    monkeypatch.setattr(tuning, "QCHUNK_MIN_LD", 21)
    maxsim(Q, DD, qm, dm, d_scales=ds)
    assert grids[-1] == (2 * 3, 0), "documents of 20 tokens, below QCHUNK_MIN_LD: one program per pair"
    monkeypatch.setattr(tuning, "QCHUNK_MIN_LD", 20)
    grids.clear()
    got = maxsim(Q, DD, qm, dm, d_scales=ds)
    got4 = maxsim(Q, DD4, d_scales=ds4)
    assert grids == [(2 * 3 * 3, 16), (2 * 3 * 3, 16)], grids
    monkeypatch.setattr(tuning, "QCHUNK_ROWS", 0)
    whole = maxsim(Q, DD, qm, dm, d_scales=ds)
    whole4 = maxsim(Q, DD4, d_scales=ds4)
    assert grids[-2:] == [(2 * 3, 0), (2 * 3, 0)], grids
    torch.testing.assert_close(got, whole, rtol=1e-6, atol=1e-4)
    torch.testing.assert_close(got4, whole4, rtol=1e-6, atol=1e-4)
    assert torch.all(got[:, 1] == 0)


def test_query_chunk_rule():
    """Queries of QCHUNK_MIN_LQ tokens and more against documents of QCHUNK_MIN_LD tokens on average
    are split into QCHUNK_ROWS-row chunks (faster on long documents, slower on short ones); the
    rest run one program per pair. The mean document length comes from the shapes:
    the padded length, or a CSR store's tokens / documents; a paged store is not split."""
    from mvdb.kernels.maxsim import kernel, tuning
    from mvdb.kernels.maxsim.tuning import QCHUNK_MIN_LD, QCHUNK_MIN_LQ, QCHUNK_ROWS, query_chunks

    assert (QCHUNK_ROWS, QCHUNK_MIN_LQ, QCHUNK_MIN_LD) == (256, 512, 512)
    assert query_chunks(32, 1024) == query_chunks(300, 1024) == query_chunks(511, 1024) == 1
    assert query_chunks(512, 1024) == 2 and query_chunks(1024, 1024) == 4 and query_chunks(1030, 512) == 5
    assert query_chunks(1024, 182) == query_chunks(1024, 511.9) == 1
    d = torch.empty(3000, 8)
    offsets = torch.zeros(4, dtype=torch.int64)
    assert tuning._mean_doc_len(int(kernel.CSR_CROSS.value), d, offsets, 0, None) == 1000
    assert tuning._mean_doc_len(int(kernel.CSR_CAND.value), d, offsets, 0, torch.zeros(3)) == 0
    assert tuning._mean_doc_len(int(kernel.PADDED_CROSS.value), d, None, 700, None) == 700


@pytest.mark.heavy
@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("dtype", ["fp16", "int8", "int8-quant-in-kernel"])
@pytest.mark.parametrize("runmax", [0, 1], ids=["reduce-per-tile", "running-max"])
@pytest.mark.parametrize("lq_bucket", [16, 128], ids=["short-query-bucket", "long-query-bucket"])
def test_every_launch_variant_is_exact(device, dtype, runmax, lq_bucket):
    """The kernel's tuning choices (per-tile reduction or an elementwise running max; a short and a
    long query's bucket; int8 queries quantized by a launch of their own or inside each program)
    give the same scores as the reference, for both CSR layouts. Documents span several BLOCK_D
    tiles plus a partial one; one query spans two BLOCK_Q blocks; a -1 candidate scores -inf."""
    from mvdb.kernels.maxsim import kernel, launcher
    from mvdb.kernels.maxsim.launcher import Geometry

    quant = dtype == "int8-quant-in-kernel"
    dtype = "int8" if quant else dtype
    g = _gen("variants", dtype)
    dim = 64
    lengths = [5, 16, 37, 0, 48, 1]
    q, cu_q = _packed([20, 3], dim, g, device, torch.float16)
    d, cu_d = _packed(lengths, dim, g, device)
    tok, sc = quantize_int8(d) if dtype == "int8" else (d.half(), None)
    cand = torch.tensor([[5, 0, 2, -1, 1], [4, 1, 3, 2, 2]], device=device)
    if dtype == "int8":
        ref_cross = naive.maxsim_csr(q.cpu(), cu_q.cpu(), tok.cpu(), cu_d.cpu().long(), None, sc.cpu(), dtype=torch.float64)
        ref_cand = naive.maxsim_csr(q.cpu(), cu_q.cpu(), tok.cpu(), cu_d.cpu().long(), cand.cpu(), sc.cpu(),
                                    dtype=torch.float64)
    else:
        ref_cross = naive.maxsim_csr(q.double().cpu(), cu_q.cpu(), tok.double().cpu(), cu_d.cpu().long())
        ref_cand = naive.maxsim_csr(q.double().cpu(), cu_q.cpu(), tok.double().cpu(), cu_d.cpu().long(), cand.cpu())
    config = {"BLOCK_Q": 16, "BLOCK_D": 16, "RUNMAX": runmax, "num_warps": 4, "QUANT": quant}
    cross = launcher.launch(_poison((2, len(lengths)), device), q, tok,
                            Geometry(kernel.CSR_CROSS, 2, len(lengths), lq_bucket), cu_q=cu_q, d_scales=sc,
                            offsets=cu_d, config=config)
    cands = launcher.launch(_poison((2, 5), device), q, tok, Geometry(kernel.CSR_CAND, 2, 5, lq_bucket), cu_q=cu_q,
                            d_scales=sc, offsets=cu_d.long(), cand=cand, config=config)
    same = None if dtype == "int8" else _torch_same_dtype_csr(q, cu_q, tok, cu_d)
    _check_close(cross, ref_cross, same, rtol=1e-6 if dtype == "int8" else 0.0)
    same = None if dtype == "int8" else _torch_same_dtype_csr(q, cu_q, tok, cu_d.long(), cand)
    _check_close(cands, ref_cand, same, rtol=1e-6 if dtype == "int8" else 0.0)


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("dtype", ["fp16", "int8"])
@pytest.mark.parametrize("lq_bucket", [16, 128], ids=["short-query-bucket", "long-query-bucket"])
def test_tiles_past_a_documents_end_never_score(device, dtype, lq_bucket):
    """The tile loop has no bounds masks: a document's last tile starts BLOCK_D tokens before its
    end, and a document shorter than a tile repeats its last token. With every score negative, a
    column that read padding (0) or a neighbour's token would win the max; none may. Lengths
    around BLOCK_D (16): shorter, one under, one over, two tiles and a bit, empty; the
    neighbours' tokens score far higher than the document's own."""
    from mvdb.kernels.maxsim import kernel, launcher
    from mvdb.kernels.maxsim.launcher import Geometry

    g = _gen("tiles-past-end", dtype)
    dim = 32
    lengths = [1, 5, 15, 17, 35, 0, 16, 2]
    q = torch.rand(20, dim, generator=g).half().to(device) + 0.1  # positive
    d = -(torch.rand(sum(lengths), dim, generator=g) + 0.1)  # negative: every score below 0
    cu_d = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    for i in range(1, len(lengths), 2):  # every other document scores high against the query
        d[cu_d[i]:cu_d[i + 1]] *= -1
    d, cu_d = d.to(device), cu_d.to(device)
    cu_q = torch.tensor([0, 20], dtype=torch.int32, device=device)
    tok, sc = quantize_int8(d) if dtype == "int8" else (d.half(), None)
    if dtype == "int8":
        ref = naive.maxsim_csr(q.cpu(), cu_q.cpu(), tok.cpu(), cu_d.cpu().long(), None, sc.cpu(), dtype=torch.float64)
    else:
        ref = naive.maxsim_csr(q.double().cpu(), cu_q.cpu(), tok.double().cpu(), cu_d.cpu().long())
    assert (ref[0, 0::2][torch.tensor(lengths[0::2]) > 0] < 0).all()
    config = {"BLOCK_Q": 16, "BLOCK_D": 16, "RUNMAX": 0, "num_warps": 4}
    got = launcher.launch(_poison((1, len(lengths)), device), q, tok,
                          Geometry(kernel.CSR_CROSS, 1, len(lengths), lq_bucket), cu_q=cu_q, d_scales=sc, offsets=cu_d,
                          config=config)
    _check_close(got, ref, rtol=1e-6 if dtype == "int8" else 1e-3)
    # padded documents of 7 and 13 tokens (shorter than a tile, and one tile minus 3): the same
    Dp = -(torch.rand(3, 13, dim, generator=g) + 0.1)
    Dp[1] *= -1
    for dl in (7, 13):
        D = Dp[:, :dl].contiguous().to(device)
        Dk, Ds = quantize_int8(D) if dtype == "int8" else (D.half(), None)
        want = (naive.maxsim_padded(q[None].cpu(), Dk.cpu(), d_scales=Ds.cpu(), dtype=torch.float64) if Ds is not None
                else naive.maxsim_padded(q[None].double().cpu(), Dk.double().cpu()))
        got = launcher.launch(_poison((1, 3), device), q, Dk,
                              Geometry(kernel.PADDED_CROSS, 1, 3, lq_bucket, q_len=20, d_len=dl), d_scales=Ds,
                              config=config)
        _check_close(got, want, rtol=1e-6 if dtype == "int8" else 1e-3)


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_query_quantization_kernel_matches_quantize_int8(device):
    """The per-launch query quantization is bit-identical to mvdb.kernels.quantize_int8
    (including an all-zero token, scale 1, and exact .5 ties rounded away from zero)."""
    from mvdb.kernels.maxsim import query_quant

    x = torch.randn(70, 96, generator=_gen("qq")).to(device)
    x[3] = 0
    x[4, :4] = torch.tensor([127.0, 63.5, -63.5, 0.5])
    x[4, 4:] = 0
    for dt in (torch.float16, torch.float32):
        q8, qs = query_quant.quantize_queries(x.to(dt).contiguous())
        r8, rs = quantize_int8(x.to(dt).cpu())
        assert torch.equal(q8.cpu(), r8) and torch.equal(qs.cpu(), rs)


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_query_quantization_inside_the_kernel_is_bit_identical(device):
    """Each program's own quantization of its query block (a reciprocal and two FMAs instead of a
    division per element) gives the scores of the quantization launch bit for bit, including
    exact .5 ties, an all-zero token and tiny and large magnitudes, for fp32, fp16 and bf16 queries."""
    from mvdb.kernels.maxsim import kernel, launcher
    from mvdb.kernels.maxsim.launcher import Geometry

    g = _gen("qk")
    q = torch.randn(3 * 16, 64, generator=g)
    q[1] = 0
    q[2, :4] = torch.tensor([127.0, 63.5, -63.5, 0.5])
    q[2, 4:] = 0
    q[20] *= 1e-30  # in query 1: query 0's score would not show a one-unit change next to 3e30
    q[21] *= 3e30
    # query 2 only of tiny rows (subnormal values and scales, where 1 / scale would overflow without
    # the 2^64 scaling), with the ties again at a subnormal scale
    q[32:47] *= 1e-40
    q[47, 1:] = (torch.arange(-126, 126, 4) + 0.5) * 61 * 2.0**-140
    q[47, 0] = 127 * 61 * 2.0**-140
    # scale 61 / 256 (1 / scale is inexact) and quotients exactly k + 0.5: ties that a multiply by
    # the rounded reciprocal moves below the half (for 57 of these 63)
    q[5, 1:] = (torch.arange(-126, 126, 4) + 0.5) * 61 / 256
    q[5, 0] = 127 * 61 / 256
    q = q.to(device)
    cu_q = torch.tensor([0, 16, 32, 48], dtype=torch.int32, device=device)
    d, cu_d = _packed([5, 16, 37, 1], 64, g, device)
    tok, sc = quantize_int8(d)
    config = {"BLOCK_Q": 16, "BLOCK_D": 16, "RUNMAX": 1, "num_warps": 4}
    # float32, and the fp16 and bf16 blocks (fp16 skips the tiny-row scaling: its scales are >= 2^-24 / 127)
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        qd = q.to(dt)
        got = [launcher.launch(_poison((3, 4), device), qd, tok, Geometry(kernel.CSR_CROSS, 3, 4, 16), cu_q=cu_q,
                               d_scales=sc, offsets=cu_d.long(), config={**config, "QUANT": quant}) for quant in (False,
                               True)]
        assert torch.equal(got[0], got[1]), dt


def test_int8_query_quantization_placement_follows_the_measurements():
    """Small int8 launches quantize the queries inside the MaxSim kernel (a launch less of host
    time); large or long-query ones in a launch of their own (less device time)."""
    from mvdb.kernels.maxsim.query_quant import quantize_in_kernel

    assert quantize_in_kernel(10_000, 32)  # 1 query of 32 tokens x 10k documents
    assert quantize_in_kernel(4 * 1000, 32)  # 4 queries x 1,000 candidates
    assert not quantize_in_kernel(16 * 1000, 32)  # 16 queries x 1,000 candidates
    assert not quantize_in_kernel(1000, 1024)  # one ColPali query x 1,000 pages


@pytest.mark.gpu
def test_quantize_array_gpu_matches_cpu():
    """The ingest quantizer on the GPU (pinned double buffers, several chunks, a short last one)
    is bit-identical to the CPU threads, for float16 and float32 input, zero rows and .5 ties."""
    from mvdb.kernels import quant

    x = torch.randn(20_011, 128, generator=_gen("qa")).numpy()
    x[7] = 0
    x[8, :3] = [127.0, 63.5, -63.5]
    x[8, 3:] = 0
    for arr in (x, x.astype(np.float16)):
        ref_q, ref_s = quant.quantize_array(arr, gpu=False)
        for got_q, got_s in (quant.quantize_array(arr, gpu=True), quant._quantize_gpu(arr, step=3000)):
            assert np.array_equal(got_q, ref_q) and np.array_equal(got_s, ref_s)


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_default_call_needs_no_longest_query(device, monkeypatch):
    """check=False without max_seqlen_q reads nothing from the device to pick the launch (the
    longest query is estimated from the shapes) and scores exactly, even when the estimate is
    short of the real longest query (a batch of one long and many short queries)."""
    from mvdb.kernels.maxsim import ops

    g = _gen("nosync")
    q, cu_q = _packed([40, 1, 1, 1, 1, 1, 1, 2], 32, g, device, torch.float16)
    d, cu_d = _packed([3, 70, 9], 32, g, device, torch.float16)
    seen = []
    real = ops.launch
    monkeypatch.setattr(ops, "launch", lambda *a, **k: seen.append(a[3].max_lq) or real(*a, **k))
    got = maxsim_varlen(q, cu_q, d, cu_d, check=False)
    assert seen == [6], "the longest query is estimated as ceil(tokens / queries) = ceil(48 / 8)"
    ref = naive.maxsim_csr(q.double().cpu(), cu_q.cpu(), d.double().cpu(), cu_d.cpu())
    _check_close(got, ref, _torch_same_dtype_csr(q, cu_q, d, cu_d))
    one = maxsim_varlen(q[:40], cu_q[:2], d, cu_d, check=False)
    assert seen[-1] == 40, "one query: its length, exactly"
    _check_close(one, ref[:1], _torch_same_dtype_csr(q[:40], cu_q[:2], d, cu_d))


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_empty_inputs(device):
    q, cu_q = _packed([3], 32, _gen("e"), device)
    empty_q = torch.zeros(0, 32, device=device)
    d, cu_d = _packed([2, 4], 32, _gen("e2"), device)
    assert maxsim_varlen(q, cu_q, d[:0], torch.zeros(1, dtype=torch.int32, device=device)).shape == (1, 0)
    zero_len = maxsim_varlen(empty_q, torch.zeros(2, dtype=torch.int32, device=device), d, cu_d, backend="triton")
    assert torch.equal(zero_len.cpu(), torch.zeros(1, 2)), "an empty query scores 0"
    cand = torch.zeros(1, 0, dtype=torch.long, device=device)
    assert maxsim_candidates(q, cu_q, d, cu_d.long(), cand).shape == (1, 0)


# The pure-torch fallback (what CPU tensors use without TRITON_INTERPRET).


@pytest.mark.parametrize("budget", [1 << 24, 7], ids=["one-chunk", "tiny-chunks"])
def test_torch_backend_matches_reference_in_any_chunking(budget, monkeypatch):
    g = _gen("torch", budget)
    q, cu_q = _packed([4, 9], 48, g, "cpu")
    d, cu_d = _packed(DOC_LENGTHS, 48, g, "cpu")
    ref = naive.maxsim_csr(q.double(), cu_q, d.double(), cu_d)
    monkeypatch.setattr(naive, "DEFAULT_BUDGET", budget)
    got = maxsim_varlen(q, cu_q, d, cu_d, backend="torch")
    _check_close(got, ref)
    cand = torch.tensor([[5, -1, 0], [3, 3, 4]])
    got = maxsim_candidates(q, cu_q, d, cu_d.long(), cand, backend="torch")
    _check_close(got, naive.maxsim_csr(q.double(), cu_q, d.double(), cu_d.long(), cand))
    Q, D = torch.randn(2, 5, 48, generator=g), torch.randn(3, 4, 48, generator=g)
    _check_close(maxsim(Q, D, backend="torch"), naive.maxsim_padded(Q.double(), D.double()))


def test_torch_reference_by_brute_force():
    """The reference itself against a literal double loop."""
    g = _gen("brute")
    q, cu_q = _packed([2, 3], 8, g, "cpu", torch.float64)
    d, cu_d = _packed([1, 4, 0], 8, g, "cpu", torch.float64)
    ref = naive.maxsim_csr(q, cu_q, d, cu_d)
    for i in range(2):
        for j in range(3):
            qi, dj = q[cu_q[i] : cu_q[i + 1]], d[cu_d[j] : cu_d[j + 1]]
            want = sum(max((a * b).sum().item() for b in dj) for a in qi) if len(dj) else 0.0
            assert math.isclose(ref[i, j].item(), want, rel_tol=1e-6, abs_tol=1e-9)


def test_quantize_int8_roundtrip():
    g = _gen("quant")
    x = torch.randn(50, 96, generator=g) * torch.rand(50, 1, generator=g) * 10
    x[3] = 0
    q, s = quantize_int8(x)
    assert q.dtype == torch.int8 and s.dtype == torch.float32 and s.shape == (50,)
    assert s[3] == 1 and torch.all(q[3] == 0), "an all-zero token gets scale 1"
    assert q.abs().max() == 127
    err = (dequantize_int8(q, s) - x).abs()
    assert torch.all(err <= s[:, None] / 2 + 1e-6)


# Bad input: each raises the right error class and names the argument.


def _good(device="cpu"):
    q, cu_q = _packed([2, 3], 32, _gen("good"), device)
    d, cu_d = _packed([2, 4, 1], 32, _gen("good2"), device)
    return q, cu_q, d, cu_d


@pytest.mark.parametrize(
    "mutate, error, message",
    [
        (lambda a: {**a, "d": a["d"][:, :16]}, InvalidInputError, "d: expected last dim 32"),
        (lambda a: {**a, "q": a["q"].long()}, InvalidTypeError, "q: expected dtype float16/bfloat16/float32, got int64"),
        (lambda a: {**a, "d": a["d"].double()}, InvalidTypeError, "d: expected dtype"),
        (lambda a: {**a, "cu_d": a["cu_d"].long()}, InvalidTypeError, "cu_d: expected dtype int32, got int64"),
        (lambda a: {**a, "cu_d": torch.tensor([0, 4, 2, 7], dtype=torch.int32)}, InvalidInputError,
         "cu_d: expected non-decreasing offsets, got a decrease of 2"),
        (lambda a: {**a, "cu_d": torch.tensor([0, 2, 6, 9], dtype=torch.int32)}, InvalidInputError,
         "cu_d: expected last entry 7 (the token count), got 9"),
        (lambda a: {**a, "cu_q": torch.tensor([1, 2, 5], dtype=torch.int32)}, InvalidInputError,
         "cu_q: expected first entry 0, got 1"),
        (lambda a: {**a, "d": quantize_int8(a["d"])[0]}, InvalidInputError, "scales: expected float32 per-token scales"),
        (lambda a: {**a, "d_scales": torch.ones(7)}, InvalidInputError, "scales: expected None for float32 d"),
        (lambda a: {**a, "q": a["q"].numpy()}, InvalidTypeError, "q: expected a torch.Tensor, got ndarray"),
        (lambda a: {**a, "q": a["q"][None]}, InvalidInputError, "q: expected a 2-D tensor, got shape (1, 5, 32)"),
        (lambda a: {**a, "backend": "cuda"}, InvalidInputError, "backend: expected one of"),
        (lambda a: {**a, "out": torch.empty(2, 2)}, InvalidInputError, "out: expected shape (2, 3), got (2, 2)"),
    ],
    ids=["dim", "q-dtype", "d-dtype", "cu-dtype", "non-monotonic", "cu-end", "cu-start", "int8-no-scales",
         "float-with-scales", "numpy", "ndim", "backend", "out-shape"],
)
def test_varlen_bad_input(mutate, error, message):
    q, cu_q, d, cu_d = _good()
    args = mutate({"q": q, "cu_q": cu_q, "d": d, "cu_d": cu_d})
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        maxsim_varlen(**args)


def test_candidates_bad_input():
    q, cu_q, d, cu_d = _good()
    off = cu_d.long()
    with pytest.raises(InvalidInputError, match=r"cand: expected document indices in \[0, 3\) or -1 for padding, got 3"):
        maxsim_candidates(q, cu_q, d, off, torch.tensor([[0, 3], [1, 2]]))
    with pytest.raises(InvalidInputError, match="got -2"):
        maxsim_candidates(q, cu_q, d, off, torch.tensor([[0, -2], [1, 2]]))
    with pytest.raises(InvalidTypeError, match="offsets: expected dtype int64, got int32"):
        maxsim_candidates(q, cu_q, d, cu_d, torch.tensor([[0, 1], [1, 2]]))
    with pytest.raises(InvalidTypeError, match="cand: expected dtype int64, got int32"):
        maxsim_candidates(q, cu_q, d, off, torch.tensor([[0, 1], [1, 2]], dtype=torch.int32))
    with pytest.raises(InvalidInputError, match="cand: expected 2 rows"):
        maxsim_candidates(q, cu_q, d, off, torch.tensor([[0, 1]]))
    with pytest.raises(InvalidInputError, match=r"offsets: expected non-decreasing"):
        maxsim_candidates(q, cu_q, d, torch.tensor([0, 5, 2, 7]), torch.tensor([[0, 1], [1, 2]]))
    with pytest.raises(InvalidInputError, match="tokens: expected last dim 32"):
        maxsim_candidates(q, cu_q, d[:, :8], off, torch.tensor([[0, 1], [1, 2]]))


def test_padded_bad_input():
    Q, D = torch.randn(2, 3, 16), torch.randn(4, 5, 16)
    with pytest.raises(InvalidInputError, match="D: expected last dim 16"):
        maxsim(Q, torch.randn(4, 5, 8))
    with pytest.raises(InvalidInputError, match=r"d_mask: expected shape \(4, 5\), got \(4, 4\)"):
        maxsim(Q, D, d_mask=torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(InvalidTypeError, match="q_mask: expected dtype bool, got float32"):
        maxsim(Q, D, q_mask=torch.ones(2, 3))
    with pytest.raises(InvalidInputError, match="D: expected 2 query rows for per-query candidates"):
        maxsim(Q, torch.randn(3, 4, 5, 16))
    with pytest.raises(InvalidInputError, match="Q: expected a 2-D or 3-D tensor"):
        maxsim(Q[None, None], D)
    with pytest.raises(InvalidInputError, match=r"scales: expected a 2-D tensor, got shape \(20,\)"):
        maxsim(Q, quantize_int8(D)[0], d_scales=torch.ones(20))


def test_errors_share_a_base_and_the_builtin():
    q, cu_q, d, cu_d = _good()
    with pytest.raises(MvdbError):
        maxsim_varlen(q, cu_q, d[:, :3], cu_d)
    with pytest.raises(ValueError):
        maxsim_varlen(q, cu_q, d[:, :3], cu_d)
    with pytest.raises(TypeError):
        maxsim_varlen(q.long(), cu_q, d, cu_d)


@pytest.mark.gpu
def test_different_devices_rejected():
    q, cu_q, d, cu_d = _good()
    with pytest.raises(DeviceMismatchError, match="d: expected a tensor on cuda:0"):
        maxsim_varlen(q.cuda(), cu_q.cuda(), d, cu_d.cuda())


def test_different_devices_rejected_cpu_meta():
    """Device mismatch without a GPU: the meta device stands in for a second device."""
    q, cu_q, d, cu_d = _good()
    with pytest.raises(DeviceMismatchError, match="cu_d: expected a tensor on cpu"):
        maxsim_varlen(q, cu_q, d, cu_d.to("meta"))


@pytest.mark.gpu
def test_new_batch_or_corpus_size_does_not_recompile(monkeypatch):
    """Autotune keys on (Lq bucket, dim, dtype, layout): new batch and corpus sizes reuse the binaries."""
    from mvdb.kernels.maxsim import kernel

    monkeypatch.setenv("MVDB_AUTOTUNE", "1")

    def call(nq, nd, lq):
        g = _gen("recompile", nq, nd, lq)
        q, cu_q = _packed([lq] * nq, 128, g, "cuda", torch.float16)
        d, cu_d = _packed(list(torch.randint(1, 200, (nd,), generator=g)), 128, g, "cuda", torch.float16)
        maxsim_varlen(q, cu_q, d, cu_d)
        cand = torch.randint(0, nd, (nq, 37), generator=g).cuda()
        maxsim_candidates(q, cu_q, d, cu_d.long(), cand)
        torch.cuda.synchronize()

    call(3, 100, 32)
    before = kernel.compiled_variants()
    assert before > 0
    for nq, nd, lq in [(1, 7, 32), (17, 1000, 30), (64, 33, 25), (2, 12_345, 32)]:
        call(nq, nd, lq)
    assert kernel.compiled_variants() == before, "a new batch/corpus size compiled a new kernel"
    call(2, 50, 100)  # a new Lq bucket may compile
    assert kernel.compiled_variants() >= before


@pytest.mark.gpu
def test_warmup_compiles_ahead(monkeypatch):
    from mvdb.kernels import warmup
    from mvdb.kernels.maxsim import kernel, query_quant

    monkeypatch.setenv("MVDB_AUTOTUNE", "1")

    warmup(dtypes=(torch.float16, torch.int8), query_lengths=(32,))
    before = kernel.compiled_variants()
    q, cu_q = _packed([32, 32], 128, _gen("w"), "cuda", torch.float16)
    d, cu_d = _packed([5, 300, 64], 128, _gen("w2"), "cuda", torch.float16)
    maxsim_candidates(q, cu_q, d, cu_d.long(), torch.tensor([[0, 1], [2, -1]], device="cuda"))
    tok, sc = quantize_int8(d)
    maxsim_varlen(q, cu_q, tok, cu_d, d_scales=sc)
    # a mid-sized int8 launch (one program per query quantizes, the others share its rows) and a
    # large one (its queries are quantized before the MaxSim kernel, not inside it)
    mid = torch.randint(0, 3, (2, query_quant.SHARE_MIN_WORK // 64 + 1), device="cuda")
    maxsim_candidates(q, cu_q, tok, cu_d.long(), mid, sc)
    many = torch.randint(0, 3, (2, query_quant.QUANT_IN_KERNEL_WORK // 64 + 1), device="cuda")
    maxsim_candidates(q, cu_q, tok, cu_d.long(), many, sc)
    torch.cuda.synchronize()
    assert kernel.compiled_variants() == before, "the first query after warmup() compiled"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "int8"])
def test_gpu_top10_agreement_realistic_shapes(dtype):
    """The kernel ranks as exactly as its reference at realistic shapes: fp16 against fp32
    arithmetic on the fp16 values; int8 against fp64 arithmetic on the same quantized documents
    and queries (top-10 identical). Against unquantized fp32 scores int8 keeps the same first
    document; its rank-10 neighbours are near-ties that quantization may swap (about a third of
    noise draws swap one, with the exact int8 reference too), so that is not asserted."""
    g = _gen("top10", dtype)
    lengths = list(torch.randint(64, 301, (3000,), generator=g))
    d, cu_d = _packed(lengths, 128, g, "cuda")
    d = torch.nn.functional.normalize(d, dim=-1)
    src = d[cu_d[5] : cu_d[5] + 32]
    noise = torch.randn(src.shape, generator=g).to(src.device)
    q = torch.nn.functional.normalize(src + 0.5 * noise, dim=-1)
    cu_q = torch.tensor([0, 32], dtype=torch.int32, device="cuda")
    if dtype == "fp16":
        got = maxsim_varlen(q.half(), cu_q, d.half(), cu_d)[0]
        ref = naive.maxsim_csr(q.half().float(), cu_q, d.half().float(), cu_d.long(), dtype=torch.float32)[0]
    else:
        tok, sc = quantize_int8(d)
        got = maxsim_varlen(q, cu_q, tok, cu_d, d_scales=sc)[0]
        ref = naive.maxsim_csr(q, cu_q, tok, cu_d.long(), None, sc, dtype=torch.float64)[0].float()
        exact = naive.maxsim_csr(q, cu_q, d, cu_d.long(), dtype=torch.float32)[0]
        assert int(got.argmax()) == int(exact.argmax()), "int8 keeps the first document of the fp32 scores"
    assert got.topk(10).indices.tolist() == ref.topk(10).indices.tolist()


@pytest.mark.parametrize("gather_cost", [0, 8, 10**9], ids=["per-group", "default", "whole-batch"])
@pytest.mark.parametrize("int8", [False, True])
def test_naive_candidates_batched_equal_per_query(monkeypatch, gather_cost, int8):
    """The CPU candidate path groups queries (or scores the whole batch's union at once): every
    grouping gives each query's own exact scores, -inf for padding, whole rows of padding too."""
    from mvdb.kernels.maxsim import naive
    from mvdb.kernels.quant import quantize_int8

    monkeypatch.setattr(naive, "GATHER_COST", gather_cost)
    g = torch.Generator().manual_seed(5)
    lens = torch.randint(1, 9, (40,), generator=g)
    off = torch.zeros(41, dtype=torch.int64)
    off[1:] = lens.cumsum(0)
    tok = torch.randn(int(off[-1]), 16, generator=g)
    scales = None
    if int8:
        tok, scales = quantize_int8(tok)
    q_lens = [3, 1, 5, 2, 4, 2]
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()])
    q = torch.randn(int(cu[-1]), 16, generator=g)
    cand = torch.randint(0, 40, (6, 7), generator=g)
    cand[1, 3:] = -1
    cand[4] = -1  # a query with no candidates
    cand[2, 1] = cand[2, 0]  # a repeat
    got = naive.maxsim_csr(q, cu, tok, off, cand, scales)
    full = naive.maxsim_csr(q, cu, tok, off, None, scales)
    want = full.gather(1, cand.clamp(min=0)).masked_fill(cand < 0, float("-inf"))
    torch.testing.assert_close(got, want)


def test_upload_all_gives_the_host_tensors_on_the_device():
    """One staged copy of several host tensors (dtypes and sizes that leave the packed block
    unaligned without padding) gives each back unchanged on the device; back-to-back calls reuse
    the pinned buffer only after the device has read it (the first call's values stay intact).
    On a CPU the tensors come back as they are."""
    from mvdb.kernels.host import upload_all

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    first = [torch.randn(1 << 20, 3, generator=g).half(), torch.arange(7, dtype=torch.int32),
             torch.randint(0, 100, (5,), generator=g), torch.zeros(0, dtype=torch.int32)]
    got1 = upload_all(first, dev)
    second = [torch.randn(1 << 21, 2, generator=g), torch.arange(3, dtype=torch.int32)]
    got2 = upload_all(second, dev)
    for want, got in [*zip(first, got1), *zip(second, got2)]:
        assert got.device.type == torch.device(dev).type and got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got.cpu(), want)


def test_autotune_short_list_follows_the_sweep(monkeypatch):
    """The autotuner's pruned list: queries of up to 32 tokens get only BLOCK_D 32 with 2 warps
    (near the best config in every short case), int8 documents
    whose queries were quantized apart also one warp with 3 stages or unpipelined (1 stage, the
    best on int8 candidates); long queries keep large query tiles; MVDB_AUTOTUNE=full keeps every config
    that fits."""
    from mvdb.kernels.maxsim import tuning

    configs = tuning._configs()
    monkeypatch.delenv("MVDB_AUTOTUNE", raising=False)
    short = tuning._prune(configs, None, LQ_BUCKET=32)
    assert short and {(c.kwargs["BLOCK_Q"], c.kwargs["BLOCK_D"], c.num_warps) for c in short} == {(32, 32, 2)}
    assert {c.num_stages for c in short} == {2, 3} and {c.kwargs["RUNMAX"] for c in short} == {0, 1}
    short8 = tuning._prune(configs, None, LQ_BUCKET=32, INT8=True, QUANT=False)
    assert {(c.kwargs["BLOCK_Q"], c.kwargs["BLOCK_D"], c.num_warps, c.num_stages) for c in short8} == {
        (32, 32, 2, 2), (32, 32, 2, 3), (32, 32, 1, 3), (32, 32, 1, 1)}
    # shared query rows (QCACHE): one warp with 3 stages, not the unpipelined one (slower there)
    shared8 = tuning._prune(configs, None, LQ_BUCKET=32, INT8=True, QUANT=True, QCACHE=True)
    assert {(c.num_warps, c.num_stages) for c in shared8} == {(2, 2), (2, 3), (1, 3)}
    # each program quantizing its own query block: not with one warp (measured 1.26x slower)
    assert tuning._prune(configs, None, LQ_BUCKET=32, INT8=True, QUANT=True) == short
    assert not any(c.num_warps == 1 for c in tuning._prune(configs, None, LQ_BUCKET=64, INT8=True, QUANT=False))
    assert {c.kwargs["BLOCK_D"] for c in tuning._prune(configs, None, LQ_BUCKET=64)} == {32, 64}
    long = tuning._prune(configs, None, LQ_BUCKET=1024)
    assert long and all(c.kwargs["BLOCK_Q"] >= 128 and c.num_stages == 3 for c in long)
    monkeypatch.setenv("MVDB_AUTOTUNE", "full")
    assert len(tuning._prune(configs, None, LQ_BUCKET=32)) > len(short)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "int8", "int8-shared"])
def test_every_short_list_config_is_exact(dtype):
    """Each config the autotuner may pick for short queries (the pruned lists of fp16, of int8 with
    the queries quantized apart, one-stage one-warp included, and of int8 with the quantized rows
    shared) scores exactly on the GPU, for both CSR layouts, on documents of 0-70 tokens around the
    32-row tile and a -1 candidate."""
    from mvdb.kernels.maxsim import kernel, launcher, tuning
    from mvdb.kernels.maxsim.launcher import Geometry

    shared = dtype == "int8-shared"
    dtype = "int8" if shared else dtype
    g = _gen("shortlist", dtype, shared)
    lengths = [5, 32, 70, 0, 33, 1, 64]
    q, cu_q = _packed([32, 7], 128, g, "cuda", torch.float16)
    d, cu_d = _packed(lengths, 128, g, "cuda")
    tok, sc = quantize_int8(d) if dtype == "int8" else (d.half(), None)
    cand = torch.tensor([[6, 0, 2, -1, 1], [4, 1, 3, 2, 5]], device="cuda")
    if sc is not None:  # the reference quantizes the fp16 queries by the kernel's rule
        ref_cross, ref_cand = (naive.maxsim_csr(q.cpu(), cu_q.cpu(), tok.cpu(), cu_d.cpu().long(), c, sc.cpu(),
                                                dtype=torch.float64) for c in (None, cand.cpu()))
        same_cross = same_cand = None
    else:
        ref_cross, ref_cand = (naive.maxsim_csr(q.double().cpu(), cu_q.cpu(), tok.double().cpu(), cu_d.cpu().long(), c)
                               for c in (None, cand.cpu()))
        same_cross, same_cand = (_torch_same_dtype_csr(q, cu_q, tok, cu_d.long(), c) for c in (None, cand))
    meta = {"LQ_BUCKET": 32, "INT8": dtype == "int8", "QUANT": shared, "QCACHE": shared}
    configs = tuning._prune(tuning._configs(), None, **meta)
    one_warp = {c.num_stages for c in configs if c.num_warps == 1}
    assert one_warp == ({3} if shared else {1, 3} if dtype == "int8" else set())
    for c in configs:
        config = {**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages, "QUANT": shared, "QCACHE": shared}
        cross = launcher.launch(_poison((2, len(lengths)), "cuda"), q, tok,
                                Geometry(kernel.CSR_CROSS, 2, len(lengths), 32), cu_q=cu_q, d_scales=sc, offsets=cu_d,
                                config=config)
        cands = launcher.launch(_poison((2, 5), "cuda"), q, tok, Geometry(kernel.CSR_CAND, 2, 5, 32), cu_q=cu_q,
                                d_scales=sc, offsets=cu_d.long(), cand=cand, config=config)
        _check_close(cross, ref_cross, same_cross, rtol=1e-6 if sc is not None else 0.0)
        _check_close(cands, ref_cand, same_cand, rtol=1e-6 if sc is not None else 0.0)


@pytest.mark.parametrize("fast", [False, True], ids=["_arg_sig", "_arg_sigs"])
def test_replay_key_separates_what_triton_specializes_on(fast):
    """The relaunch cache's key (runtime._arg_sigs, whose inline cases must agree with
    runtime._arg_sig) tells apart everything the Triton JIT compiles a separate binary for: tensor
    dtype and 16-byte alignment, None, 32- vs 64-bit integers and integers equal to 1 or divisible
    by 16; so a cached binary is never reused where triton would have compiled another."""
    from mvdb.kernels.maxsim import runtime

    x = torch.zeros(64, dtype=torch.float16)
    sig = (lambda a: runtime._arg_sigs((a,))[0]) if fast else runtime._arg_sig
    values = [x, x[8:], x[1:], x.float(), torch.nn.Parameter(x.float()), None, 0, 1, 5, 16, 32, -16, -17,
              2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**70, True, False, 1.5, np.int64(16)]
    assert runtime._arg_sigs(tuple(values)) == tuple(map(runtime._arg_sig, values))
    assert sig(x) == sig(x[8:]) != sig(x[1:])  # 16 bytes in: aligned; 2 bytes in: not
    assert sig(x) != sig(x.float()) and sig(x) != sig(x.view(torch.int16))
    assert sig(None) != sig(x) and sig(None) != sig(0)
    assert sig(5) == sig(7) and sig(5) != sig(2**31) and sig(-(2**31)) != sig(-(2**31) - 1)
    assert sig(5) != sig(1) and sig(5) != sig(32) and sig(32) == sig(48)
    assert sig(True) != sig(1)


def _set_launch_hook(monkeypatch, hook):
    from triton import knobs

    chain = knobs.runtime.launch_enter_hook
    if hasattr(chain, "add"):  # triton 3.9: a HookChain, empty unless a profiler added to it
        monkeypatch.setattr(chain, "calls", [*chain.calls, hook])
    else:
        monkeypatch.setattr(knobs.runtime, "launch_enter_hook", hook)


def test_direct_relaunch_only_where_the_runner_is_known_and_no_hook_is_set(monkeypatch):
    """A relaunch goes straight to the compiled kernel's launcher only where this triton's runner
    (CompiledKernel.__getitem__) makes the call launch_kernel makes, and only while no launch hook
    (a profiler's) is installed; otherwise through the runner, which feeds the hooks."""
    from triton.compiler.compiler import CompiledKernel

    from mvdb.kernels.maxsim import runtime

    assert runtime._known_launcher(CompiledKernel)  # this triton's runner: the known call

    class Other:
        def __getitem__(self, grid):
            return lambda *args: None

    assert not runtime._known_launcher(Other)
    assert runtime._hooks_idle()
    _set_launch_hook(monkeypatch, lambda *a: None)
    assert not runtime._hooks_idle()


@pytest.mark.gpu
def test_direct_relaunch_is_taken_and_launch_hooks_still_fire(monkeypatch):
    """On the GPU the relaunch cache's entries hold the launcher (the direct path is taken, with
    triton's scores); a launch hook installed later is called on every launch."""
    from mvdb.kernels.maxsim import kernel, runtime

    g = _gen("direct")
    q, cu_q = _packed([32], 128, g, "cuda", torch.float16)
    d, cu_d = _packed([64, 300, 5, 180] * 20, 128, g, "cuda", torch.float16)
    monkeypatch.setattr(runtime, "FAST_LAUNCH", False)
    want = maxsim_varlen(q, cu_q, d, cu_d, check=False).clone()
    monkeypatch.setattr(runtime, "FAST_LAUNCH", True)
    runtime._REPLAY.clear()
    got = [maxsim_varlen(q, cu_q, d, cu_d, check=False).clone() for _ in range(3)]
    entries = [v for v in runtime._REPLAY.values() if v[3] is kernel._maxsim_fwd_kernel]
    assert entries and all(e[2] is not None for e in entries), "the direct relaunch was not recognised"
    assert all(torch.equal(x, want) for x in got)
    calls = []
    _set_launch_hook(monkeypatch, lambda *a: calls.append(1))
    assert torch.equal(maxsim_varlen(q, cu_q, d, cu_d, check=False), want)
    torch.cuda.synchronize()
    assert calls, "a launch hook was skipped"


@pytest.mark.gpu
def test_replayed_launches_match_triton_launches(monkeypatch):
    """Relaunching a compiled binary (runtime.launch_kernel, the default) gives the scores of
    triton's own launch, for the float and both int8 paths, after a query that is not
    16-byte aligned (a different specialization) and back; the cache is used (it fills) and stays
    within its bound."""
    from mvdb.kernels.maxsim import query_quant, runtime

    g = _gen("replay")
    q, cu_q = _packed([32], 128, g, "cuda", torch.float16)
    d, cu_d = _packed([64, 300, 5, 180] * 50, 128, g, "cuda", torch.float16)
    tok, sc = quantize_int8(d)
    qm = torch.empty(q.numel() + 8, dtype=q.dtype, device="cuda")[7:7 + q.numel()].view_as(q).copy_(q)
    assert qm.data_ptr() % 16 != 0

    def run(qq):
        got = [maxsim_varlen(qq, cu_q, t, cu_d, d_scales=s, check=False).clone() for t, s in ((d, None), (tok, sc))]
        with monkeypatch.context() as m:  # int8 queries quantized by a launch of their own: two kernels
            m.setattr(query_quant, "QUANT_IN_KERNEL_WORK", 0)
            got.append(maxsim_varlen(qq, cu_q, tok, cu_d, d_scales=sc, check=False).clone())
        return got

    monkeypatch.setattr(runtime, "FAST_LAUNCH", False)
    want = run(q)
    monkeypatch.setattr(runtime, "FAST_LAUNCH", True)
    runtime._REPLAY.clear()
    for qq in (q, q, qm, qm, q):
        got = run(qq)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert len(runtime._REPLAY) >= 3, "launches did not go through the relaunch cache"
    runtime._REPLAY.clear()
    monkeypatch.setattr(runtime, "_REPLAY_MAX", 2)
    for qq in (q, qm, q, qm):
        got = run(qq)
        assert all(torch.equal(a, b) for a, b in zip(got, want)) and len(runtime._REPLAY) <= 2


@pytest.mark.gpu
def test_shared_query_quantization_matches_the_quantization_launch(monkeypatch):
    """Programs that load the query blocks another program quantized and published (QCACHE, the
    default for int8 launches): the published rows and scales are quantize_int8's bit for
    bit, and the scores those of the query-quantization launch (to the order of the row sums,
    which the compiler may lay out otherwise): fp32 / fp16 / bf16 queries, one query over many
    documents, several of different lengths (an empty one, one longer than a query block),
    candidate lists whose first entries are padding, queries changed in place between calls (a
    flag from an earlier launch never counts), a poisoned buffer under every warp count, and
    launches on two streams at once."""
    from mvdb.kernels.maxsim import kernel, launcher, query_quant
    from mvdb.kernels.maxsim.launcher import Geometry

    g = _gen("qcache")
    d, cu_d = _packed([64, 300, 5, 180, 0, 33] * 300, 128, g, "cuda", torch.float16)
    tok, sc = quantize_int8(d)
    n = cu_d.numel() - 1
    off = cu_d.long()
    cfg = {"BLOCK_Q": 32, "BLOCK_D": 32, "RUNMAX": 1, "num_warps": 2, "num_stages": 3}

    def close(a, b):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=0)

    def published(q):
        """The shared buffer's rows and scales for q (the launch that just ran on this stream)."""
        (buf, *_), = query_quant._QCACHE.values()
        rows8, scales8 = query_quant._int8_views(buf, q)
        r8, rs = quantize_int8(q)
        assert torch.equal(rows8, r8) and torch.equal(scales8, rs)

    def both(q, cu_q, layout=kernel.CSR_CROSS, cand=None, warps=2):
        """(separate quantization launch, shared in-kernel quantization) scores."""
        nq = cu_q.numel() - 1
        k = n if cand is None else cand.shape[1]
        query_quant._QCACHE.clear()
        query_quant._query_cache(q, nq, force=True)
        (buf, *_), = query_quant._QCACHE.values()
        buf.fill_(127)  # int8 127s and scales of 3e38: a row read before it was published shows
        out = []
        for c in ({"QUANT": 0}, {"QUANT": 1, "QCACHE": 1}):
            out.append(launcher.launch(_poison((nq, k), "cuda"), q, tok, Geometry(layout, nq, k, 64), cu_q=cu_q,
                                       d_scales=sc, offsets=off, cand=cand, config={**cfg, "num_warps": warps, **c}))
        torch.cuda.synchronize()
        published(q)
        return out

    for dt in (torch.float32, torch.float16, torch.bfloat16):
        q, cu_q = _packed([32], 128, g, "cuda", dt)
        a, b = both(q, cu_q)
        close(b, a)
        # same tensor, new values, same buffer (its flag holds the last launch's number): the next
        # launch must not take the earlier rows
        q.mul_(-0.5)
        b2 = launcher.launch(_poison((1, n), "cuda"), q, tok, Geometry(kernel.CSR_CROSS, 1, n, 64), cu_q=cu_q,
                             d_scales=sc, offsets=off, config={**cfg, "QUANT": 1, "QCACHE": 1})
        close(b2, both(q, cu_q)[0])
        assert not torch.equal(b2, b), dt

    # the programs that find the flag take the published rows: flags set to the coming launch's
    # "published" state (2 * its number + 1) over sentinel rows (all 1, scale 1) give the
    # sentinel's scores, not the query's
    q, cu_q = _packed([32], 128, g, "cuda", torch.float16)
    query_quant._QCACHE.clear()
    rows8, scales8 = query_quant._query_cache(q, 1, force=True)[:2]
    (buf, flags, *_), = query_quant._QCACHE.values()
    rows8.fill_(1)
    scales8.fill_(1.0)
    flags.fill_(2 * (next(query_quant._GEN) + 1) + 1)
    got = launcher.launch(_poison((1, n), "cuda"), q, tok, Geometry(kernel.CSR_CROSS, 1, n, 64), cu_q=cu_q, d_scales=sc,
                          offsets=off, config={**cfg, "QUANT": 1, "QCACHE": 1})
    # (the sentinel is the quantization of a query of ones up to the scale: 127 with scale 1 / 127)
    sentinel = launcher.launch(_poison((1, n), "cuda"), torch.ones_like(q), tok, Geometry(kernel.CSR_CROSS, 1, n, 64),
                               cu_q=cu_q, d_scales=sc, offsets=off, config={**cfg, "QUANT": 0})
    close(got, sentinel)
    # and a launch publishes: its flag holds its own "published" state afterwards
    launcher.launch(_poison((1, n), "cuda"), q, tok, Geometry(kernel.CSR_CROSS, 1, n, 64), cu_q=cu_q, d_scales=sc,
                    offsets=off, config={**cfg, "QUANT": 1, "QCACHE": 1})
    assert int(flags[0]) == 2 * (next(query_quant._GEN) - 1) + 1
    q, cu_q = _packed([7, 0, 70, 32], 128, g, "cuda", torch.float16)
    close(*reversed(both(q, cu_q)))

    # candidate lists: each query's first candidates are padding (-1, whose programs write nothing)
    cand = torch.randint(0, n, (4, 200), generator=g).cuda()
    cand[:, :40] = -1
    close(*reversed(both(q, cu_q, kernel.CSR_CAND, cand)))

    # many programs per query on short documents, every warp count
    cand = torch.randint(0, n, (32, 1000), generator=g).cuda()
    q32, cu32 = _packed([32] * 32, 128, g, "cuda", torch.float16)
    for warps in (1, 2, 4, 2, 2):
        close(*reversed(both(q32, cu32, kernel.CSR_CAND, cand, warps)))

    # the default call takes the shared path (here from any launch size), on two streams at once,
    # each alternating between two queries (a stream's launch must not read the other query's rows)
    monkeypatch.setattr(query_quant, "SHARE_MIN_WORK", 0)
    q1, cu1 = _packed([32], 128, g, "cuda", torch.float16)
    queries = (q1, -q1, q1 * 0.5)
    cfg0 = {"BLOCK_Q": 32, "BLOCK_D": 32, "RUNMAX": 1, "num_warps": 2, "num_stages": 3, "QUANT": 0}
    want = [launcher.launch(_poison((1, n), "cuda"), x, tok, Geometry(kernel.CSR_CROSS, 1, n, 32), cu_q=cu1,
                            d_scales=sc, offsets=off, config=cfg0) for x in queries]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    torch.cuda.synchronize()
    query_quant._QCACHE.clear()
    outs = []
    for r in range(20):
        for i, s in enumerate(streams):
            j = (i + r) % len(queries)
            with torch.cuda.stream(s):
                outs.append((j, maxsim_varlen(queries[j], cu1, tok, cu_d, d_scales=sc, check=False)))
    torch.cuda.synchronize()
    assert len(query_quant._QCACHE) == 2, "the default call did not share the quantized query on each stream"
    for j, o in outs:
        close(o, want[j])


@pytest.mark.gpu
def test_shared_query_quantization_is_off_under_graph_capture(monkeypatch):
    """A captured launch would replay its launch number: while a CUDA graph is captured, every
    program quantizes for itself, and replays after the query changes in place stay right."""
    from mvdb.kernels.maxsim import query_quant

    g = _gen("qcache-graph")
    d, cu_d = _packed([64, 300, 5, 180] * 100, 128, g, "cuda", torch.float16)
    tok, sc = quantize_int8(d)
    q, cu_q = _packed([32], 128, g, "cuda", torch.float16)
    monkeypatch.setattr(query_quant, "SHARE_MIN_WORK", 0)  # eager calls of this size share the rows
    # compile both builds (shared and not) outside the capture
    query_quant._QCACHE.clear()
    maxsim_varlen(q, cu_q, tok, cu_d, d_scales=sc, check=False)
    assert query_quant._QCACHE, "the eager call did not share the quantized query"
    monkey = pytest.MonkeyPatch()
    monkey.setattr(query_quant, "QCACHE_MAX_TOKENS", -1)
    maxsim_varlen(q, cu_q, tok, cu_d, d_scales=sc, check=False)
    monkey.undo()
    # the eager call shares the rows (another build: the row sums may be ordered otherwise)
    _replays_after_the_query_changes(q, lambda: maxsim_varlen(q, cu_q, tok, cu_d, d_scales=sc, check=False),
                                     exact=False)


def _replays_after_the_query_changes(q, call, exact: bool):
    """``call()`` captured in a CUDA graph on a side stream (after one eager run there) replays as
    the eager call scores after q changes in place (bit for bit where ``exact``)."""
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call()
        with torch.cuda.graph(graph, stream=s):
            out = call()
    torch.cuda.current_stream().wait_stream(s)
    for scale in (1.0, -0.5, 2.0):
        q.mul_(scale)
        graph.replay()
        torch.cuda.synchronize()
        if exact:
            assert torch.equal(out, call())
        else:
            torch.testing.assert_close(out, call(), rtol=1e-6, atol=0)


def test_relaunch_tail_takes_parameter_defaults():
    """A relaunch passes every parameter after the arguments: the constexprs given, else the
    kernel's default (GDC), and refuses (KeyError: no relaunch entry) one with neither."""
    from types import SimpleNamespace

    from mvdb.kernels.maxsim import runtime

    empty = runtime.inspect.Parameter.empty
    fn = SimpleNamespace(arg_names=["X", "N", "BLOCK", "GDC"],
                         params=[SimpleNamespace(name=n, default=d) for n, d in
                                 (("X", empty), ("N", empty), ("BLOCK", empty), ("GDC", False))])
    assert runtime._const_tail(fn, 2, {"BLOCK": 16, "num_warps": 4}) == (16, False)
    assert runtime._const_tail(fn, 2, {"BLOCK": 16, "GDC": True}) == (16, True)
    with pytest.raises(KeyError):
        runtime._const_tail(fn, 2, {"GDC": True})


def test_pdl_only_on_a_hopper_gpu_outside_graph_capture(monkeypatch):
    """The MaxSim launch is the quantization launch's programmatic dependent only on CUDA devices of
    sm_90 and later, outside CUDA graph capture, with tuning.PDL on (MVDB_PDL=0 turns it off)."""
    from mvdb.kernels.maxsim import runtime, tuning

    assert not tuning.pdl_ok(torch.device("cpu"))
    monkeypatch.setattr(runtime, "_INTERPRET", False)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(tuning, "_PDL_DEVICES", {0: True, 1: False})
    monkeypatch.setattr(tuning, "PDL", True)
    assert tuning.pdl_ok(torch.device("cuda", 0)) and not tuning.pdl_ok(torch.device("cuda", 1))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not tuning.pdl_ok(torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(tuning, "PDL", False)
    assert not tuning.pdl_ok(torch.device("cuda", 0))


@pytest.mark.gpu
def test_pdl_launch_gives_the_same_scores_and_replays_under_capture(monkeypatch):
    """With the queries quantized by a launch of their own, the MaxSim launch as its programmatic
    dependent (sm_90) scores bit for bit as without, for varlen and candidate calls; a CUDA graph
    captured on that path (PDL off there) replays right after the query changes in place."""
    from mvdb.kernels.maxsim import query_quant, runtime, tuning

    g = _gen("pdl")
    d, cu_d = _packed([64, 300, 5, 180] * 100, 128, g, "cuda", torch.float16)
    tok, sc = quantize_int8(d)
    q, cu_q = _packed([32, 7, 40], 128, g, "cuda", torch.float16)
    offsets = cu_d.long()
    cand = torch.randint(-1, cu_d.numel() - 1, (3, 50), generator=g).cuda()

    def calls():
        return [maxsim_varlen(q, cu_q, tok, cu_d, d_scales=sc, check=False).clone(),
                maxsim_candidates(q, cu_q, tok, offsets, cand, sc, check=False).clone()]

    def poison():  # the stream's buffer holds other rows: a read before the quantization lands shows
        for buf, *_ in query_quant._QCACHE.values():
            buf.fill_(77)

    with query_quant.placed("launch"):
        monkeypatch.setattr(tuning, "PDL", False)
        want = calls()
        assert query_quant._QCACHE, "the quantization launch did not write into the stream's buffer"
        monkeypatch.setattr(tuning, "PDL", True)
        runtime._REPLAY.clear()
        for _ in range(2):
            got = []
            for call in (lambda: maxsim_varlen(q, cu_q, tok, cu_d, d_scales=sc, check=False),
                         lambda: maxsim_candidates(q, cu_q, tok, offsets, cand, sc, check=False)):
                poison()
                got.append(call().clone())
            assert all(torch.equal(a, b) for a, b in zip(got, want))
        on = torch.cuda.get_device_capability()[0] >= 9
        assert any(dict(key[3]).get("launch_pdl") for key in runtime._REPLAY) == on
        _replays_after_the_query_changes(q, lambda: maxsim_varlen(q, cu_q, tok, cu_d, d_scales=sc, check=False),
                                         exact=True)


@pytest.mark.gpu
def test_int8_query_quantization_placement_rule(monkeypatch):
    """Where the default call quantizes int8 queries: every program for itself in a small launch
    (no buffer), shared rows above query_quant.SHARE_MIN_WORK, a launch of its own past
    query_quant.QUANT_IN_KERNEL_WORK (writing into the stream's buffer); the same scores each way."""
    from mvdb.kernels.maxsim import launcher, query_quant

    g = _gen("placement")
    d, cu_d = _packed([64, 300, 5, 180] * 200, 128, g, "cuda", torch.float16)
    tok, sc = quantize_int8(d)
    q, cu_q = _packed([32], 128, g, "cuda", torch.float16)
    n = cu_d.numel() - 1
    work = n * 32
    calls = []
    real = query_quant.quantize_queries
    monkeypatch.setattr(launcher, "quantize_queries", lambda x, *a: calls.append(1) or real(x, *a))
    got = []
    for share_min, in_kernel, shared, launched, name in ((work, work, False, False, "every_program"),
                                                         (work - 1, work, True, False, "shared"),
                                                         (0, work - 1, False, True, "launch")):
        monkeypatch.setattr(query_quant, "SHARE_MIN_WORK", share_min)
        monkeypatch.setattr(query_quant, "QUANT_IN_KERNEL_WORK", in_kernel)
        assert query_quant.quant_placement(n, 32) == name  # the rule benchmarks report
        query_quant._QCACHE.clear()
        calls.clear()
        got.append(maxsim_varlen(q, cu_q, tok, cu_d, d_scales=sc, check=False))
        assert bool(query_quant._QCACHE) == (shared or launched) and bool(calls) == launched, (share_min, in_kernel)
        if launched:  # the launch wrote the query's int8 rows and scales into the stream's buffer
            buf = next(iter(query_quant._QCACHE.values()))[0]
            q8, qs = query_quant._int8_views(buf, q)
            want8, wants = quantize_int8(q)
            assert torch.equal(q8, want8) and torch.equal(qs, wants.float())
    for name in query_quant.PLACEMENTS:  # the forced placements (warmup, benchmarks) take the same paths
        with query_quant.placed(name):
            assert query_quant.quant_placement(n, 32) == name
    for x in got[1:]:
        torch.testing.assert_close(x, got[0], rtol=1e-6, atol=0)


@pytest.mark.gpu
def test_shared_query_quantization_on_padded_layouts_with_masks():
    """The shared rows on the padded layouts (query i's rows at i * Lq) with query and document
    masks and a dim that is not a power of two (masked columns): the separate launch's scores."""
    from mvdb.kernels.maxsim import kernel, launcher, query_quant
    from mvdb.kernels.maxsim.launcher import Geometry

    g = _gen("qcache-padded")
    Q = torch.randn(3, 20, 96, generator=g).half().cuda()
    qm = torch.rand(3, 20, generator=g).cuda() > 0.3
    D = torch.randn(40, 50, 96, generator=g).cuda()
    dm = torch.rand(40, 50, generator=g).cuda() > 0.2
    D8, ds = quantize_int8(D)
    cfg = {"BLOCK_Q": 32, "BLOCK_D": 32, "RUNMAX": 1, "num_warps": 2, "num_stages": 3}
    per_query = [x[:30].reshape(3, 10, *x.shape[1:]).contiguous() for x in (D8, ds, dm)]
    for layout, (DD, SS, MM), nk in ((kernel.PADDED_CROSS, (D8, ds, dm), 40), (kernel.PADDED_PER_QUERY, per_query, 10)):
        query_quant._QCACHE.clear()
        got = [launcher.launch(_poison((3, nk), "cuda"), Q, DD, Geometry(layout, 3, nk, 20, q_len=20, d_len=50),
                               q_mask=qm, d_scales=SS, d_mask=MM, config={**cfg, **c})
               for c in ({"QUANT": 0}, {"QUANT": 1, "QCACHE": 1})]
        torch.testing.assert_close(got[1], got[0], rtol=1e-6, atol=0)
        assert len(query_quant._QCACHE) == 1
