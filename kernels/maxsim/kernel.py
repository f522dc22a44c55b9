"""Fused MaxSim forward in Triton: one program per (query, document) pair, never materialising
the [Lq, Ld] similarity tile beyond one [BLOCK_Q, BLOCK_D] block in registers.

Every public layout (padded cross product, padded per-query candidates, packed varlen, CSR store
with candidate lists) reduces to "query tokens start here, doc tokens start there"; the kernel
reads documents straight from where they lie, so no padded copy is ever made.

The host side lies beside it: launcher.py validates and launches, tuning.py picks the launch
config, query_quant.py quantizes int8 queries and shares them between programs, runtime.py
relaunches compiled kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Doc layouts (constexpr D_LAYOUT; globals a kernel reads must be tl.constexpr).
PADDED_CROSS = tl.constexpr(0)  # D [Nd, Ld, d]: doc k starts at k * Ld
PADDED_PER_QUERY = tl.constexpr(1)  # D [Nq, K, Ld, d]: doc (i, k) starts at (i * K + k) * Ld
CSR_CROSS = tl.constexpr(2)  # tokens [T, d] + offsets: every doc for every query
CSR_CAND = tl.constexpr(3)  # tokens [T, d] + offsets + cand [Nq, K]: doc cand[i, k], -1 = padding
# CSR_CAND over a paged store: offsets give each document's length only; STARTS [n_docs] int64 gives
# the row (counted from D, possibly in another allocation of the same device) where its tokens
# start, and SC_STARTS the same for the int8 scales (counted from DS).

# Shared query rows (QCACHE, see query_quant.py)
QCACHE_ROWS = tl.constexpr(8)  # query rows a claimant quantizes at a time (few registers: any warp count)
QCACHE_PF_LINES = tl.constexpr(64)  # 128-byte lines of its query a claimant prefetches into L2 first (QPF)


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
            # float subtract, exact). Folding the subtract into an FMA with -12582912 * scale would
            # lose about half an int8 unit per score; sm_90's I2FP conversion is no faster on
            # compute-bound long queries and slower on some configs; the bit pattern as the MMA's
            # accumulator input compiles to the same integer add.
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
    # needs a masked load or a -inf select. A masked tail tile after the loop would put a second
    # dot in the code (long-query configs then spill registers to the stack), and masking every
    # tile costs a select per score. The columns are int32 rows counted from the document's first
    # token, scale and mask entry (64-bit addresses per column would take about a third more
    # instructions in the int8 loop); only the token rows' byte offsets are widened, so no
    # document length overflows them.
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
    magnitude are scaled by 2^64 first) at about half the cost of div_rn per element."""
    # scales from the block as given, not its float32 copy: fewer registers per thread
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
    GDC: tl.constexpr = False,  # launched as the dependent of the query quantization launch (PDL, tuning.py)
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
        # thread's, broadcast to the program, so its warps all take the same branch (per-thread
        # reads can disagree, and the quantizing branch's cross-warp reductions would then read the
        # other branch's shared memory). Padding candidates (q_n 0) neither claim nor wait.
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
            # loaded after the document loop, not beside the rows: scales held across the loop
            # would cost registers (a few dozen per thread at one warp)
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


@triton.jit(do_not_specialize=["n_rows"])  # batches of every size: one compile
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


def compiled_variants() -> int:
    """How many binaries the Triton JIT holds for the kernel (to prove shapes do not recompile)."""
    caches = getattr(_maxsim_fwd_kernel, "device_caches", None)
    if caches is None:
        return len(getattr(_maxsim_fwd_kernel, "cache", {}).get(torch.cuda.current_device(), {}))
    return sum(len(entry[0]) for entry in caches.values())
