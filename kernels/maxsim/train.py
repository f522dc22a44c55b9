"""Differentiable MaxSim: a forward that saves the winning document token per (pair, query
token) as int32, and backwards that gather from it, so neither pass materialises the
query-token x doc-token similarity tensor.

Every layout is described by offsets: query i's tokens are ``q_off[i]:q_off[i+1]`` of a packed
[Tq, d] tensor; document ``doc`` is ``d_off[doc]:d_off[doc+1]`` of a packed [Td, d] tensor; pair
(i, k) scores query i against document k (cross product, every query against every document) or
against document i * K + k (per-query candidates). Padded batches are packed views with
``Lq`` / ``Ld`` tokens each and optional masks over the same token positions.

Backwards (``backward=``):
- ``"unified"``: one program per pair adds g * D[argmax] to dQ and g * Q to dD[argmax] with fp32
  atomics; fast, not bitwise reproducible, gradients accumulated in fp32.
- ``"lowmem"``: every gradient row is owned by one program (dQ rows by query, dD rows by
  document, a one-hot matmul over the queries that picked them): no atomics, gradients written
  in the input dtype, bitwise identical run to run.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mvdb.kernels.maxsim.fused import interpreting

BACKWARDS = ("auto", "unified", "lowmem")
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
    document tokens' norms are computed from the tiles and stored to ``Nd`` where ``write_nd``."""
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
def _hit_prep_kernel(order, q_off, G, Nq, rows, weights, n_slots, n_k, lq_max, NORM: tl.constexpr,
                     BLOCK: tl.constexpr):
    """For each sorted hit slot (an entry ``pair * lq_max + t`` of the winners): the query-token
    row it came from and its weight g (over that token's norm under NORM), so the dD kernel's
    loop reads two arrays instead of chasing four dependent loads."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n_slots
    e = tl.load(order + i, mask=ok, other=0)
    pair = e // lq_max
    row = tl.load(q_off + pair // n_k, mask=ok, other=0) + (e - pair * lq_max)
    g = tl.load(G + pair, mask=ok, other=0.0)
    if NORM:
        g = g / tl.load(Nq + row, mask=ok, other=1.0)
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
        acc += g[:, None] * tl.load(Q + row[:, None] * DIM + offs_c[None, :], mask=c_ok[None, :],
                                    other=0.0).to(tl.float32)
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
                    racc += g[:, None] * tl.load(Q + row[:, None] * DIM + offs_c[None, :], mask=c_ok[None, :],
                                                 other=0.0).to(tl.float32)
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


def forward(q, q_off, d, d_off, n_q, n_k, lq_max, per_query, q_mask=None, d_mask=None, mask_zero=False,
            equal_lengths=False, normalize=False):
    """Scores [n_q, n_k] float32, the winners Arg [n_q, n_k, lq_max] int32 (token index into the
    packed d, -1 for masked query tokens and when no document token is valid) and, with
    ``normalize``, the clamped L2 norms of q's and d's rows (float32; else None)."""
    bdim, bq, bd = _blocks(q.shape[1], lq_max)
    out = torch.empty(n_q, n_k, dtype=torch.float32, device=q.device)
    arg = torch.full((n_q, n_k, max(1, lq_max)), -1, dtype=torch.int32, device=q.device)
    # norms from the tiles, inside the kernels (reading them from a pass before measured slower on
    # the H100: ColPali in-batch fwd+bwd 10.8 vs 6.6 ms)
    nq = torch.ones(q.shape[0], dtype=torch.float32, device=q.device) if normalize else None
    nd = torch.ones(d.shape[0], dtype=torch.float32, device=q.device) if normalize else None
    upcast = interpreting() or q.dtype == torch.float32
    group = grouped_queries(lq_max, per_query, equal_lengths, n_q)
    common = dict(HAS_QMASK=q_mask is not None, HAS_DMASK=d_mask is not None, DIM=q.shape[1], BLOCK_DIM=bdim,
                  BLOCK_D=bd, UPCAST=upcast, IEEE=q.dtype == torch.float32, MASK_ZERO=mask_zero, NORM=normalize)
    # measured (benchmarks/training_sweep.py, H100): 2 stages for the grouped short-query kernel
    stages = TUNE.get("fwd_stages", 2 if group > 1 else 3)
    qm = q_mask if q_mask is not None else q
    dm = d_mask if d_mask is not None else d
    if n_q and n_k and group > 1:
        rows = triton.next_power_of_2(group * lq_max)
        _fwd_argmax_grouped_kernel[(triton.cdiv(n_q, group), n_k)](
            q, qm, d, dm, d_off, out, arg, nq if normalize else out, nd if normalize else out, n_q, n_k, lq_max,
            GROUP=group, BLOCK_Q=rows, num_warps=TUNE.get("fwd_warps", 8 if rows >= 128 else 4), num_stages=stages,
            **common,
        )
    elif n_q and n_k:
        _fwd_argmax_kernel[(n_q, n_k)](
            q, qm, q_off, d, dm, d_off, out, arg, nq if normalize else out, nd if normalize else out, n_k,
            arg.shape[2], PER_QUERY=per_query, BLOCK_Q=bq, num_warps=TUNE.get("fwd_warps", 8 if bq >= 128 else 4),
            num_stages=stages, **common,
        )
    return out, arg, nq, nd


def _project_rows(grad_n: torch.Tensor, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """torch form of the kernels' ``_project``: from gradients of normalised rows to gradients of x."""
    xn = x.float() / n[:, None]
    proj = (grad_n - xn * (xn * grad_n).sum(1, keepdim=True)) / n[:, None]
    return torch.where((n > EPS.value)[:, None], proj, grad_n / n[:, None])


