"""Every published figure traceable to the file that measured it (issue #59).

Each entry of ``FIGURES`` is one figure as a page prints it, and where it comes from: the page, a
place in the page (a literal phrase, or a table cell), the results file(s) under
``benchmarks/results/`` and a function of the file's JSON. The page's figure must equal the
file's value rounded to the precision the page shows (``0.982`` for 0.9821, ``7,589`` for
7589.11, ``95%`` for 0.9502); ``not run`` where the file records no time. A phrase must occur
exactly once in its page and a table row key must pick exactly one row, so an edit that rewords
or drops a figure fails here as well as one that changes it: update the entry with the page.

Phrases are literal text where ``#`` is a number (one figure each), ``~`` a word (a
machine name) and a space any whitespace (the pages wrap lines). Cells (``Cell``) name the table
by text of its header row, the row by the start of its leading cells (a blank cell takes the one
above) and the column by its header; ``pick`` takes part of a cell, else the cell's leading
figure or range (``0.949-0.950``, ``1,424 / 69``) is the figure.

The generic checks: every ``*.json`` a page cites in backticks exists under benchmarks/results/
(or, as a pattern, matches one), and every "N B a token" figure is one the capacity plan takes
from a results file.
"""

from __future__ import annotations

import functools
import json
import math
import re
import statistics
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


# ---------------------------------------------------------------------------------------------
# Reading pages and results

@functools.cache
def read_page(root: Path, page: str) -> str:
    return (root / page).read_text()


@functools.cache
def result(name: str) -> Any:
    """A results file's JSON; of a file the benchmark runner wrote around one script's file
    (suite, command, machine, versions, results), that script's file."""
    d = json.loads((RESULTS / name).read_text())
    if isinstance(d, dict) and {"suite", "command", "machine", "results"} <= set(d) and len(d["results"]) == 1:
        return next(iter(d["results"].values()))
    return d


NUM = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
NUM_RE = re.compile(NUM)
UNITS = {"k": 1e3, "M": 1e6, "B": 1e9, "T": 1e12, "MB": 1e6, "GB": 1e9, "TB": 1e12}
QTY_RE = re.compile(rf"({NUM})\s*(MB|GB|TB|[kMBT])(?![A-Za-z])")


def lit(text: str) -> str:
    """A literal phrase as a regex: ``#`` a number, ``~`` a word, a space any whitespace."""
    out = []
    for ch in text:
        if ch == "#":
            out.append(f"({NUM})")
        elif ch == "~":
            out.append(r"([A-Za-z0-9]+)")
        elif ch == " ":
            out.append(r"\s+")
        else:
            out.append(re.escape(ch))
    return "".join(out)


@dataclass(frozen=True)
class Cell:
    table: str                 # text in the table's header row
    row: tuple[str, ...]       # starts of the row's leading cells
    col: str | int             # header text (exact, else a unique prefix) or index
    after: tuple[str, ...] = ()  # for rows keyed alike ("same: ..."): the first such row after this one


@dataclass(frozen=True)
class Qty:
    """A figure printed with a unit or scale suffix: ``468 GB``, ``4.7 TB``, ``1.8B``."""
    value: float


@dataclass(frozen=True)
class Fig:
    page: str
    at: str | Cell             # a phrase (see lit), or a table cell
    file: str | tuple[str, ...]
    value: Callable[[Any], Any]
    pick: str | None = None    # a phrase inside the cell

    def id(self) -> str:
        where = (f"{zlib.crc32(self.at.table.encode()) % 4096:03x}:{'/'.join(self.at.after + self.at.row)}:{self.at.col}"
                 if isinstance(self.at, Cell) else self.at)  # the table's tag: tables with rows alike
        return f"{self.page}:{where}{'' if self.pick is None else ':' + self.pick}"[:120]


def table(text: str, header: str) -> list[list[str]]:
    """The rows of the table whose header row contains ``header``: header first, blanks filled."""
    lines = text.splitlines()
    starts = [i for i, (line, below) in enumerate(pairwise(lines))
              if line.startswith("|") and below.startswith("|-") and header in line]
    if len(starts) != 1:
        raise LookupError(f"{len(starts)} tables with {header!r} in the header")
    rows, i = [], starts[0]
    while i < len(lines) and lines[i].startswith("|"):
        if i != starts[0] + 1:  # the |---| line
            rows.append([c.strip().replace("**", "") for c in lines[i].strip().strip("|").split("|")])
        i += 1
    for prev, row in pairwise(rows[1:]):
        for j, c in enumerate(row):
            if c:
                break
            row[j] = prev[j]
    return rows


def cell_text(text: str, at: Cell) -> str:
    rows = table(text, at.table)
    head, body = rows[0], rows[1:]
    if isinstance(at.col, int):
        col = at.col
    else:
        cols = [j for j, h in enumerate(head) if h == at.col] or [j for j, h in enumerate(head) if h.startswith(at.col)]
        if len(cols) != 1:
            raise LookupError(f"{len(cols)} columns {at.col!r} in {head}")
        col = cols[0]
    if at.after:
        first = _rows(body, at.after, at.table)[0]
        hits = _rows(body[body.index(first) + 1:], at.row, at.table, unique=False)[:1]
    else:
        hits = _rows(body, at.row, at.table)
    if not hits:
        raise LookupError(f"no row {at.row} in the table with {at.table!r}")
    return hits[0][col]


def _starts(cell: str, key: str) -> bool:
    """The cell is the key, or starts with it and then a word ends: 'grow20' is not 'grow200'."""
    cell, key = cell.replace("`", ""), key.replace("`", "")
    return cell == key or (cell.startswith(key) and not (cell[len(key)].isalnum() and key[-1].isalnum()))


def _rows(body: list[list[str]], key: tuple[str, ...], name: str, unique: bool = True) -> list[list[str]]:
    hits = [r for r in body if all(_starts(r[j], k) for j, k in enumerate(key))]
    if unique and len(hits) != 1:
        raise LookupError(f"{len(hits)} rows {key} in the table with {name!r}")
    return hits


def number(s: str) -> tuple[float, int]:
    s = s.replace(",", "")
    return float(s), len(s.split(".")[1]) if "." in s else 0


def compare(shown: str, want: Any) -> str | None:
    """None if ``shown`` (the page's text) prints ``want`` (the file's value); else why not."""
    if want is None:
        return None if shown == "not run" else f"page {shown!r}, file: not run (null)"
    if isinstance(want, str):
        return None if shown == want else f"page {shown!r}, file {want!r}"
    wants = want if isinstance(want, tuple) else (want,)
    if all(isinstance(w, Qty) for w in wants):
        found = [(number(n), UNITS[u]) for n, u in QTY_RE.findall(shown)]
        wants = tuple(w.value / scale for w, (_, scale) in zip(wants, found))
        nums = [n for n, _ in found]
    else:
        nums = [number(n) for n in NUM_RE.findall(shown)]
    if len(nums) != len(wants) or any(w is None for w in wants):
        return f"page {shown!r} shows {len(nums)} figures, file gives {want!r}"
    for (p, places), w in zip(nums, wants):
        if abs(p - w) > 0.5 * 10 ** -places + 1e-9 * max(1.0, abs(w)):
            return f"page {shown!r}, file {want!r} (to {places} decimal places: {round(w, places)})"
    return None


DEFAULT_PICK = re.compile(rf"^(not run|(?:{NUM})(?:\s*[-/]\s*(?:{NUM}))*)")
LEADING_QTY = re.compile(rf"^{QTY_RE.pattern}(?:\s*(?:/|vs)\s*{QTY_RE.pattern})*")


def check(fig: Fig, root: Path = ROOT) -> str | None:
    """None if the page at ``root`` prints the figure as its file records it; else the error."""
    where = fig.id()
    try:
        text = read_page(root, fig.page)
        data = [result(f) for f in fig.file] if isinstance(fig.file, tuple) else result(fig.file)
        want = fig.value(data)
        if isinstance(fig.at, Cell):
            cell = cell_text(text, fig.at)
            if fig.pick is None and any(isinstance(w, Qty) for w in (want if isinstance(want, tuple) else (want,))):
                m = LEADING_QTY.match(cell)
                shown = [m.group(0)] if m else []
            elif fig.pick is None and isinstance(want, str):
                shown = [cell]
            elif fig.pick is None:
                m = DEFAULT_PICK.match(cell)
                shown = [m.group(1)] if m else []
            else:
                ms = re.findall(lit(fig.pick), cell)
                shown = list(ms[0]) if len(ms) == 1 and isinstance(ms[0], tuple) else ms
                if len(ms) != 1:
                    shown = []
            if not shown:
                return f"{where}: no figure in the cell {cell!r}"
        else:
            ms = re.findall(lit(fig.at), text)
            if len(ms) != 1:
                return f"{where}: the phrase occurs {len(ms)} times in the page (expected once)"
            shown = list(ms[0]) if isinstance(ms[0], tuple) else [ms[0]]
    except (LookupError, OSError, ValueError) as e:
        return f"{where}: {type(e).__name__}: {e}"
    if len(shown) > 1:
        if not isinstance(want, tuple) or len(want) != len(shown):
            return f"{where}: {len(shown)} figures on the page, value {want!r}"
        errors = [compare(s, w) for s, w in zip(shown, want)]
    else:
        errors = [compare(shown[0], want)]
    errors = [e for e in errors if e]
    return f"{where}: {'; '.join(errors)} [{fig.file}]" if errors else None


# ---------------------------------------------------------------------------------------------
# Values: key paths into a results file

def at(*path: Any, times: float = 1) -> Callable[[Any], Any]:
    """A key path; a dict step picks the one list element whose items match it."""
    def get(d: Any) -> Any:
        for step in path:
            if isinstance(step, dict):
                hits = [x for x in d if all(x.get(k) == v for k, v in step.items())]
                if len(hits) != 1:
                    raise LookupError(f"{len(hits)} entries match {step}")
                d = hits[0]
            else:
                d = d[step]
        return d if d is None else d * times if times != 1 else d
    return get


