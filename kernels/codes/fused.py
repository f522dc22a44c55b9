"""Approximate MaxSim over residual codes (Triton): each document token is decoded in registers
(its centroid row, from L2, plus each dimension's bucket weight) and never written out."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _decode_tile(CODES, W, tok, offs_c, c_ok, w0, w1, w2, w3, DIM: tl.constexpr, BLOCK_DIM: tl.constexpr,
                 BITS: tl.constexpr, NB: tl.constexpr, WORDS: tl.constexpr, BLOCK_D: tl.constexpr):
    """[BLOCK_D, BLOCK_DIM] residuals of the tokens ``tok`` (int64 rows), in the weights' dtype."""
    levels: tl.constexpr = 1 << BITS
    if WORDS:
        # whole 32-bit words of codes (dimension 32 / BITS * w + j at bits BITS * j of word w): one
        # coalesced load of NB / 4 words a token, unpacked in registers
        PER: tl.constexpr = 32 // BITS
        NW: tl.constexpr = NB // 4
        offs_w = tl.arange(0, NW)
        words = tl.load(CODES + tok[:, None] * NW + offs_w[None, :])  # [BD, NW] int32
        shifts = tl.arange(0, PER) * BITS
        code = tl.reshape((words[:, :, None] >> shifts[None, None, :]) & (levels - 1), (BLOCK_D, BLOCK_DIM))
    else:
        PER_B: tl.constexpr = 8 // BITS
        byt = tl.load(CODES + tok[:, None] * NB + (offs_c // PER_B)[None, :], mask=c_ok[None, :], other=0)
        code = ((byt >> ((offs_c % PER_B) * BITS).to(tl.uint8)[None, :]) & (levels - 1)).to(tl.int32)
    if BITS == 1:
        res = tl.where(code == 0, w0[None, :], w1[None, :])  # two values a dimension, in registers
    elif BITS == 2:
        # four values a dimension, held in registers for the whole program: selects, no gather
        res = tl.where(code == 0, w0[None, :], tl.where(code == 1, w1[None, :],
                                                        tl.where(code == 2, w2[None, :], w3[None, :])))
    else:
        res = tl.load(W + offs_c[None, :] * levels + code, mask=c_ok[None, :], other=0.0).to(w0.dtype)
    return res


@triton.jit
def _doc_rows(qk, r_ok, C, LISTS, CODES, W, d_start, n, offs_t, offs_c, c_ok, w0, w1, w2, w3,
              DIM: tl.constexpr, BLOCK_DIM: tl.constexpr, BITS: tl.constexpr, NB: tl.constexpr,
              WORDS: tl.constexpr, LIST16: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr):
    """Sum over the valid rows of ``qk`` of each row's best similarity among the document's tokens."""
    best = tl.full([BLOCK_Q], float("-inf"), dtype=tl.float32)
    lim = tl.minimum(offs_t, n - 1)  # columns past a short document's end repeat its last token
    for db in range(0, n, BLOCK_D):
        # the last tile starts BLOCK_D tokens before the end (overlapping): no masks, the max is exact
        tok = d_start + (tl.maximum(tl.minimum(db, n - BLOCK_D), 0) + lim).to(tl.int64)  # [BD]
        lid = tl.load(LISTS + tok).to(tl.int64)
        if LIST16:
            lid = lid & 0xFFFF  # int16 holding the uint16 list id
        cen = tl.load(C + lid[:, None] * DIM + offs_c[None, :], mask=c_ok[None, :], other=0.0)  # [BD, BDIM]
        res = _decode_tile(CODES, W, tok, offs_c, c_ok, w0, w1, w2, w3, DIM, BLOCK_DIM, BITS, NB, WORDS, BLOCK_D)
        x = (cen.to(res.dtype) + res).to(tl.float16)
        s = tl.dot(qk, tl.trans(x))  # [BQ, BD]
        best = tl.maximum(best, tl.max(s, axis=1))
    best = tl.where(r_ok & (best > float("-inf")), best, 0.0)
    return tl.sum(best, axis=0)


@triton.jit(do_not_specialize=["n_k", "n_groups"])
def _approx_kernel(
    Q,  # [Tq, DIM] float16 query tokens
    CU_Q,  # [Nq + 1] int32 query offsets
    C,  # [nlist, DIM] float16 centroids
    LISTS,  # [T] int32 each stored token's list (LIST16: int16 holding the uint16 id)
    CODES,  # [T, NB] uint8 packed residual codes (WORDS: viewed as [T, NB / 4] int32)
    W,  # [DIM, 2**BITS] float32 bucket weights
    OFF,  # [n_rows + 1] int64 document offsets (tokens)
    CAND,  # [Nq, n_k] int64 candidate rows, -1 pads (n_k a multiple of GROUP)
    Out,  # [Nq, n_k] float32
    n_k,
    n_groups,  # n_k / GROUP
    DIM: tl.constexpr,
    BLOCK_DIM: tl.constexpr,
    BITS: tl.constexpr,
    NB: tl.constexpr,
    WORDS: tl.constexpr,
    LIST16: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_D: tl.constexpr,
    GROUP: tl.constexpr,  # candidates a program scores (one query's: its tokens loaded once)
    ONE_QB: tl.constexpr,  # every query fits one BLOCK_Q tile
    HALF: tl.constexpr,  # decode in float16 (else float32, rounded to float16 for the dot)
):
    pid = tl.program_id(0).to(tl.int64)
    qi = pid // n_groups
    k0 = (pid % n_groups) * GROUP
    q_start = tl.load(CU_Q + qi).to(tl.int64)
    q_all = tl.load(CU_Q + qi + 1).to(tl.int64) - q_start

    offs_q = tl.arange(0, BLOCK_Q)
    offs_t = tl.arange(0, BLOCK_D)
    offs_c = tl.arange(0, BLOCK_DIM)
    c_ok = offs_c < DIM
    levels: tl.constexpr = 1 << BITS
    wt = tl.float16 if HALF else tl.float32
    if BITS <= 2:  # the values of each dimension in registers (_decode_tile selects among them)
        w0 = tl.load(W + offs_c * levels, mask=c_ok, other=0.0).to(wt)
        w1 = tl.load(W + offs_c * levels + 1, mask=c_ok, other=0.0).to(wt)
        w2 = w0
        w3 = w0
        if BITS == 2:
            w2 = tl.load(W + offs_c * levels + 2, mask=c_ok, other=0.0).to(wt)
            w3 = tl.load(W + offs_c * levels + 3, mask=c_ok, other=0.0).to(wt)
    else:
        w0 = tl.zeros([BLOCK_DIM], dtype=wt)
        w1 = w0
        w2 = w0
        w3 = w0
    if ONE_QB:
        r_ok1 = offs_q < q_all
        qk1 = tl.load(Q + (q_start + offs_q)[:, None] * DIM + offs_c[None, :], mask=r_ok1[:, None] & c_ok[None, :],
                      other=0.0)  # [BQ, BDIM]
    for g in range(GROUP):
        k = k0 + g
        doc = tl.load(CAND + qi * n_k + k)
        is_pad = doc < 0
        safe = tl.maximum(doc, 0)
        d_start = tl.load(OFF + safe)
        n = tl.where(is_pad, 0, tl.load(OFF + safe + 1) - d_start).to(tl.int32)
        if ONE_QB:
            total = _doc_rows(qk1, r_ok1, C, LISTS, CODES, W, d_start, n, offs_t, offs_c, c_ok, w0, w1, w2, w3,
                              DIM, BLOCK_DIM, BITS, NB, WORDS, LIST16, BLOCK_Q, BLOCK_D)
        else:
            total = tl.sum(tl.zeros([BLOCK_Q], dtype=tl.float32), axis=0)
            q_n = tl.where(is_pad, 0, q_all)
            for qb in range(0, q_n, BLOCK_Q):
                rows = qb + offs_q
                r_ok = rows < q_n
                qk = tl.load(Q + (q_start + rows)[:, None] * DIM + offs_c[None, :],
                             mask=r_ok[:, None] & c_ok[None, :], other=0.0)
                total += _doc_rows(qk, r_ok, C, LISTS, CODES, W, d_start, n, offs_t, offs_c, c_ok, w0, w1, w2, w3,
                                   DIM, BLOCK_DIM, BITS, NB, WORDS, LIST16, BLOCK_Q, BLOCK_D)
        total = tl.where(is_pad, float("-inf"), total)
        tl.store(Out + qi * n_k + k, total)


@triton.jit
def _doc_rows_qc(qt, r_ok, QCT, qc_stride, q_rows, LISTS, CODES, W, d_start, n, offs_t, offs_c, c_ok,
                 w0, w1, w2, w3, DIM: tl.constexpr, BLOCK_DIM: tl.constexpr, BITS: tl.constexpr, NB: tl.constexpr,
                 WORDS: tl.constexpr, LIST16: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr):
    """:func:`_doc_rows` with each token's centroid term read from the query rows' centroid scores
    (``QCT[list, q_rows]``, one contiguous run a token) instead of its centroid: only the residual
    is decoded and multiplied; ``qt`` [BDIM, BQ] the query rows transposed."""
    best = tl.full([BLOCK_Q], float("-inf"), dtype=tl.float32)
    lim = tl.minimum(offs_t, n - 1)
    for db in range(0, n, BLOCK_D):
        tok = d_start + (tl.maximum(tl.minimum(db, n - BLOCK_D), 0) + lim).to(tl.int64)  # [BD]
        lid = tl.load(LISTS + tok).to(tl.int64)
        if LIST16:
            lid = lid & 0xFFFF
        cs = tl.load(QCT + lid[:, None] * qc_stride + q_rows[None, :], mask=r_ok[None, :], other=0.0)  # [BD, BQ]
        res = _decode_tile(CODES, W, tok, offs_c, c_ok, w0, w1, w2, w3, DIM, BLOCK_DIM, BITS, NB, WORDS, BLOCK_D)
        s = tl.dot(res.to(tl.float16), qt) + cs.to(tl.float32)  # [BD, BQ]
        best = tl.maximum(best, tl.max(s, axis=0))
    best = tl.where(r_ok & (best > float("-inf")), best, 0.0)
    return tl.sum(best, axis=0)


@triton.jit(do_not_specialize=["n_k", "n_groups", "qc_stride"])
def _approx_qc_kernel(
    Q,  # [Tq, DIM] float16 query tokens (this launch's)
    CU_Q,  # [Nq + 1] int32 query offsets (into Q and the columns of QCT)
    QCT,  # [nlist, qc_stride] float16: centroid c's similarity to query token t at [c, t]
    qc_stride,
    LISTS, CODES, W, OFF, CAND, Out,  # as _approx_kernel's
    n_k,
    n_groups,
    DIM: tl.constexpr,
    BLOCK_DIM: tl.constexpr,
    BITS: tl.constexpr,
    NB: tl.constexpr,
    WORDS: tl.constexpr,
    LIST16: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_D: tl.constexpr,
    GROUP: tl.constexpr,
    ONE_QB: tl.constexpr,
    HALF: tl.constexpr,
):
    """:func:`_approx_kernel` over the residuals, each token's centroid term looked up (see
    :func:`_doc_rows_qc`): a token reads its list id, its codes and its query's run of centroid
    scores, never its centroid."""
    pid = tl.program_id(0).to(tl.int64)
    qi = pid // n_groups
    k0 = (pid % n_groups) * GROUP
    q_start = tl.load(CU_Q + qi).to(tl.int64)
    q_all = tl.load(CU_Q + qi + 1).to(tl.int64) - q_start

    offs_q = tl.arange(0, BLOCK_Q)
    offs_t = tl.arange(0, BLOCK_D)
    offs_c = tl.arange(0, BLOCK_DIM)
    c_ok = offs_c < DIM
    levels: tl.constexpr = 1 << BITS
    wt = tl.float16 if HALF else tl.float32
    if BITS <= 2:
        w0 = tl.load(W + offs_c * levels, mask=c_ok, other=0.0).to(wt)
        w1 = tl.load(W + offs_c * levels + 1, mask=c_ok, other=0.0).to(wt)
        w2 = w0
        w3 = w0
        if BITS == 2:
            w2 = tl.load(W + offs_c * levels + 2, mask=c_ok, other=0.0).to(wt)
            w3 = tl.load(W + offs_c * levels + 3, mask=c_ok, other=0.0).to(wt)
    else:
        w0 = tl.zeros([BLOCK_DIM], dtype=wt)
        w1 = w0
        w2 = w0
        w3 = w0
    if ONE_QB:
        r_ok1 = offs_q < q_all
        qt1 = tl.load(Q + (q_start + offs_q)[None, :] * DIM + offs_c[:, None], mask=r_ok1[None, :] & c_ok[:, None],
                      other=0.0)  # [BDIM, BQ]
    for g in range(GROUP):
        k = k0 + g
        doc = tl.load(CAND + qi * n_k + k)
        is_pad = doc < 0
        safe = tl.maximum(doc, 0)
        d_start = tl.load(OFF + safe)
        n = tl.where(is_pad, 0, tl.load(OFF + safe + 1) - d_start).to(tl.int32)
        if ONE_QB:
            total = _doc_rows_qc(qt1, r_ok1, QCT, qc_stride, q_start + offs_q, LISTS, CODES, W, d_start, n, offs_t,
                                 offs_c, c_ok, w0, w1, w2, w3, DIM, BLOCK_DIM, BITS, NB, WORDS, LIST16, BLOCK_Q,
                                 BLOCK_D)
        else:
            total = tl.sum(tl.zeros([BLOCK_Q], dtype=tl.float32), axis=0)
            q_n = tl.where(is_pad, 0, q_all)
            for qb in range(0, q_n, BLOCK_Q):
                rows = qb + offs_q
                r_ok = rows < q_n
                qt = tl.load(Q + (q_start + rows)[None, :] * DIM + offs_c[:, None],
                             mask=r_ok[None, :] & c_ok[:, None], other=0.0)
                total += _doc_rows_qc(qt, r_ok, QCT, qc_stride, q_start + rows, LISTS, CODES, W, d_start, n, offs_t,
                                      offs_c, c_ok, w0, w1, w2, w3, DIM, BLOCK_DIM, BITS, NB, WORDS, LIST16,
                                      BLOCK_Q, BLOCK_D)
        total = tl.where(is_pad, float("-inf"), total)
        tl.store(Out + qi * n_k + k, total)


def block_q(max_lq: int) -> int:
    return max(32, min(64, triton.next_power_of_2(max(1, max_lq))))
