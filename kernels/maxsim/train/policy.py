"""Launch policy of the training kernels: the tuning table benchmarks/training_sweep.py overrides,
the blocks, splits and query groups derived from it, and the ``auto`` backward's choice."""

from __future__ import annotations

import triton

from mvdb.kernels.maxsim.fused import interpreting

BACKWARDS = ("auto", "unified", "lowmem")

# Launch parameters that benchmarks/training_sweep.py may override (name -> value); empty = the
# measured defaults below.
TUNE: dict = {}


def _blocks(dim: int, lq: int = 32) -> tuple[int, int, int]:
    """(BLOCK_DIM, BLOCK_Q, BLOCK_D): query blocks as long as the queries up to 128 (long queries
    are compute-bound and want big tiles; short ones are latency-bound)."""
    bdim = max(16, triton.next_power_of_2(dim))
    if interpreting():
        return bdim, 16, 16
    return bdim, min(128, max(32, triton.next_power_of_2(lq))), TUNE.get("fwd_bd", 64)


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


def choose_backward(kind: str, per_query: bool, lq: int, ld: float, padded: bool = True, n_hits: int = 0,
                    doc_elems: int = 0) -> str:
    """``auto`` for padded batches (where lowmem's dD needs no sort): lowmem, except a cross
    product whose documents are at least 16 times longer than the queries (``ld`` the documents'
    length, ``lq`` the queries'), where the picks are sparse in each document's rows and unified's
    atomics cost less than lowmem's pick-matrix products. Measured by the GPU's kernel time over 19
    shapes on the H100 (benchmarks/results/training-sweep-H100-device.json): the faster one on 18;
    the miss is in-batch B=16, Lq 32, Ld 180 (lowmem 47 us against 43). Varlen (``padded=False``:
    lowmem sorts the winners) keeps the rule measured with the sort
    (benchmarks/results/training-sweep-H100.json): lowmem from 2^20 winners (``n_hits``) or 2^28
    document elements. ``lowmem`` is also the reproducible one."""
    if kind != "auto":
        return kind
    if not padded:
        return "lowmem" if n_hits >= 1 << 20 or doc_elems >= 1 << 28 else "unified"
    return "unified" if not per_query and ld >= 16 * max(1, lq) else "lowmem"