def both(*gets: Callable) -> Callable[[Any], tuple]:
    return lambda d: tuple(g(d) for g in gets)


def ratio(num: Callable, den: Callable, times: float = 1) -> Callable[[Any], float]:
    return lambda d: num(d) / den(d) * times


def gpu(d: Any) -> str:
    """The GPU model a file ran on: 'H100', 'H200'."""
    return re.search(r"H\d00", d["device"]).group()


def median(get: Callable) -> Callable[[list], float]:
    return lambda ds: statistics.median(get(d) for d in ds)


def same(values: Any) -> Any:
    """The one value that all of ``values`` are (a figure the page gives once for several)."""
    values = set(values)
    if len(values) != 1:
        raise ValueError(f"the page gives one figure for differing values {sorted(values)}")
    return values.pop()


# ---------------------------------------------------------------------------------------------
# The figures

BENCH = "docs/benchmarks.md"
SCALE = "docs/scale.md"
README = "README.md"

# Kernels: every row from one runner file.
ABC = KC = "kernels-H200.json"
KT = "| case | mvdb default call |"


def kern(case: str, impl: str, key: str = "ms") -> Callable:
    """A row's field; a row without it (the peers' "not run" row has no ms) gives None."""
    return lambda d: at("rows", {"case": case, "impl": impl})(d).get(key)


def kernel_row(row: str, file: str, case: str, mvdb: str, peers: dict[str, str | None], hbm: str | None) -> list[Fig]:
    figs = [Fig(BENCH, Cell(KT, (row,), "mvdb default call"), file, kern(case, mvdb))]
    if hbm:
        figs.append(Fig(BENCH, Cell(KT, (row,), "mvdb default call"), file, kern(case, mvdb, "pct_of_roofline"), pick=hbm))
    for col, impl in peers.items():
        figs.append(Fig(BENCH, Cell(KT, (row,), col), file, kern(case, impl)))
    return figs


KERNELS = [
    *kernel_row("(a) 1 query", ABC, "a-10k", "mvdb varlen (default call)",
                {"flash-maxsim": "flash-maxsim packed", "late-interaction-kernels": "late-interaction-kernels",
                 "naive torch": "naive torch (padded)"}, "(#% of HBM)"),
    *kernel_row("(a) same, int8", ABC, "a-10k-int8", "mvdb varlen int8 (default call)",
                {"flash-maxsim": "flash-maxsim int8x8 (padded)"}, None),
    *kernel_row("(b) ColPali", ABC, "b-colpali", "mvdb maxsim",
                {"flash-maxsim": "flash-maxsim", "late-interaction-kernels": "late-interaction-kernels",
                 "naive torch": "naive torch (einsum)"}, "(#% of tensor-core peak)"),
    *kernel_row("(b) same, int8", ABC, "b-colpali-int8", "mvdb maxsim int8",
                {"flash-maxsim": "flash-maxsim int8x8", "late-interaction-kernels": "late-interaction-kernels fp8"}, None),
    *kernel_row("(c) 32 queries", KC, "c-150k", "mvdb candidates (default call)",
                {"flash-maxsim": "flash-maxsim rerank_direct", "late-interaction-kernels": "late-interaction-kernels pairs",
                 "naive torch": "naive torch (gather+einsum)"}, "(#% of HBM)"),
    # The peers' (c) 1M row: the file records one "peers" row with ms null (not run).
    *kernel_row("(c) same from a 1M", KC, "c-1M", "mvdb candidates (default call)",
                {"flash-maxsim": "peers", "late-interaction-kernels": "peers",
                 "naive torch": "naive torch (gather+einsum)"}, "(#%)"),
    *kernel_row("(c) 1M-doc store, int8", KC, "c-1M-int8", "mvdb candidates int8 (default call)", {}, "(#%)"),
    Fig(BENCH, "the store has # elements (> 2^31)", KC,
        lambda d: float(number(re.search(r"([\d,]+) elements", kern("c-1M", "peers", "note")(d)).group(1))[0])),
    Fig(BENCH, "The int8 (c) call reaches #% of the rate", "kernel-floor-H200.json",
        lambda d: 100 * min(d["cases"]["c-1M int8"]["read_kernel_ms"].values()) / d["cases"]["c-1M int8"]["mvdb_default_ms"]),
]

# Search at 1M documents (docs/benchmarks.md) and the headline rows that cite it.
DH = "tiers-dups-1000000-float16-H200.json"
ST = "| tier | recall@10, 4-64 / 32 tokens |"
Q64, Q32 = {"qlen": "4-64"}, {"qlen": "32"}  # the tiers runs' query sets


def tier_row(tier: str, key: str, qlen: dict = Q64) -> Callable:
    return at("runs", {"tier": tier}, "rows", qlen, key)


def both_qlens(tier: str, key: str) -> Callable:
    """A "4-64 / 32" cell: the tier's figure for each query set."""
    return both(tier_row(tier, key, Q64), tier_row(tier, key, Q32))


# mvdb against fast-plaid: one H200, the e2e corpus, 32-token queries, both at their defaults.
FP, EQ = "fastplaid-1000000-H200.json", "e2e-1000000-q32-H200.json"
FPT = "| | recall@10 | batched QPS | single-query p50 | build |"
FP_DEFAULT = at("sweep", {"setting": "default"})
MV_DEFAULT = at("runs", 0, "sweep", 0)
FASTPLAID = [
    *[Fig(BENCH, Cell(FPT, (row,), col), file, get)
      for row, file, base, build in (("mvdb", EQ, MV_DEFAULT, at("runs", 0, "build_s")), ("fast-plaid", FP, FP_DEFAULT, at("build_s")))
      for col, get in (("recall@10", lambda d, b=base: b(d)["recall10"] if "recall10" in b(d) else b(d)["recall10_vs_exhaustive"]),
                       ("batched QPS", lambda d, b=base: b(d)["batch_qps"]),
                       ("single-query p50", lambda d, b=base: b(d)["single_p50_ms"]),
                       ("build", build))],
    Fig(BENCH, "the same 1M-document synthetic corpus (#M tokens)", (FP, EQ),
        lambda ds: same(d["tokens"] * 1e-6 for d in ds)),
    Fig(BENCH, "mvdb answers #x the batched queries a second at higher recall", (EQ, FP),
        lambda ds: MV_DEFAULT(ds[0])["batch_qps"] / FP_DEFAULT(ds[1])["batch_qps"]
        if MV_DEFAULT(ds[0])["recall10"] > FP_DEFAULT(ds[1])["recall10_vs_exhaustive"] else None),
    Fig(BENCH, "fast-plaid's index keeps # GB on the GPU", FP, at("index_resident_gpu_gb")),
    Fig(BENCH, "tokens (# GB of the GPU in use after the open)", EQ, at("runs", 0, "device_used_after_open_gb")),
    Fig(BENCH, "its best recall there is #, at # QPS", FP,
        lambda d: max((r["recall10_vs_exhaustive"], r["batch_qps"]) for r in d["sweep"])),
    Fig(README, "recall@10 # at # queries/s against fast-plaid's # at #", (EQ, FP),
        lambda ds: (MV_DEFAULT(ds[0])["recall10"], MV_DEFAULT(ds[0])["batch_qps"],
                    FP_DEFAULT(ds[1])["recall10_vs_exhaustive"], FP_DEFAULT(ds[1])["batch_qps"])),
]

SEARCH_1M = [
    Fig(BENCH, "--parts 200` on one ~ (2026-11-29)", DH, gpu),
    Fig(BENCH, "1M documents of 16-200 tokens (#M tokens", DH, at("tokens", times=1e-6)),
    *[Fig(BENCH, Cell(ST, (row,), col), DH, get)
      for row, tier in (("device", "device"), ("codes+host", "host"))
      for col, get in (("recall@10, 4-64 / 32 tokens", both_qlens(tier, "recall10")),
                       ("batched QPS, 4-64 / 32", both_qlens(tier, "batch_qps")),
                       ("single-query p50 ms, 4-64 / 32", both_qlens(tier, "single_p50_ms")),
                       ("GPU memory held", at("runs", {"tier": tier}, "gpu_allocated_gb")))],
    *FASTPLAID,
]

# The 5.6M database (docs/benchmarks.md, docs/scale.md, README).
LARGE = "large-dups-5600000-H200.json"
CS = "| documents | tokens | tier | recall@10 |"  # docs/scale.md: corpus size at the defaults
AUTO, DISK = {"open": "auto"}, {"open": "disk"}
LT = "| | `auto` | `residency=\"disk\"` |"
LARGE_FIGS = [
    Fig(BENCH, "**Larger than the GPU**: #M documents, # GB of fp16, on one ~ capped at an H100's # GB", LARGE,
        both(at("docs", times=1e-6), at("fp16_gb"), gpu, at("runs", AUTO, "options", "max_gpu_bytes", times=1e-9))),
    Fig(BENCH, "in the codes+host tier: recall@10 # at # QPS, p50 # ms", LARGE,
        both(at("runs", AUTO, "search", "recall10"), at("runs", AUTO, "search", "batch_qps"),
             at("runs", AUTO, "search", "single_p50_ms"))),
    Fig(SCALE, "80 GB of GPU memory, an H100's (`max_gpu_bytes`): # `dups` documents, #M tokens, # GB of fp16", LARGE,
        both(at("docs"), at("tokens", times=1e-6), at("fp16_gb"))),
    Fig(SCALE, Cell(LT, ("tier",), "`auto`"), LARGE, ratio(at("fp16_gb"), at("runs", AUTO, "options", "max_gpu_bytes", times=1e-9)),
        pick="(the tokens are #x the cap)"),
    *[Fig(SCALE, Cell(LT, (row,), col), LARGE, get)
      for col, run in (("`auto`", AUTO), ('`residency="disk"`', DISK))
      for row, get in (("recall@10", at("runs", run, "search", "recall10")),
                       ("batched QPS", at("runs", run, "search", "batch_qps")),
                       ("single-query p50", both(at("runs", run, "search", "single_p50_ms"), at("runs", run, "search", "single_p99_ms"))),
                       ("open", at("runs", run, "open_s")),
                       ("host memory", at("runs", run, "host_rss_gb")))],
    Fig(SCALE, Cell(LT, ("GPU memory the database holds",), "`auto`"), LARGE,
        both(at("runs", AUTO, "gpu_allocated_gb"), at("runs", AUTO, "stats", "codes_bytes", times=1e-9)),
        pick="# GB (the codes # GB of it)"),
    Fig(SCALE, Cell(LT, ("GPU memory the database holds",), "`auto`"), LARGE,
        ratio(at("runs", AUTO, "gpu_allocated_gb"), at("fp16_gb"), 100), pick="#% of the fp16 tokens"),
    Fig(SCALE, Cell(LT, ("GPU memory the database holds",), "`auto`"), LARGE, at("runs", AUTO, "gpu_peak_gb"),
        pick="peak over the process # GB"),
    Fig(SCALE, "Build: generating # s, the reference # s, ingest # s.", LARGE,
        both(at("generate_s"), at("reference_s"), at("ingest_s"))),
    Fig(SCALE, Cell(CS, ("5,600,000",), "batched QPS"), LARGE,
        at("runs", AUTO, "search", "batch_qps")),
    Fig(SCALE, Cell(CS, ("5,600,000",), "recall@10"), LARGE,
        at("runs", AUTO, "search", "recall10")),
    Fig(SCALE, Cell(CS, ("5,600,000",), "p50 ms"), LARGE,
        at("runs", AUTO, "search", "single_p50_ms")),
]

