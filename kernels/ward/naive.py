"""Torch Ward merges: one merge of every set a step (the reference and the CPU path)."""

from __future__ import annotations

import torch


def ward_update(da, dc, dac, na, nc, nk):
    """SciPy's Ward distance of cluster k to the union of a and c, in its order of operations
    (``_hierarchy_distance_update``): the distances da = d(k, a), dc = d(k, c), dac = d(a, c)."""
    t = 1.0 / (na + nc + nk)
    return torch.sqrt(((nk + na) * t * da * da + (nk + nc) * t * dc * dc - nk * t * dac * dac).clamp_(min=0))


def merge_torch(dist: torch.Tensor, near: torch.Tensor, near_at: torch.Tensor, n: torch.Tensor,
                k: torch.Tensor) -> torch.Tensor:
    """See :func:`mvdb.kernels.ward.merge`; ``dist`` is changed in place."""
    b, size_n = dist.shape[0], dist.shape[1]
    device = dist.device
    pos = torch.arange(size_n, device=device)
    rows = torch.arange(b, device=device)
    inf = torch.tensor(float("inf"), dtype=dist.dtype, device=device)
    size = (pos[None, :] < n[:, None]).to(dist.dtype)
    rep = pos.expand(b, size_n).clone()
    near, near_at = near.clone(), near_at.long().clone()
    merges = (n - k).clamp(min=0)
    flat = dist.view(b * size_n, size_n)
    for step in range(int(merges.max()) if b else 0):
        live = merges > step
        m, i = near.min(-1)
        j = near_at[rows, i]
        a, c = torch.minimum(i, j), torch.maximum(i, j)  # c joins a
        na, nc = size[rows, a][:, None], size[rows, c][:, None]
        da, dc = dist[rows, a], dist[rows, c]
        new = ward_update(da, dc, m[:, None], na, nc, size)
        new = torch.where(torch.isinf(da) | torch.isinf(dc), inf, new)  # merged-away or padding, a and c
        lb, a_l, c_l, new_l = rows[live], a[live], c[live], new[live]
        dist[lb, a_l, :] = new_l
        dist[lb, :, a_l] = new_l
        dist[lb, c_l, :] = inf
        dist[lb, :, c_l] = inf
        size[lb, a_l] += size[lb, c_l]
        size[lb, c_l] = 0
        rep = torch.where(live[:, None] & (rep == c[:, None]), a[:, None].expand(b, size_n), rep)
        # the nearest of every other row: a row whose nearest was a or c looks again; the others
        # compare their old nearest with their new distance to a
        stale = live[:, None] & ((near_at == a[:, None]) | (near_at == c[:, None]))
        closer = live[:, None] & (new < near)
        near = torch.where(closer, new, near)
        near_at = torch.where(closer, a[:, None].expand(b, size_n), near_at)
        stale[lb, a_l] = True
        stale[lb, c_l] = False
        idx = stale.flatten().nonzero().flatten()
        if idx.numel():
            v, at = flat[idx].min(-1)
            near.view(-1)[idx], near_at.view(-1)[idx] = v, at
        near[lb, c_l] = inf
    return rep
