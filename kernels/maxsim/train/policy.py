"""Launch policy of the training kernels: the tuning table a parameter sweep may override, the
blocks, splits and query groups derived from it, and the ``auto`` backward's choice."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Callable

import torch
from triton.runtime.errors import OutOfResources

from mvdb.kernels.maxsim.runtime import cdiv, interpreting, pow2
from mvdb.kernels.maxsim.train.fused import _hold_kernel
from mvdb.kernels.maxsim.tuning import autotuning

BACKWARDS = ("auto", "unified", "lowmem")

# Launch parameters that a parameter sweep may override (name -> value); empty = the defaults
# below.
TUNE: dict = {}


def _blocks(dim: int, lq: int = 32) -> tuple[int, int, int]:
    """(BLOCK_DIM, BLOCK_Q, BLOCK_D): query blocks as long as the queries up to 128 (long queries
    are compute-bound and want big tiles; short ones are latency-bound)."""
    bdim = max(16, pow2(dim))
    if interpreting():
        return bdim, 16, 16
    return bdim, min(128, max(32, pow2(lq))), TUNE.get("fwd_bd", 64)


def _splits(programs: int, loop: int, slice_bytes: int, budget: int = 256 << 20, min_steps: int = 32) -> int:
    """How many slices to split a lowmem reduction loop of ``loop`` steps into: enough programs to
    fill the GPU (about 1,024), at least ``min_steps`` steps a slice, fp32 slices within ``budget``."""
    if interpreting():
        return 2 if loop >= 2 else 1  # exercise the split path in the CPU tests
    return max(1, min(8, 1024 // max(1, programs), loop // min_steps, budget // max(1, slice_bytes)))


def grouped_queries(lq: int, per_query: bool, equal_lengths: bool, n_q: int) -> int:
    """Queries per program in the cross-product forward: short equal-length (padded) queries share
    each document tile (GROUP * lq <= 128 rows); 1 otherwise."""
    if per_query or not equal_lengths or lq == 0 or lq > 64 or n_q < 2:
        return 1
    return max(1, min(n_q, (16 if interpreting() else TUNE.get("fwd_rows", 128)) // lq))


# ``auto``'s static rule (where it cannot measure, :func:`measured_backward`) for padded in-batch
# products. Unified's atomics cost about the same per query token wherever the document's rows
# are; lowmem's sort-free dD makes a pass over every 64-row block of every document per query,
# so its cost grows with blocks x padded query-token slots. Unified is cheaper once blocks x slots
# > AUTO_UNIFIED_RATIO x query tokens, for batches of at least AUTO_MIN_PAIRS pairs (below that
# the kernels are short and lowmem's, with no fp32 zero fills and casts, are faster). Both
# constants are fitted to kernel times over a grid of batch sizes, query and document lengths: a
# lower ratio sends shapes to unified that lowmem runs faster, and below the pair floor unified
# never wins. The fallback, not the rule a GPU uses.
AUTO_UNIFIED_RATIO = 16
AUTO_MIN_PAIRS = 512
CROSS_BLOCK = 64  # rows per program of the sort-free cross-product dD (TUNE "cross_bj")


def choose_backward(kind: str, per_query: bool, lq: int, ld: float, padded: bool = True, n_hits: int = 0,
                    doc_elems: int = 0, n_q: int = 0, n_k: int = 0) -> str:
    """``auto``'s static pick (padded batches on a GPU measure instead, :func:`measured_backward`;
    this is their fallback). Deterministic algorithms on: lowmem. Padded batches (where lowmem's
    dD needs no sort): lowmem, except an in-batch cross product of at least AUTO_MIN_PAIRS pairs
    (``n_q`` x ``n_k``) with queries of at most 128 tokens (``lq``) whose documents (``ld`` rows)
    are long enough that lowmem's pass over every 64-row block costs more than unified's atomics
    per picked row: ceil(ld / 64) x the query's padded length > 16 x lq (above; ld > 1024 for
    lq 32, ld > 640 for lq 40). Per-query negatives, long queries and small batches: lowmem. Varlen
    (``padded=False``: lowmem sorts the winners) keeps the rule fitted with the sort: lowmem from
    2^20 winners (``n_hits``) or 2^28 document elements. ``lowmem`` is also the reproducible one."""
    if kind != "auto":
        return kind
    if torch.are_deterministic_algorithms_enabled():
        return "lowmem"
    if not padded:
        return "lowmem" if n_hits >= 1 << 20 or doc_elems >= 1 << 28 else "unified"
    if per_query or lq > 128 or n_q * n_k < AUTO_MIN_PAIRS:
        return "lowmem"
    slots = max(16, pow2(max(1, lq)))
    return "unified" if cdiv(int(ld), CROSS_BLOCK) * slots > AUTO_UNIFIED_RATIO * lq else "lowmem"


# ``auto`` by measurement: the backward each padded in-batch shape bucket measured faster on this
# GPU (bounded, least recently used first out), keyed by :func:`auto_key` plus which gradients are
# needed; read it to see (or log) the choices, pass ``backward=`` to pin one.
AUTO_CHOICES: OrderedDict = OrderedDict()
AUTO_CACHE_SIZE = 256
_AUTO_LOCK = threading.Lock()


def auto_key(device: torch.device, dtype: torch.dtype, dim: int, normalize: bool, n_q: int, n_k: int, lq: int,
             ld: int, q_masked: bool, d_masked: bool) -> tuple:
    """The shape bucket ``auto`` measures once: the exact batch sizes and query length, the
    documents' length in 64-row blocks (the sort-free dD's unit: documents padded to each batch's
    longest stay in one bucket while that length stays in one block), whether masks are given, and
    the launch overrides in ``TUNE``."""
    return (str(device), dtype, dim, normalize, n_q, n_k, lq, cdiv(int(ld), CROSS_BLOCK), q_masked, d_masked,
            tuple(sorted(TUNE.items())))


def can_measure(device: torch.device) -> bool:
    """Whether ``auto`` may time the two backwards: a CUDA tensor, compiled kernels, autotuning not
    disabled (MVDB_AUTOTUNE=0), and no CUDA graph being captured or graph being compiled."""
    if device.type != "cuda" or not autotuning():
        return False
    return not torch.cuda.is_current_stream_capturing() and not torch.compiler.is_compiling()


def _gpu_ms(run: Callable, kind: str, hold_s: float = 2e-3) -> float:
    """The GPU's time for ``run(kind)``, without the host's: the backward is queued behind a kernel
    that holds the stream for ``hold_s`` (its global timer), longer than the host takes to queue the
    backward, so the events time its kernels and the gaps between them back to back (a small batch's
    step is otherwise the host's launch time, the same for both backwards). A run the host took
    longer to queue is timed again behind a hold of twice that (three tries; then the last timing,
    which includes some of the host's time)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        _hold_kernel[(1,)](int(hold_s * 1e9), num_warps=1)
        start.record()
        t0 = time.perf_counter()
        run(kind)
        host = time.perf_counter() - t0
        end.record()
        end.synchronize()
        if host < hold_s:
            break
        hold_s = min(2 * host, 0.1)
    return start.elapsed_time(end)


def measured_backward(key: tuple, run: Callable, fallback: str, device: torch.device, timer: Callable = _gpu_ms):
    """``run(kind)``'s result for the backward ``key``'s bucket measured faster. The first call of
    a bucket runs each backward once (compiling it if needed), then times them on the GPU
    (:func:`_gpu_ms`, one synchronisation each) alternately (lowmem, unified, lowmem, unified; the
    smaller of each pair), keeps the faster and runs it: the gradients are the chosen backward's
    own, and the first call costs six more backwards. Its peak memory is the larger of the two
    backwards'; if unified's runs out of memory or of GPU resources, lowmem (kept for the bucket).
    Where it cannot measure (:func:`can_measure`), ``fallback`` (the static rule,
    :func:`choose_backward`); with torch's deterministic algorithms on, lowmem (no atomics)."""
    if torch.are_deterministic_algorithms_enabled():
        return run("lowmem")
    with _AUTO_LOCK:
        kind = AUTO_CHOICES.get(key)
        if kind is not None:
            AUTO_CHOICES.move_to_end(key)
    if kind is not None:
        return run(kind)
    if not can_measure(device):
        return run(fallback)
    ms = {"lowmem": [], "unified": []}
    for step in ("warm", "timed", "timed"):  # compile (and warm) both first
        for kind in ms:
            if float("inf") in ms[kind]:
                continue
            try:
                if step == "warm":
                    run(kind)
                else:
                    ms[kind].append(timer(run, kind))
            except (torch.cuda.OutOfMemoryError, OutOfResources):
                if kind == "lowmem":  # the backward auto falls back to: nothing to measure against
                    raise
                ms[kind] = [float("inf")]  # unified's fp32 buffers (or its kernel) do not fit
    kind = min(ms, key=lambda k: (min(ms[k]), k != fallback))
    with _AUTO_LOCK:
        AUTO_CHOICES[key] = kind
        while len(AUTO_CHOICES) > AUTO_CACHE_SIZE:
            AUTO_CHOICES.popitem(last=False)
    return run(kind)