# The first query (docs/benchmarks.md table and prose).
FQD, FQM = "first-query-dups-1000000-H200.json", "first-query-manpages-58000-H200.json"
FT = "| corpus | state | first pass QPS |"


def fq(state: str, *path: Any, times: float = 1) -> Callable:
    return at("runs", {"state": state}, *path, times=times)


def fq_row(corpus: str, file: str, state: str) -> list[Fig]:
    key = (corpus, state)
    return [
        Fig(BENCH, Cell(FT, key, "first pass QPS"), file, fq(state, "first_pass", "qps")),
        Fig(BENCH, Cell(FT, key, "warm pass QPS"), file, fq(state, "second_pass", "qps")),
        Fig(BENCH, Cell(FT, key, "first / warm"), file,
            ratio(fq(state, "first_pass", "qps"), fq(state, "second_pass", "qps"), 100)),
        Fig(BENCH, Cell(FT, key, "slowest first single query"), file, fq(state, "singles_summary", "slowest_first_ms")),
    ]


FIRST_QUERY = [
    *[f for state in ("cold", "second", "warmed") for f in fq_row("dups 1M", FQD, state)],
    *[f for state in ("cold", "second", "warmed") for f in fq_row("man pages", FQM, state)],
    Fig(BENCH, Cell(FT, ("dups 1M", "warmed"), "state"), FQD, fq("warmed", "warmup", "seconds"), pick=": # s)"),
    Fig(BENCH, Cell(FT, ("man pages", "warmed"), "state"), FQM, fq("warmed", "warmup", "seconds"), pick=": # s)"),
    Fig(BENCH, Cell(FT, ("dups 1M", "cold"), "corpus"), FQD, at("build", "stats", "tokens", times=1e-6), pick="(#M tokens"),
    Fig(BENCH, Cell(FT, ("man pages", "cold"), "corpus"), FQM, at("build", "stats", "tokens", times=1e-6), pick="(#M tokens"),
    Fig(BENCH, "the man pages' one-line summaries through all-MiniLM-L6-v2, #-# tokens)", FQM,
        both(at("build", "query_lengths", "min"), at("build", "query_lengths", "max"))),
    Fig(BENCH, "on dups the slowest length's p50 lies within #-#x of the 32-token", FQD,
        lambda d: (min(worst_ratio(r)[0] for r in d["runs"]), max(worst_ratio(r)[0] for r in d["runs"]))),
    Fig(BENCH, "a process that only imports torch took #-# s, and with the CUDA context #-# s", "import-floor-H200.json",
        lambda d: (min(r["torch"] for r in d["seconds"]), max(r["torch"] for r in d["seconds"]),
                   min(r["torch_cuda_ctx"] for r in d["seconds"]), max(r["torch_cuda_ctx"] for r in d["seconds"]))),
    Fig(BENCH, "on the man pages (41 calls a length) within #x (cold), #x (second: # tokens) and #x (warmed)", FQM,
        lambda d: (*worst_ratio(fq("cold")(d))[:1], *worst_ratio(fq("second")(d)), *worst_ratio(fq("warmed")(d))[:1])),
    Fig(BENCH, "their p50s still spread over #-#x of the 32-token p50 in the second run", FQM,
        lambda d: ratio_range(fq("second")(d), range(33, 65))),
    Fig(BENCH, "Recall@10 is the same in every pass (# on dups, # on the man pages)", (FQD, FQM),
        lambda ds: tuple(same(r[p]["recall10"] for r in d["runs"] for p in ("first_pass", "second_pass")) for d in ds)),
    Fig(BENCH, ("Time to the first hit in a new process (man pages, second run): # s, of which imports "
                "# s (torch # s, mvdb # s), CUDA context # s, `mvdb.open` # s, the first search # s."),
        FQM, lambda d: first_hit_parts(at("runs", {"state": "second"})(d))),
    Fig(BENCH, ("listening after # s, ready (warmed up) after # s; 16 clients sending the 2,000 queries one search at "
                "a time then completed # searches/s in the first 10 s after ready against # in the last 10 s of 30 (#%;"),
        "first-query-dups-200000-serve-H200.json",
        both(at("runs", 0, "listening_s"), at("runs", 0, "ready_s"), at("runs", 0, "first_10s_qps"),
             at("runs", 0, "last_10s_qps"), at("runs", 0, "first_over_steady", times=100))),
    Fig("docs/guides/serving.md", ("a server was ready # s after it listened, and its first 10 s under 16 clients "
                                   "ran at #% of its steady rate"), "first-query-dups-200000-serve-H200.json",
        lambda d: (at("runs", 0, "ready_s")(d) - at("runs", 0, "listening_s")(d), at("runs", 0, "first_over_steady", times=100)(d))),
]


def worst_ratio(r: dict) -> tuple:
    """A run's largest p50 of one length over the 32-token p50, and that length."""
    return max((v["p50_ms"] / r["singles"]["32"]["p50_ms"], int(n)) for n, v in r["singles"].items())


def ratio_range(r: dict, lengths: range) -> tuple:
    """The smallest and largest p50 over the 32-token p50 among the given query lengths."""
    rs = [r["singles"][str(n)]["p50_ms"] / r["singles"]["32"]["p50_ms"] for n in lengths]
    return min(rs), max(rs)


def first_hit_parts(r: dict) -> tuple:
    """A run's time to the first hit and its parts, from the times since launch it records."""
    return (r["first_hit_s"], r["import_mvdb_s"], r["import_torch_s"] - r["import_numpy_s"],
            r["import_mvdb_s"] - r["import_torch_s"], r["cuda_context_s"] - r["import_mvdb_s"],
            r["open_s"] - r["load_queries_s"], r["first_hit_s"] - r["open_s"])


# Serving: one run (docs/benchmarks.md table, serving guide, README).
SERVE = "serve-1000000-H200.json"
SVT = "| | clients | QPS | p50 ms |"


def load(clients: int, key: str, times: float = 1) -> Callable:
    return at("servers", 0, "load", {"clients": clients}, key, times=times)


SERVING = [
    Fig(BENCH, Cell(SVT, ("in process",), "QPS"), SERVE, at("in_process_batched_qps")),
    *[Fig(BENCH, Cell(SVT, ("served", str(c)), col), SERVE, load(c, key, times))
      for c in (1, 16, 64)
      for col, key, times in (("QPS", "qps", 1), ("p50 ms", "p50_ms", 1), ("p99 ms", "p99_ms", 1),
                              ("share of in-process batched QPS", "share_of_in_process_batched", 100))],
    Fig(BENCH, "served answers checked equal to in-process ones (# of #)", SERVE,
        lambda d: tuple(int(x) for x in d["servers"][0]["served_equals_in_process"].split("/"))),
    Fig(BENCH, "run serve --clients 1,16,64 --seconds 8` on one ~ with # cores", SERVE,
        both(gpu, at("cpus"))),
    Fig("docs/guides/serving.md", ("64 client threads reach # searches/s, #% of the in-process "
                                   "batched rate, and 16 clients see a median latency of # ms."),
        SERVE, both(load(64, "qps"), load(64, "share_of_in_process_batched", 100), load(16, "p50_ms"))),
]


# Training (docs/benchmarks.md and the guide's table, from one runner file).
TC = TD = "training-H200.json"


def lik_best(case: str, key: str = "ms") -> Callable:
    """late-interaction-kernels with its faster backward."""
    def get(d: Any) -> float:
        runs = [d["cases"][case][k] for k in ("lik-unified", "lik-lowmem")]
        return min(runs, key=lambda r: r["ms"])[key]
    return get


