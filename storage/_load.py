"""Load every live document into one torch buffer (GPU or pinned host), overlapping reads and copies."""

from __future__ import annotations

import numpy as np
import torch

CHUNK_TOKENS = 1 << 18  # rows per staging copy (64 MiB at dim 128, fp16)


def _sources(store):
    """(token array, scales array, row slice) pieces in storage order: whole segments stay memory-mapped."""
    snap = store._snap
    for s, r in enumerate(snap.readers):
        live = snap.live[snap.doc_start[s] : snap.doc_start[s + 1]]
        if live.all():
            yield r.tokens, r.scales, r.offsets, None, s
        elif live.any():
            part = store._gather_rows(snap.doc_start[s] + np.flatnonzero(live))
            yield part.tokens, part.scales, part.offsets, part.ids, s


def load_to_device(store, device, pin: bool):
    from mvdb.storage.store import Packed

    snap = store._snap
    device = torch.device(device) if device is not None else torch.device("cpu")
    pieces = list(_sources(store))
    n_tokens = sum(int(p[0].shape[0]) for p in pieces)
    dim = store.dim or 0
    tdtype = torch.int8 if store.dtype == "int8" else torch.float16
    on_gpu = device.type == "cuda"
    pin = pin and torch.cuda.is_available()  # page-locked memory needs a CUDA driver
    tokens = torch.empty((n_tokens, dim), dtype=tdtype, device=device, pin_memory=pin and not on_gpu)
    scales = None
    if store.dtype == "int8":
        scales = torch.empty(n_tokens, dtype=torch.float32, device=device, pin_memory=pin and not on_gpu)
    staging = [torch.empty((CHUNK_TOKENS, dim), dtype=tdtype, pin_memory=True) for _ in range(2)] if on_gpu else []
    done = [None, None]
    lens, ids = [], []
    dst, k = 0, 0
    for tok, sc, off, piece_ids, s in pieces:
        n = int(tok.shape[0])
        for t0 in range(0, n, CHUNK_TOKENS):
            t1 = min(n, t0 + CHUNK_TOKENS)
            if on_gpu:
                slot = k % 2
                if done[slot] is not None:
                    done[slot].synchronize()  # the copy that last used this staging buffer has finished
                buf = staging[slot][: t1 - t0]
                np.copyto(buf.numpy(), tok[t0:t1])  # disk / page cache -> pinned host
                tokens[dst + t0 : dst + t1].copy_(buf, non_blocking=True)
                done[slot] = torch.cuda.Event()
                done[slot].record()
                k += 1
            else:
                np.copyto(tokens[dst + t0 : dst + t1].numpy(), tok[t0:t1])
        if scales is not None:
            scales[dst : dst + n].copy_(torch.from_numpy(np.array(sc)))
        lens.append(np.diff(np.asarray(off)))
        if piece_ids is None:
            r = snap.readers[s]
            ids.extend(r.ids.tolist() if r.ids.dtype.kind != "S" else [x.decode() for x in r.ids])
        else:
            ids.extend(piece_ids)
        dst += n
    if on_gpu:
        torch.cuda.synchronize(device)
    lengths = np.concatenate(lens) if lens else np.zeros(0, np.int64)
    offsets = torch.from_numpy(np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)).to(device)
    return Packed(tokens, offsets, scales, ids)
