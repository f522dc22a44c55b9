"""Public functions of the residual codes: training the buckets, encoding, decoding, and
:func:`approx_maxsim_candidates`, the approximate MaxSim of candidate documents over their codes."""

from __future__ import annotations

import contextlib

import torch
import triton

from mvdb.kernels import _checks
from mvdb.kernels.codes import naive
from mvdb.kernels.codes.fused import _approx_kernel, block_q
from mvdb.kernels.errors import InvalidInputError
from mvdb.kernels.maxsim.runtime import interpreting, launch_guard

BITS = (1, 2, 4)
# The launch: the fastest correct one of the configs swept (benchmarks may set these)
BLOCK_D = 32  # document tokens a tile
WARPS, STAGES = 2, 2
WORDS = True  # decode from 32-bit words (False: byte by byte, kept for comparison)
GROUP = 16  # candidates one program scores (its query's tokens loaded once)
HALF = True  # decode in float16 (else float32)


def check_bits(bits) -> int:
    if bits not in BITS:
        raise InvalidInputError(f"bits: expected one of {BITS}, got {bits!r}")
    return bits


def approx_maxsim_candidates(q: torch.Tensor, cu_q: torch.Tensor, centroids: torch.Tensor, lists: torch.Tensor,
                             codes: torch.Tensor, weights: torch.Tensor, offsets: torch.Tensor, cand: torch.Tensor,
                             bits: int, *, max_seqlen_q: int | None = None, backend: str = "auto") -> torch.Tensor:
    """MaxSim of query i against documents cand[i, :] (-1 pads: -inf), each document token decoded
    from its codes (``centroids[lists[t]]`` plus each dimension's ``weights[d, code]``) -> float32
    [Nq, K]. q [Tq, dim] float, cu_q [Nq + 1] int32, centroids [nlist, dim], lists [T] int32 (or
    int16 holding the uint16 id where nlist <= 65536: naive.narrow_lists), codes [T, n_bytes]
    uint8, weights [dim, 2**bits] float32, offsets [n_rows + 1] int64 (the documents' tokens),
    cand [Nq, K] int64. Triton on CUDA (or under the interpreter), else torch;
    the decoded tokens are never materialised by the kernel."""
    check_bits(bits)
    _checks.tensor("q", q, (2,), _checks.FLOAT_DTYPES)
    _checks.tensor("centroids", centroids, (2,), _checks.FLOAT_DTYPES)
    _checks.dim_match("centroids", centroids, q.shape[1])
    _checks.tensor("lists", lists, (1,), (torch.int32, torch.int16))
    if lists.dtype == torch.int16 and centroids.shape[0] > naive.LIST16_MAX:
        raise InvalidInputError(f"lists: int16 holds at most {naive.LIST16_MAX} list ids, got {centroids.shape[0]} "
                                f"centroids (use int32)")
    _checks.tensor("codes", codes, (2,), (torch.uint8,))
    _checks.tensor("cand", cand, (2,), (torch.int64,))
    _checks.tensor("offsets", offsets, (1,), (torch.int64,))
    dim = q.shape[1]
    if codes.shape != (lists.shape[0], naive.n_bytes(dim, bits)):
        raise InvalidInputError(f"codes: expected shape {(lists.shape[0], naive.n_bytes(dim, bits))}, got "
                                f"{tuple(codes.shape)}")
    if tuple(weights.shape) != (dim, 1 << bits):
        raise InvalidInputError(f"weights: expected shape {(dim, 1 << bits)}, got {tuple(weights.shape)}")
    nq = cu_q.numel() - 1
    if cand.shape[0] != nq:
        raise InvalidInputError(f"cand: expected {nq} rows (one per query in cu_q), got {cand.shape[0]}")
    device = _checks.same_device(q=q, cu_q=cu_q, centroids=centroids, lists=lists, codes=codes, weights=weights,
                                 offsets=offsets, cand=cand)
    triton_ok = device.type == "cuda" or interpreting()
    if backend == "torch" or not triton_ok or cand.numel() == 0:
        return naive.approx_candidates_torch(q, cu_q, centroids, lists, codes, weights, offsets, cand, bits)
    if max_seqlen_q is None:
        max_seqlen_q = int((cu_q[1:] - cu_q[:-1]).max()) if nq else 1
    bdim = max(16, 1 << (dim - 1).bit_length())
    nb = codes.shape[1]
    # whole 32-bit words where a token's codes are whole words and the padded width holds whole words
    words = WORDS and nb % 4 == 0 and bdim % (32 // bits) == 0 and codes.is_contiguous()
    width = cand.shape[1]
    padded = -(-width // GROUP) * GROUP  # every program scores GROUP candidates: -1 pads the last
    if padded != width:
        cand = torch.nn.functional.pad(cand, (0, padded - width), value=-1)
    out = torch.empty((nq, padded), dtype=torch.float32, device=device)
    bq = block_q(max_seqlen_q)
    with launch_guard(), torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        _approx_kernel[(nq * padded // GROUP,)](
            q.to(torch.float16).contiguous(), cu_q.to(torch.int32), centroids.to(torch.float16).contiguous(),
            lists.contiguous(), codes.view(torch.int32) if words else codes.contiguous(), weights.float().contiguous(),
            offsets.contiguous(), cand.contiguous(), out,
            padded, padded // GROUP, DIM=dim, BLOCK_DIM=bdim, BITS=bits, NB=nb, WORDS=words,
            LIST16=lists.dtype == torch.int16, BLOCK_Q=bq, BLOCK_D=BLOCK_D, GROUP=GROUP,
            GROUP_P2=triton.next_power_of_2(GROUP), ONE_QB=max_seqlen_q <= bq, HALF=HALF, num_warps=WARPS,
            num_stages=STAGES)
    out = out[:, :width] if padded != width else out
    return out


def train_buckets(residuals: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """See :func:`mvdb.kernels.codes.naive.train_buckets`."""
    return naive.train_buckets(residuals, check_bits(bits))


def encode(x, lists, centroids, cutoffs, bits: int) -> torch.Tensor:
    """See :func:`mvdb.kernels.codes.naive.encode`."""
    return naive.encode(x, lists, centroids, cutoffs, check_bits(bits))


def decode(packed, lists, centroids, weights, bits: int) -> torch.Tensor:
    """See :func:`mvdb.kernels.codes.naive.decode`."""
    return naive.decode(packed, lists, centroids, weights, check_bits(bits))