TT = "| case | naive (einsum + max) |"
TRAINING = [
    Fig(BENCH, ("ColBERT in-batch B=256 # ms per step (#x faster than "
                "late-interaction-kernels' faster backward, # MB of extra memory against # MB)"),
        TC, both(at("cases", "colbert", "mvdb-auto", "ms"),
                 ratio(lik_best("colbert"), at("cases", "colbert", "mvdb-auto", "ms")),
                 # a bucket's later steps run lowmem: auto's own peak includes the first step's trial of both
                 at("cases", "colbert", "mvdb-lowmem", "peak_extra_gb", times=1000),
                 lambda d: lik_best("colbert", "peak_extra_gb")(d) * 1000)),
    *[Fig("docs/guides/training.md", Cell(TT, (row,), col), TD, get)
      for row, case in (("ColBERT", "colbert"), ("B=256 x 16", "hardneg"), ("ColPali", "colpali"))
      for col, get in (("naive", at("cases", case, "naive", "ms")), ("mvdb `auto`", at("cases", case, "mvdb-auto", "ms")),
                       ("LIK", lik_best(case)))],
    *[Fig("docs/guides/training.md", Cell(TT, ("same: peak",), col, after=(row,)), TD, get)
      for row, case, mvdb in (("ColBERT", "colbert", "mvdb-lowmem"),  # later steps run lowmem; auto's first step below
                              ("B=256 x 16", "hardneg", "mvdb-auto"), ("ColPali", "colpali", "mvdb-auto"))
      for col, get in (("naive", lambda d, c=case: Qty(d["cases"][c]["naive"]["peak_extra_gb"] * 1e9)),
                       ("mvdb `auto`", lambda d, c=case, m=mvdb: Qty(d["cases"][c][m]["peak_extra_gb"] * 1e9)),
                       ("LIK", lambda d, c=case: Qty(lik_best(c, "peak_extra_gb")(d) * 1e9)))],
    Fig("docs/guides/training.md", Cell(TT, ("same: peak",), "mvdb `auto`", after=("ColBERT",)), TD,
        at("cases", "colbert", "mvdb-auto", "peak_extra_gb", times=1000), pick="(# MB on a bucket's first step)"),
]

# Sparton, hybrid, grow, text ingest (docs/benchmarks.md, guides).
SP = "sparton-H200.json"
SPT = "| V | PyTorch eager fwd / fwd+bwd |"
SPARTON = [
    f for i, v in enumerate(("30,522", "250,002")) for f in (
        Fig(BENCH, Cell(SPT, (v,), 1), SP, both(at("cases", i, "eager", "fwd_ms"), at("cases", i, "eager", "fwd_bwd_ms"))),
        Fig(BENCH, Cell(SPT, (v,), 2), SP, both(at("cases", i, "sparton", "fwd_ms"), at("cases", i, "sparton", "fwd_bwd_ms"))),
        Fig(BENCH, Cell(SPT, (v,), 3), SP,
            lambda d, i=i: (Qty(d["cases"][i]["eager"]["fwd_bwd_peak_gb"] * 1e9), Qty(d["cases"][i]["sparton"]["fwd_bwd_peak_gb"] * 1e9))),
        Fig(BENCH, Cell(SPT, (v,), "V"), SP, at("cases", i, "V")),
    )
] + [Fig("docs/guides/hybrid.md", "Sparton runs forward and backward #x faster than the PyTorch head, in #x less memory",
         SP, both(at("cases", 0, "speedup_fwd_bwd"), at("cases", 0, "memory_ratio_fwd_bwd")))]

HY = "hybrid-manpages-dev-cpu.json"
HT = "| token index, candidates | candidate recall, tokens only |"
IVF20 = {"name": "ivf, 20 candidates"}
HYBRID = [
    *[Fig(BENCH, Cell(HT, (row,), col), HY, at("settings", {"name": name}, channel, key))
      for row, name in (("flat, 100", "flat, 100 candidates"), ("flat, 20", "flat, 20 candidates"),
                        ("IVF, 100", "ivf, 100 candidates"), ("IVF, 20", "ivf, 20 candidates"))
      for col, channel, key in (("candidate recall, tokens only", "tokens", "candidate_recall"),
                                (2, "tokens+bm25", "candidate_recall"), ("MRR@10, tokens only", "tokens", "mrr10"),
                                (4, "tokens+bm25", "mrr10"))],
    Fig(BENCH, "BM25 alone: MRR@10 #; exhaustive MaxSim: #.", HY, both(at("bm25_alone_mrr10"), at("exhaustive_maxsim_mrr10"))),
    Fig(BENCH, "the sparse channel adds # documents", HY, at("n_sparse")),
    Fig("docs/guides/hybrid.md", "On the #-page man-page dev set", HY, at("pages")),
    Fig("docs/guides/hybrid.md", "raises candidate recall from # to # and MRR@10 from # to #, exhaustive MaxSim's", HY,
        both(at("settings", IVF20, "tokens", "candidate_recall"), at("settings", IVF20, "tokens+bm25", "candidate_recall"),
             at("settings", IVF20, "tokens", "mrr10"), at("settings", IVF20, "tokens+bm25", "mrr10"))),
    Fig("docs/guides/hybrid.md", ("the search time over the set rises #x, from # to "
                                  "# s (# documents reranked a query instead of #,"), HY,
        both(ratio(at("settings", IVF20, "tokens+bm25", "search_s"), at("settings", IVF20, "tokens", "search_s")),
             at("settings", IVF20, "tokens", "search_s"), at("settings", IVF20, "tokens+bm25", "search_s"),
             at("settings", IVF20, "tokens+bm25", "candidates_mean"), at("settings", IVF20, "tokens", "candidates_mean"))),
]

GR = "grow-dups-1000000-H200.json"
GT = "| mode | recall@10 | batched QPS |"
GROW = [
    Fig(BENCH, Cell(GT, (mode,), col), GR, at("modes", {"mode": mode}, *path))
    for mode in ("bulk", "grow20", "grow200")
    for col, path in (("recall@10", ("search", 0, "recall10")),
                      # bulk: "(after reopen)"
                      ("batched QPS", ("after_reopen", "search", "batch_qps") if mode == "bulk" else ("search", 0, "batch_qps")),
                      ("p50 ms", ("search", 0, "single_p50_ms")), ("peak GPU GB", ("peak_gb",)), ("build s", ("build_s",)))
] + [
    Fig(BENCH, "--settings default`) on one ~ (2026-11-29,", GR, gpu),
    Fig(BENCH, "The first batched pass after `grow20` ran at # QPS", GR,
        at("modes", {"mode": "grow20"}, "search", 0, "first_pass_qps")),
]

E2E = "e2e-1000000-H200.json"
E2E_DEFAULT = ("runs", 0, "sweep", 0)
E2E_FIGS = [
    Fig(BENCH, ("queries of 4-64 tokens: recall@10 # at # batched QPS (first pass #), p50 # ms, built in # s "
                "(`python -m benchmarks --label 1000000 run e2e`"), E2E,
        both(at(*E2E_DEFAULT, "recall10"), at(*E2E_DEFAULT, "batch_qps"), at(*E2E_DEFAULT, "first_pass_qps"),
             at(*E2E_DEFAULT, "single_p50_ms"), at("runs", 0, "build_s"))),
    Fig(BENCH, "| mvdb (torch token index, no FAISS) |", (E2E, "e2e-1000000-q32-H200.json"),
        lambda ds: None if any(d["faiss_gpu"] for d in ds) else ()),
]

IN = "install-cpu.json"
IT = "| install | time | environment size | token index |"
INSTALLS = [
    Fig("docs/install.md", Cell(IT, (row,), col), IN, get, pick=pick)
    for row, case in (("CPU:", "cpu"), ("GPU:", "gpu"), ("no extra:", "plain"))
    for col, get, pick in (("time", at("cases", {"case": case}, "seconds"), "# s"),
                           ("environment size", at("cases", {"case": case}, "venv_mb", times=1e-3), "# GB"))
] + [  # the backend the smoke search reported, on this GPU-less machine
    Fig("docs/install.md", Cell(IT, (row,), "token index"), IN,
        lambda d, case=case: at("cases", {"case": case}, "smoke", "index_backend")(d).removeprefix("faiss-"), pick=pick)
    for row, case, pick in (("CPU:", "cpu", "faiss-~"), ("GPU:", "gpu", "(faiss-~ here"), ("no extra:", "plain", "~"))
]

DF = "defaults-dups-1000000-H200.json"
GPU_TRAIN = {"per_list": 160, "niter": 10}  # the GPU's default k-means training
DF_DEFAULT = ("variants", GPU_TRAIN, "search", {"k": 10, "nprobe": None})
DF_WIDE = ("variants", GPU_TRAIN, "search", {"nprobe": 16, "n_candidates": 8192})
DEFAULTS = [
    Fig(BENCH, "run defaults --generators dups` on one ~", DF, gpu),
    Fig(BENCH, ("the defaults reach recall@10 # at # batched QPS, p50 # ms; probing # lists and reranking # documents "
                "reaches # at # QPS"), DF,
        both(at(*DF_DEFAULT, "recall10"), at(*DF_DEFAULT, "batch_qps"), at(*DF_DEFAULT, "single_p50_ms"),
             at(*DF_WIDE, "nprobe"), at(*DF_WIDE, "n_candidates"), at(*DF_WIDE, "recall10"), at(*DF_WIDE, "batch_qps"))),
]

TI = "text-ingest-H200.json"
TEXT = [
    Fig(BENCH, ("mvdb's pipeline # documents/s against the bare Sentence "
                "Transformers `encode` call's # in the same process (#x)"), TI,
        both(at("mvdb", "docs_per_s"), at("bare", "docs_per_s"), at("speedup"))),
    Fig(BENCH, "`add_texts` end to end #.", TI, at("add_texts", "docs_per_s")),
    Fig(BENCH, "On the 2-core CPU # against # (#x, `text-ingest-cpu.json`)", "text-ingest-cpu.json",
        both(at("mvdb", "docs_per_s"), at("bare", "docs_per_s"), at("speedup"))),
    Fig("docs/guides/text.md", ("the pipeline # documents/s, the bare call # (#x); their vectors differ by at "
                                "most one float16 step (#)"), "text-ingest-cpu.json",
        both(at("mvdb", "docs_per_s"), at("bare", "docs_per_s"), at("speedup"), at("check", "max_abs_diff_fp16_store"))),
    Fig("docs/guides/text.md", Cell("| path | documents/s |", ("bare",), "documents/s"), TI, at("bare", "docs_per_s")),
    Fig("docs/guides/text.md", Cell("| path | documents/s |", ("`Encoder(",), "documents/s"), TI,
        both(at("mvdb", "docs_per_s"), at("speedup"), at("mvdb_first_call", "docs_per_s")), pick="# (#x; the first call #)"),
    Fig("docs/guides/text.md", Cell("| path | documents/s |", ("`db.add_texts",), "documents/s"), TI,
        at("add_texts", "docs_per_s")),
    Fig("docs/guides/text.md", "The pipeline's # s are about the tokenizing (# s when timed alone) and the forward (# s)", TI,
        both(at("mvdb", "seconds"), at("stages", "tokenize_s"), at("stages", "forward_s"))),
    Fig("docs/guides/text.md", "60,000 man-page passages of # tokens on average", TI, at("mvdb", "tokens_per_doc")),
]

