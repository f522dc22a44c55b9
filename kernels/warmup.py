"""Compile (and autotune) the common kernel variants before the first query."""

from __future__ import annotations

import time

import torch

from mvdb.kernels.maxsim import maxsim_candidates, maxsim_varlen
from mvdb.kernels.maxsim.query_quant import PLACEMENTS, placed
from mvdb.kernels.quant import quantize_int8


def warmup(
    dims: tuple[int, ...] = (128,),
    dtypes: tuple[torch.dtype, ...] = (torch.float16,),
    query_lengths: tuple[int, ...] = (32,),
    device: str | torch.device = "cuda",
    n_docs: int = 4096,
    doc_length: int = 128,
) -> float:
    """Run every (dim, dtype, query length) combination through both CSR layouts on
    representative synthetic data, so that autotuning and compilation happen now. ``torch.int8``
    in ``dtypes`` warms the INT8 path with each placement of the query quantization: by every
    program (small launches), once per query inside the kernel and shared (mid-sized ones), by a
    launch of its own before the kernel (large ones). ``doc_length``: your documents' typical length; queries
    of 512 tokens and more against documents of 512 tokens and more on average run a split launch
    with an autotune entry of its own (``tuning.query_chunks``), so long queries against long pages
    warm that entry only with a doc_length of 512 or more. (The padded ``maxsim`` layouts and
    paged stores, which are never split, are not warmed here.)
    Returns the seconds spent; a no-op without CUDA."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return 0.0
    t0 = time.perf_counter()
    g = torch.Generator(device=device).manual_seed(0)
    for dim in dims:
        docs = torch.randn(n_docs * doc_length, dim, device=device, generator=g)
        offsets = torch.arange(0, n_docs + 1, device=device, dtype=torch.int64) * doc_length
        for lq in query_lengths:
            nq = 8
            q = torch.randn(nq * lq, dim, device=device, generator=g, dtype=torch.float16)
            cu_q = torch.arange(0, nq + 1, device=device, dtype=torch.int32) * lq
            cand = torch.randint(0, n_docs, (nq, 512), device=device, generator=g)
            for dtype in dtypes:
                if dtype == torch.int8:
                    tokens, scales = quantize_int8(docs)
                else:
                    tokens, scales = docs.to(dtype), None
                maxsim_candidates(q, cu_q, tokens, offsets, cand, scales, max_seqlen_q=lq, check=False)
                maxsim_varlen(q[:lq], cu_q[:2], tokens, offsets.int(), d_scales=scales, max_seqlen_q=lq, check=False)
                if dtype == torch.int8:
                    # each placement of the query quantization (launcher._launch) for each layout:
                    # every program for itself, shared rows, a launch of its own
                    for placement in PLACEMENTS:
                        with placed(placement):
                            maxsim_candidates(q, cu_q, tokens, offsets, cand, scales, max_seqlen_q=lq, check=False)
                            maxsim_varlen(q[:lq], cu_q[:2], tokens, offsets.int(), d_scales=scales, max_seqlen_q=lq,
                                          check=False)
    torch.cuda.synchronize(device)
    return time.perf_counter() - t0
