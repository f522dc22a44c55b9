"""Resident token memory: the stored tokens of every row of a snapshot, where the exact rerank
reads them (the device, or pinned host memory).

Tokens live in pages. Opening loads everything into one page of exactly the right size (as a bulk
build does). An add copies only its own tokens: first into the free tail of the last page, then
into a new page that holds at least ``GROWTH`` times the tokens already resident. Nothing is ever
copied twice, so memory stays near the tokens' size (at most ``1 + GROWTH`` times it, plus one
small page) and the number of pages grows with the logarithm of the corpus. A document never
straddles two pages.

The rerank kernel reads every page in one launch: each document's start row is counted from the
first page (``maxsim_candidates(starts=...)``), and every later page is placed so that this
distance is a whole number of rows. Views (:class:`Tokens`) are immutable: an add writes only rows
past the end of every earlier view, so a search on an older view reads what it always did.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mvdb.kernels import maxsim_candidates, maxsim_varlen
from mvdb.kernels.maxsim.runtime import interpreting
from mvdb.kernels.maxsim.gather import gather_rows
from mvdb.kernels.maxsim.naive import distinct_candidates, token_rows

GROWTH = 0.25  # a new page holds at least this share of the tokens already resident
# How the rerank reads pinned host pages from a CUDA device: "gather" (the distinct candidates'
# tokens copied to the device by one launch of many independent row loads, then scored there) or
# "in_place" (the MaxSim kernel reads each document through unified addressing). docs/scale.md
# has the measurement behind the default.
HOST_READ = "gather"
GATHER_BUDGET = 1 << 29  # bytes of gathered candidate tokens at a time
MIN_PAGE_BYTES = 4 << 20  # the smallest page allocated for an add


@dataclass(frozen=True)
class Page:
    tokens: torch.Tensor  # [capacity, dim] float16 or int8
    scales: torch.Tensor | None  # [capacity] float32 (int8)
    first: int  # logical token index of row 0
    row: int  # rows from the first page's row 0 to this page's (the kernel's start rows)
    scale_row: int  # the same for the scales


@dataclass(frozen=True)
class Tokens:
    """An immutable view: every row of one snapshot, in row order (deleted rows included)."""

    pages: tuple[Page, ...]
    n_tokens: int
    offsets: torch.Tensor  # [n_rows + 1] int64 logical token offsets, on the compute device
    host_offsets: torch.Tensor  # the same on the host
    starts: torch.Tensor | None  # [n_rows] int64 start rows counted from page 0 (several pages)
    scale_starts: torch.Tensor | None  # the same for the scales (int8)
    device: torch.device  # where searches compute
    dim: int
    int8: bool
    staged: bool  # pages in host memory, candidates gathered and copied per search

    @property
    def n_rows(self) -> int:
        return int(self.host_offsets.numel()) - 1

    @property
    def home(self) -> torch.device:
        return self.pages[0].tokens.device if self.pages else self.device

    @property
    def on_host(self) -> bool:
        return self.staged

    @property
    def mapped(self) -> bool:
        """Host pages a CUDA launch reads in place (pinned: unified addressing)."""
        return self.staged and self.device.type == "cuda" and self.home.type == "cpu"  # Resident pins them

    @property
    def capacity_bytes(self) -> int:
        return sum(p.tokens.nbytes + (p.scales.nbytes if p.scales is not None else 0) for p in self.pages)

    @property
    def token_bytes(self) -> int:
        return self.n_tokens * (self.dim * (1 if self.int8 else 2) + (4 if self.int8 else 0))

    def lengths(self, rows: torch.Tensor) -> torch.Tensor:
        return self.offsets[rows + 1] - self.offsets[rows]

    def _used(self, i: int) -> int:
        nxt = self.pages[i + 1].first if i + 1 < len(self.pages) else self.n_tokens
        return nxt - self.pages[i].first

    def chunks(self, t0: int = 0, t1: int | None = None):
        """(tokens, scales or None) views covering logical tokens [t0, t1), page by page."""
        t1 = self.n_tokens if t1 is None else t1
        for i, p in enumerate(self.pages):
            lo, hi = max(t0, p.first), min(t1, p.first + self._used(i))
            if lo < hi:
                yield p.tokens[lo - p.first : hi - p.first], None if p.scales is None else p.scales[lo - p.first : hi - p.first]

    def take(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Tokens (and scales) at logical token indices ``idx`` (on the pages' device)."""
        idx = idx.to(self.home, torch.int64)
        if len(self.pages) == 1:
            p = self.pages[0]
            return p.tokens.index_select(0, idx), None if p.scales is None else p.scales.index_select(0, idx)
        firsts = torch.tensor([p.first for p in self.pages], dtype=torch.int64, device=self.home)
        which = torch.searchsorted(firsts, idx, right=True) - 1
        tok = torch.empty((idx.numel(), self.dim), dtype=self.pages[0].tokens.dtype, device=self.home)
        sc = torch.empty(idx.numel(), dtype=torch.float32, device=self.home) if self.int8 else None
        for i, p in enumerate(self.pages):
            sel = torch.nonzero(which == i).flatten()
            if sel.numel():
                local = idx[sel] - p.first
                tok[sel] = p.tokens.index_select(0, local)
                if sc is not None:
                    sc[sel] = p.scales.index_select(0, local)
        return tok, sc

    def gather(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """The tokens of ``rows`` packed in order on the pages' device -> (tokens, scales, offsets)."""
        rows = rows.to(torch.int64).cpu()
        starts = self.host_offsets[rows]
        idx, local = token_rows(starts, self.host_offsets[rows + 1] - starts)
        tok, sc = self.take(idx)
        return tok, sc, local

    def score(self, q: torch.Tensor, cu_q: torch.Tensor, cand: torch.Tensor, max_lq: int,
              budget: int = 1 << 31) -> torch.Tensor:
        """Exact MaxSim of each query against its candidate rows cand [Nq, K] (-1 = padding -> -inf).

        Pinned host pages from a CUDA device: with HOST_READ "gather" (the default) the distinct
        candidates' tokens are copied onto the device by one launch of row loads through unified
        addressing (no CPU gather, no staging copy) and scored there; with "in_place" the MaxSim
        kernel reads them where they are. Other pages the kernel can read are read in place, all
        in one launch: the device's; the CPU's under the Triton interpreter. Otherwise (several pages
        on a CPU without the Triton kernel) the distinct candidates' tokens are gathered per chunk
        of queries (about ``budget`` bytes at a time) and scored.
        """
        if self.mapped and HOST_READ == "gather" and self.pages:
            return self._score_gathered(q, cu_q, cand, max_lq)
        in_place = (not self.on_host or self.mapped) and (len(self.pages) <= 1 or self.device.type == "cuda"
                                                          or interpreting())
        if in_place:
            if not self.pages:
                return torch.full(cand.shape, float("-inf"), device=self.device)
            p = self.pages[0]
            return maxsim_candidates(q, cu_q, p.tokens, self.offsets, cand, p.scales, max_seqlen_q=max_lq, check=False,
                                     starts=self.starts, scale_starts=self.scale_starts)
        return self._score_chunked(q, cu_q, cand, max_lq, budget, self._staged_rows)

    def _score_gathered(self, q: torch.Tensor, cu_q: torch.Tensor, cand: torch.Tensor, max_lq: int) -> torch.Tensor:
        """score() over pinned host pages: per chunk of queries (about GATHER_BUDGET bytes of
        tokens), the distinct candidates' tokens gathered onto the device in one launch, then
        scored there."""
        return self._score_chunked(q, cu_q, cand, max_lq, GATHER_BUDGET, self._device_rows)

    def _score_chunked(self, q: torch.Tensor, cu_q: torch.Tensor, cand: torch.Tensor, max_lq: int, budget: int,
                       fetch) -> torch.Tensor:
        """Per chunk of queries (about ``budget`` bytes of candidate tokens), the distinct
        candidates' tokens brought to the device by ``fetch(rows) -> (tokens, scales, offsets)``,
        then scored there."""
        nq, width = cand.shape
        out = torch.full((nq, width), float("-inf"), device=self.device)
        per_row = max(1, self.n_tokens // max(1, self.n_rows)) * self.dim * (1 if self.int8 else 2)
        chunk = max(1, budget // max(1, width * per_row))
        cu_host = cu_q.tolist()
        for a in range(0, nq, chunk):
            b = min(nq, a + chunk)
            rows, lc = distinct_candidates(cand[a:b])
            if not rows.numel():
                continue
            tok, sc, local = fetch(rows)
            cu = cu_q[a : b + 1] - cu_q[a]
            out[a:b] = maxsim_candidates(q[cu_host[a] : cu_host[b]], cu, tok, local, lc, sc, max_seqlen_q=max_lq,
                                         check=False)
        return out

    def _staged_rows(self, rows: torch.Tensor):
        """The rows' tokens gathered on the host, copied to the device (through pinned memory)."""
        tok, sc, local = self.gather(rows)
        if self.device.type == "cuda":
            tok = tok.pin_memory()
            sc = sc.pin_memory() if sc is not None else None
        tok = tok.to(self.device, non_blocking=True)
        sc = sc.to(self.device, non_blocking=True) if sc is not None else None
        return tok, sc, local.to(self.device)

    def _device_rows(self, rows: torch.Tensor):
        """The rows' tokens read from the pages by one gather launch on the device (pinned host
        pages through unified addressing; page rows counted from the first page)."""
        p = self.pages[0]
        lens = self.offsets[rows + 1] - self.offsets[rows]
        starts = self.starts[rows] if self.starts is not None else self.offsets[rows]
        idx, local = token_rows(starts, lens)
        sidx = None
        if self.scale_starts is not None:  # the scales' rows: the tokens' shifted by each page's offset
            sidx = idx + torch.repeat_interleave((self.scale_starts - self.starts)[rows], lens, output_size=idx.numel())
        tok, sc = gather_rows(p.tokens, idx, p.scales, sidx)
        return tok, sc, local

    def score_all(self, q: torch.Tensor, cu_q: torch.Tensor, max_lq: int, rows_per_step: int = 1 << 26):
        """Exact MaxSim of every query against every row -> [Nq, n_rows] float32 (page by page,
        at most ``rows_per_step`` tokens per kernel call; host pages are copied over in steps)."""
        nq = cu_q.numel() - 1
        out = torch.empty((nq, self.n_rows), dtype=torch.float32, device=self.device)
        off = self.host_offsets
        for i, p in enumerate(self.pages):
            lo, hi = p.first, p.first + self._used(i)
            r0 = int(torch.searchsorted(off, torch.tensor(lo), right=False))
            r1 = int(torch.searchsorted(off, torch.tensor(hi), right=False))
            a = r0
            while a < r1:  # rows whose tokens fit one step (a longer document goes alone)
                b = max(a + 1, min(r1, int(torch.searchsorted(off, off[a] + rows_per_step, right=True)) - 1))
                t0, t1 = int(off[a]) - p.first, int(off[b]) - p.first
                tok = p.tokens[t0:t1].to(self.device)
                sc = None if p.scales is None else p.scales[t0:t1].to(self.device)
                cu_d = (off[a : b + 1] - off[a]).to(self.device, torch.int32)
                out[:, a:b] = maxsim_varlen(q, cu_q, tok, cu_d, d_scales=sc, max_seqlen_q=max_lq, check=False)
                a = b
        return out


class Resident:
    """The writer's side: owns the pages, appends documents, hands out immutable :class:`Tokens`
    views. One writer at a time (the database serialises them)."""

    def __init__(self, dim: int, int8: bool, home: torch.device, device: torch.device, staged: bool = False):
        self.dim, self.int8, self.home, self.device = dim, int8, torch.device(home), torch.device(device)
        self.pin = self.home.type == "cpu" and self.device.type == "cuda"
        self.staged = staged or self.home != self.device
        self.dtype = torch.int8 if int8 else torch.float16
        self.pages: list[Page] = []
        self.allocations = 0  # page allocations made for adds (the growth test counts them)
        self.n_tokens = 0
        self._host_offsets = torch.zeros(1, dtype=torch.int64)
        self._offsets = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._starts = self._scale_starts = None
        self._view = self._make_view()

    # ---- views

    def _make_view(self) -> Tokens:
        return Tokens(tuple(self.pages), self.n_tokens, self._offsets, self._host_offsets, self._starts,
                      self._scale_starts, self.device, self.dim, self.int8, self.staged)

    def view(self) -> Tokens:
        return self._view

    @property
    def capacity_bytes(self) -> int:
        return self._view.capacity_bytes

    def free_rows(self) -> int:
        if not self.pages:
            return 0
        p = self.pages[-1]
        return int(p.tokens.shape[0]) - (self.n_tokens - p.first)

    # ---- pages

    def _alloc(self, rows: int) -> Page:
        """A page of ``rows`` rows whose distance from page 0 is a whole number of rows."""
        rows = max(1, rows)
        if not self.pages:
            tok = torch.empty((rows, self.dim), dtype=self.dtype, device=self.home, pin_memory=self.pin)
            sc = torch.empty(rows, dtype=torch.float32, device=self.home, pin_memory=self.pin) if self.int8 else None
            return Page(tok, sc, self.n_tokens, 0, 0)
        base = self.pages[0]
        item = tok_item = torch.empty(0, dtype=self.dtype).element_size()
        row_bytes = self.dim * item
        buf = torch.empty(((rows + 1) * self.dim,), dtype=self.dtype, device=self.home, pin_memory=self.pin)
        shift = (-(buf.data_ptr() - base.tokens.data_ptr())) % row_bytes
        if shift % tok_item:
            raise AssertionError(f"page alignment: {shift} bytes is not a whole number of elements")
        e0 = shift // tok_item
        tok = buf[e0 : e0 + rows * self.dim].view(rows, self.dim)
        row = (tok.data_ptr() - base.tokens.data_ptr()) // row_bytes
        sc, scale_row = None, 0
        if self.int8:
            sc = torch.empty(rows, dtype=torch.float32, device=self.home, pin_memory=self.pin)
            gap = sc.data_ptr() - base.scales.data_ptr()
            if gap % 4:
                raise AssertionError("scale pages are not 4-byte aligned")
            scale_row = gap // 4
        return Page(tok, sc, self.n_tokens, row, scale_row)

    def load(self, snap_loader, lengths: np.ndarray) -> Tokens:
        """Append documents of ``lengths`` tokens, filling the last page's free tail with whole
        documents and putting the rest in a new page. ``snap_loader(pieces)`` writes the tokens
        (in row order) into the given (tokens, scales) buffers."""
        lengths = np.asarray(lengths, dtype=np.int64)
        total = int(lengths.sum())
        ends = np.cumsum(lengths)
        fit = int(np.searchsorted(ends, self.free_rows(), side="right")) if len(lengths) else 0
        head = int(ends[fit - 1]) if fit else 0
        pieces, new_page = [], None
        if head:
            p, used = self.pages[-1], self.n_tokens - self.pages[-1].first
            pieces.append((p.tokens[used : used + head], None if p.scales is None else p.scales[used : used + head]))
        rest = total - head
        if rest:
            row_bytes = self.dim * (1 if self.int8 else 2) + (4 if self.int8 else 0)
            rows = rest if not self.pages else max(rest, int(GROWTH * self.n_tokens), MIN_PAGE_BYTES // row_bytes)
            new_page = Page(*self._alloc_at(rows, self.n_tokens + head))
            self.allocations += 1 if self.pages else 0
            pieces.append((new_page.tokens[:rest], None if new_page.scales is None else new_page.scales[:rest]))
        if total:
            snap_loader(pieces)
        if new_page is not None:
            self.pages.append(new_page)
        self._append_rows(lengths, head_docs=fit)
        return self._view

    def _alloc_at(self, rows: int, first: int) -> tuple:
        p = self._alloc(rows)
        return p.tokens, p.scales, first, p.row, p.scale_row

    def _append_rows(self, lengths: np.ndarray, head_docs: int) -> None:
        """Row offsets (and, with several pages, start rows) of newly appended documents."""
        n_old = self.n_tokens
        new_off = n_old + np.cumsum(lengths)
        host = torch.cat([self._host_offsets, torch.from_numpy(new_off.astype(np.int64))])
        self.n_tokens = int(host[-1])
        self._host_offsets = host
        self._offsets = host.to(self.device)
        if len(self.pages) > 1:
            firsts = np.array([p.first for p in self.pages], dtype=np.int64)
            rows_abs = np.array([p.row for p in self.pages], dtype=np.int64)
            sc_abs = np.array([p.scale_row for p in self.pages], dtype=np.int64)
            starts_all = host[:-1].numpy()
            which = np.searchsorted(firsts, starts_all, side="right") - 1
            local = starts_all - firsts[which]
            self._starts = torch.from_numpy(rows_abs[which] + local).to(self.device)
            self._scale_starts = torch.from_numpy(sc_abs[which] + local).to(self.device) if self.int8 else None
        self._view = self._make_view()

    def adopt(self, tokens: torch.Tensor, scales: torch.Tensor | None, lengths: np.ndarray) -> Tokens:
        """Take a freshly loaded buffer (the whole snapshot) as the first page, exactly sized."""
        if self.pages:
            raise AssertionError("adopt: the resident memory already holds pages")
        if tokens.shape[0]:
            self.pages.append(Page(tokens, scales, 0, 0, 0))
        self._append_rows(np.asarray(lengths, dtype=np.int64), 0)
        return self._view
