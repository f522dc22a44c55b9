"""Fused MaxSim forward in Triton: one program per (query, document) pair, never materialising
the [Lq, Ld] similarity tile beyond one [BLOCK_Q, BLOCK_D] block in registers.

Every public layout (padded cross product, padded per-query candidates, packed varlen, CSR store
with candidate lists) reduces to "query tokens start here, doc tokens start there"; the kernel
reads documents straight from where they lie, so no padded copy is ever made.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import os
import threading

import torch
import triton
import triton.language as tl

try:
    from triton import knobs
except ImportError:  # older triton: launch hooks live elsewhere; relaunches go through the runner
    knobs = None

# Doc layouts (constexpr D_LAYOUT; globals a kernel reads must be tl.constexpr).
PADDED_CROSS = tl.constexpr(0)  # D [Nd, Ld, d]: doc k starts at k * Ld
PADDED_PER_QUERY = tl.constexpr(1)  # D [Nq, K, Ld, d]: doc (i, k) starts at (i * K + k) * Ld
CSR_CROSS = tl.constexpr(2)  # tokens [T, d] + offsets: every doc for every query
CSR_CAND = tl.constexpr(3)  # tokens [T, d] + offsets + cand [Nq, K]: doc cand[i, k], -1 = padding
# CSR_CAND over a paged store: offsets give each document's length only; STARTS [n_docs] int64 gives
# the row (counted from D, possibly in another allocation of the same device) where its tokens
# start, and SC_STARTS the same for the int8 scales (counted from DS).

LQ_BUCKETS = (16, 32, 64, 128, 256, 512, 1024)


def lq_bucket(max_lq: int) -> int:
    """Autotune bucket of the longest query (queries past 512 tokens share the 'long' bucket)."""
    for b in LQ_BUCKETS:
        if max_lq <= b:
            return b
    return LQ_BUCKETS[-1]


# Read once, at import: triton.jit decides at decoration (this package's import) whether a kernel
# is interpreted, so a later change of the variable could not switch the kernels anyway. (Read per
# call it was an os.environ lookup on every launch, several per training step.)
_INTERPRET = getattr(getattr(knobs, "runtime", None), "interpret", None)  # triton's own reading of the variable
if _INTERPRET is None:
    _INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
_INTERPRET = bool(_INTERPRET)


def interpreting() -> bool:
    return _INTERPRET


# Host-side integer helpers for the launchers: triton.cdiv / next_power_of_2 are constexpr
# functions in triton 3.x, about 2-3 us per host call; these are plain int arithmetic.
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pow2(n: int) -> int:
    """The smallest power of two >= n (0 for 0, as triton.next_power_of_2)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def _configs():
    """Candidate launch configs; the prune filter keeps the ones that fit the query bucket.
    RUNMAX=1 keeps an elementwise running max over the document's tiles and reduces across the
    tile's columns once per document (fewer cross-lane reductions, one more [BLOCK_Q, BLOCK_D]
    block of registers); RUNMAX=0 reduces every tile."""
    out = []
    for bq in (32, 64, 128, 256):
        for bd in (32, 64, 128):
            for warps in (1, 2, 4, 8) if bq == 32 else (2, 4, 8):  # one warp: measured on 32-token tiles only
                for stages in (1, 2, 3, 4) if warps == 1 else (2, 3, 4):  # no pipelining: measured at one warp
                    for runmax in (0, 1):
                        out.append(triton.Config({"BLOCK_Q": bq, "BLOCK_D": bd, "RUNMAX": runmax}, num_warps=warps,
                                                 num_stages=stages))
    return out


def _prune(configs, nargs, **kwargs):
    lq = kwargs["LQ_BUCKET"]
    full = os.environ.get("MVDB_AUTOTUNE", "") == "full"
    keep = []
    for c in configs:
        bq, bd = c.kwargs["BLOCK_Q"], c.kwargs["BLOCK_D"]
        if bq > max(32, lq):
            continue
        if not full:
            # The measured short list (benchmarks/kernel_variants.py on an H100): short queries
            # are latency-bound gathers, best with small tiles and 2-4 warps; long queries are
            # compute-bound, best with large query tiles and 3 stages. Queries of up to 32 tokens:
            # BLOCK_D 32 with 2 warps was within 2% of the best config in every short case of the
            # 2026-11-24 sweep (kernel-variants-H100-drows.json) while BLOCK_D 64 with 4 warps,
            # which the autotuner could pick on a small first call, was 1.6x slower on int8
            # candidates: the list keeps only the former.
            # INT8 documents with the queries quantized by their own launch (not QUANT): one warp
            # with 3 stages was the best of 72 configs on int8 candidates (0.175 ms against 0.184
            # for 2 warps) and within 1% of the best on 1 query x 10k documents
            # (kernel-variants-H100-int8.json). Not with QUANT: one warp quantizing each program's
            # query block took 1 x 10k documents from 0.125 to 0.158 ms (picked by the autotuner
            # on a host-noisy first call, kernels-H100-20261124-oneWarpQuant.json).
            # With the rows shared (QCACHE) one program per query quantizes, the others load int8
            # rows as they do after the launch: the same list.
            # Also one warp with one stage (no software pipeline: less shared memory per program,
            # more programs per SM) where the queries were quantized apart (with the rows shared
            # it took 1 x 10k from 0.102 to 0.104-0.105 ms, -qshared-stage1.json): 32 x 1,000 int8
            # candidates from the 1M store of 64-128-token documents in 0.160 ms against 0.165 at
            # 2 stages and 0.168 at 3, 1 x 10k varlen documents of 64-300 tokens 0.103 against
            # 0.100 at 3 (H100, kernel-variants-H100-20261126-int8small.json, -int8.json;
            # paired rounds in stages-ab-H100-20261126.json): the autotuner picks per layout and
            # query bucket.
            one_warp = kwargs.get("INT8") and c.num_warps == 1 and (
                c.num_stages == 3 and (not kwargs.get("QUANT") or kwargs.get("QCACHE"))
                or c.num_stages == 1 and not kwargs.get("QUANT"))
            if lq <= 32 and not (bq == 32 and bd == 32 and (c.num_warps == 2 and c.num_stages in (2, 3) or one_warp)):
                continue
            if 32 < lq <= 64 and not (bq == max(32, lq) and bd in (32, 64) and c.num_warps in (2, 4)
                                 and c.num_stages in (2, 3)):
                continue
            if lq > 64 and not (bq >= 128 and bd in (64, 128) and c.num_warps in (4, 8) and c.num_stages == 3):
                continue
        keep.append(c)
    return keep or configs[:1]