# The README's headline table: each row's figures from the file its linked page cites.
RT = "| what | figure |"
HEADLINES = [
    Fig(README, Cell(RT, ("[Search, 1M",), "what"), DH, gpu, pick="on one ~]"),
    Fig(README, Cell(RT, ("[Search, 1M",), "figure"), "tiers-1000000-dups-H200.json",
        both(tier_row("device", "recall10"), tier_row("device", "batch_qps"), tier_row("device", "single_p50_ms")),
        pick="recall@10 # against exhaustive MaxSim at # queries/s batched, p50 # ms"),  # the 4-64 query set
    Fig(README, Cell(RT, ("[Larger than the GPU",), "figure"), LARGE,
        both(at("docs", times=1e-6), at("fp16_gb"), gpu, at("runs", AUTO, "options", "max_gpu_bytes", times=1e-9),
             at("runs", AUTO, "search", "recall10"), at("runs", AUTO, "search", "batch_qps")),
        pick="#M documents (# GB of fp16) on one ~ capped at # GB of GPU memory (an H100's): recall@10 # at # queries/s"),
    Fig(README, Cell(RT, ("[The first query",), "figure"), FQD,
        both(at("build", "query_lengths", "min"), at("build", "query_lengths", "max"),
             ratio(fq("second", "first_pass", "qps"), fq("second", "second_pass", "qps"), 100),
             at("build", "docs", times=1e-6), gpu, fq("second", "singles_summary", "slowest_first_ms")),
        pick="queries of #-# tokens at #% of the warm pass's speed (#M documents, ~), every query length's first single call within # ms"),
    Fig(README, Cell(RT, ("[Kernels",), "figure"), (KC, TC),
        lambda ds: (kern("c-1M", "mvdb candidates (default call)")(ds[0]),
                    kern("c-1M", "mvdb candidates (default call)", "pct_of_roofline")(ds[0]),
                    ratio(lik_best("colbert"), at("cases", "colbert", "mvdb-auto", "ms"))(ds[1])),
        pick="in # ms on an H200 (#% of HBM bandwidth); a ColBERT training step #x faster"),
    Fig(README, Cell(RT, ("[Serving over HTTP",), "figure"), SERVE, both(load(64, "qps"), gpu, load(16, "p50_ms")),
        pick="# searches/s from 64 clients at 1M documents on an ~, p50 # ms at 16 clients"),
    Fig(README, Cell(RT, ("[Text ingest",), "figure"), TI,
        both(at("mvdb", "docs_per_s"), gpu, at("speedup")),
        pick="# man-page passages/s through all-MiniLM-L6-v2 on one ~, #x its own"),
]

# docs/scale.md: the measured table (H200 runs of the benchmark runner, two query sets a cell).
MT1 = "| corpus | store | tier | recall@10 | batched QPS | p50 ms | GPU memory held |"
DEV, HOST = {"tier": "device"}, {"tier": "host"}
WARM, COLD = {"tier": "disk"}, {"tier": "disk-cold"}
TT8 = "tiers-topics-1000000-int8-H200.json"
# (corpus, store, tier): file, run (WARM: the codes+disk row, warm then the cold pass).
MEASURED = [
    (("`dups`", "fp16", "device"), DH, DEV),
    (("`dups`", "fp16", "codes+host"), DH, HOST),
    (("`dups`", "fp16", "codes+disk"), DH, WARM),
    (("`dups`", "int8", "device"), "tiers-dups-1000000-int8-H200.json", DEV),
    (("`dups`", "int8", "codes+host"), "tiers-dups-1000000-int8-H200.json", HOST),
    (("`dups`", "int8", "codes+disk"), "tiers-dups-1000000-int8-H200.json", WARM),
    (("`topics`", "fp16", "device"), "tiers-topics-1000000-float16-H200.json", DEV),
    (("`topics`", "fp16", "codes+host"), "tiers-topics-1000000-float16-H200.json", HOST),
    (("`topics`", "fp16", "codes+disk"), "tiers-topics-1000000-float16-H200.json", WARM),
    (("`topics`", "int8", "device"), TT8, DEV),
    (("`topics`", "int8", "codes+host"), TT8, HOST),
]


PARTS_FILES = (DH, "tiers-topics-1000000-float16-H200.json", "tiers-dups-1000000-int8-H200.json", TT8)


def has_part(d: Any, tier: str) -> bool:
    return any(r["tier"] == tier for r in d["runs"])


def part(d: Any, tier: str, key: str) -> float:
    """A codes tier's --parts figure (ms a query), from the row of the first query set."""
    return at("runs", {"tier": tier}, "rows", Q64, "parts", key)(d)


def measured_rows() -> list[Fig]:
    figs = []
    for key, file, run in MEASURED:
        tier = run["tier"]
        for col, k, cold in (("recall@10", "recall10", None), ("batched QPS", "batch_qps", "batch_qps"),
                             ("p50 ms", "single_p50_ms", "single_ms")):
            if run is WARM and cold:
                figs.append(Fig(SCALE, Cell(MT1, key, col), file,
                                both(tier_row(tier, k, Q64), tier_row(tier, k, Q32), at("runs", COLD, "cold", cold)),
                                pick="# / # (cold #)"))
            else:
                figs.append(Fig(SCALE, Cell(MT1, key, col), file, both_qlens(tier, k)))
        figs.append(Fig(SCALE, Cell(MT1, key, "GPU memory held"), file, at("runs", run, "gpu_allocated_gb")))
        if run is not DEV:  # and its share of the same file's device tier
            figs.append(Fig(SCALE, Cell(MT1, key, "GPU memory held"), file,
                            ratio(at("runs", run, "gpu_allocated_gb"), at("runs", DEV, "gpu_allocated_gb"), 100), pick="(#%)"))
    return figs


# The codes' rate (docs/scale.md): each store at its default rate, from the measured table's runs.
B1 = {"tier": "host", "code_bits": 1}
D8, T8 = "tiers-dups-1000000-int8-H200.json", "tiers-topics-1000000-int8-H200.json"
TF = "tiers-topics-1000000-float16-H200.json"


def share(device: dict = DEV) -> Callable:
    """The codes+host run's GPU memory over the same file's device-tier run's, in %."""
    return ratio(at("runs", HOST, "gpu_allocated_gb"), at("runs", device, "gpu_allocated_gb"), 100)


RATE_FIGS = [
    Fig(SCALE, "the fp16 codes tiers hold #% of the device tier's GPU memory", (DH, TF),
        lambda ds: same(round(share()(d)) for d in ds)),
    Fig(SCALE, "the int8 ones #-#% of the int8 device tier's", (D8, T8),
        lambda ds: (min(share()(d) for d in ds), max(share()(d) for d in ds))),
    Fig(SCALE, "at lower recall with short queries (# against # on `dups` with queries of 4-64", (D8, DH),
        lambda ds: (tier_row("host", "recall10")(ds[0]), tier_row("host", "recall10")(ds[1]))),
]


INT8 = D8
CODES2 = at("runs", HOST, "gpu_bytes_per_token")  # of the fp16 run: 2-bit codes, its default
CODES1 = at("runs", HOST, "gpu_bytes_per_token")  # of the int8 run: 1-bit codes, its default
DEVICE_B = ratio(at("runs", DEV, "gpu_allocated_gb"), at("tokens"), 1e9)


def bytes_a_token(ds: list) -> dict[str, float]:
    """The capacity plan's bytes a token at dim 128, from (DH, INT8)."""
    dh, int8 = ds
    if at("runs", HOST, "stats", "codes_bits")(dh) != 2 or at("runs", HOST, "stats", "codes_bits")(int8) != 1:
        raise ValueError("the plan's 2-bit and 1-bit codes come from the fp16 and int8 runs' codes+host tiers")
    return {"device": DEVICE_B(dh), "codes2": CODES2(dh), "codes1": CODES1(int8),
            "device_int8": at("runs", DEV, "gpu_bytes_per_token")(int8),
            "fp16": at("runs", DEV, "stats", "resident_bytes")(dh) / dh["tokens"],
            "int8": at("runs", DEV, "stats", "resident_bytes")(int8) / int8["tokens"]}


CAP_FILES = (DH, INT8)
CT = "| model | documents | tokens | GPU memory, device tier fp16 |"
# Page constants of the plan: an H200's 141 GB counted at 80%; ColBERT 180 tokens, ColPali 1,030.
H200_BYTES = 141e9 * 0.8
DOC_TOKENS = {"ColBERT": 180, "ColPali": 1030}
CAP_ROWS = [(m, n) for m in ("ColBERT", "ColPali") for n in ("10M", "100M", "1B")]


def test_capacity_plan_states_its_parameters():
    text = read_page(ROOT, SCALE)
    for phrase in ("over an H200's 141 GB counted at 80% (112.8 GB)", "ColBERT passages of 180 tokens and ColPali pages of 1,030"):
        assert re.search(lit(phrase), text), f"{SCALE}: {phrase!r} changed: update H200_BYTES / DOC_TOKENS here"


def gpu_bytes(ds: list, tokens: float, which: str) -> float:
    """The plan's arithmetic: tokens x the bytes a token as the page prints them (260, 38, 22)."""
    return tokens * round(bytes_a_token(ds)[which])


CT_POOLED = "| model | documents | vectors, pool_factor 2 |"


