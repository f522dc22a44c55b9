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
    MID: tl.constexpr = (levels - 1) / 2
    if WORDS:
        # whole 32-bit words of codes (dimension 32 / BITS * w + j at bits BITS * j of word w): one
        # coalesced load of NB / 4 words a token, unpacked in registers; past the last word (a
        # dimension that is not a power of two) code 0, which the zeroed query columns cancel
        PER: tl.constexpr = 32 // BITS
        NW: tl.constexpr = NB // 4
        NW_P2: tl.constexpr = BLOCK_DIM // PER
        offs_w = tl.arange(0, NW_P2)
        if NW_P2 == NW:
            words = tl.load(CODES + tok[:, None] * NW + offs_w[None, :])  # [BD, NW] int32
        else:
            words = tl.load(CODES + tok[:, None] * NW + offs_w[None, :], mask=(offs_w < NW)[None, :], other=0)
        shifts = tl.arange(0, PER) * BITS
        code = tl.reshape((words[:, :, None] >> shifts[None, None, :]) & (levels - 1), (BLOCK_D, BLOCK_DIM))
    else:
        PER_B: tl.constexpr = 8 // BITS
        byt = tl.load(CODES + tok[:, None] * NB + (offs_c // PER_B)[None, :], mask=c_ok[None, :], other=0)
        code = ((byt >> ((offs_c % PER_B) * BITS).to(tl.uint8)[None, :]) & (levels - 1)).to(tl.int32)
    if BITS <= 2:
        # the level's value as a polynomial in the code (exact at the 2**BITS codes): packed
        # float16 multiply-adds, no compares or selects (w0..w3 hold the coefficients, lowest first)
        if w0.dtype == tl.float16:  # 1024 + code as float16's bits, less 1024, less MID (each exact)
            c = ((code | 0x6400).to(tl.int16).to(tl.float16, bitcast=True) - 1024.0) - MID
        else:
            c = code.to(w0.dtype) - MID
        if BITS == 1:
            res = w1[None, :] * c + w0[None, :]
        else:
            res = ((w3[None, :] * c + w2[None, :]) * c + w1[None, :]) * c + w0[None, :]
    else:
        res = tl.load(W + offs_c[None, :] * levels + code, mask=c_ok[None, :], other=0.0).to(w0.dtype)
    return res


@triton.jit
def _tile_best(qk, C, LISTS, CODES, W, d_start, n, db, offs_t, offs_c, c_ok, w0, w1, w2, w3,
               DIM: tl.constexpr, BLOCK_DIM: tl.constexpr, BITS: tl.constexpr, NB: tl.constexpr,
               WORDS: tl.constexpr, LIST16: tl.constexpr, BLOCK_D: tl.constexpr):
    """Each row of ``qk``'s best similarity [BQ] among the document's tokens db .. db + BLOCK_D - 1.
    The last tile starts BLOCK_D tokens before the end (overlapping) and columns past a short
    document's end repeat its last token: no masks, the max is exact."""
    lim = tl.minimum(offs_t, n - 1)
    tok = d_start + (tl.maximum(tl.minimum(db, n - BLOCK_D), 0) + lim).to(tl.int64)  # [BD]
    lid = tl.load(LISTS + tok).to(tl.int64)
    if LIST16:
        lid = lid & 0xFFFF  # int16 holding the uint16 list id
    cen = tl.load(C + lid[:, None] * DIM + offs_c[None, :], mask=c_ok[None, :], other=0.0)  # [BD, BDIM]
    res = _decode_tile(CODES, W, tok, offs_c, c_ok, w0, w1, w2, w3, DIM, BLOCK_DIM, BITS, NB, WORDS, BLOCK_D)
    x = (cen.to(res.dtype) + res).to(tl.float16)
    return tl.max(tl.dot(qk, tl.trans(x)), axis=1)  # [BQ]


@triton.jit
def _doc_rows(qk, r_ok, C, LISTS, CODES, W, d_start, n, offs_t, offs_c, c_ok, w0, w1, w2, w3,
              DIM: tl.constexpr, BLOCK_DIM: tl.constexpr, BITS: tl.constexpr, NB: tl.constexpr,
              WORDS: tl.constexpr, LIST16: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr):
    """Sum over the valid rows of ``qk`` of each row's best similarity among the document's tokens."""
    best = tl.full([BLOCK_Q], float("-inf"), dtype=tl.float32)
    for db in range(0, n, BLOCK_D):
        best = tl.maximum(best, _tile_best(qk, C, LISTS, CODES, W, d_start, n, db, offs_t, offs_c, c_ok,
                                           w0, w1, w2, w3, DIM, BLOCK_DIM, BITS, NB, WORDS, LIST16, BLOCK_D))
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
    GROUP_P2: tl.constexpr,  # GROUP rounded up to a power of two
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
    if BITS <= 2:
        # each dimension's levels as the coefficients of the polynomial through them (float32 here,
        # then the decode's dtype): w0 + w1 c (1 bit), or w0 + w1 c + w2 c^2 + w3 c^3 (2 bits)
        v0 = tl.load(W + offs_c * levels, mask=c_ok, other=0.0)
        v1 = tl.load(W + offs_c * levels + 1, mask=c_ok, other=0.0)
        w0 = ((v0 + v1) / 2.0).to(wt)  # in c - MID (0.5 at 1 bit)
        w1 = (v1 - v0).to(wt)
        w2 = w0
        w3 = w0
        if BITS == 2:
            v2 = tl.load(W + offs_c * levels + 2, mask=c_ok, other=0.0)
            v3 = tl.load(W + offs_c * levels + 3, mask=c_ok, other=0.0)
            d1 = v1 - v0  # forward differences of the levels
            d2 = v2 - 2.0 * v1 + v0
            d3 = v3 - 3.0 * v2 + 3.0 * v1 - v0
            a1 = d1 - d2 / 2.0 + d3 / 3.0  # the coefficients in c
            a2 = (d2 - d3) / 2.0
            a3 = d3 / 6.0
            # ... and in c - MID (1.5, the codes' middle: near-symmetric levels give small
            # intermediate values in the float16 multiply-adds)
            w0 = (v0 + 1.5 * a1 + 2.25 * a2 + 3.375 * a3).to(wt)
            w1 = (a1 + 3.0 * a2 + 6.75 * a3).to(wt)
            w2 = (a2 + 4.5 * a3).to(wt)
            w3 = a3.to(wt)
    else:
        w0 = tl.zeros([BLOCK_DIM], dtype=wt)
        w1 = w0
        w2 = w0
        w3 = w0
    if ONE_QB:
        r_ok1 = offs_q < q_all
        qk1 = tl.load(Q + (q_start + offs_q)[:, None] * DIM + offs_c[None, :], mask=r_ok1[:, None] & c_ok[None, :],
                      other=0.0)  # [BQ, BDIM]
    # the group's candidates and their token ranges, loaded at once (not one candidate at a time)
    offs_g = tl.arange(0, GROUP_P2)
    g_ok = offs_g < GROUP
    docs = tl.load(CAND + qi * n_k + k0 + offs_g, mask=g_ok, other=-1)
    safe = tl.maximum(docs, 0)
    starts = tl.load(OFF + safe)
    lens = tl.where(docs < 0, 0, tl.load(OFF + safe + 1) - starts).to(tl.int32)
    totals = tl.zeros([GROUP_P2], dtype=tl.float32)
    for g in range(GROUP):
        pick = offs_g == g
        d_start = tl.sum(tl.where(pick, starts, 0), axis=0)
        n = tl.sum(tl.where(pick, lens, 0), axis=0)
        if ONE_QB:
            total = _doc_rows(qk1, r_ok1, C, LISTS, CODES, W, d_start, n, offs_t, offs_c, c_ok, w0, w1, w2, w3,
                              DIM, BLOCK_DIM, BITS, NB, WORDS, LIST16, BLOCK_Q, BLOCK_D)
        else:
            total = tl.sum(tl.zeros([BLOCK_Q], dtype=tl.float32), axis=0)
            q_n = tl.where(n > 0, q_all, 0)
            for qb in range(0, q_n, BLOCK_Q):
                rows = qb + offs_q
                r_ok = rows < q_n
                qk = tl.load(Q + (q_start + rows)[:, None] * DIM + offs_c[None, :],
                             mask=r_ok[:, None] & c_ok[None, :], other=0.0)
                total += _doc_rows(qk, r_ok, C, LISTS, CODES, W, d_start, n, offs_t, offs_c, c_ok, w0, w1, w2, w3,
                                   DIM, BLOCK_DIM, BITS, NB, WORDS, LIST16, BLOCK_Q, BLOCK_D)
        totals = tl.where(pick, total, totals)
    tl.store(Out + qi * n_k + k0 + offs_g, tl.where(docs < 0, float("-inf"), totals), mask=g_ok)

def block_q(max_lq: int) -> int:
    return max(32, min(64, triton.next_power_of_2(max(1, max_lq))))