def backward(kind, grad, q, q_off, d, arg, n_q, n_k, need_dq=True, need_dd=True, norms=None, covered=False):
    """(dQ, dD) for packed q [Tq, dim] and d [Td, dim], as the inputs' dtypes. ``norms``: (nq, nd)
    from a normalising forward. ``covered``: q_off tiles q exactly (every row belongs to one
    query), so dQ needs no zero fill. dD needs no document offsets: the winners are token indices."""
    bdim, bq, _ = _blocks(q.shape[1])
    g = grad.float().contiguous()
    lq_max = arg.shape[2]
    norm = norms is not None
    nq, nd = norms if norm else (q, d)
    dev = q.device
    if kind == "unified":
        dq = torch.zeros(q.shape, dtype=torch.float32, device=dev)
        dd = torch.zeros(d.shape, dtype=torch.float32, device=dev)
        if n_q and n_k:
            _bwd_unified_kernel[(n_q, n_k)](q, q_off, d, arg, g, dq, dd, nq, nd, n_k, lq_max, DIM=q.shape[1],
                                            BLOCK_DIM=bdim, BLOCK_Q=bq, NORM=norm, num_warps=4)
        if norm:
            dq, dd = _project_rows(dq, q, nq), _project_rows(dd, d, nd)
        return dq.to(q.dtype) if need_dq else None, dd.to(d.dtype) if need_dd else None
    dq = dd = None
    work = n_q and n_k
    if need_dq:
        # few queries: split each query's pairs over programs, fp32 slices summed in a fixed order
        splits = TUNE.get("dq_splits") or _splits(n_q * triton.cdiv(lq_max, bq), n_k, q.numel() * 4,
                                                 min_steps=TUNE.get("dq_min_steps", 32))
        fill = torch.empty if covered and work else torch.zeros
        dq = fill(q.shape, dtype=q.dtype, device=dev) if splits == 1 else \
            fill((splits, *q.shape), dtype=torch.float32, device=dev)
        if work:
            _bwd_lowmem_dq_kernel[(n_q, triton.cdiv(lq_max, bq), splits)](
                q, d, arg, g, q_off, dq, nq, nd, n_k, lq_max, triton.cdiv(n_k, splits), q.numel(), DIM=q.shape[1],
                BLOCK_DIM=bdim, BLOCK_Q=bq, NORM=norm, num_warps=TUNE.get("dq_warps", 2))
        if splits > 1:
            dq = dq.sum(0).to(q.dtype)
    if need_dd:
        # the hits sorted by the document token they picked (stable: a fixed summation order)
        keys, order = torch.sort(arg.view(-1), stable=True)
        n_slots = keys.numel()
        rows = torch.empty(n_slots, dtype=torch.int32, device=dev)
        weights = torch.empty(n_slots, dtype=torch.float32, device=dev)
        _hit_prep_kernel[(triton.cdiv(n_slots, 1024),)](order, q_off, g, nq, rows, weights, n_slots, n_k, lq_max,
                                                         NORM=norm, BLOCK=1024)
        # fewer hits than document tokens (per-query negatives): zero-fill, then write the rows hit
        sparse = n_slots < d.shape[0] // 2
        if sparse:  # per slot: where its token's hits end
            bounds = torch.searchsorted(keys, keys, right=True)
        else:  # per token: where its hits start
            bounds = torch.searchsorted(keys, torch.arange(d.shape[0] + 1, device=dev, dtype=keys.dtype))
        dd = torch.zeros_like(d) if sparse else torch.empty_like(d)
        if d.shape[0]:
            bj = 16 if interpreting() else TUNE.get("dd_bj", 128 if sparse else 32)  # measured, H100
            _bwd_lowmem_dd_kernel[(triton.cdiv(n_slots if sparse else d.shape[0], bj),)](
                q, keys, bounds, rows, weights, d, dd, nd, d.shape[0], n_slots, SPARSE=sparse,
                NORM=norm, DIM=q.shape[1], BLOCK_DIM=bdim, BLOCK_J=bj,
                BLOCK_H=16 if interpreting() else TUNE.get("dd_bh", 128),
                LIGHT=4 if interpreting() else TUNE.get("dd_light", 256), num_warps=TUNE.get("dd_warps", 4),
            )
    return dq, dd


