"""Load every live document into one torch buffer (GPU or pinned host), overlapping reads and copies."""

from __future__ import annotations

import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from mvdb.kernels.errors import CorruptionError
from mvdb.storage.packed import Packed

_CRC = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mvdb-crc")  # one in-order stream of chunks


class _Checksum:
    """The CRC-32 of a whole dataset, fed chunk by chunk in order on a helper thread (zlib releases
    the GIL), so it overlaps the next read; compared with the one written when the dataset ends."""

    def __init__(self, reader, name: str):
        self.reader, self.name, self.value, self.jobs = reader, name, 0, []

    def feed(self, chunk: np.ndarray):
        def step(view=memoryview(np.ascontiguousarray(chunk)).cast("B")):
            self.value = zlib.crc32(view, self.value)

        job = _CRC.submit(step)
        self.jobs.append(job)
        return job

    def finish(self) -> None:
        for j in self.jobs:
            j.result()
        want = self.reader.crcs.get(self.name)
        if want is not None and want != self.value:
            raise CorruptionError(f"{self.reader.path}: dataset {self.name} checksum mismatch while loading "
                                  f"(damaged segment; `mvdb verify` lists every problem)")

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


def _sources(store, snap, include_deleted: bool, from_segment: int):
    """(source, offsets, ids or None, segment) in storage order."""
    for s, r in enumerate(snap.readers):
        if s < from_segment:
            continue
        live = snap.live[snap.doc_start[s] : snap.doc_start[s + 1]]
        if include_deleted or live.all():
            yield _Whole(r), r.offsets, None, s
        elif live.any():
            part = store._gather_rows(snap.doc_start[s] + np.flatnonzero(live))
            yield _Gathered(part), part.offsets, part.ids, s


class _Pieces:
    """Destination rows spread over consecutive buffers (pieces of pages): row r of the load goes
    to the piece holding it."""

    def __init__(self, pieces: list[tuple[torch.Tensor, torch.Tensor | None]]):
        self.pieces = pieces
        self.starts = np.cumsum([0] + [int(t.shape[0]) for t, _ in pieces]).tolist()

    def spans(self, r0: int, r1: int):
        """(piece index, rows in the piece, rows of [r0, r1)) covering [r0, r1)."""
        for i, (a, b) in enumerate(zip(self.starts[:-1], self.starts[1:])):
            lo, hi = max(a, r0), min(b, r1)
            if lo < hi:
                yield i, slice(lo - a, hi - a), slice(lo - r0, hi - r0)

    def copy_tokens(self, r0: int, src: torch.Tensor, non_blocking: bool) -> None:
        for i, dst, part in self.spans(r0, r0 + src.shape[0]):
            self.pieces[i][0][dst].copy_(src[part], non_blocking=non_blocking)

    def copy_scales(self, r0: int, src: torch.Tensor) -> None:
        for i, dst, part in self.spans(r0, r0 + src.shape[0]):
            self.pieces[i][1][dst].copy_(src[part])


def load_to_device(store, device, pin: bool, include_deleted: bool = False, from_segment: int = 0, *,
                   snap=None, out: list | None = None):
    """Every (live, or with ``include_deleted`` every) document of the snapshot from
    ``from_segment`` on, as one buffer on ``device`` (pinned host memory with ``pin``), or written
    into ``out``: consecutive (tokens, scales) buffers on one device whose rows add up to the
    load's (then the returned Packed holds no tokens)."""
    snap = store._snap if snap is None else snap
    pieces = list(_sources(store, snap, include_deleted, from_segment))
    n_tokens = sum(int(p[0].shape[0]) for p in pieces)
    dim = snap.manifest["dim"] or 0
    int8 = snap.manifest["dtype"] == "int8"
    tdtype = torch.int8 if int8 else torch.float16
    if out is not None:
        device = out[0][0].device if out else torch.device("cpu")
        have = sum(int(t.shape[0]) for t, _ in out)
        if have != n_tokens:
            raise ValueError(f"out: buffers for {have} rows, the load has {n_tokens}")
        tokens = scales = None
        dest = _Pieces(out)
    else:
        device = torch.device(device) if device is not None else torch.device("cpu")
        pin = pin and torch.cuda.is_available()  # page-locked memory needs a CUDA driver
        host = device.type != "cuda"
        tokens = torch.empty((n_tokens, dim), dtype=tdtype, device=device, pin_memory=pin and host)
        scales = torch.empty(n_tokens, dtype=torch.float32, device=device, pin_memory=pin and host) if int8 else None
        dest = _Pieces([(tokens, scales)])
    on_gpu = device.type == "cuda"
    staging = [torch.empty((CHUNK_TOKENS, dim), dtype=tdtype, pin_memory=True) for _ in range(2)] if on_gpu else []
    done = [None, None]
    lens, ids = [], []
    dst, k = 0, 0
    check = getattr(store, "checksums", True)
    crc_done = [None, None]
    for src, off, piece_ids, s in pieces:
        n = int(src.shape[0])
        # Whole segments are checked against their written CRC-32 as they stream in; the live part
        # of a segment with deletions is a subset (verify() and compact() check those); segments
        # this store handle wrote itself were checksummed from the bytes it wrote.
        crc = None
        if check and isinstance(src, _Whole) and src.r.name not in getattr(store, "written_here", ()):
            crc = _Checksum(src.r, "tokens")
        for t0 in range(0, n, CHUNK_TOKENS):
            t1 = min(n, t0 + CHUNK_TOKENS)
            if on_gpu:
                slot = k % 2
                if done[slot] is not None:
                    done[slot].synchronize()  # the copy that last used this staging buffer has finished
                if crc_done[slot] is not None:
                    crc_done[slot].result()  # ... and its checksum has been taken
                buf = staging[slot][: t1 - t0]
                src.read("tokens", buf.numpy(), t0, t1)  # disk / page cache -> pinned host
                dest.copy_tokens(dst + t0, buf, non_blocking=True)
                crc_done[slot] = crc.feed(buf.numpy()) if crc is not None else None
                done[slot] = torch.cuda.Event()
                done[slot].record()
                k += 1
            elif out is None:
                src.read("tokens", tokens[dst + t0 : dst + t1].numpy(), t0, t1)
                if crc is not None:
                    crc.feed(tokens[dst + t0 : dst + t1].numpy())
            else:
                chunk = np.empty((t1 - t0, dim), dtype=np.int8 if int8 else np.float16)
                src.read("tokens", chunk, t0, t1)
                if crc is not None:
                    crc.feed(chunk)
                dest.copy_tokens(dst + t0, torch.from_numpy(chunk), non_blocking=False)
        if int8:
            sc = np.empty(n, np.float32)
            src.read("scales", sc, 0, n)
            if crc is not None:
                sc_crc = _Checksum(src.r, "scales")
                sc_crc.feed(sc)
                sc_crc.finish()
            dest.copy_scales(dst, torch.from_numpy(sc))
        if crc is not None:
            crc.finish()
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
