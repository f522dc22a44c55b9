"""The training kernels (Triton): argmax forwards that save each query token's winning document
token, and the unified / lowmem backwards that gather from it. Launched by ops.py."""

from __future__ import annotations

import triton
import triton.language as tl

EPS: tl.constexpr = tl.constexpr(1e-12)  # F.normalize's default eps


@triton.jit
def _norms(x, axis: tl.constexpr):
    """L2 norms of the rows (axis=1) or columns (axis=0) of a tile, clamped below at EPS as in
    torch's F.normalize."""
    xf = x.to(tl.float32)
    return tl.maximum(tl.sqrt(tl.sum(xf * xf, axis=axis)), EPS)


@triton.jit
def _best_in_doc(q, D, DM, d_start, d_n, offs_c, c_ok, inv_nq, Nd, write_nd,
                 DIM: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr, HAS_DMASK: tl.constexpr,
                 UPCAST: tl.constexpr, IEEE: tl.constexpr, MASK_ZERO: tl.constexpr, NORM: tl.constexpr):
    """Per query row of ``q`` [BLOCK_Q, BLOCK_DIM]: the best similarity over the document's valid
    tokens and its token index (-1 where none is valid, or where a masked token's 0 wins under
    MASK_ZERO, PyLate's multiply-by-mask). Ties go to the first token, as in torch's argmax.
    NORM: similarities of the L2-normalised tokens (``inv_nq``: the query rows' 1/norm); the
    document tokens' norms are computed from the tiles and stored to ``Nd`` where ``write_nd``.
    An argmax reduction per tile: an elementwise running (max, token) over the tiles, reduced
    once per document, is slower on the ColBERT step."""
    offs_d = tl.arange(0, BLOCK_D)
    best = tl.full([BLOCK_Q], float("-inf"), dtype=tl.float32)
    arg = tl.full([BLOCK_Q], -1, dtype=tl.int64)
    n_masked = tl.zeros([1], dtype=tl.int32)
    for db in range(0, d_n, BLOCK_D):
        cols = db + offs_d
        ok = cols < d_n
        dt = tl.load(D + (d_start + cols)[None, :] * DIM + offs_c[:, None], mask=c_ok[:, None] & ok[None, :], other=0.0)
        if UPCAST:
            dt = dt.to(tl.float32)
        if HAS_DMASK:
            dm_ok = tl.load(DM + d_start + cols, mask=ok, other=0) != 0
            if MASK_ZERO:
                n_masked += tl.sum((ok & ~dm_ok).to(tl.int32), axis=0)
            ok = ok & dm_ok
        if IEEE:  # fp32 inputs: full-precision products (TF32 would move near-ties)
            s = tl.dot(q, dt, input_precision="ieee", out_dtype=tl.float32)
        else:
            s = tl.dot(q, dt, out_dtype=tl.float32)
        if NORM:
            nd = _norms(dt, 0)
            if write_nd:
                tl.store(Nd + d_start + cols, nd, mask=cols < d_n)
            s = s * inv_nq[:, None] * (1.0 / nd)[None, :]
        s = tl.where(ok[None, :], s, float("-inf"))
        m, idx = tl.max(s, axis=1, return_indices=True, return_indices_tie_break_left=True)
        better = m > best  # strictly: the first maximal token wins
        best = tl.where(better, m, best)
        arg = tl.where(better, d_start + db + idx.to(tl.int64), arg)
    if MASK_ZERO:
        zero_wins = (tl.sum(n_masked, axis=0) > 0) & (best < 0)
        best = tl.where(zero_wins, 0.0, best)
        arg = tl.where(zero_wins, -1, arg)
    return best, arg