@triton.jit
def _tile_scores(qk, Dd, DSd, DMd, cols, offs_c, DIM: tl.constexpr, BLOCK_DIM: tl.constexpr, HAS_DMASK: tl.constexpr,
                 INT8: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """[BLOCK_Q, BLOCK_D] scores <q_i, d_j> of the document tokens ``cols`` (int32 rows counted from
    the document's first token ``Dd``, its first scale ``DSd`` and mask entry ``DMd``; -inf where
    the mask says no); int8 scores carry the document token's scale, not the query token's."""
    d_ptrs = Dd + cols.to(tl.int64)[None, :] * DIM + offs_c[:, None]  # [BDIM, BD]
    if BLOCK_DIM == DIM:
        dt = tl.load(d_ptrs)
    else:
        dt = tl.load(d_ptrs, mask=(offs_c < DIM)[:, None], other=0)
    if INT8:
        scale = tl.load(DSd + cols)
        acc = tl.dot(qk, dt, out_dtype=tl.int32)  # [BQ, BD]
        if DIM * 127 * 127 < 4194304:
            # |acc| < 2**22: int -> float by adding 1.5 * 2**23's bit pattern (an integer add and a
            # float subtract, exact). (Folding the subtract into an FMA with -12582912 * scale loses
            # about half an int8 unit per score: no. sm_90's I2FP conversion instead, one instruction
            # for two, measured no faster on the compute-bound ColPali case: best of ten configs
            # 0.355 against 0.353 ms, faster on six, up to 17% slower on the others
            # (kernel-variants-qchunk-H100-2.json). The bit pattern as the MMA's accumulator input
            # compiles to the same integer add.)
            s = ((acc + 0x4B400000).to(tl.float32, bitcast=True) - 12582912.0) * scale[None, :]
        else:
            s = acc.to(tl.float32) * scale[None, :]
    elif UPCAST:
        s = tl.dot(qk.to(tl.float32), dt.to(tl.float32), input_precision="ieee")
    elif IEEE:
        s = tl.dot(qk, dt, input_precision="ieee")
    else:
        s = tl.dot(qk, dt)
    if HAS_DMASK:
        s = tl.where((tl.load(DMd + cols) != 0)[None, :], s, float("-inf"))
    return s


@triton.jit
def _fold(acc, s, RUNMAX: tl.constexpr):
    """Fold a tile's scores into the running max: elementwise ([BQ, BD], RUNMAX) or per row ([BQ])."""
    if RUNMAX:
        out = tl.maximum(acc, s)
    else:
        out = tl.maximum(acc, tl.max(s, axis=1))
    return out


@triton.jit
def _doc_max(qk, D, DS, DM, d_start, s_start, d_n, offs_d, offs_c, DIM: tl.constexpr, BLOCK_DIM: tl.constexpr,
             HAS_DMASK: tl.constexpr, INT8: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
             RUNMAX: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr):
    """[BLOCK_Q]: each query row's max over the document's valid tokens (-inf if none)."""
    if RUNMAX:
        acc = tl.full([BLOCK_Q, BLOCK_D], float("-inf"), dtype=tl.float32)
    else:
        acc = tl.full([BLOCK_Q], float("-inf"), dtype=tl.float32)
    # One loop without bounds masks: the last tile starts BLOCK_D tokens before the document's end
    # (overlapping the tile before it), and a document shorter than a tile repeats its last token
    # in the columns past its end. The max is idempotent, so the scores are exact, and no tile
    # needs a masked load or a -inf select. Before, whole tiles were followed by one masked tail
    # tile after the loop (long queries) or every tile was masked (short ones): a second dot in the
    # code took the long-query configs to 255 registers and a stack spill (sm_90 compile, 304
    # bytes at BLOCK_Q 256 / BLOCK_D 64 / 4 warps, now 217 and none), and the masks cost a select
    # per score. H100, default calls, old against new in one session (kernel-ab-H100-20261125-orig /
    # -lim.json): ColPali bf16 0.481 -> 0.434 ms, int8 0.357 -> 0.346; 1 x 10k int8 0.106 -> 0.103;
    # 32 x 1,000 candidates int8 0.172 -> 0.166. The columns are int32 rows counted from the
    # document's first token, scale and mask entry (64-bit addresses per column, an int64 clamp,
    # took the int8 loop from 391 to 528 instructions, sm_90 SASS at 128 x 64 tiles); only the
    # token rows' byte offsets are widened, so no document length overflows them (that version:
    # kernels-H100-{a,bc}-20261125-onetileloop.json, ColPali bf16 0.440, int8 0.345).
    Dd = D + d_start * DIM
    DSd = DS
    if INT8:
        DSd = DS + s_start
    DMd = DM
    if HAS_DMASK:
        DMd = DM + d_start
    n = d_n.to(tl.int32)
    lim = tl.minimum(offs_d, n - 1)  # loop-invariant: the columns past a short document's end repeat its last token
    for db in range(0, n, BLOCK_D):
        cols = tl.maximum(tl.minimum(db, n - BLOCK_D), 0) + lim
        acc = _fold(acc, _tile_scores(qk, Dd, DSd, DMd, cols, offs_c, DIM, BLOCK_DIM, HAS_DMASK, INT8, IEEE, UPCAST),
                    RUNMAX)
    if RUNMAX:
        best = tl.max(acc, axis=1)
    else:
        best = acc
    return best


@triton.jit
def _int8_scales(x):
    """mvdb.kernels.quant's per-row scales of a float block: absmax / 127 (an IEEE division,
    div_rn, as torch divides: the plain '/' is approximate on the GPU), 1 for a zero row. The row
    maxima are taken in the block's own dtype (exact: |x| and max only pick values), so that no
    float32 copy of a half-precision block stays live across the cross-lane reduction."""
    amax = tl.max(tl.abs(x), axis=1).to(tl.float32)
    return tl.where(amax > 0, tl.math.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32)), 1.0)


@triton.jit
def _round_half_away(y):
    """mvdb.kernels.quant's rounding of the quotients to int8: half away from zero."""
    return tl.where(y >= 0, y + 0.5, y - 0.5).to(tl.int8)