def capacity_rows(table: str = CT, pool_factor: int = 1) -> list[Fig]:
    """The plan's rows; with ``pool_factor``, of documents pooled by it (1 + (n - 1) // f vectors)."""
    figs = []
    for model, docs in CAP_ROWS:
        per_doc = DOC_TOKENS[model] if pool_factor == 1 else 1 + (DOC_TOKENS[model] - 1) // pool_factor
        n = {"10M": 1e7, "100M": 1e8, "1B": 1e9}[docs] * per_doc
        key = (model, docs)
        figs.append(Fig(SCALE, Cell(table, key, 2), CAP_FILES, lambda ds, n=n: Qty(n)))
        for col, which in ((3, "device"), (5, "codes2"), (7, "codes1")):
            # the GPU memory, then the H200s it takes, rounded up
            figs.append(Fig(SCALE, Cell(table, key, col), CAP_FILES, lambda ds, n=n, w=which: Qty(gpu_bytes(ds, n, w))))
            figs.append(Fig(SCALE, Cell(table, key, col + 1), CAP_FILES,
                            lambda ds, n=n, w=which: math.ceil(gpu_bytes(ds, n, w) / H200_BYTES)))
        figs.append(Fig(SCALE, Cell(table, key, 9), CAP_FILES,
                        lambda ds, n=n: tuple(Qty(n * round(bytes_a_token(ds)[w])) for w in ("fp16", "int8"))))
    return figs


