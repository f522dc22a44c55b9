"""credit_lists in pure torch: a [tokens, rows] scatter-amax scratch summed per query (CPU, and the
reference the Triton kernel is tested against)."""

from __future__ import annotations

import numpy as np
import torch


def _credit_lists_torch(list_offsets, list_rows, n_rows, probes, gains, cu):
    dev = probes.device
    nq = cu.numel() - 1
    cu_l = cu.long().tolist()
    t0, t1 = cu_l[0], cu_l[-1]
    entries = _entries_host if dev.type == "cpu" else _entries_torch
    key, val = entries(list_offsets, list_rows, n_rows, probes[t0:t1], gains[t0:t1])
    best = torch.zeros((t1 - t0) * n_rows, dtype=torch.float32, device=dev)
    best.scatter_reduce_(0, key, val, "amax")
    best = best.view(t1 - t0, n_rows)
    out = torch.empty(nq, n_rows, dtype=torch.float32, device=dev)
    for i in range(nq):  # a query's tokens are consecutive rows of the scratch
        torch.sum(best[cu_l[i] - t0 : cu_l[i + 1] - t0], dim=0, out=out[i])
    return out


def _entries_torch(list_offsets, list_rows, n_rows, probes, gains):
    """(flat scratch index token * n_rows + row, gain) of every row of every probed list, built
    with tensor ops (any device)."""
    dev, p = probes.device, probes.shape[1]
    starts = list_offsets[probes.long()]
    lens = (list_offsets[probes.long() + 1] - starts).flatten()
    ent = torch.repeat_interleave(torch.arange(lens.numel(), device=dev), lens)  # entry -> (token, probe)
    pos = torch.arange(ent.numel(), device=dev) - (lens.cumsum(0) - lens)[ent]
    rows = list_rows[starts.flatten()[ent] + pos].long()
    return (ent // p) * n_rows + rows, gains.float().flatten()[ent]


def _entries_host(list_offsets, list_rows, n_rows, probes, gains):
    """:func:`_entries_torch` on the host, without the entries of a gain of 0 (which credit
    nothing): the lists' rows taken as slices of one array, several times faster on a CPU."""
    p = probes.shape[1]
    g = gains.float().numpy().ravel()
    keep = np.flatnonzero(g > 0)
    if not keep.size:
        return torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.float32)
    lists = probes.numpy().ravel()[keep].astype(np.int64)
    offsets, rows = list_offsets.numpy(), list_rows.numpy()
    s, e = offsets[lists], offsets[lists + 1]
    lens = e - s
    key = np.concatenate([rows[a:b] for a, b in zip(s.tolist(), e.tolist())]).astype(np.int64)
    key += np.repeat((keep // p) * n_rows, lens)
    return torch.from_numpy(key), torch.from_numpy(np.repeat(g[keep], lens))