@triton.jit
def _quantize_block(x):
    """In-register per-row INT8 of a query block (the rule of _quantize_rows_kernel and
    mvdb.kernels.quant, bit for bit): (int8 block, float32 scales [rows]). The quotient x / scale
    is the correctly rounded reciprocal's product corrected by two FMAs (Markstein), the same bits
    as a div_rn per element for finite inputs (checked on 48M fp16 / fp32 quotients; rows of tiny
    magnitude are scaled by 2^64 first) at a fraction of its cost:
    on the H100 the in-kernel quantization added 25 us to 1 query x 10k documents this way, 45 us
    with div_rn (benchmarks/results/int8-call-H100-quant-placement.json)."""
    # scales from the block as given (not its float32 copy): 128 registers per thread instead of
    # 157 on the H100 (2 warps), 1 x 10k documents 0.125 -> 0.116 ms
    scale = _int8_scales(x)
    xf = x.to(tl.float32)
    if x.dtype == tl.float16:  # fp16 rows: scale >= 2^-24 / 127, 1 / scale is finite
        sk = scale
        xk = xf
    else:
        # rows of tiny magnitude (scale below 2^-60, subnormal ones included): x * 2^64 / (scale * 2^64),
        # exact power-of-two scalings of the same quotient, so that 1 / scale stays finite
        k = tl.where(scale < 8.673617379884035e-19, 18446744073709551616.0, 1.0)
        sk = scale * k
        xk = xf * k[:, None]
    r = tl.math.div_rn(tl.full(sk.shape, 1.0, tl.float32), sk)[:, None]
    y0 = xk * r
    y = tl.math.fma(tl.math.fma(-y0, sk[:, None], xk), r, y0)
    return _round_half_away(y), scale


