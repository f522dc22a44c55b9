"""The exact tokens read from the segments on disk: the :class:`mvdb.engine.resident.Tokens`
interface with nothing resident but the row offsets (the codes tier, mvdb.engine.codes, ranks the
pool on the device; only the best few candidates' tokens are read, per search).

Reads gather the candidates' rows from each segment's memory map (torch's multi-threaded
index_select, from the page cache) into one pinned buffer, then copy it to the device. A batch of
queries is scored in chunks of about ``budget`` bytes of candidate tokens, the next chunk read (in
a worker thread) while the device scores the one before.
"""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from mvdb.kernels import maxsim_candidates, maxsim_varlen
from mvdb.kernels.maxsim.naive import distinct_candidates, token_rows

_PREFETCH = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mvdb-disk")


class DiskTokens:
    """Every row of one snapshot, in row order (deleted rows included), read from its segments."""

    pages = ()
    staged = True
    starts = scale_starts = None

    def __init__(self, snap, device: torch.device):
        self.snap, self.device = snap, torch.device(device)
        self.dim = snap.dim or 0
        self.int8 = snap.dtype == "int8"
        parts, base = [np.zeros(1, np.int64)], 0
        for r in snap.readers:
            off = np.asarray(r.offsets, dtype=np.int64)
            parts.append(off[1:] + base)
            base += int(off[-1])
        self.host_offsets = torch.from_numpy(np.concatenate(parts))
        self.offsets = self.host_offsets.to(self.device)
        self.n_tokens = base
        self._seg_first = np.array([0] + [r.n_tokens for r in snap.readers], dtype=np.int64).cumsum()

    @property
    def n_rows(self) -> int:
        return int(self.host_offsets.numel()) - 1

    home = torch.device("cpu")
    on_host = True
    mapped = False
    capacity_bytes = 0

    @property
    def token_bytes(self) -> int:
        return self.n_tokens * (self.dim * (1 if self.int8 else 2) + (4 if self.int8 else 0))

    def lengths(self, rows: torch.Tensor) -> torch.Tensor:
        return self.offsets[rows + 1] - self.offsets[rows]

    def chunks(self, t0: int = 0, t1: int | None = None, step: int = 1 << 20):
        """(tokens, scales or None) host tensors covering logical tokens [t0, t1), at most ``step``
        rows each, read from the segments."""
        t1 = self.n_tokens if t1 is None else t1
        for s, r in enumerate(self.snap.readers):
            a, b = max(t0, int(self._seg_first[s])), min(t1, int(self._seg_first[s + 1]))
            for lo in range(a, b, step):
                hi = min(b, lo + step)
                tok = np.empty((hi - lo, self.dim), dtype=np.int8 if self.int8 else np.float16)
                one = np.ones(1, np.int64)
                r.read_runs("tokens", tok, one * (lo - int(self._seg_first[s])), one * 0, one * (hi - lo))
                sc = None
                if self.int8:
                    sc = np.empty(hi - lo, np.float32)
                    r.read_runs("scales", sc, one * (lo - int(self._seg_first[s])), one * 0, one * (hi - lo))
                yield torch.from_numpy(tok), None if sc is None else torch.from_numpy(sc)

    def take(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Tokens (and scales) at logical token indices ``idx`` (host tensors)."""
        idx = idx.cpu().numpy().astype(np.int64)
        seg = np.searchsorted(self._seg_first, idx, side="right") - 1
        tok = np.empty((len(idx), self.dim), dtype=np.int8 if self.int8 else np.float16)
        sc = np.empty(len(idx), np.float32) if self.int8 else None
        for s in np.unique(seg):
            sel = np.flatnonzero(seg == s)
            r, local = self.snap.readers[s], idx[sel] - self._seg_first[s]
            tok[sel] = r.tokens[local]
            if sc is not None:
                sc[sel] = r.scales[local]
        return torch.from_numpy(tok), None if sc is None else torch.from_numpy(sc)

    def _views(self):
        """Each segment's tokens (and scales) as torch views of its memory map (no copy)."""
        v = getattr(self, "_mapped", None)
        if v is None:
            with warnings.catch_warnings():  # read-only maps: nothing writes through these views
                warnings.simplefilter("ignore", UserWarning)
                v = self._mapped = [(torch.from_numpy(r.tokens), None if r.scales is None else torch.from_numpy(r.scales))
                                    for r in self.snap.readers]
        return v

    def _read(self, rows: np.ndarray):
        """The tokens of distinct rows (ascending), packed in host memory (pinned where the device is
        a GPU) -> (tokens, scales, local offsets). Each segment's rows are gathered from its memory
        map by torch's multi-threaded index_select straight into one buffer (the page cache's
        pages, no per-document system call)."""
        off = self.host_offsets
        rows_t = torch.from_numpy(rows)
        starts = off[rows_t]
        idx, local_t = token_rows(starts, off[rows_t + 1] - starts)
        local, starts = local_t.numpy(), starts.numpy()
        n = int(local[-1])
        pin = self.device.type == "cuda"
        tok = torch.empty((n, self.dim), dtype=torch.int8 if self.int8 else torch.float16, pin_memory=pin)
        sc = torch.empty(n, dtype=torch.float32, pin_memory=pin) if self.int8 else None
        seg = np.searchsorted(self._seg_first, starts, side="right") - 1
        bounds = np.searchsorted(seg, np.arange(len(self.snap.readers) + 1))  # rows are ascending: segments in order
        for s, (t_map, s_map) in enumerate(self._views()):
            a, b = int(local[bounds[s]]), int(local[bounds[s + 1]])
            if a == b:
                continue
            part = idx[a:b] - int(self._seg_first[s])
            torch.index_select(t_map, 0, part, out=tok[a:b])
            if sc is not None:
                torch.index_select(s_map, 0, part, out=sc[a:b])
        return tok, sc, local_t

    def score(self, q: torch.Tensor, cu_q: torch.Tensor, cand: torch.Tensor, max_lq: int,
              budget: int = 1 << 29) -> torch.Tensor:
        """Exact MaxSim of each query against its candidate rows cand [Nq, K] (-1: -inf), the
        candidates' tokens read from disk a chunk of queries at a time (the next chunk's read in
        flight while the device scores one)."""
        nq, width = cand.shape
        out = torch.full((nq, width), float("-inf"), device=self.device)
        if nq == 0 or width == 0:
            return out
        row_bytes = max(1, self.n_tokens // max(1, self.n_rows)) * (self.dim * (1 if self.int8 else 2))
        step = max(1, budget // max(1, width * row_bytes))
        cand_host = cand.cpu()
        chunks = [(a, min(nq, a + step)) for a in range(0, nq, step)]

        def prepare(a: int, b: int):
            rows, lc = distinct_candidates(cand_host[a:b])
            return (lc, self._read(rows.numpy())) if rows.numel() else None

        pending = _PREFETCH.submit(prepare, *chunks[0])
        for i, (a, b) in enumerate(chunks):
            got = pending.result()
            if i + 1 < len(chunks):
                pending = _PREFETCH.submit(prepare, *chunks[i + 1])
            if got is None:
                continue
            lc, (tok, sc, local) = got
            # copied on the caller's stream (the one the kernel runs on), not the reading thread's
            pin = self.device.type == "cuda"
            tok, local = tok.to(self.device, non_blocking=pin), local.to(self.device)
            sc = None if sc is None else sc.to(self.device, non_blocking=pin)
            cu = cu_q[a : b + 1] - cu_q[a]
            qa = q[int(cu_q[a]) : int(cu_q[b])]
            out[a:b] = maxsim_candidates(qa, cu, tok, local, lc.to(self.device), sc, max_seqlen_q=max_lq, check=False)
        return out

    def score_all(self, q: torch.Tensor, cu_q: torch.Tensor, max_lq: int, rows_per_step: int = 1 << 22):
        """Exact MaxSim of every query against every row -> [Nq, n_rows], the segments streamed."""
        nq = cu_q.numel() - 1
        out = torch.empty((nq, self.n_rows), dtype=torch.float32, device=self.device)
        row0 = 0
        for s, r in enumerate(self.snap.readers):
            off = np.asarray(r.offsets, dtype=np.int64)
            a = 0
            while a < r.n_docs:
                b = max(a + 1, int(np.searchsorted(off, off[a] + rows_per_step, side="right")) - 1)
                b = min(b, r.n_docs)
                (tok, sc), = list(self.chunks(int(self._seg_first[s] + off[a]), int(self._seg_first[s] + off[b]),
                                             step=1 << 62))
                cu_d = torch.from_numpy(off[a : b + 1] - off[a]).to(self.device, torch.int32)
                out[:, row0 + a : row0 + b] = maxsim_varlen(q, cu_q, tok.to(self.device), cu_d,
                                                            d_scales=None if sc is None else sc.to(self.device),
                                                            max_seqlen_q=max_lq, check=False)
                a = b
            row0 += r.n_docs
        return out
