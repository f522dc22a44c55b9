"""Load every live document into one torch buffer (GPU or pinned host), overlapping reads and copies."""

from __future__ import annotations

import numpy as np
import torch

CHUNK_TOKENS = 1 << 18  # rows per staging copy (64 MiB at dim 128, fp16)


class _Whole:
    """A whole segment as a source: rows are read with pread (no page faults on a memory map)."""

    def __init__(self, reader):
        self.r, self.shape = reader, reader.tokens.shape

    def read(self, name: str, out: np.ndarray, t0: int, t1: int) -> None:
        one = np.ones(1, np.int64)
        self.r.read_runs(name, out, one * t0, one * 0, one * (t1 - t0))


class _Gathered:
    """Live documents of a segment with deletions, gathered into memory first."""

    def __init__(self, part):
        self.p, self.shape = part, part.tokens.shape

    def read(self, name: str, out: np.ndarray, t0: int, t1: int) -> None:
        out[: t1 - t0] = (self.p.tokens if name == "tokens" else self.p.scales)[t0:t1]


def _sources(store, include_deleted: bool, from_segment: int):
    """(source, offsets, ids or None, segment) in storage order."""
    snap = store._snap
    for s, r in enumerate(snap.readers):
        if s < from_segment:
            continue
        live = snap.live[snap.doc_start[s] : snap.doc_start[s + 1]]
        if include_deleted or live.all():
            yield _Whole(r), r.offsets, None, s
        elif live.any():
            part = store._gather_rows(snap.doc_start[s] + np.flatnonzero(live))
            yield _Gathered(part), part.offsets, part.ids, s


def load_to_device(store, device, pin: bool, include_deleted: bool = False, from_segment: int = 0):
    from mvdb.storage.store import Packed

    snap = store._snap
    device = torch.device(device) if device is not None else torch.device("cpu")
    pieces = list(_sources(store, include_deleted, from_segment))
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
    for src, off, piece_ids, s in pieces:
        n = int(src.shape[0])
        for t0 in range(0, n, CHUNK_TOKENS):
            t1 = min(n, t0 + CHUNK_TOKENS)
            if on_gpu:
                slot = k % 2
                if done[slot] is not None:
                    done[slot].synchronize()  # the copy that last used this staging buffer has finished
                buf = staging[slot][: t1 - t0]
                src.read("tokens", buf.numpy(), t0, t1)  # disk / page cache -> pinned host
                tokens[dst + t0 : dst + t1].copy_(buf, non_blocking=True)
                done[slot] = torch.cuda.Event()
                done[slot].record()
                k += 1
            else:
                src.read("tokens", tokens[dst + t0 : dst + t1].numpy(), t0, t1)
        if scales is not None:
            host = np.empty(n, np.float32)
            src.read("scales", host, 0, n)
            scales[dst : dst + n].copy_(torch.from_numpy(host))
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
