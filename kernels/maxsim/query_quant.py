"""INT8 queries for int8 documents: the quantization launch, where the default call quantizes
(in a launch of its own, inside the MaxSim kernel by every program, or inside it by one program
per query with the rows shared), and the per-stream buffers that hold the shared rows."""

from __future__ import annotations

import contextlib
import itertools
import threading

import torch

from mvdb.kernels.maxsim.kernel import _quantize_rows_kernel
from mvdb.kernels.maxsim.runtime import (
    _current_device,
    _keep_plan,
    _stream_handle,
    cdiv,
    interpreting,
    launch_kernel,
    pow2,
)

def _int8_layout(q: torch.Tensor) -> tuple[int, int]:
    """(rows, bytes) of q's int8 tokens followed by their float32 scales in one int8 buffer (the
    scales start 16-byte aligned behind the tokens): one allocation for both."""
    rows = q.numel() // q.shape[-1] if q.shape[-1] else 0
    return rows, -(-q.numel() // 16) * 16 + 4 * rows


def _int8_views(buf: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The int8 tokens (q's shape) and float32 scales [rows] in ``buf`` (_int8_layout)."""
    rows, size = _int8_layout(q)
    return buf[: q.numel()].view(q.shape), buf[size - 4 * rows : size].view(torch.float32)


def quantize_queries(q: torch.Tensor, gdc: bool = False, into=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Query tokens [..., dim] (contiguous) -> (int8 of the same shape, float32 scales [rows]),
    bit-identical to mvdb.kernels.quantize_int8, in one launch (``gdc``: the next launch is its
    programmatic dependent, see PDL). ``into``: (int8, scales) views to write, else one allocation."""
    dim = q.shape[-1]
    n, size = _int8_layout(q)
    q8, qs = into if into is not None else _int8_views(torch.empty(size, dtype=torch.int8, device=q.device), q)
    if n:
        plan = _QUANT_PLANS.get((dim, gdc))
        if plan is None:
            block_dim = max(16, pow2(dim))
            plan = _keep_plan(_QUANT_PLANS, (dim, gdc), 64,
                              dict(DIM=dim, BLOCK_DIM=block_dim, BLOCK_T=max(1, min(64, 4096 // block_dim)), GDC=gdc))
        launch_kernel(_quantize_rows_kernel, (cdiv(n, plan[0]["BLOCK_T"]),), (q, q8, qs, n), *plan)
    return q8, qs


_QUANT_PLANS: dict[tuple, tuple[dict, tuple]] = {}  # (dim, gdc) -> the quantization launch's constexprs, their items


# INT8 launches of up to this much work ((query, document) pairs x the longest query's tokens)
# quantize the query blocks inside the MaxSim kernel (every program redoes its blocks: device
# work) instead of in a launch of their own before it (a second launch and two allocations: host
# work, which is what a small call waits on). Small calls save more host time than the kernel
# spends redoing the blocks; from a few tens of thousands of pairs, and on compute-bound long
# queries, the separate launch is faster, even with the blocks shared (QCACHE below).
QUANT_IN_KERNEL_WORK = 12288 * 32
# In-kernel launches share the quantized rows from this much work on; below it every program
# quantizes its own block. Small launches wait on the host, where sharing costs its buffer lookup
# and three more launch arguments; larger ones save the programs' repeated quantization.
SHARE_MIN_WORK = 4096 * 32


# Programs that quantize their query blocks themselves (QUANT) can share the result (QCACHE): the
# first program of a launch to reach query i claims it (an atomic max of the query's flag to 2 *
# the launch's number, ``gen``), quantizes its rows into a buffer and publishes them (the flag to
# 2 * gen + 1, a release after every thread's GPU-scope fence and a barrier); the others wait for
# that and load the rows (half the bytes of the float rows, no arithmetic). The buffers are kept
# per device and stream; launches on one stream run one after the other, each with a larger
# number than the last (drawn, and the launch enqueued, under the buffer's lock), so a flag left
# by an earlier launch never matches. With queries varying fastest in the grid every query is
# claimed by the first programs. Not used while a CUDA graph is being captured (a replayed
# launch would reuse its number and read the rows of the captured run) nor for more than
# QCACHE_MAX_TOKENS query tokens; there every program quantizes. The rows a claimant quantizes
# at a time and the L2 prefetch of its query's first lines are kernel.QCACHE_ROWS and
# kernel.QCACHE_PF_LINES.
QCACHE_MAX_TOKENS = 8192


QCACHE_PREFETCH = True  # the claimant prefetches its query's first rows into L2 (QPF): the waiters wait less
_QCACHE: dict[tuple, tuple] = {}  # (device, stream, thread) -> (int8 rows + scales buffer, flags, lock, views)
_QCACHE_LOCK = threading.Lock()
_GEN = itertools.count(2**32)  # launch numbers: int64 (2**32 on), unique, next() is atomic under the GIL


def _query_cache(q: torch.Tensor, n_q: int, force: bool = False):
    """(QC, QCS, QFLAG, lock) for a QUANT launch (the quantization launch writes QC / QCS too,
    under the lock), or (None, None, None, None) where it is not used.
    The launch draws its number (``next(_GEN)``) and is enqueued with ``lock`` held, so that the
    launches using one buffer run in the order of their numbers. (Host time counts here: a small
    call waits on it. The stream comes as a raw handle, the views of a query shape are kept.)"""
    rows, size = _int8_layout(q)
    if interpreting() or not q.is_cuda or rows > QCACHE_MAX_TOKENS and not force \
            or torch.cuda.is_current_stream_capturing():
        return None, None, None, None
    dev = q.device.index if q.device.index is not None else _current_device()
    stream = _stream_handle(dev)
    # a default stream may be per thread (builds with per-thread default streams report the same
    # handle on every thread): one buffer per thread there. Other handles name one stream (an
    # external stream destroyed while its launches run must not be recreated under the same handle
    # and used from elsewhere meanwhile).
    key = (dev, stream, threading.get_ident() if stream in (0, 1, 2) else 0)
    def fits(entry):
        return entry is not None and entry[0].numel() >= size and entry[1].numel() >= n_q

    hit = _QCACHE.get(key)
    if not fits(hit):
        with _QCACHE_LOCK:
            hit = _QCACHE.get(key)
            if not fits(hit):
                # a replaced buffer is freed to the stream it was used on: reused only after its launches
                buf = torch.empty(max(0 if hit is None else hit[0].numel(), 2 * size), dtype=torch.int8,
                                  device=q.device)
                flags = torch.zeros(max(0 if hit is None else hit[1].numel(), 2 * n_q, 64), dtype=torch.int64,
                                    device=q.device)
                if len(_QCACHE) >= 64 and key not in _QCACHE:  # streams come and go: keep the recent ones
                    _QCACHE.pop(next(iter(_QCACHE)))
                hit = _QCACHE[key] = (buf, flags, threading.Lock() if hit is None else hit[2], {})
    buf, flags, lock, views = hit
    view = views.get(q.shape)
    if view is None:
        if len(views) >= 16:
            views.clear()
        view = views[q.shape] = _int8_views(buf, q)
    return *view, flags, lock


def quantize_in_kernel(pairs: int, max_lq: int) -> bool:
    return pairs * max(1, max_lq) <= QUANT_IN_KERNEL_WORK


def share_in_kernel(pairs: int, max_lq: int) -> bool:
    """An in-kernel quantization shares the rows (one program per query quantizes)."""
    return pairs * max(1, max_lq) > SHARE_MIN_WORK


def quant_placement(pairs: int, max_lq: int) -> str:
    """Where the default call quantizes int8 queries: "every_program", "shared" or "launch"."""
    if not quantize_in_kernel(pairs, max_lq):
        return "launch"
    return "shared" if share_in_kernel(pairs, max_lq) else "every_program"


# (SHARE_MIN_WORK, QUANT_IN_KERNEL_WORK) that send every launch to one placement (warmup, benchmarks)
PLACEMENTS = {"every_program": (1 << 40, 1 << 40), "shared": (0, 1 << 40), "launch": (0, -1)}


@contextlib.contextmanager
def placed(placement: str):
    """Every launch meanwhile quantizes int8 queries at ``placement`` (one of PLACEMENTS). Module-wide:
    launches of other threads too; their scores do not change, only where the quantization runs."""
    global SHARE_MIN_WORK, QUANT_IN_KERNEL_WORK
    saved = SHARE_MIN_WORK, QUANT_IN_KERNEL_WORK
    SHARE_MIN_WORK, QUANT_IN_KERNEL_WORK = PLACEMENTS[placement]
    try:
        yield
    finally:
        SHARE_MIN_WORK, QUANT_IN_KERNEL_WORK = saved