@triton.jit
def _prefetch_l2(ptrs):
    """prefetch.global.L2 of the 128-byte line holding each address (nothing waits on it)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _fence_gpu():
    """fence.acq_rel.gpu in every thread: its earlier writes are ordered, at GPU scope, before its
    later ones (a barrier alone orders the block's threads only within the block)."""
    tl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tmov.u32 $0, $1;", "=r,r", [tl.zeros([1], tl.int32)],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit(do_not_specialize=["n_q", "n_k", "q_len", "d_len", "gen", "n_chunks"])
def _maxsim_fwd_kernel(
    Q,  # [Tq, DIM] query tokens (any float dtype; int8 when INT8 and not QUANT, by _quantize_rows_kernel)
    QS,  # [Tq] float32 query-token scales (INT8 and not QUANT) or None
    QM,  # [Tq] uint8 query-token mask (1 = valid) or None
    CU_Q,  # [Nq + 1] int32 query offsets (Q_VARLEN) or None
    D,  # [Td, DIM] doc tokens: float or int8
    DS,  # [Td] float32 per-token scales (INT8) or None
    DM,  # [Td] uint8 doc-token mask (1 = valid) or None
    OFF,  # [n_docs + 1] int64 doc offsets (CSR layouts) or None
    CAND,  # [Nq, K] int64 candidate doc indices (CSR_CAND) or None
    STARTS,  # [n_docs] int64 token rows of the documents, counted from D (PAGED) or None
    SC_STARTS,  # [n_docs] int64 scale rows of the documents, counted from DS (PAGED and INT8) or None
    Out,  # [Nq, K] float32, or [n_chunks, Nq, K] (QCHUNK): each chunk's sum, added up after the launch
    QC,  # [Tq, DIM] int8: the launch's shared quantized query tokens (QCACHE) or None
    QCS,  # [Tq] float32: their scales (QCACHE) or None
    QFLAG,  # [>= Nq] int64: query i's state in this launch (QCACHE) or None: 2 * gen once a program
    # claimed it, 2 * gen + 1 once its rows of QC / QCS are written; anything smaller, not yet
    n_q,
    n_k,
    q_len,  # padded query length (not Q_VARLEN)
    d_len,  # padded doc length (PADDED_* layouts)
    gen,  # this launch's number (QCACHE): unique per launch, never 0
    n_chunks,  # query chunks per pair (QCHUNK): the last one runs to the query's end
    LQ_BUCKET: tl.constexpr,
    DIM: tl.constexpr,
    BLOCK_DIM: tl.constexpr,
    Q_VARLEN: tl.constexpr,
    D_LAYOUT: tl.constexpr,
    HAS_QMASK: tl.constexpr,
    HAS_DMASK: tl.constexpr,
    INT8: tl.constexpr,
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
    PAGED: tl.constexpr,
    QUANT: tl.constexpr,  # INT8 with float queries quantized in this launch: by each program for its own
    # query block, or (QCACHE) by one program per query for all
    QCACHE: tl.constexpr,  # QUANT with one program per query quantizing its rows into QC / QCS, the
    # others loading them from there (int8 + scales, from L2) once published
    QCHUNK: tl.constexpr,  # 0, or query rows per program: a pair's chunks are programs side by side
    BLOCK_Q: tl.constexpr,
    BLOCK_D: tl.constexpr,
    RUNMAX: tl.constexpr,
    GDC: tl.constexpr = False,  # launched as the dependent of the query quantization launch (PDL, below)
    QPF: tl.constexpr = False,  # QCACHE: the claimant asks for its query's first rows in L2 at once (QCACHE_PREFETCH)
):
    pid = tl.program_id(0).to(tl.int64)
    if QCHUNK:
        # a pair's chunks vary fastest: the programs reading one document run at the same time, so
        # it comes from HBM once and from L2 for the others (one program per pair streams it from
        # HBM once per query block: the blocks' passes are a whole document apart)
        chunk = pid % n_chunks
        pid = pid // n_chunks
    if D_LAYOUT == PADDED_CROSS or D_LAYOUT == CSR_CROSS or QCACHE:
        # Queries vary fastest: the programs sharing a document run together and hit L2; with
        # the query rows shared (QCACHE) the first programs claim every query at once, instead of
        # each query's first program stalling the programs after it (all the GPU's, at 1,000
        # candidates per query) until its rows are published.
        qi = pid % n_q
        k = pid // n_q
    else:
        qi = pid // n_k
        k = pid % n_k

    if Q_VARLEN:
        q_start = tl.load(CU_Q + qi).to(tl.int64)
        q_n = tl.load(CU_Q + qi + 1).to(tl.int64) - q_start
    else:
        q_start = qi * q_len
        q_n = q_len + 0 * qi

    is_pad = False
    if D_LAYOUT == PADDED_CROSS:
        d_start = k * d_len
        d_n = d_len + 0 * k
    elif D_LAYOUT == PADDED_PER_QUERY:
        d_start = (qi * n_k + k) * d_len
        d_n = d_len + 0 * k
    elif D_LAYOUT == CSR_CROSS:
        d_start = tl.load(OFF + k).to(tl.int64)
        d_n = tl.load(OFF + k + 1).to(tl.int64) - d_start
    else:
        doc = tl.load(CAND + qi * n_k + k)
        is_pad = doc < 0
        safe = tl.maximum(doc, 0)
        d_start = tl.load(OFF + safe).to(tl.int64)
        d_n = tl.where(is_pad, 0, tl.load(OFF + safe + 1).to(tl.int64) - d_start)
        q_n = tl.where(is_pad, 0, q_n)
        if PAGED:
            d_start = tl.load(STARTS + safe)
    s_start = d_start
    if PAGED and INT8:  # PAGED implies CSR_CAND (launch checks): ``safe`` is the document
        s_start = tl.load(SC_STARTS + safe)

    offs_q = tl.arange(0, BLOCK_Q)
    offs_d = tl.arange(0, BLOCK_D)
    offs_c = tl.arange(0, BLOCK_DIM)
    c_ok = offs_c < DIM  # [BDIM]; all True when DIM is a power of two

    q_lo = 0
    q_hi = q_n
    if QCHUNK:
        q_lo = chunk * QCHUNK
        q_hi = tl.where(chunk == n_chunks - 1, q_n, tl.minimum(q_n, q_lo + QCHUNK))
    total = tl.zeros([1], dtype=tl.float32)
    if GDC:
        # Programmatic dependent launch: this launch may start while the quantization launch before
        # it runs; what that launch writes (Q, QS) is read only after this wait. The offsets and
        # candidates above come from launches that finished before it started.
        tl.extra.cuda.gdc_wait()
    if QCACHE:
        # The first program of the launch to reach query i claims it (an atomic max of its flag to
        # 2 * gen: every earlier launch left a smaller number), quantizes its rows into QC / QCS and
        # publishes them (flag 2 * gen + 1); the others wait for that. The claimant is running when
        # anyone waits on it, and waits on nothing itself: no deadlock. A scalar atomic is one
        # thread's, broadcast to the program, so its warps all take the same branch (a per-thread
        # read once let them disagree, and the quantizing branch's cross-warp reductions then read
        # the other branch's shared memory). Padding candidates (q_n 0) neither claim nor wait.
        if q_n > 0:
            claim = 2 * gen
            seen = tl.atomic_max(QFLAG + qi, claim, sem="acq_rel", scope="gpu")
            if seen < claim:
                if QPF:
                    # the first rows' 128-byte lines (8 KB: 32 fp16 rows of 128) requested from HBM
                    # at once (one line per thread at 2 warps; more warps repeat lines), so that the
                    # loop's loads below, QCACHE_ROWS rows at a time, wait on L2 instead of HBM each
                    # (the waiters wait on this loop)
                    LINE: tl.constexpr = 1024 // Q.dtype.element_ty.primitive_bitwidth
                    li = tl.arange(0, QCACHE_PF_LINES) * LINE
                    _prefetch_l2(Q + q_start * DIM + tl.where(li < q_n * DIM, li, 0))
                for rb in range(0, q_n, QCACHE_ROWS):
                    qr = rb + tl.arange(0, QCACHE_ROWS)
                    qr_ok = qr < q_n
                    x = tl.load(Q + (q_start + qr)[:, None] * DIM + offs_c[None, :],
                                mask=qr_ok[:, None] & c_ok[None, :], other=0.0)
                    x8, xs = _quantize_block(x)
                    tl.store(QC + (q_start + qr)[:, None] * DIM + offs_c[None, :], x8,
                             mask=qr_ok[:, None] & c_ok[None, :])
                    tl.store(QCS + q_start + qr, xs, mask=qr_ok)
                # Each thread fences its own stores at GPU scope, the barrier waits for all of them,
                # then one release of the flag (the barrier also orders them before this program's
                # own loads of the rows below).
                _fence_gpu()
                tl.debug_barrier()
                tl.atomic_cas(QFLAG + qi, claim, claim + 1, sem="release", scope="gpu")
            else:
                while seen == claim:
                    seen = tl.atomic_add(QFLAG + qi, 0, sem="acquire", scope="gpu")
    # Long queries are scored BLOCK_Q tokens at a time and summed: exact, bounded registers.
    for qb in range(q_lo, q_hi, BLOCK_Q):
        rows = qb + offs_q
        r_ok = rows < q_hi
        q_ptrs = Q + (q_start + rows)[:, None] * DIM + offs_c[None, :]
        if BLOCK_DIM == DIM:
            ld_ok = r_ok[:, None]
        else:
            ld_ok = r_ok[:, None] & c_ok[None, :]
        if INT8 and QUANT and QCACHE:
            qk = tl.load(QC + (q_start + rows)[:, None] * DIM + offs_c[None, :], mask=ld_ok, other=0)
        else:
            q = tl.load(q_ptrs, mask=ld_ok, other=0.0)  # [BQ, BDIM]
            if INT8 and QUANT:
                qk, q_scale = _quantize_block(q)
            elif INT8:
                qk = q  # int8, quantized once per launch
            else:
                qk = q.to(D.dtype.element_ty)
        if HAS_QMASK:
            r_ok = r_ok & (tl.load(QM + q_start + rows, mask=r_ok, other=0) != 0)
        best = _doc_max(qk, D, DS, DM, d_start, s_start, d_n, offs_d, offs_c, DIM, BLOCK_DIM, HAS_DMASK, INT8, IEEE,
                        UPCAST, RUNMAX, BLOCK_Q, BLOCK_D)
        if INT8 and QUANT and QCACHE:
            # loaded after the document loop, not beside the rows: the scales held across it took
            # 36-44 more registers per thread at one warp (sm_90 compile, 168 -> 212 on varlen)
            best = best * tl.load(QCS + q_start + rows, mask=r_ok, other=1.0)
        elif INT8 and QUANT:
            best = best * q_scale
        elif INT8:
            best = best * tl.load(QS + q_start + rows, mask=r_ok, other=1.0)
        # A row with no valid doc token (empty or fully masked doc) adds 0, as do masked rows.
        best = tl.where(r_ok & (best > float("-inf")), best, 0.0)
        total += tl.sum(best, axis=0)
    if D_LAYOUT == CSR_CAND:
        total = tl.where(is_pad, float("-inf"), total)
    o = qi * n_k + k
    if QCHUNK:
        o += chunk * n_q * n_k
    tl.store(Out + o + tl.arange(0, 1), total)


_KEY = ["LQ_BUCKET", "DIM", "Q_VARLEN", "D_LAYOUT", "HAS_QMASK", "HAS_DMASK", "INT8", "PAGED", "QUANT", "QCACHE",
        "QCHUNK"]


def _claim_afresh(kwargs, reset_only=False):
    """Autotuning hook: the launch's query flags zeroed before each timed run (under the buffer's
    lock, on the launch's stream), so that every run of a shared-quantization config claims,
    quantizes and waits as a real launch does, instead of finding the first run's rows."""
    flags = kwargs.get("QFLAG")
    if flags is not None:
        flags.zero_()


_tuned = triton.autotune(configs=_configs(), key=_KEY, prune_configs_by={"early_config_prune": _prune},
                         pre_hook=_claim_afresh)(_maxsim_fwd_kernel)


def default_config(lq_bucket_: int) -> dict:
    """Launch config used without autotuning (interpreter, MVDB_AUTOTUNE=0): the measured best
    of the H100 sweeps (benchmarks/kernel_variants.py) for short and for long queries."""
    if interpreting():
        return {"BLOCK_Q": 16, "BLOCK_D": 16, "num_warps": 4, "RUNMAX": 1}
    if lq_bucket_ <= 64:
        return {"BLOCK_Q": max(32, lq_bucket_), "BLOCK_D": 32, "num_warps": 2, "num_stages": 3, "RUNMAX": 1}
    # every query bucket above 64 tokens, measured on the ColPali case only (split in QCHUNK_ROWS
    # chunks): BLOCK_D 64 (two programs per SM) took it from 0.58-0.61 ms (BLOCK_D 128) to 0.49-0.50
    # in bf16, int8 unchanged at 0.35-0.36 (kernel-variants-qchunk-H100*.json)
    return {"BLOCK_Q": 128, "BLOCK_D": 64, "num_warps": 4, "num_stages": 3, "RUNMAX": 0}


@triton.jit
def _quantize_rows_kernel(X, Q8, QS, n_rows, DIM: tl.constexpr, BLOCK_DIM: tl.constexpr, BLOCK_T: tl.constexpr,
                          GDC: tl.constexpr = False):
    """Per-row symmetric INT8 (mvdb.kernels.quant's rule: scale = absmax / 127, 1 for a zero
    row, round half away from zero) of the query tokens, once per launch of the MaxSim kernel.
    GDC: the MaxSim launch after it is its programmatic dependent, let start at once (it waits
    for these rows before reading them)."""
    if GDC:
        tl.extra.cuda.gdc_launch_dependents()
    rows = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_DIM)
    ok = (rows < n_rows)[:, None] & (cols < DIM)[None, :]
    x = tl.load(X + rows[:, None] * DIM + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    scale = _int8_scales(x)
    # an IEEE division (div_rn), as torch and numpy divide: the plain '/' is an approximate
    # division on the GPU, which would round some ties differently from quantize_int8
    y = tl.math.div_rn(x, tl.broadcast_to(scale[:, None], x.shape))
    tl.store(Q8 + rows[:, None] * DIM + cols[None, :], _round_half_away(y), mask=ok)
    tl.store(QS + rows, scale, mask=rows < n_rows)


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


def _keep_plan(cache: dict, key, cap: int, consts: dict) -> tuple[dict, tuple]:
    """A launch's plan, ``(consts, tuple(consts.items()))``, stored in ``cache`` under ``key`` (the
    cache emptied first when it holds ``cap`` plans): merged and listed once, not per call (host time)."""
    if len(cache) >= cap:
        cache.clear()
    plan = cache[key] = (consts, tuple(consts.items()))
    return plan


# INT8 launches of up to this much work ((query, document) pairs x the longest query's tokens)
# quantize the query blocks inside the MaxSim kernel (every program redoes its blocks: device
# work) instead of in a launch of their own before it (a second launch and two allocations: host
# work, which is what a small call waits on). Measured on the H100 (benchmarks/int8_call.py,
# int8-call-H100-quant-placement.json and int8-call-H100-20261124.json): in the kernel, 1 query of
# 32 tokens x 10k documents took 115 us of device time against 90 us and saved 90 us of host time
# per call (135 vs 231 us on that machine); at 16k pairs the device cost (+50 us) matched a
# launch's host time, at 32k and 50k pairs the launch was faster; one ColPali query of 1,024
# tokens x 1,000 documents (compute-bound, 0.36 ms) took 0.58 ms with it (kernels.py case b).
# With the blocks shared between programs (QCACHE below, one program per query quantizing) the
# single-query call measured 0.103-0.107 ms against 0.116-0.117 with every program quantizing and
# 0.100-0.104 with the launch on fast hosts (int8-call-H100-20261125-claim.json, -tuned.json),
# 0.18-0.24 on a slow one, where its two launches' host work outlasted do_bench's cache flush
# (-rule.json); 32 queries x 1,000 candidates still lose in the kernel (202 us of device time
# shared, 255 not, 163 with the launch), so the rule stands.
QUANT_IN_KERNEL_WORK = 12288 * 32
# In-kernel launches share the quantized rows from this much work on; below it every program
# quantizes its own block. Small launches wait on the host, where sharing costs its buffer lookup
# and three more launch arguments: in two runs 1 query x 1,000 documents took 0.022 / 0.048 ms
# (host 71 / 95 us per call) with every program quantizing against 0.052 / 0.094 (102 / 114 us)
# shared, 4 x 1,000 candidates 34-37 us of device time either way, 1 x 10k documents 94 us
# shared against 107 (int8-call-H100-20261125-claim.json, int8-call-H100-20261125-rule.json).
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
# QCACHE_MAX_TOKENS query tokens; there every program quantizes. Measured on the H100
# (benchmarks/int8_call.py, int8-call-H100-20261125-claim.json, -tuned.json), 1 query x 10k documents:
# 91-94 us of device time against 104-107 with every program quantizing and 113-115 with the earlier scheme
# (every program that ran before the flag was set quantized and published;
# int8-call-H100-20261124-relaunch.json).
QCACHE_MAX_TOKENS = 8192
QCACHE_ROWS = tl.constexpr(8)  # query rows a claimant quantizes at a time (few registers: any warp count)
QCACHE_PF_LINES = tl.constexpr(64)  # 128-byte lines of its query a claimant prefetches into L2 first (QPF)
# Measured on the H100 (benchmarks/qcache_probe.py, 1 query x 10k int8 documents): the MaxSim
# kernel 89.4 us with the prefetch against 89.9 without, lower in all 7 rounds (a second run, with
# a polling variant since dropped in both arms: 90.4 against 91.1); the same launch with its rows
# already published (no claim, no quantization, no wait) 85.4.
QCACHE_PREFETCH = True
_QCACHE: dict[tuple, tuple] = {}  # (device, stream, thread) -> (int8 rows + scales buffer, flags, lock, views)
_QCACHE_LOCK = threading.Lock()
_GEN = itertools.count(2**32)  # launch numbers: int64 (2**32 on), unique, next() is atomic under the GIL


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # the current stream's handle, no Stream object


_GET_DEVICE = getattr(torch._C, "_cuda_getDevice", None)  # the current device's index, without torch.cuda's wrapper


def _current_device() -> int:
    """torch.cuda.current_device() for launches (CUDA is initialised: their tensors live there)."""
    return _GET_DEVICE() if _GET_DEVICE is not None else torch.cuda.current_device()


def _stream_handle(dev: int) -> int:
    return _RAW_STREAM(dev) if _RAW_STREAM is not None else torch.cuda.current_stream(dev).cuda_stream


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


# Long queries against long documents are split across programs, QCHUNK_ROWS query rows each:
# from QCHUNK_MIN_LQ query tokens (the launch's longest query, or its estimate: the last chunk runs
# to the query's end, so an underestimate costs speed, not correctness; an overestimate is capped at
# the query tokens of the launch, and a grid past 2**31 - 1 programs is not split) and QCHUNK_MIN_LD document
# tokens on average (the padded length, or tokens / documents of a CSR store; paged stores, whose
# shapes do not tell, are not split). One program per pair loops over its query blocks and streams
# the whole document once per block; at ColPali's size (1,024 x 1,024 tokens, 1,000 documents)
# those passes are a document apart on every SM, tens of MB, and come back from HBM. Chunk programs
# of one document run side by side instead and share its tiles through L2. The chunks' sums land in
# an [n_chunks, Nq, K] buffer, added up in chunk order after the launch. Measured on the H100
# (benchmarks/long_query.py, long-query-H100.json): 2-14% faster on documents of 1,024-1,030
# tokens, 6% slower on 64-300 (one program's passes over such a document stay in L2); the
# threshold between them is not measured.
QCHUNK_ROWS = 256
QCHUNK_MIN_LQ = 512
QCHUNK_MIN_LD = 512


def query_chunks(max_lq: int, mean_ld: float) -> int:
    """Programs per (query, document) pair: 1, or one per QCHUNK_ROWS rows of long queries."""
    if QCHUNK_ROWS <= 0 or max_lq < max(QCHUNK_MIN_LQ, QCHUNK_ROWS + 1) or mean_ld < QCHUNK_MIN_LD:
        return 1
    return -(-max_lq // QCHUNK_ROWS)


def _mean_doc_len(layout: int, d: torch.Tensor, offsets, d_len: int, starts) -> float:
    """The documents' mean length from the shapes alone (0 where they do not tell: paged stores)."""
    if layout < int(CSR_CROSS.value):  # PADDED_CROSS, PADDED_PER_QUERY
        return d_len
    if starts is None and offsets is not None:
        return d.shape[0] / max(1, offsets.numel() - 1)
    return 0


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


# Programmatic dependent launch (Hopper and later), opt-in (MVDB_PDL=1): where the queries are
# quantized by a launch of their own, the MaxSim launch is its dependent and may start while it
# runs (its programs wait for the rows before reading them), which hides the gap between the two
# launches; never while a CUDA graph is captured nor on GPUs before sm_90. Not the default: it
# saves about 2 us of GPU time per call (H100, benchmarks/pdl_probe.py: 32 x 1,000 int8 candidates
# 0.1624 against 0.1642 ms) but took more host time in 6 of 8 measured pairs, and where the host
# set the pace it was slower (H200: 0.1767 against 0.1716; pdl-probe-H100-20261126.json,
# pdl-probe-H200-20261126.json).
PDL = os.environ.get("MVDB_PDL", "0") not in ("", "0")
_PDL_DEVICES: dict[int, bool] = {}


def pdl_ok(device: torch.device) -> bool:
    if not PDL or interpreting() or device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    ok = _PDL_DEVICES.get(index)
    if ok is None:
        ok = _PDL_DEVICES[index] = torch.cuda.get_device_capability(index)[0] >= 9
    return ok


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


def autotuning() -> bool:
    return not interpreting() and os.environ.get("MVDB_AUTOTUNE", "1") != "0"


def launch(
    out: torch.Tensor,
    q: torch.Tensor,
    q_mask: torch.Tensor | None,
    cu_q: torch.Tensor | None,
    q_len: int,
    d: torch.Tensor,
    d_scales: torch.Tensor | None,
    d_mask: torch.Tensor | None,
    offsets: torch.Tensor | None,
    cand: torch.Tensor | None,
    d_len: int,
    n_q: int,
    n_k: int,
    layout: int,
    max_lq: int,
    starts: torch.Tensor | None = None,
    scale_starts: torch.Tensor | None = None,
    config: dict | None = None,
) -> torch.Tensor:
    """Launch the kernel over an [n_q, n_k] output; arguments are already validated and contiguous.
    ``starts`` / ``scale_starts`` (CSR_CAND only): a paged store's document rows (see PAGED).
    ``config`` (tests, benchmarks): launch with these BLOCK_Q/BLOCK_D/RUNMAX/num_warps/num_stages
    instead of the autotuned or default ones (and QUANT, to force where int8 queries are
    quantized; QCACHE, whether they are shared; QCHUNK, query rows per program, 0 for one program
    per pair, instead of :func:`query_chunks`' rule). INT8 documents: the query tokens are
    quantized by a kernel of their own before the launch, or, for launches of up to
    QUANT_IN_KERNEL_WORK (:func:`quantize_in_kernel`), inside it: by each program for its own
    block up to SHARE_MIN_WORK, above that by one program per query for all (QCACHE)."""
    n = n_q * n_k
    layout = int(getattr(layout, "value", layout))
    if starts is not None and layout != int(CSR_CAND.value):
        raise ValueError("starts: only the candidate layout (CSR_CAND) reads a paged store")
    if n == 0:
        return out
    if n >= 2**31:
        raise ValueError(f"too many (query, document) pairs in one call: {n} (at most 2**31 - 1); split the batch")
    # no query is longer than all the query tokens: a generous max_seqlen_q adds no empty chunks
    lq = min(max_lq, q.shape[0] if cu_q is not None else q_len)
    forced = None if config is None else config.get("QCHUNK")  # benchmarks: force the split (0: off)
    if forced is None:
        chunks, rows = query_chunks(lq, _mean_doc_len(layout, d, offsets, d_len,
                                                      starts)), QCHUNK_ROWS
    else:
        chunks, rows = (-(-lq // forced) if forced else 1), forced
    if chunks <= 1 or n * chunks >= 2**31:  # the split is a speed-up only: one program per pair instead
        chunks, rows = 1, 0
    other_gpu = out.is_cuda and out.device.index != _current_device()
    with torch.cuda.device(out.device) if other_gpu else _NO_GUARD:
        _launch(out, q, q_mask, cu_q, q_len, d, d_scales, d_mask, offsets, cand, d_len, n_q, n_k, layout, max_lq,
                starts, scale_starts, config, chunks, rows)
    return out


def _launch(out, q, q_mask, cu_q, q_len, d, d_scales, d_mask, offsets, cand, d_len, n_q, n_k, layout, max_lq,
            starts, scale_starts, config, chunks, rows) -> None:
    q_dtype = q.dtype  # the autotune key names the caller's query dtype
    dim = q.shape[-1]
    int8 = d.dtype == torch.int8
    q_scales = None
    config = dict(config) if config is not None else None
    forced = config.pop("QUANT", None) if config is not None else None
    shared = config.pop("QCACHE", None) if config is not None else None
    if config is not None:
        config.pop("QCHUNK", None)  # decided by launch: ``chunks`` programs of ``rows`` query rows per pair
    quant = int8 and (quantize_in_kernel(n_q * n_k, max_lq) if forced is None else bool(forced))
    qc = qcs = qflag = lock = None
    # shared where forced, or by default above SHARE_MIN_WORK; a chunk quantizes its own rows
    if quant and not rows and (shared or shared is None and share_in_kernel(n_q * n_k, max_lq)):
        qc, qcs, qflag, lock = _query_cache(q, n_q, force=bool(shared))
    # PDL only behind a quantization launch that runs (no rows: no launch to depend on)
    gdc = int8 and not quant and q.numel() > 0 and pdl_ok(q.device)
    into = None
    if int8 and not quant:
        # up to QCACHE_MAX_TOKENS query tokens the quantization launch writes into the stream's
        # buffer (no allocation: host time), under its lock together with the MaxSim launch, so
        # another thread's launches on the same stream cannot overwrite the rows in between; larger
        # batches get an allocation of their own, freed after the call (no large buffer is kept)
        c8, cs, _, lock = _query_cache(q, n_q)
        into = None if c8 is None else (c8, cs)
    part = out if not rows else torch.empty((chunks, n_q, n_k), dtype=torch.float32, device=out.device)
    meta = dict(
        LQ_BUCKET=lq_bucket(max_lq),
        DIM=dim,
        BLOCK_DIM=max(32, pow2(dim)),
        Q_VARLEN=cu_q is not None,
        D_LAYOUT=layout,
        HAS_QMASK=q_mask is not None,
        HAS_DMASK=d_mask is not None,
        INT8=int8,
        IEEE=d.dtype == torch.float32,
        # Triton's CPU interpreter computes bf16 x bf16 dots wrongly (triton 3.9): upcast there.
        UPCAST=d.dtype == torch.bfloat16 and interpreting(),
        PAGED=starts is not None,
        QUANT=quant,
        QCACHE=qc is not None,
        QCHUNK=rows,
        GDC=gdc,
        QPF=qc is not None and QCACHE_PREFETCH,
    )
    if gdc:
        meta["launch_pdl"] = True
    grid = (n_q * n_k * chunks,)
    # a shared buffer's launches draw their numbers and are enqueued in one order (under its lock)
    with lock if lock is not None else _NO_GUARD:
        if int8 and not quant:
            with launch_guard():
                q, q_scales = quantize_queries(q, gdc, into)
        gen = next(_GEN) if qc is not None else 0
        args = (
            q,
            q_scales,
            None if q_mask is None else q_mask.view(torch.uint8),
            cu_q,
            d,
            d_scales,
            None if d_mask is None else d_mask.view(torch.uint8),
            offsets,
            cand,
            starts,
            scale_starts,
            part,
            qc,
            qcs,
            qflag,
            n_q,
            n_k,
            q_len,
            d_len,
            gen,
            chunks,
        )
        if config is not None:
            with launch_guard():
                launch_kernel(_maxsim_fwd_kernel, grid, args, {**meta, **config})
        else:
            _run(grid, args, meta, out.device, q_dtype, d.dtype)
    if rows:
        torch.sum(part, 0, out=out.view(n_q, n_k))


_BEST: dict[tuple, dict] = {}  # autotune winners, launched directly (skips the autotuner's per-call work)


# Relaunching a compiled kernel. triton's JITFunction.run re-derives the specialization of every
# argument, builds its cache key (a string of the compile options) and looks the binary up on every
# call: ~30-50 us of host time on the GPU hosts, which is what a small call (1 query x 10k
# documents, ~0.1 ms of device time) waits on. The first launch of a specialization goes through
# triton; later ones with the same specialization (what triton keys on: each tensor's dtype and
# 16-byte alignment, each integer's 32/64-bit type and whether it is 1 or divisible by 16, None-ness,
# the constexprs and launch options, the device) call that binary's launcher directly.
# MVDB_FAST_LAUNCH=0 turns it off.
FAST_LAUNCH = os.environ.get("MVDB_FAST_LAUNCH", "1") != "0"
# Relaunches straight through the launcher (below, launch_kernel); MVDB_DIRECT_LAUNCH=0 keeps them on
# CompiledKernel's runner. Measured on the H100's host: the launcher called directly 5.0-5.7 us
# of host time against 7.9-10.3 through the runner (benchmarks/train_host_parts.py, three runs);
# a whole relaunch through launch_kernel (its key and lookup included) 13.4 us against 16.6, the
# MaxSim kernel's 38 against 47 (benchmarks/kernel_variants.py --cases h, one run, the GPU idle).
DIRECT_LAUNCH = os.environ.get("MVDB_DIRECT_LAUNCH", "1") != "0"
_REPLAY: dict[tuple, list] = {}  # key -> [compiled kernel, constexpr tail, (launcher, function, metadata) or None, fn]
_REPLAY_MAX = 256  # specializations kept (a launch beyond them is a cache miss, never a wrong kernel)
_INT32 = (-(2**31), 2**31)


def _arg_sig(a):
    if isinstance(a, torch.Tensor):
        return a.dtype, a.data_ptr() % 16 == 0
    if a is None:
        return None
    if isinstance(a, int) and not isinstance(a, bool):
        return _INT32[0] <= a < _INT32[1], a == 1, a % 16 == 0
    return type(a), a


_TENSOR = torch.Tensor


def _arg_sigs(args: tuple) -> tuple:
    """``tuple(map(_arg_sig, args))``, with plain tensors, None and plain ints inline (host time:
    2.3 us against 4.4 for the MaxSim kernel's 21 arguments on a 2-core CPU)."""
    return tuple([None if a is None else (a.dtype, not a.data_ptr() & 15) if type(a) is _TENSOR else
                  (-2147483648 <= a < 2147483648, a == 1, not a & 15) if type(a) is int else _arg_sig(a)
                  for a in args])


def _const_tail(fn, n_args: int, consts: dict) -> tuple:
    """The values of ``fn``'s parameters after its first ``n_args``: from ``consts``, else the
    parameter's default (KeyError where it has none)."""
    defaults = {p.name: p.default for p in getattr(fn, "params", ()) if p.default is not inspect.Parameter.empty}
    return tuple(consts[name] if name in consts else defaults[name] for name in fn.arg_names[n_args:])


def launch_kernel(fn, grid: tuple, args: tuple, consts: dict, consts_key: tuple | None = None) -> None:
    """``fn[grid](*args, **consts)`` (``args``: the kernel's leading non-constexpr parameters in order;
    ``consts``: its constexprs and launch options by name; ``consts_key``: ``tuple(consts.items())``
    where the caller keeps it). An already seen specialization is
    relaunched without JITFunction's per-call dispatch: straight through its compiled binary's
    launcher on the current stream while no launch hook is installed (the call CompiledKernel's
    runner makes, without re-reading the device and stream through triton's driver or building
    launch metadata nobody reads), else through that runner (see FAST_LAUNCH)."""
    if not FAST_LAUNCH or interpreting():
        fn[grid](*args, **consts)
        return
    dev = _current_device()
    # id(fn): a JITFunction hashes by its cache_key, a property that takes a lock (host time); the
    # entry holds fn, so the id is not reused while the entry lives
    key = (id(fn), dev, _arg_sigs(args), tuple(consts.items()) if consts_key is None else consts_key)
    hit = _REPLAY.get(key)
    if hit is None:
        kernel = fn[grid](*args, **consts)
        try:  # a triton whose compiled kernels launch otherwise keeps launching through JITFunction
            tail = _const_tail(fn, len(args), consts)
            kernel[(1, 1, 1)]  # noqa: B018 - the launcher exists (loads the binary's handles)
        except (AttributeError, KeyError, TypeError):
            return
        direct = tuple(getattr(kernel, name, None) for name in ("run", "function", "packed_metadata"))
        if len(_REPLAY) >= _REPLAY_MAX:
            _REPLAY.clear()
        _REPLAY[key] = [kernel, tail, direct if None not in direct and _known_launcher(type(kernel)) else None, fn]
        return
    kernel, tail, direct, _ = hit
    grid3 = (*grid, 1, 1)[:3]
    if direct is not None and DIRECT_LAUNCH and _hooks_idle():
        run, function, packed = direct
        try:
            run(*grid3, _stream_handle(dev), function, packed, None, None, None, *args, *tail)
            return
        except TypeError:  # a launcher of another signature: argument parsing fails before any launch
            hit[2] = None
    kernel[grid3](*args, *tail)


# The call CompiledKernel's runner makes (triton 3.4-3.9), read from its source once: grid x, y,
# z, the stream, the function handle, the packed metadata, the launch metadata, the enter / exit
# hooks (from triton.knobs), the arguments. Another layout keeps relaunches on the runner.
_RUNNER_CALL = "self.run(grid[0],grid[1],grid[2],stream,self.function,self.packed_metadata,launch_metadata,"
_KNOWN_RUNNERS: dict[type, bool] = {}


def _known_launcher(cls: type) -> bool:
    """Whether the runner of compiled kernels of class ``cls`` (CompiledKernel.__getitem__) calls
    their launcher as above."""
    known = _KNOWN_RUNNERS.get(cls)
    if known is None:
        try:
            src = "".join(inspect.getsource(cls.__getitem__).split())
        except (OSError, TypeError, AttributeError):
            src = ""
        known = _KNOWN_RUNNERS[cls] = _RUNNER_CALL in src and "knobs.runtime.launch_enter_hook" in src
    return known


def _hook_set(hook) -> bool:
    return hook is not None and bool(getattr(hook, "calls", True))  # triton 3.9 keeps an empty HookChain


def _hooks_idle() -> bool:
    """No launch hook is installed (a profiler such as proton installs them; then every launch goes
    through CompiledKernel's runner, which builds the launch metadata the hooks read)."""
    runtime = getattr(knobs, "runtime", None)
    return runtime is not None and not (_hook_set(getattr(runtime, "launch_enter_hook", None))
                                        or _hook_set(getattr(runtime, "launch_exit_hook", None)))


_TUNE_LOCK = threading.Lock()  # one autotuning run at a time (the autotuner keeps per-call state)
_INTERPRETER_LOCK = threading.Lock()  # Triton's CPU interpreter patches module globals per launch


_NO_GUARD = contextlib.nullcontext()  # stateless: one instance serves every with-statement (host time)


def launch_guard():
    """Held around a kernel launch: serialises launches under TRITON_INTERPRET=1, which is not
    thread-safe; compiled launches run concurrently."""
    return _INTERPRETER_LOCK if interpreting() else _NO_GUARD


# (autotuning, device, query dtype, document dtype, the launch's meta values) -> (the launch's
# constexprs and options: meta with its config, and their items): a launch whose config is known
# merges and lists them once (host time), not per call
_PLANS: dict[tuple, tuple[dict, tuple]] = {}
_PLANS_MAX = 256


def _run(grid, args, meta, device, q_dtype, d_dtype) -> None:
    tuned = autotuning()
    pkey = (tuned, device, q_dtype, d_dtype, *meta.values())
    plan = _PLANS.get(pkey)
    if plan is None:
        if tuned:
            key = (device, q_dtype, d_dtype, *(meta[k] for k in _KEY))
            best = _BEST.get(key)
            if best is None:
                with _TUNE_LOCK:
                    best = _BEST.get(key)
                    if best is None:
                        _tuned[grid](*args, **meta)
                        _BEST[key] = _tuned.best_config.all_kwargs()
                        return
        else:
            best = default_config(meta["LQ_BUCKET"])
        plan = _keep_plan(_PLANS, pkey, _PLANS_MAX, {**meta, **best})
    with launch_guard():
        launch_kernel(_maxsim_fwd_kernel, grid, args, *plan)


def compiled_variants() -> int:
    """How many binaries the Triton JIT holds for the kernel (to prove shapes do not recompile)."""
    caches = getattr(_maxsim_fwd_kernel, "device_caches", None)
    if caches is None:
        return len(getattr(_maxsim_fwd_kernel, "cache", {}).get(torch.cuda.current_device(), {}))
    return sum(len(entry[0]) for entry in caches.values())