class _MaxSimFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, d, q_off, d_off, n_q, n_k, lq_max, per_query, q_mask, d_mask, kind, mask_zero=False,
                equal_lengths=False, normalize=False):
        out, arg, nq, nd = forward(q, q_off, d, d_off, n_q, n_k, lq_max, per_query, q_mask, d_mask, mask_zero,
                                   equal_lengths, normalize)
        if normalize:
            ctx.save_for_backward(q, d, q_off, arg, nq, nd)
        else:
            ctx.save_for_backward(q, d, q_off, arg)
        # padded layouts (equal_lengths) tile q exactly
        ctx.meta = (n_q, n_k, kind, equal_lengths)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, d, q_off, arg, *norms = ctx.saved_tensors
        n_q, n_k, kind, covered = ctx.meta
        dq, dd = backward(kind, grad, q, q_off, d, arg, n_q, n_k, ctx.needs_input_grad[0], ctx.needs_input_grad[1],
                          tuple(norms) if norms else None, covered)
        return dq, dd, None, None, None, None, None, None, None, None, None, None, None, None


def choose_backward(kind: str, n_hits: int, doc_elems: int) -> str:
    """``auto``: lowmem for big problems, unified for small ones. Measured on the H100
    (benchmarks/results/training-sweep-H100.json, bf16 fwd+bwd over 19 shapes): lowmem's sort and
    extra launches cost more than unified's atomics below about 2^20 winners (pairs x query
    tokens) unless the documents are large, where unified's fp32 dD buffer is the cost (per-query
    negatives B=256 x 16 x 1030 tokens: lowmem 1.31 ms vs 2.31). The rule picks the faster one on
    18 of the 19 shapes (the miss: 0.98 vs 0.89 ms). Ask for ``lowmem`` for reproducible
    gradients."""
    if kind != "auto":
        return kind
    return "lowmem" if n_hits >= 1 << 20 or doc_elems >= 1 << 28 else "unified"


def _flat_mask(mask):
    return None if mask is None else mask.reshape(-1).to(torch.uint8).contiguous()


def padded(Q, D, q_mask, d_mask, kind: str, mask_zero: bool = False, normalize: bool = False) -> torch.Tensor:
    """Differentiable MaxSim of padded Q [Nq, Lq, d] against D [Nd, Ld, d] or [Nq, K, Ld, d].
    ``mask_zero``: a masked document token counts as similarity 0 (PyLate's semantics) instead of
    being left out. ``normalize``: of the L2-normalised tokens, inside the kernels."""
    nq, lq, dim = Q.shape
    per_query = D.dim() == 4
    n_k, ld = D.shape[-3], D.shape[-2]
    n_docs = D.shape[0] * (D.shape[1] if per_query else 1)
    dev = Q.device
    q_off = torch.arange(nq + 1, device=dev, dtype=torch.int64) * lq
    d_off = torch.arange(n_docs + 1, device=dev, dtype=torch.int64) * ld
    kind = choose_backward(kind, nq * n_k * lq, D.numel())
    return _MaxSimFn.apply(Q.reshape(-1, dim).contiguous(), D.reshape(-1, dim).contiguous(), q_off, d_off, nq, n_k,
                           lq, per_query, _flat_mask(q_mask), _flat_mask(d_mask), kind, mask_zero, True, normalize)


def varlen(q, cu_q, d, cu_d, max_seqlen_q: int, kind: str, normalize: bool = False) -> torch.Tensor:
    """Differentiable MaxSim of packed queries against packed documents (cross product)."""
    nq, nd = cu_q.numel() - 1, cu_d.numel() - 1
    kind = choose_backward(kind, nq * nd * max_seqlen_q, d.numel())
    return _MaxSimFn.apply(q.contiguous(), d.contiguous(), cu_q.long(), cu_d.long(), nq, nd, max_seqlen_q, False,
                           None, None, kind, False, False, normalize)
