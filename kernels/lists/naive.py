"""credit_lists in pure torch: a [tokens, rows] scatter-amax scratch summed per query (CPU, and the
reference the Triton kernel is tested against)."""

from __future__ import annotations

import torch


def _credit_lists_torch(list_offsets, list_rows, n_rows, probes, gains, cu):
    dev = probes.device
    nq, p = cu.numel() - 1, probes.shape[1]
    cu_l = cu.long().tolist()
    t0, t1 = cu_l[0], cu_l[-1]
    starts = list_offsets[probes[t0:t1].long()]
    lens = (list_offsets[probes[t0:t1].long() + 1] - starts).flatten()
    ent = torch.repeat_interleave(torch.arange(lens.numel(), device=dev), lens)  # entry -> (token, probe)
    pos = torch.arange(ent.numel(), device=dev) - (lens.cumsum(0) - lens)[ent]
    rows = list_rows[starts.flatten()[ent] + pos].long()
    best = torch.zeros((t1 - t0) * n_rows, dtype=torch.float32, device=dev)
    best.scatter_reduce_(0, (ent // p) * n_rows + rows, gains[t0:t1].float().flatten()[ent], "amax")
    qid = torch.repeat_interleave(torch.arange(nq, device=dev), torch.tensor([cu_l[i + 1] - cu_l[i] for i in range(nq)], device=dev, dtype=torch.long))
    return torch.zeros(nq, n_rows, dtype=torch.float32, device=dev).index_add_(0, qid, best.view(t1 - t0, n_rows))