SCALE_FIGS = [
    *measured_rows(),
    *RATE_FIGS,
    Fig(SCALE, "`dups`: 1M docs, #M tokens", DH, at("tokens", times=1e-6)),
    Fig(SCALE, "`topics`: 1M docs, #M tokens", "tiers-topics-1000000-float16-H200.json", at("tokens", times=1e-6)),
    Fig(SCALE, "most of all in the int8 codes tiers (# against # on `dups`)", "tiers-dups-1000000-int8-H200.json",
        both_qlens("host", "recall10")),
    Fig(SCALE, "fp16 `topics` codes tiers' p50 (# ms; # warm from the page cache)", "tiers-topics-1000000-float16-H200.json",
        both(tier_row("host", "single_p50_ms"), tier_row("disk", "single_p50_ms"))),
    Fig(SCALE, "the int8 `topics` run's codes+host p50 is # ms", TT8, tier_row("host", "single_p50_ms")),
    Fig(SCALE, "fp16 `dups` # QPS with queries of #-# tokens and # with # (target 3,000), `topics` # and #; int8 #-#.",
        PARTS_FILES,
        lambda ds: (tier_row("host", "batch_qps")(ds[0]), 4, 64, tier_row("host", "batch_qps", Q32)(ds[0]), 32,
                    *both_qlens("host", "batch_qps")(ds[1]),
                    min(v for d in ds[2:] for v in both_qlens("host", "batch_qps")(d)),
                    max(v for d in ds[2:] for v in both_qlens("host", "batch_qps")(d)))),
    Fig(SCALE, "Its recall with 4-64-token queries is lower than with 32: # and # (fp16), # and # (int8).", PARTS_FILES,
        lambda ds: tuple(tier_row("host", "recall10")(d) for d in ds)),
    # where a codes-tier query's time goes (--parts): the host runs, then every codes run's range
    Fig(SCALE, ("the pool from the lists #-#; the codes' ranking of 8,192 documents #-# (#-# decoding "
                "byte by byte"), PARTS_FILES,
        lambda ds: tuple(f(part(d, t, k) for d in ds for t in ("host", "disk", "disk-cold") if has_part(d, t))
                         for k in ("pool_ms", "codes_ms", "codes_bytewise_ms") for f in (min, max))),
    Fig(SCALE, "rerank from host memory # (fp16 `dups`) / # (fp16 `topics`) / # and # (int8), #-# from the page cache",
        PARTS_FILES,
        lambda ds: (*(part(d, "host", "exact_ms") for d in ds),
                    *(f(part(d, t, "exact_ms") for d in ds for t in ("disk", "disk-cold") if has_part(d, t))
                      for f in (min, max)))),
    Fig(SCALE, "(the default) took # / # / # / # ms where the MaxSim kernel reading in place took # / # / # / #",
        PARTS_FILES,
        lambda ds: (*(part(d, "host", "exact_ms") for d in ds), *(part(d, "host", "exact_in_place_ms") for d in ds))),
    # The capacity plan's bytes a token, and the table computed from them.
    Fig(SCALE, "1M `dups` documents): # B in the device tier, fp16 (on an H200: # GB, `gpu_allocated_gb`", DH,
        both(DEVICE_B, at("runs", {"tier": "device"}, "gpu_allocated_gb"))),
    Fig(SCALE, "in the codes tiers # B with 2-bit codes (fp16 stores' default) and # B with 1-bit codes", CAP_FILES,
        lambda ds: (bytes_a_token(ds)["codes2"], bytes_a_token(ds)["codes1"])),
    Fig(SCALE, ("`gpu_bytes_per_token` # of the fp16 codes+host run in `tiers-dups-1000000-float16-H200.json` "
                "and # of the int8 one in `tiers-dups-1000000-int8-H200.json`"), CAP_FILES,
        lambda ds: (bytes_a_token(ds)["codes2"], bytes_a_token(ds)["codes1"])),
    Fig(SCALE, "The exact tokens take # (fp16) or # (int8) B a token in host memory", CAP_FILES,
        lambda ds: (bytes_a_token(ds)["fp16"], bytes_a_token(ds)["int8"])),
    Fig(SCALE, "(fp16: # B a token at dim 128, int8: # B)", CAP_FILES,
        lambda ds: (bytes_a_token(ds)["fp16"], bytes_a_token(ds)["int8"])),
    *capacity_rows(),
    *capacity_rows(CT_POOLED, pool_factor=2),
    Fig(SCALE, "vectors, # of a 180-token ColBERT passage and # of a 1,030-token ColPali page", CAP_FILES,
        lambda ds: (1 + 179 // 2, 1 + 1029 // 2)),
    Fig("docs/guides/scale-out.md", ("10M ColBERT passages (#B tokens) need # H200s with the tokens "
                                     "on the GPU, or one with the codes tier; 100M need #, or #."),
        CAP_FILES, lambda ds: (1e7 * 180 / 1e9,
                               *(math.ceil(n * round(bytes_a_token(ds)[w]) / H200_BYTES)
                                 for n, w in ((1.8e9, "device"), (1.8e10, "device"), (1.8e10, "codes2"))))),
    Fig(SCALE, "(its build took # s at 1M documents, #M tokens,", FP,
        both(at("build_s"), at("tokens", times=1e-6))),
]

XFILES = tuple(f"cpu-{g}-cpu.json" for g in ("uniform96", "dups", "mixed96"))


def crossover_span(ds: list) -> tuple:
    """Where `auto` picks the lists: their speedup over exhaustive and first open (min, max); and
    `auto`'s worst ratio to the better path at any size."""
    ivf = [r for d in ds for r in d["sizes"] if r["auto_index"] == "ivf"]
    speed = [r["exhaustive_per_query_s"] / r["ivf_per_query_s"] for r in ivf]
    return (min(speed), max(speed), min(r["ivf_open_s"] for r in ivf), max(r["ivf_open_s"] for r in ivf),
            max(r["auto_over_best"] for d in ds for r in d["sizes"]))


# The CPU (docs/benchmarks.md): where `index="auto"` switches, one file a corpus.
XT = "| corpus | documents (tokens) | lists, ms |"
CROSSOVER = [
    Fig(BENCH, Cell(XT, (corpus, f"{docs:,}"), col), f"cpu-{corpus}-cpu.json", at("sizes", {"docs": docs}, key, times=times),
        pick=pick)
    for corpus in ("uniform96", "dups", "mixed96")
    for docs in (1000, 2000, 4000, 8000, 16000, 30000, 60000, 120000)
    for col, key, times, pick in (("documents (tokens)", "tokens", 1e-6, "(#M)"), ("lists, ms", "ivf_per_query_s", 1000, None),
                                  ("lists recall@10", "ivf_recall10", 1, None), ("exhaustive, ms", "exhaustive_per_query_s", 1000, None),
                                  ("auto picks", "auto_index", 1, None), ("auto / best", "auto_over_best", 1, None),
                                  ("lists' first open", "ivf_open_s", 1, "# s"))
] + [
    Fig(BENCH, "the lists answer #-#x faster (their first open trains them: #-# s). At no size is `auto` more than #x slower",
        XFILES, lambda ds: crossover_span(ds)),
    Fig(BENCH, "lists' recall@10 at the CPU's defaults is #-# from 16,000 documents up", XFILES,
        lambda ds: (min(r["ivf_recall10"] for d in ds for r in d["sizes"] if r["docs"] >= 16000),
                    max(r["ivf_recall10"] for d in ds for r in d["sizes"] if r["docs"] >= 16000))),
    Fig(BENCH, ("The issue's case, 30,000 documents of 40-160 tokens at dim 96 (#M tokens): "
                "# ms a query at the defaults against # ms exhaustive (#x), at recall@10 #."),
        "cpu-uniform96-cpu.json",
        lambda d: issue_case(at("sizes", {"docs": 30000})(d))),
    Fig(BENCH, ("(4.4M tokens, dim 128; `python -m benchmarks --label 40000 run first-open`, "
                "`first-open-40000-cpu.json`): # s (the lists trained in # s and assigned in # s"),
        "first-open-40000-cpu.json", both(at("first", "open_s"), at("first", "stats", "build_seconds", "train"),
                                          at("first", "stats", "build_seconds", "assign"))),
    Fig(BENCH, "then persisted), first search # s; every later open # s.", "first-open-40000-cpu.json",
        both(at("first", "first_search_s"), at("reopen", "open_s"))),
    Fig(BENCH, ("`cpu-pool-GEN-120000-cpu.json`): # ms a query at recall@10 "
                "# on `topics`, # ms at # on `dups`, # ms at # on `mixed96`"),
        tuple(f"cpu-pool-{g}-120000-cpu.json" for g in ("topics", "dups", "mixed96")),
        lambda ds: tuple(v for d in ds for v in (at("runs", 0, "searches", {"search": "default"}, "ms_per_query")(d),
                                                 at("runs", 0, "searches", {"search": "default"}, "recall10")(d)))),
]

def issue_case(s: dict) -> tuple:
    return (s["tokens"] / 1e6, s["auto_per_query_s"] * 1000, s["exhaustive_per_query_s"] * 1000,
            s["auto_per_query_s"] / s["exhaustive_per_query_s"], s["auto_recall10"])


# The same runs in docs/scale.md's CPU table.
PT = "| corpus | tokens | lists | build (k-means + assignment) |"
CPU_POOL = [
    Fig(SCALE, Cell(PT, (f"`{g}`",), col), f"cpu-pool-{g}-120000-cpu.json", get, pick=pick)
    for g in ("topics", "dups", "mixed96")
    for col, get, pick in (("tokens", lambda d: Qty(d["tokens"]), None), ("lists", at("runs", 0, "nlist"), None),
                           ("build", at("runs", 0, "build_s"), "# s"),
                           ("ms a query", at("runs", 0, "searches", {"search": "default"}, "ms_per_query"), None),
                           ("recall@10", at("runs", 0, "searches", {"search": "default"}, "recall10"), None),
                           ("the lists' 1,024 alone", at("runs", 0, "pools", {"pool": 1024}, "pool_recall"), None))
]
POOLS = tuple(f"cpu-pool-{g}-120000-cpu.json" for g in ("topics", "dups", "mixed96"))
POOL_ROW = at("runs", 0, "pools", {"pool": 1024})
CPU_POOL += [
    Fig(SCALE, "records a fixed GEMM's time before and after its run (`gemm_probe_ms`, #-# ms here)", POOLS,
        lambda ds: (min(x for d in ds for x in d["gemm_probe_ms"]), max(x for d in ds for x in d["gemm_probe_ms"]))),
    Fig(SCALE, ("crediting) #-# ms, the interaction over # documents another #-# ms, and the exact rerank of "
                "# the rest (# ms on `topics`, # ms on `mixed96`)"), POOLS,
        lambda ds: (min(POOL_ROW(d)["ms_per_query"] for d in ds), max(POOL_ROW(d)["ms_per_query"] for d in ds),
                    4 * 1024 if all(d["factor"] == 4 for d in ds) else None,
                    min(POOL_ROW(d)["ranked_ms_per_query"] - POOL_ROW(d)["ms_per_query"] for d in ds),
                    max(POOL_ROW(d)["ranked_ms_per_query"] - POOL_ROW(d)["ms_per_query"] for d in ds), 1024,
                    *(at("runs", 0, "searches", {"search": "default"}, "ms_per_query")(d) - POOL_ROW(d)["ranked_ms_per_query"]
                      for d in (ds[0], ds[2])))),
]

# (its rows: 32-token queries; the 1M runs measured two query sets, the others 32 tokens only)
SIZES = [
    (("250,000",), "tiers-dups-250000-float16-H200.json", {"tier": "auto"}),
    (("1,000,000", "72.6M", "device"), DH, DEV),
    (("1,000,000", "72.6M", "codes+host"), DH, HOST),
    (("2,000,000", "145.2M", "device"), "tiers-dups-2000000-float16-H200.json", {"tier": "auto"}),
    (("2,000,000", "145.2M", "codes+host"), "tiers-dups-2000000-float16-H200.json", HOST),
]
T2M = "tiers-dups-2000000-float16-H200.json"
CORPUS_SIZE = [
    *[Fig(SCALE, Cell(CS, key, col), file, get)
      for key, file, run in SIZES
      for col, get in (("tokens", lambda d: Qty(d["tokens"])), ("recall@10", at("runs", run, "rows", Q64, "recall10")),
                       ("batched QPS", at("runs", run, "rows", Q64, "batch_qps")),
                       ("p50 ms", at("runs", run, "rows", Q64, "single_p50_ms")))],
    Fig(SCALE, "(`tiers-dups-2000000-float16-H200.json`: # GB on the GPU in the codes+host tier, #% of the device tier's #)",
        T2M, both(at("runs", HOST, "gpu_allocated_gb"), share({"tier": "auto"}), at("runs", {"tier": "auto"}, "gpu_allocated_gb"))),
    Fig(SCALE, ("20 adds of 10,000 documents into the codes+host tier reach "
                "recall@10 # at # QPS against # at # for one bulk build"),
        "grow-dups-200000-host-H200.json",
        both(at("modes", {"mode": "grow20"}, "search", 0, "recall10"), at("modes", {"mode": "grow20"}, "search", 0, "batch_qps"),
             at("modes", {"mode": "bulk"}, "search", 0, "recall10"), at("modes", {"mode": "bulk"}, "search", 0, "batch_qps"))),
    Fig(SCALE, "the index retrains as the corpus grows (#, #, then # lists)", "grow-dups-200000-host-H200.json",
        lambda d: tuple(t["nlist"] for t in at("modes", {"mode": "grow20"}, "trainings")(d))),
    Fig(SCALE, ("two\nstages) it takes # ms a query and reads the codes at # GB/s, #% of the H200's memory"),
        "codes-kernel-q32c-H200.json",
        lambda d: (lambda r: (r["ms_per_query"], r["gb_s"], r["gb_s"] / 4800 * 100))(
            at("rows", {"group": 16, "half": True, "block_d": 32, "warps": 2, "stages": 2, "flat": 0})(d))),
]

# The device tier's pool ranked by the codes (docs/scale.md), one runner file.
PRT, PRF = "| device tier, pool ranked by |", "tiers-1000000-dups-H200.json"


def _prerank(tier: str, setting: dict, key: str) -> Callable:
    return lambda d: tuple(at("runs", {"tier": tier}, "rows", {"qlen": q, **setting}, key)(d) for q in ("4-64", "32"))


def _lists_and_codes(tier: str, setting: dict) -> Callable:
    """A "recall / recall at QPS / QPS QPS" cell of the generators' table."""
    return lambda d: (*_prerank(tier, setting, "recall10")(d), *_prerank(tier, setting, "batch_qps")(d))


GT = "| generator | device tier, the lists |"
# ms a query of the device tier's stages (docs/scale.md): before, now, and the bound
PB, PN = "tiers-1000000-parts-H200.json", PRF


def _part(tier: str, key: str, setting: dict | None = None, times: float = 1) -> Callable:
    return at("runs", {"tier": tier}, "rows", {"qlen": "4-64", **(setting or {})}, "parts", key, times=times)


def _kernels(*names: str) -> Callable:
    """GPU ms a query of the kernels whose names start with any of ``names`` (device tier)."""
    return lambda d: sum(v for k, v in _part("device", "kernels_us")(d).items() if k.startswith(names)) / 1e3


ST = "| stage | before | now | bound |"
C8 = {"pool": 8192, "exact": 128}
STAGES = [
    *[Fig(SCALE, Cell(ST, (row,), col), file, _part("device", key))
      for row, key in (("queries to the device", "prepare_ms"), ("candidates: probes", "candidates_ms"),
                       ("exact MaxSim of 4,096", "exact_ms"), ("scores to hits", "hits_ms"), ("whole search", "search_ms"))
      for col, file in (("before", PB), ("now", PN))],
    Fig(SCALE, Cell(ST, ("exact MaxSim of 4,096",), "bound"), PN, _part("device", "exact_roofline_ms")),
    Fig(SCALE, "| exact MaxSim of 4,096 candidates (# MB) |", PN, _part("device", "exact_bytes_per_query", times=1e-6)),
    Fig(SCALE, Cell(ST, ("of which list crediting",), "now"), PN, _kernels("_credit_tokens_kernel")),
    Fig(SCALE, Cell(ST, ("of which selecting",), "now"), PN,
        _kernels("void at::native::mbtopk::computeBlockDigitCounts<int", "void at::native::mbtopk::gatherTopK<int",
                 "void at::native::mbtopk::computeBlockwiseWithinKCounts<unsigned int, int>",
                 "at::native::mbtopk::computeDigitCumSum", "void at::native::mbtopk::computeBlockwiseKthCounts")),
    Fig(SCALE, Cell(ST, ("with `prerank=\"codes\"`",), "before"), PB,
        at("runs", {"tier": "device+codes"}, "rows", {"qlen": "4-64"}, "parts", "codes_ms")),
    Fig(SCALE, Cell(ST, ("with `prerank=\"codes\"`",), "now"), PN, _part("device+codes", "codes_ms", C8)),
    Fig(SCALE, Cell(ST, ("with `prerank=\"codes\"`",), "bound"), PN,
        lambda d: 8192 * d["tokens"] / d["docs"] * 34 / 4.8e12 * 1e3),
]

PRERANK = [
    Fig(SCALE, Cell(GT, ("`topics`",), "device tier, the lists"), "tiers-1000000-topics-H200.json",
        _lists_and_codes("device", {}), "# / # at # / # QPS"),
    Fig(SCALE, Cell(GT, ("`mixed96`",), "device tier, the lists"), "tiers-1000000-mixed96-lists-H200.json",
        _lists_and_codes("device", {}), "# / # at # / # QPS"),
    Fig(SCALE, Cell(GT, ("`mixed96`",), "device tier, the codes"), "tiers-1000000-mixed96-H200.json",
        _lists_and_codes("device+codes", {"pool": 16384, "exact": 128}), "# / # at # / # QPS"),
    Fig(SCALE, "`topics` (#M tokens,", "tiers-1000000-topics-H200.json", lambda d: d["tokens"] / 1e6),
    Fig(SCALE, "`mixed96` (dim 96, #M tokens,", "tiers-1000000-mixed96-H200.json", lambda d: d["tokens"] / 1e6),
    *STAGES,
] + [
    Fig(SCALE, Cell(PRT, (label,), col), PRF, get)
    for label, tier, setting in (("the lists (default)", "device", {}),
                                 ("the codes, a pool of 8,192, 128 reranked", "device+codes", {"pool": 8192, "exact": 128}),
                                 ("the codes, a pool of 16,384, 128 reranked", "device+codes", {"pool": 16384, "exact": 128}))
    for col, get in (("recall@10", _prerank(tier, setting, "recall10")), ("batched QPS", _prerank(tier, setting, "batch_qps")),
                     ("GPU memory allocated", at("runs", {"tier": tier}, "gpu_allocated_gb")))
]


# Token pooling's quality (docs/guides/database.md), one runner file.
PQ = "pool-quality-manpages-dev-H200.json"
PQT = "| pool_factor | vectors stored | MRR@10 |"
PS = "pool-speed-H200.json"
DB_GUIDE = "docs/guides/database.md"


POOL_QUALITY = [
    Fig(DB_GUIDE, Cell(PQT, (str(f),), col), PQ, at("factors", {"pool_factor": f}, key))
    for f in (1, 2, 3, 4)
    for col, key in (("vectors stored", "tokens"), ("MRR@10", "mrr10"), ("recall@10 of the page", "recall10"),
                     ("top 10 shared", "recall10_vs_unpooled_exhaustive"))
] + [
    Fig(DB_GUIDE, Cell(PQT, (str(f),), col), PQ, at("factors", {"pool_factor": f}, key, times=1e-6))
    for f in (1, 2, 3, 4)
    for col, key in (("GPU MB, device tier", "gpu_bytes_device"), ("GPU MB, codes+host tier", "gpu_bytes_host"))
] + [
    Fig(DB_GUIDE, "the 1,979 man pages of the dev split", PQ, lambda d: () if d["pages"] == 1979 else None),
    Fig(DB_GUIDE, "a quarter #;", PQ,
        lambda d: at("factors", {"pool_factor": 1}, "mrr10")(d) - at("factors", {"pool_factor": 4}, "mrr10")(d)),
    Fig(DB_GUIDE, "60,000 man-page passages through all-MiniLM-L6-v2 in float16 (# tokens a passage)", PS,
        at("tokens_per_doc")),
    Fig(DB_GUIDE, ("`mvdb.pool` on the passages' vectors: # documents/s, against # for Sentence Transformers "
                   "6.0.1's `HierarchicalTokenPooling(pool_factor=2).pool` on the same vectors (#x); the same "
                   "clusters on #% of the passages"), PS,
        both(at("pool", "mvdb_docs_per_s"), at("pool", "st_docs_per_s"), at("pool", "speedup"),
             at("pool", "same_clusters", times=100))),
    Fig(DB_GUIDE, "# documents/s with `pool_factor=2` against # without (#%", PS,
        both(at("ingest", "pool_factor_2", "docs_per_s"), at("ingest", "plain", "docs_per_s"),
             at("ingest", "pooled_over_plain", times=100))),
    Fig("docs/guides/multivector.md", ("# documents/s through mvdb against # for its own `encode_document` in the "
                                       "same process (#x), the vectors equal on the # checked"), PS,
        lambda d: (d["multivector"]["mvdb_docs_per_s"], d["multivector"]["own_docs_per_s"], d["multivector"]["speedup"],
                   d["multivector"]["checked"] if d["multivector"]["max_abs_diff"] == 0 else None)),
]


# Quality, storage, checksums, Ray (docs/benchmarks.md).
OTHER = [
    Fig("docs/guides/text.md", "the MRR@10 of the embeddings path on the same pages, # on all # pages",
        "text-api-manpages-dev-cpu.json",
        lambda d: (same((d["text_path"]["mrr10"], d["embeddings_path"]["mrr10"])), d["pages"])),
    Fig(BENCH, "default settings: MRR@10 #, Recall@10 #, Recall@100 #, identical to exhaustive MaxSim", "quality-manpages-dev-cpu.json",
        lambda d: same(tuple(d[run][k] for k in ("mrr10", "recall10", "recall100")) for run in ("mvdb_k100", "exhaustive"))),
    Fig(BENCH, "ingest # GB/s, open # ms, gather of 1,000 random documents # ms median.",
        "storage-1000000-cpu.json",
        both(at("ingest_gbps"), at("open_seconds_median", times=1000), at("gather_1000_ms_median"))),
    Fig(BENCH, "1M documents of 80-120 tokens, dim 128, fp16: # GB)", "storage-1000000-cpu.json",
        at("store_bytes", times=1e-9)),
    Fig(BENCH, "costs #% of the reopen time (# s against # s for # GB)", "open-checksums-40000-cpu.json",
        lambda d: (100 * d["overhead"], min(d["open_s_checksums_True"]), min(d["open_s_checksums_False"]), d["bytes"] / 1e9)),
    Fig(BENCH, "documents, 768k tokens): # docs/s with one worker; more workers are slower", "ray-ingest-8000-cpu.json",
        lambda d: at("runs", {"workers": 1}, "docs_per_s")(d) if all(
            r["docs_per_s"] < at("runs", {"workers": 1}, "docs_per_s")(d) for r in d["runs"] if r["workers"] > 1) else None),
]

FIGURES: list[Fig] = [*KERNELS, *SEARCH_1M, *LARGE_FIGS, *FIRST_QUERY, *SERVING, *TRAINING,
                      *SPARTON, *HYBRID, *GROW, *DEFAULTS, *E2E_FIGS, *INSTALLS, *TEXT, *HEADLINES, *SCALE_FIGS, *CROSSOVER, *CPU_POOL, *CORPUS_SIZE, *POOL_QUALITY, *PRERANK,
                      *OTHER]


@pytest.mark.parametrize("fig", FIGURES, ids=[f.id() for f in FIGURES])
def test_figure_matches_its_results_file(fig):
    error = check(fig)
    assert error is None, error


def test_figure_ids_are_unique():
    ids = [f.id() for f in FIGURES]
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})