@triton.jit
def _fwd_argmax_kernel(
    Q, QM, q_off, D, DM, d_off, Out, Arg, Nq, Nd,
    n_k, lq_max,
    PER_QUERY: tl.constexpr, HAS_QMASK: tl.constexpr, HAS_DMASK: tl.constexpr,
    DIM: tl.constexpr, BLOCK_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr,
    UPCAST: tl.constexpr, IEEE: tl.constexpr, MASK_ZERO: tl.constexpr, NORM: tl.constexpr,
):
    qi = tl.program_id(0)
    k = tl.program_id(1)
    doc = qi * n_k + k if PER_QUERY else k
    q_start = tl.load(q_off + qi)
    q_n = tl.load(q_off + qi + 1) - q_start
    d_start = tl.load(d_off + doc)
    d_n = tl.load(d_off + doc + 1) - d_start
    offs_q = tl.arange(0, BLOCK_Q)
    offs_c = tl.arange(0, BLOCK_DIM)
    c_ok = offs_c < DIM
    total = tl.zeros([1], dtype=tl.float32)
    pair = qi.to(tl.int64) * n_k + k
    for qb in range(0, q_n, BLOCK_Q):
        rows = qb + offs_q
        r_ok = rows < q_n
        q = tl.load(Q + (q_start + rows)[:, None] * DIM + offs_c[None, :], mask=r_ok[:, None] & c_ok[None, :], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        inv_nq = tl.full([BLOCK_Q], 1.0, dtype=tl.float32)
        if NORM:  # every program of the query computes them; the first document's stores them
            nq = _norms(q, 1)
            if k == 0:
                tl.store(Nq + q_start + rows, nq, mask=r_ok)
            inv_nq = 1.0 / nq
        if HAS_QMASK:
            r_ok = r_ok & (tl.load(QM + q_start + rows, mask=r_ok, other=0) != 0)
        if PER_QUERY:  # each document has one program: it stores the norms
            write_nd = k >= 0
        else:
            write_nd = qi == 0
        best, arg = _best_in_doc(q, D, DM, d_start, d_n, offs_c, c_ok, inv_nq, Nd, write_nd, DIM,
                                 BLOCK_Q, BLOCK_D, HAS_DMASK, UPCAST, IEEE, MASK_ZERO, NORM)
        valid = r_ok & (best > float("-inf"))
        total += tl.sum(tl.where(valid, best, 0.0), axis=0)
        tl.store(Arg + pair * lq_max + rows, tl.where(valid, arg, -1).to(tl.int32), mask=rows < q_n)
    tl.store(Out + pair + tl.arange(0, 1), total)


@triton.jit
def _fwd_argmax_grouped_kernel(
    Q, QM, D, DM, d_off, Out, Arg, Nq, Nd,
    n_q, n_k, lq,
    GROUP: tl.constexpr, HAS_QMASK: tl.constexpr, HAS_DMASK: tl.constexpr,
    DIM: tl.constexpr, BLOCK_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr,
    UPCAST: tl.constexpr, IEEE: tl.constexpr, MASK_ZERO: tl.constexpr, NORM: tl.constexpr,
):
    """Cross product of short equal-length queries: GROUP queries (GROUP * lq <= BLOCK_Q rows)
    against one document per program, so each document tile is loaded once for the group."""
    g0 = tl.program_id(0) * GROUP
    k = tl.program_id(1)
    d_start = tl.load(d_off + k)
    d_n = tl.load(d_off + k + 1) - d_start
    rows = tl.arange(0, BLOCK_Q)
    qloc = rows // lq
    in_group = (qloc < GROUP) & (g0 + qloc < n_q)
    r_ok = in_group
    q_row = g0.to(tl.int64) * lq + rows
    offs_c = tl.arange(0, BLOCK_DIM)
    c_ok = offs_c < DIM
    q = tl.load(Q + q_row[:, None] * DIM + offs_c[None, :], mask=r_ok[:, None] & c_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    inv_nq = tl.full([BLOCK_Q], 1.0, dtype=tl.float32)
    if NORM:
        nq = _norms(q, 1)
        if k == 0:
            tl.store(Nq + q_row, nq, mask=in_group)
        inv_nq = 1.0 / nq
    if HAS_QMASK:
        r_ok = r_ok & (tl.load(QM + q_row, mask=r_ok, other=0) != 0)
    best, arg = _best_in_doc(q, D, DM, d_start, d_n, offs_c, c_ok, inv_nq, Nd, g0 == 0, DIM, BLOCK_Q, BLOCK_D,
                             HAS_DMASK, UPCAST, IEEE, MASK_ZERO, NORM)
    valid = r_ok & (best > float("-inf"))
    contrib = tl.where(valid, best, 0.0)
    pair = (g0 + qloc).to(tl.int64) * n_k + k
    tl.store(Arg + pair * lq + (rows - qloc * lq), tl.where(valid, arg, -1).to(tl.int32), mask=in_group)
    for g in tl.static_range(GROUP):
        tot = tl.sum(tl.where(qloc == g, contrib, 0.0), axis=0)
        if g0 + g < n_q:
            tl.store(Out + (g0 + g).to(tl.int64) * n_k + k, tot)


@triton.jit
def _project(acc, x, n):
    """The Jacobian of x / max(|x|, EPS) applied to the gradient ``acc`` of the normalised rows
    (x [R, C] as stored, n [R] the clamped norms): (acc - x̂ (x̂ . acc)) / n, and acc / n where the
    clamp is active (F.normalize's gradient there)."""
    xn = x.to(tl.float32) / n[:, None]
    proj = (acc - xn * tl.sum(xn * acc, axis=1)[:, None]) / n[:, None]
    return tl.where((n > EPS)[:, None], proj, acc / n[:, None])


@triton.jit
def _bwd_unified_kernel(
    Q, q_off, D, Arg, G, dQ, dD, Nq, Nd, n_k, lq_max,
    DIM: tl.constexpr, BLOCK_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, NORM: tl.constexpr,
):
    """fp32 atomics of g * D[argmax] into dQ and g * Q into dD[argmax]; under NORM these are the
    gradients of the normalised tokens (projected afterwards, :func:`_project_rows`)."""
    qi = tl.program_id(0)
    k = tl.program_id(1)
    pair = qi.to(tl.int64) * n_k + k
    g = tl.load(G + pair)
    q_start = tl.load(q_off + qi)
    q_n = tl.load(q_off + qi + 1) - q_start
    offs_q = tl.arange(0, BLOCK_Q)
    offs_c = tl.arange(0, BLOCK_DIM)
    c_ok = offs_c < DIM
    for qb in range(0, q_n, BLOCK_Q):
        rows = qb + offs_q
        a = tl.load(Arg + pair * lq_max + rows, mask=rows < q_n, other=-1).to(tl.int64)
        ok = a >= 0
        m2 = ok[:, None] & c_ok[None, :]
        d = tl.load(D + a[:, None] * DIM + offs_c[None, :], mask=m2, other=0.0).to(tl.float32)
        q = tl.load(Q + (q_start + rows)[:, None] * DIM + offs_c[None, :], mask=m2, other=0.0).to(tl.float32)
        if NORM:
            d = d / tl.load(Nd + a, mask=ok, other=1.0)[:, None]
            q = q / tl.load(Nq + q_start + rows, mask=ok, other=1.0)[:, None]
        tl.atomic_add(dQ + (q_start + rows)[:, None] * DIM + offs_c[None, :], g * d, mask=m2)
        tl.atomic_add(dD + a[:, None] * DIM + offs_c[None, :], g * q, mask=m2)


@triton.jit
def _bwd_lowmem_dq_kernel(
    Q, D, Arg, G, q_off, dQ, Nq, Nd, n_k, lq_max, k_per_split, split_stride,
    DIM: tl.constexpr, BLOCK_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, NORM: tl.constexpr,
):
    """dQ rows of query i, tokens [qb, qb + BLOCK_Q): sum over its pairs of g * D[argmax]; split
    ``sp`` takes pairs [sp * k_per_split, ...) and writes its own slice (summed after, in order;
    the normalisation's Jacobian is linear, so each slice applies it)."""
    qi = tl.program_id(0)
    qb = tl.program_id(1) * BLOCK_Q
    sp = tl.program_id(2)
    dQ += sp.to(tl.int64) * split_stride
    q_start = tl.load(q_off + qi)
    q_n = tl.load(q_off + qi + 1) - q_start
    if qb < q_n:
        rows = qb + tl.arange(0, BLOCK_Q)
        r_ok = rows < q_n
        offs_c = tl.arange(0, BLOCK_DIM)
        c_ok = offs_c < DIM
        acc = tl.zeros([BLOCK_Q, BLOCK_DIM], dtype=tl.float32)
        for k in range(sp * k_per_split, tl.minimum(n_k, (sp + 1) * k_per_split)):
            pair = qi.to(tl.int64) * n_k + k
            g = tl.load(G + pair)
            a = tl.load(Arg + pair * lq_max + rows, mask=r_ok, other=-1).to(tl.int64)
            ok = a >= 0
            if NORM:
                g = g / tl.load(Nd + a, mask=ok, other=1.0)[:, None]
            acc += g * tl.load(D + a[:, None] * DIM + offs_c[None, :], mask=ok[:, None] & c_ok[None, :],
                               other=0.0).to(tl.float32)
        m2 = r_ok[:, None] & c_ok[None, :]
        if NORM:
            q = tl.load(Q + (q_start + rows)[:, None] * DIM + offs_c[None, :], mask=m2, other=0.0)
            acc = _project(acc, q, tl.load(Nq + q_start + rows, mask=r_ok, other=1.0))
        tl.store(dQ + (q_start + rows)[:, None] * DIM + offs_c[None, :], acc.to(dQ.dtype.element_ty), mask=m2)


@triton.jit
def _hit_prep_kernel(order, keys, q_off, G, Nq, rows, weights, n_slots, n_k, lq_max, NORM: tl.constexpr,
                     BLOCK: tl.constexpr):
    """For each sorted hit slot (an entry ``pair * lq_max + t`` of the winners): the query-token
    row it came from and its weight g (over that token's norm under NORM), so the dD kernel's
    loop reads two arrays instead of chasing four dependent loads. Slots without a winner (masked
    query tokens, key -1) get row -1: the dD kernel never reads them (padding may hold anything)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n_slots
    e = tl.load(order + i, mask=ok, other=0)
    pair = e // lq_max
    row = tl.load(q_off + pair // n_k, mask=ok, other=0) + (e - pair * lq_max)
    g = tl.load(G + pair, mask=ok, other=0.0)
    if NORM:
        g = g / tl.load(Nq + row, mask=ok, other=1.0)
    row = tl.where(tl.load(keys + i, mask=ok, other=-1) >= 0, row, -1)
    tl.store(rows + i, row.to(tl.int32), mask=ok)
    tl.store(weights + i, g, mask=ok)


@triton.jit
def _bwd_lowmem_dd_kernel(
    Q, keys, bounds, rows, weights, D, dD, Nd, n_rows, n_slots,
    SPARSE: tl.constexpr, NORM: tl.constexpr, DIM: tl.constexpr, BLOCK_DIM: tl.constexpr,
    BLOCK_J: tl.constexpr, BLOCK_H: tl.constexpr, LIGHT: tl.constexpr,
):
    """dD rows: each sums g * Q[row] over the hits that picked it, in sorted order (``rows`` /
    ``weights`` per sorted slot; fp32, a fixed order: reproducible). Dense: a program owns rows
    [jb, jb + BLOCK_J) and writes them all; row j's hits are slots [bounds[j], bounds[j+1]).
    SPARSE (fewer hits than rows, dD zero-filled before): a program takes sorted slots
    [jb, jb + BLOCK_J) and owns the rows whose hits start there (bounds[slot]: where they end).
    Rows with at most LIGHT hits advance together one hit per step; a row with more (a token many
    queries pick) is summed on its own, BLOCK_H hits at a time."""
    jb = tl.program_id(0) * BLOCK_J
    offs_j = tl.arange(0, BLOCK_J)
    offs_c = tl.arange(0, BLOCK_DIM)
    c_ok = offs_c < DIM
    if SPARSE:
        slot = jb + offs_j
        in_n = slot < n_slots
        key = tl.load(keys + slot, mask=in_n, other=-1)
        prev = tl.load(keys + slot - 1, mask=in_n & (slot > 0), other=-1)
        j_ok = (key >= 0) & (key != prev)
        js = tl.where(j_ok, key, 0).to(tl.int64)
        s = slot.to(tl.int64)
        cnt = tl.where(j_ok, tl.load(bounds + slot, mask=j_ok, other=0) - s, 0)
    else:
        js = (jb + offs_j).to(tl.int64)
        j_ok = js < n_rows
        s = tl.load(bounds + js, mask=j_ok, other=0)
        cnt = tl.load(bounds + js + 1, mask=j_ok, other=0) - s
    light = cnt <= LIGHT
    acc = tl.zeros([BLOCK_J, BLOCK_DIM], dtype=tl.float32)
    for h in range(0, tl.max(tl.where(light, cnt, 0), axis=0)):
        # lanes without a hit read slot 0 (there is one whenever a row has a hit) and weigh it by
        # g = 0; nothing else is masked (masks shared between 1-D and 2-D uses here trip Triton
        # 3.6's layout pass)
        idx = tl.where(light & (h < cnt), s + h, 0)
        row = tl.load(rows + idx)
        g = tl.where(light & (h < cnt), tl.load(weights + idx), 0.0)
        acc += g[:, None] * tl.load(Q + tl.maximum(row, 0)[:, None] * DIM + offs_c[None, :],
                                    mask=(row >= 0)[:, None] & c_ok[None, :], other=0.0).to(tl.float32)
    m2 = (j_ok & light)[:, None] & c_ok[None, :]
    if NORM:
        d = tl.load(D + js[:, None] * DIM + offs_c[None, :], mask=m2, other=0.0)
        acc = _project(acc, d, tl.load(Nd + js, mask=j_ok, other=1.0))
    tl.store(dD + js[:, None] * DIM + offs_c[None, :], acc.to(dD.dtype.element_ty), mask=m2)
    if tl.sum((j_ok & ~light).to(tl.int32), axis=0) > 0:  # rows with many hits, one at a time
        offs_h = tl.arange(0, BLOCK_H)
        for r in range(0, BLOCK_J):
            pick = (offs_j == r) & j_ok & ~light
            c_r = tl.sum(tl.where(pick, cnt, 0), axis=0)
            if c_r > 0:
                s_r = tl.sum(tl.where(pick, s, 0), axis=0)
                j_r = tl.sum(tl.where(pick, js, 0), axis=0)
                racc = tl.zeros([BLOCK_H, BLOCK_DIM], dtype=tl.float32)
                for h0 in range(0, c_r, BLOCK_H):
                    idx = tl.where(h0 + offs_h < c_r, s_r + h0 + offs_h, 0)
                    row = tl.load(rows + idx)
                    g = tl.where(h0 + offs_h < c_r, tl.load(weights + idx), 0.0)
                    racc += g[:, None] * tl.load(Q + tl.maximum(row, 0)[:, None] * DIM + offs_c[None, :],
                                                 mask=(row >= 0)[:, None] & c_ok[None, :], other=0.0).to(tl.float32)
                acc_r = tl.sum(racc, axis=0)
                if NORM:
                    x = tl.load(D + j_r * DIM + offs_c, mask=c_ok, other=0.0).to(tl.float32)
                    n = tl.load(Nd + j_r)
                    xn = x / n
                    if n > EPS:
                        acc_r = (acc_r - xn * tl.sum(xn * acc_r, axis=0)) / n
                    else:
                        acc_r = acc_r / n
                tl.store(dD + j_r * DIM + offs_c, acc_r.to(dD.dtype.element_ty), mask=c_ok)


@triton.jit
def _bwd_perdoc_dd_kernel(
    Q, q_off, D, Arg, G, dD, Nq, Nd, n_k, lq_max, ld,
    NORM: tl.constexpr, DIM: tl.constexpr, BLOCK_DIM: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_J: tl.constexpr,
):
    """dD of per-query documents (document = pair, ``ld`` rows each), one program per document:
    its pair's winners are the only hits of its rows, so no sort is needed. Rows no winner picked
    are written 0; a picked row gets the sum of g * Q[t] over the winners t that picked it, in
    the order of t (fp32 products of a 0/1 matrix: a fixed order, reproducible), written once by
    its first winner."""
    pair = tl.program_id(0).to(tl.int64)
    g = tl.load(G + pair)
    q_start = tl.load(q_off + pair // n_k)
    row0 = pair * ld
    offs_t = tl.arange(0, BLOCK_T)
    a = tl.load(Arg + pair * lq_max + offs_t, mask=offs_t < lq_max, other=-1).to(tl.int64)
    hit = a >= 0
    offs_c = tl.arange(0, BLOCK_DIM)
    c_ok = offs_c < DIM
    offs_j = tl.arange(0, BLOCK_J)
    zeros = tl.zeros([BLOCK_J, BLOCK_DIM], dtype=dD.dtype.element_ty)
    # only the rows nobody picked are zeroed (zeroing every row, then overwriting the picked ones
    # after a CTA barrier, is no faster)
    for jb in range(0, ld, BLOCK_J):
        j = row0 + jb + offs_j
        keep = (jb + offs_j < ld) & ~(tl.max((j[:, None] == a[None, :]).to(tl.int32), axis=1) > 0)
        tl.store(dD + j[:, None] * DIM + offs_c[None, :], zeros, mask=keep[:, None] & c_ok[None, :])
    w = tl.where(hit, g, 0.0)
    if NORM:
        w = w / tl.load(Nq + q_start + offs_t, mask=hit, other=1.0)
    m2 = hit[:, None] & c_ok[None, :]
    qt = tl.load(Q + (q_start + offs_t)[:, None] * DIM + offs_c[None, :], mask=m2, other=0.0).to(tl.float32)
    same = (a[:, None] == a[None, :]) & hit[None, :]  # [t, t']: t' picked t's row
    acc = tl.dot(same.to(tl.float32), qt * w[:, None], input_precision="ieee")
    earlier = tl.max((same & (offs_t[None, :] < offs_t[:, None])).to(tl.int32), axis=1) > 0
    first = hit & ~earlier
    if NORM:
        x = tl.load(D + a[:, None] * DIM + offs_c[None, :], mask=m2, other=0.0)
        acc = _project(acc, x, tl.load(Nd + a, mask=hit, other=1.0))
    tl.store(dD + a[:, None] * DIM + offs_c[None, :], acc.to(dD.dtype.element_ty), mask=first[:, None] & c_ok[None, :])


@triton.jit
def _bwd_cross_dd_kernel(
    Q, Arg, G, dD, n_q, n_k, lq, ld,
    DIM: tl.constexpr, BLOCK_DIM: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_J: tl.constexpr, IEEE: tl.constexpr,
):
    """dD of a padded cross product (every query against documents of ``ld`` rows), rows
    [jb, jb + BLOCK_J) of document k per program, with no sort: for each query i in order, the
    0/1 matrix of which of its tokens picked which row times its token block (a tensor-core
    product, exact: one term per pick, fp32 sums), scaled by g[i, k] into an fp32 accumulator.
    A fixed order: reproducible. Every query row is read, winner or not (a load that waits on the
    winners' load is much slower), so rows a query mask hides
    must hold finite values (0 x NaN would reach dD through the product): the launcher passes a
    copy with those rows zeroed."""
    k = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)
    tok = k * ld + rows
    offs_t = tl.arange(0, BLOCK_T)
    t_ok = offs_t < lq
    offs_c = tl.arange(0, BLOCK_DIM)
    c_ok = offs_c < DIM
    acc = tl.zeros([BLOCK_J, BLOCK_DIM], dtype=tl.float32)
    # pointers advanced one query per step (64-bit pointer arithmetic: no int32 index overflow)
    a_ptr = Arg + k * lq + offs_t
    g_ptr = G + k
    q_ptr = Q + offs_t[:, None] * DIM + offs_c[None, :]
    for i in range(0, n_q):
        a = tl.load(a_ptr, mask=t_ok, other=-1)
        g = tl.load(g_ptr)
        q = tl.load(q_ptr, mask=t_ok[:, None] & c_ok[None, :], other=0.0)
        a_ptr += n_k * lq
        g_ptr += n_k
        q_ptr += lq * DIM
        hit = tok[:, None] == a[None, :]
        if IEEE:  # fp32 inputs (and the CPU interpreter): full-precision products
            acc += g * tl.dot(hit.to(tl.float32), q.to(tl.float32), input_precision="ieee")
        else:
            acc += g * tl.dot(hit.to(q.dtype), q, out_dtype=tl.float32)
    m2 = (rows < ld)[:, None] & c_ok[None, :]
    tl.store(dD + tok[:, None] * DIM + offs_c[None, :], acc.to(dD.dtype.element_ty), mask=m2)


@triton.jit
def _now_ns():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _hold_kernel(ns):
    """Keeps the GPU's stream busy for ``ns`` nanoseconds (its global timer), so work queued
    behind it starts back to back (policy._gpu_ms: timing a backward without the host's launches)."""
    t0 = _now_ns()
    t = t0
    while t - t0 < ns:
        t = _now_ns()