# ---------------------------------------------------------------------------------------------
# Generic checks over every page

def pages(root: Path = ROOT) -> list[str]:
    return ["README.md", *sorted(str(p.relative_to(root)) for p in (root / "docs").rglob("*.md"))]


# Backticked *.json names that are not results files: the database's own files, the API's
# schema, the shipped kernel winners, and the naming scheme of `python -m benchmarks run`.
NOT_RESULTS = {"shards.json", "OUT.pooling.json", "MANIFEST.json", "modules.json", "config_sentence_transformers.json", "/openapi.json",
               "kernels/winners.json",
               "segments/commit-<generation>-<random>.json",
               "benchmarks/results/<suite>-<machine>.json", "<suite>-<machine>-smoke.json"}
PLACEHOLDER = re.compile(r"\*|GEN|\bN\b")


def missing_results_files(root: Path = ROOT) -> list[str]:
    names = {p.name for p in RESULTS.glob("*.json")}
    missing = []
    for page in pages(root):
        for cited in re.findall(r"`([^`\s]+\.json)`", read_page(root, page)):
            if cited in NOT_RESULTS:
                continue
            name = cited.removeprefix("benchmarks/results/")
            if PLACEHOLDER.search(name):
                pattern = re.compile("^" + ".*".join(map(re.escape, PLACEHOLDER.split(name))) + "$")
                if any(pattern.match(n) for n in names):
                    continue
            elif name in names:
                continue
            missing.append(f"{page}: `{cited}`")
    return missing


def test_cited_results_files_exist():
    missing = missing_results_files()
    assert not missing, "pages cite results files that benchmarks/results/ does not hold:\n" + "\n".join(missing)


BYTES_PHRASE = re.compile(rf"(?<!/ )((?:{NUM})(?:(?:,\s+|\s+or\s+|-)(?:{NUM}))*)\s+B\s+a\s+token")
BYTES_HEADER = re.compile(r"\b(?:[Bb]ytes|B) a token")


def bytes_a_token_figures(root: Path = ROOT) -> list[str]:
    """Every "N B a token" figure, and every figure of a "bytes a token" table column (all columns
    where the first header cell says it), that is not one the capacity plan takes from its files."""
    plan = bytes_a_token([result(f) for f in CAP_FILES])
    allowed = {round(v) for v in plan.values()} | {round(v, 1) for v in plan.values()}

    def off(s: str) -> bool:
        return any(number(n)[0] not in allowed for n in NUM_RE.findall(s))

    wrong = []
    for page in pages(root):
        text = read_page(root, page)
        wrong += [f"{page}: {m.group(0)!r}" for m in BYTES_PHRASE.finditer(text) if off(m.group(1))]
        lines = text.splitlines()
        for line, below in pairwise(lines):
            if not (line.startswith("|") and below.startswith("|-") and BYTES_HEADER.search(line)):
                continue
            rows = table(text, line)
            cols = [j for j, h in enumerate(rows[0]) if BYTES_HEADER.search(h)]
            if cols == [0]:  # the table's own unit: every other column
                cols = list(range(1, len(rows[0])))
            wrong += [f"{page}: column {rows[0][j]!r}: {row[j]!r}"
                      for row in rows[1:] for j in cols if j < len(row) and off(row[j])]
    return wrong


def test_bytes_a_token_are_the_capacity_plans():
    wrong = bytes_a_token_figures()
    assert not wrong, ("bytes a token the capacity plan in docs/scale.md does not take from its results files "
                       "(link to the plan instead):\n" + "\n".join(wrong))



# What the benchmark runner records in every file (`python -m benchmarks run`).
PROVENANCE = ("suite", "command", "date", "machine", "versions")


def test_results_files_record_how_they_were_made():
    lacking = {}
    for p in sorted(RESULTS.glob("*.json")):
        d = json.loads(p.read_text())
        missing = [k for k in PROVENANCE if not (isinstance(d, dict) and d.get(k))]
        if missing:
            lacking[p.name] = missing
    assert not lacking, f"results files without {', '.join(PROVENANCE)} (write them with `python -m benchmarks run`): {lacking}"
