"""The search pipeline over one engine :class:`~mvdb.engine.state.State`, batched end to end.

1. Candidates from the token index: flat (each query token's k' nearest stored tokens, documents
   scored by ``approximate_candidates``) or IVF (centroid lists, mvdb.engine.ivf); plus, when the
   queries carry sparse vectors, the best sparse dot products (mvdb.engine.sparse).
2. The exact rerank of the candidates (mvdb.engine.resident.Tokens.score), top-k out.
3. Filters that leave a query with fewer than k candidates: every matching document is scored.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from mvdb.engine import codes as codes_tier
from mvdb.engine import ivf
from mvdb.engine.filters import allowed_rows
from mvdb.engine.flat import approximate_candidates
from mvdb.engine.sparse import query_sparse, sparse_candidates
from mvdb.kernels.host import upload_all
from mvdb.storage import validate
from mvdb.storage.packed import torch_ready
from mvdb.errors import InvalidInputError, InvalidTypeError

# Defaults chosen so that nobody needs to tune them (docs/scale.md, docs/benchmarks.md).
DEFAULT_K_TOKENS = 512  # flat index: nearest stored tokens per query token
DEFAULT_CANDIDATES = 256  # flat index: documents reranked exactly per query
DEFAULT_LISTS_PROBE = 20  # IVF: lists probed per query token (docs/benchmarks.md, defaults)
DEFAULT_LISTS_CANDIDATES = 4096  # IVF: documents reranked exactly per query, up to 1M documents
# On a CPU the lists are finer (ivf.CPU_LISTS_PER_SQRT), so fewer probes keep the same recall, and
# they hand ivf.CPU_POOL_PER_CANDIDATE times the documents to the centroid interaction, whose best
# go to the exact rerank, which costs a CPU most of a search: a quarter of a GPU's (up to 1M documents).
CPU_LISTS_PROBE = 16
CPU_LISTS_CANDIDATES = 1024
# ... for a query of CPU_WIDTH_TOKENS tokens. A short query's few tokens rank the candidates less
# surely (and its exact rerank costs less), a long one's more surely: at the defaults each CPU
# query takes CPU_LISTS_CANDIDATES * (CPU_WIDTH_TOKENS / its tokens) ** CPU_WIDTH_POWER, within
# [1/2, 4] times CPU_LISTS_CANDIDATES (cpu_widths; benchmarks/cpu_crossover.py)
CPU_WIDTH_TOKENS = 32
CPU_WIDTH_POWER = 0.5
# ... past 1M the pool grows with the square root of the corpus (a fixed pool covers a shrinking
# share of a growing one), at most LISTS_CANDIDATES_MAX; an int8 store reranks twice as many (its
# tokens are half the bytes, and its rounded scores need the wider pool to keep recall: docs/scale.md)
LISTS_CANDIDATES_MAX = 32768


def default_lists_candidates(n_live: int, int8: bool = False, cpu: bool = False) -> int:
    """Documents the IVF stage hands the exact rerank per query at the defaults (device tier)."""
    per = 2 if int8 else 1
    share = CPU_LISTS_CANDIDATES / DEFAULT_LISTS_CANDIDATES if cpu else 1
    return int(min(LISTS_CANDIDATES_MAX, per * share * max(DEFAULT_LISTS_CANDIDATES, 4.096 * max(1, n_live) ** 0.5)))


def cpu_widths(n_cand: int, cu: list[int]) -> list[int]:
    """Each query's number of candidates on a CPU at the defaults (see CPU_WIDTH_POWER), from
    ``n_cand`` for a query of CPU_WIDTH_TOKENS tokens, in steps of 64."""
    out = []
    for a, b in zip(cu, cu[1:]):
        w = n_cand * (CPU_WIDTH_TOKENS / max(1, b - a)) ** CPU_WIDTH_POWER
        out.append(int(min(4 * n_cand, max(n_cand // 2, -(-w // 64) * 64))))
    return out


def default_probe(device: torch.device) -> int:
    return CPU_LISTS_PROBE if device.type == "cpu" else DEFAULT_LISTS_PROBE


DEFAULT_SPARSE_CANDIDATES = 100  # documents the sparse (lexical) channel adds per query


class Hit(NamedTuple):
    id: object
    score: float


class Queries(NamedTuple):
    q: torch.Tensor  # [Tq, dim] float32 on the device
    cu: torch.Tensor  # [Nq + 1] int32 on the device
    cu_host: list  # the same offsets as ints
    single: bool
    qid: torch.Tensor | None = None  # [Tq] int32 on the device: each token's query

    @property
    def n(self) -> int:
        return len(self.cu_host) - 1

    @property
    def longest(self) -> int:
        return max((b - a for a, b in zip(self.cu_host, self.cu_host[1:])), default=0)


K_MAX = 2**63 - 1  # the largest k (and candidate / token / list count) a search takes: int64


def check_k(k, name: str = "k") -> None:
    """``k`` (or another count of a search) a positive int up to :data:`K_MAX`; hits are capped
    by the number of live documents anyway."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise InvalidTypeError(f"{name}: expected a positive int, got {type(k).__name__}")
    if k <= 0 or k > K_MAX:
        raise InvalidInputError(f"{name}: expected a positive int up to {K_MAX:,} (hits are capped by the number of "
                                f"documents), got {k}")


def is_batch(queries) -> bool:
    """One query [Lq, dim], or a batch (a list / tuple, or [Nq, Lq, dim])."""
    return isinstance(queries, (list, tuple)) or getattr(queries, "ndim", 2) == 3


def empty_answer(st, queries, device: torch.device):
    """The answer of a search over a state with nothing to search (no documents, or none live):
    no hits per query, after the same checks of the queries; None when there is something."""
    if st.tokens is not None and st.snap.n_live:
        return None
    if st.dim:
        qs = prepare(queries, st.dim, device)
        return [] if qs.single else [[] for _ in range(qs.n)]
    return [[] for _ in range(len(queries))] if is_batch(queries) else []


def prepare(queries, dim: int, device: torch.device) -> Queries:
    """One query [Lq, dim] or a batch (list, or [Nq, Lq, dim]) -> packed float32 queries."""
    def as_tensor(x, where):
        if isinstance(x, np.ndarray):
            if x.dtype.kind not in "fiu":
                raise InvalidTypeError(f"{where}: expected a numeric array, got dtype {x.dtype}")
            return torch.from_numpy(torch_ready(x))
        if isinstance(x, torch.Tensor):
            validate.dense_tensor(x, where)
            if x.is_complex() or x.dtype == torch.bool:
                raise InvalidTypeError(f"{where}: expected a real-valued tensor, got dtype {x.dtype}")
            return x.detach()
        raise InvalidTypeError(f"{where}: expected a numpy array or torch tensor, got {type(x).__name__}")

    if isinstance(queries, (list, tuple)):
        items, single = [as_tensor(x, f"queries[{i}]") for i, x in enumerate(queries)], False
        for i, t in enumerate(items):
            if t.dim() != 2 or t.shape[1] != dim:
                raise InvalidInputError(f"query {i}: expected shape [Lq, {dim}], got {tuple(t.shape)}")
            if t.shape[0] == 0:
                raise InvalidInputError(f"query {i}: empty (0 tokens)")
        lens = [t.shape[0] for t in items]
        if not items:
            q = torch.zeros(0, dim, device=device)
        elif all(t.device.type == "cpu" for t in items):  # one host-to-device copy for the batch (below)
            q = torch.cat([t.to(torch.float32) for t in items])
        elif len({(t.device, t.dtype) for t in items}) == 1:  # one conversion for the batch, not one a query
            q = torch.cat(items).to(device, torch.float32)
        else:
            q = torch.cat([t.to(device, torch.float32) for t in items])
    else:
        t = as_tensor(queries, "queries")
        if t.dim() not in (2, 3):
            raise InvalidInputError(f"queries: expected [Lq, dim], [Nq, Lq, dim] or a list, got shape {tuple(t.shape)}")
        single = t.dim() == 2
        t = t[None] if single else t
        if t.shape[2] != dim:
            raise InvalidInputError(f"query 0: expected shape [Lq, {dim}], got {tuple(t.shape[1:])}")
        if t.shape[1] == 0 and t.shape[0]:
            raise InvalidInputError("query 0: empty (0 tokens)")
        lens = [t.shape[1]] * t.shape[0]
        if t.device.type == "cpu":  # float64 is narrowed before the check (1e300 is finite, its float32 is not)
            q = (t.float() if t.dtype == torch.float64 else t).reshape(-1, dim)
        else:
            q = t.to(device, torch.float32).reshape(-1, dim)
    cu_np = np.concatenate(([0], np.cumsum(lens, dtype=np.int64)))
    cu_host = cu_np.tolist()
    cu = torch.from_numpy(cu_np.astype(np.int32))
    qid = torch.from_numpy(np.repeat(np.arange(len(lens), dtype=np.int32), lens))
    # One check for the batch (then name the query). Small host batches (what a server hands
    # over) are checked on the host, where a check on the device would wait for it; they are
    # copied over in their own dtype (fp16 stays 2 bytes a value) with the offsets, in one copy
    # that does not wait, and converted there.
    if q.device.type == "cpu" and q.numel() <= HOST_CHECK_MAX:
        ok = in_range_on_host(q)
        q, cu, qid = upload_all([q.contiguous(), cu, qid], device)
    else:
        q = q.to(device)
        cu, qid = upload_all([cu, qid], device)
        ok = not q.numel() or bool((q.abs() <= QUERY_MAX).all())  # (NaN compares False)
    if not ok:
        q = q.float()
        bad = (~(q.abs() <= QUERY_MAX).all(dim=1)).nonzero()[0, 0].item()
        i = int(np.searchsorted(np.asarray(cu_host), bad, side="right")) - 1
        raise InvalidInputError(out_of_range(q[bad].cpu().numpy(), f"query {i}"))
    return Queries(q.float(), cu, cu_host, single, qid)


# Query values at most this large in magnitude (float16's largest): the GPU kernels compute the
# query tokens in float16, and with stored values in the same range (float16 stores; int8 stores
# at most mvdb.storage.validate.INT8_VALUE_MAX) no score can overflow float32.
QUERY_MAX = validate.FP16_MAX


def out_of_range(row: np.ndarray, where: str) -> str:
    """The message for a query row holding NaN, Inf or a value beyond QUERY_MAX."""
    if not np.isfinite(row).all():
        return f"{where}: contains NaN or Inf"
    v = float(row[np.argmax(np.abs(row))])
    return (f"{where}: value {v:.4g} is out of range (query values must lie within +-{QUERY_MAX:g}, the float16 "
            f"range the kernels compute in; scale the query)")


HOST_CHECK_MAX = 1 << 20  # query values checked for NaN / Inf on the host at most (else on the device)
_EXPONENT = {torch.float16: (np.uint16, 0x7C00)}


def in_range_on_host(t: torch.Tensor) -> bool:
    """No NaN, Inf or value beyond QUERY_MAX in the host tensor ``t``: for fp16 from the exponent
    bits (all ones only there: every finite fp16 is in range) in numpy, where torch's isfinite on a
    CPU half tensor emulates floats (over 30 times slower for a batch of 5 x 32 x 128)."""
    if t.dtype in _EXPONENT:
        as_int, mask = _EXPONENT[t.dtype]
        bits = t.contiguous().numpy().view(as_int)
        return not bool(((bits & mask) == mask).any())
    return bool((t.abs() <= QUERY_MAX).all())


def union(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per row, the candidates of a and b without repeats (-1 pads the rest)."""
    c = torch.cat([a, b.to(a.device)], dim=1).sort(dim=1, descending=True).values
    dup = torch.zeros_like(c, dtype=torch.bool)
    dup[:, 1:] = c[:, 1:] == c[:, :-1]
    return torch.where(dup, -1, c)


def decode_keys(keys: np.ndarray) -> list:
    return [x.decode() for x in keys.tolist()] if keys.dtype.kind == "S" else keys.tolist()


class PendingHits(NamedTuple):
    """The best scores and rows of a batch on their way to the host (:func:`hits_start`)."""

    both: torch.Tensor | None  # [2, Nq, n] float64 scores and rows (None: no hits); on the host
    copied: torch.cuda.Event | None  # recorded after the copy from the device (None: already there)
    n_queries: int


def hits_start(scores: torch.Tensor, rows: torch.Tensor, k: int | None) -> PendingHits:
    """The device's half of :func:`hits`: the top k of each row, sent to the host by a copy that
    does not wait (the host may work on something else until :func:`hits_end`)."""
    n = scores.shape[1] if k is None else min(k, scores.shape[1])
    if n == 0:
        return PendingHits(None, None, scores.shape[0])
    top = scores.topk(n, dim=1)
    # one copy to the host for both (float64 holds float32 scores and row numbers exactly)
    both = torch.stack([top.values.double(), rows.gather(1, top.indices).double()])
    if not both.is_cuda:
        return PendingHits(both, None, scores.shape[0])
    host = both.to("cpu", non_blocking=True)  # into pinned memory
    copied = torch.cuda.Event()
    copied.record(torch.cuda.current_stream(both.device))
    return PendingHits(host, copied, scores.shape[0])


def hits_end(pending: PendingHits, keys: np.ndarray) -> list[list[Hit]]:
    """The host's half of :func:`hits`: waits for the copy, then names the rows."""
    if pending.both is None:
        return [[] for _ in range(pending.n_queries)]
    if pending.copied is not None:
        pending.copied.synchronize()
    both = pending.both.numpy()
    vals, sel = both[0], both[1].astype(np.int64)
    ok = ((sel >= 0) & ~np.isneginf(vals)).tolist()
    vals = vals.tolist()
    ids = keys[np.maximum(sel, 0)]
    ids = [[x.decode() for x in r] for r in ids.tolist()] if ids.dtype.kind == "S" else ids.tolist()
    return [[Hit(i, v) for i, v, good in zip(kr, vr, okr) if good] for kr, vr, okr in zip(ids, vals, ok)]


def hits(scores: torch.Tensor, rows: torch.Tensor, keys: np.ndarray, k: int | None) -> list[list[Hit]]:
    """Best-first hits per query from scores/rows [Nq, K] (padding rows -1 / -inf dropped)."""
    return hits_end(hits_start(scores, rows, k), keys)


def exhaustive(state, qs: Queries, k: int, live: torch.Tensor, budget: int = 1 << 28) -> list[list[Hit]]:
    """Exact MaxSim of every query against every live row (no candidate stage), top-k; queries
    in chunks whose [queries, rows] score table stays near ``budget`` bytes."""
    keys = state.snap.row_keys()
    out = []
    step = max(1, budget // max(1, 4 * state.n_rows))
    for a in range(0, qs.n, step):
        b = min(qs.n, a + step)
        cu = qs.cu[a : b + 1] - qs.cu[a]
        s = state.tokens.score_all(qs.q[qs.cu_host[a] : qs.cu_host[b]], cu, qs.longest)
        s.masked_fill_(~live[None], float("-inf"))
        rows = torch.arange(state.n_rows, device=s.device).expand(b - a, -1)
        out += hits(s, rows, keys, k)
    return out


def candidates(state, qs: Queries, k: int, live: torch.Tensor, *, n_candidates=None, k_tokens=None, nprobe=None,
               sparse=None, n_sparse=None, n_live: int | None = None, ordered: bool = False) -> torch.Tensor:
    """The rows the exact stage reranks per query [Nq, width] (-1 pads); ``n_live``: the rows
    ``live`` allows where the caller knows it (else counted, a wait for the device); ``ordered``:
    best approximate score first (the IVF stage otherwise leaves them in any order: the rerank
    does not need one)."""
    for name, v in (("n_candidates", n_candidates), ("k_tokens", k_tokens), ("nprobe", nprobe), ("n_sparse", n_sparse)):
        if v is not None:
            check_k(v, name)
    index = state.index
    is_ivf = isinstance(index, ivf.Lists)
    # never wider than the live (matching) documents: k=10**9 must not allocate [Nq, 8e9] tables
    n_live = int(live.sum()) if n_live is None else n_live
    cap = max(1, n_live)
    all_live = n_live == state.n_rows  # (no dead or filtered-out row to mask)
    k = min(k, cap)
    on_cpu = qs.q.device.type == "cpu"
    default = default_lists_candidates(cap, getattr(state.tokens, "int8", False), on_cpu) if is_ivf \
        else DEFAULT_CANDIDATES
    n_cand = min(n_candidates or max(default, 8 * k), cap)
    n_sparse = min(n_sparse or DEFAULT_SPARSE_CANDIDATES, cap)
    if is_ivf and state.residuals is not None:
        # the compressed tier: a large pool from the lists, ranked by approximate MaxSim over the
        # codes; the best n_candidates go to the exact rerank (which reads the exact tokens off
        # the device)
        pool = min(max(codes_tier.default_pool(cap), n_candidates or 0), cap)
        n_exact = min(n_candidates or codes_tier.default_exact(k), pool)
        cand = index.candidates(qs.q, qs.cu_host, live, pool, nprobe or default_probe(qs.q.device), cu_dev=qs.cu,
                                qid=qs.qid, ordered=False, all_live=all_live)
        approx = state.residuals.score(qs.q, qs.cu, state.tokens.offsets, cand, qs.longest)
        top = approx.topk(n_exact, dim=1, sorted=ordered)
        cand = cand.gather(1, top.indices).masked_fill(top.values == float("-inf"), -1)
    elif is_ivf:
        # (a CPU's lists hand a wider pool to the centroid interaction, which picks what is
        # reranked; at the defaults each query as many as its length asks for)
        widths = None
        if on_cpu and n_candidates is None:
            widths = [min(w, cap) for w in cpu_widths(n_cand, qs.cu_host)]
            n_cand = max(widths)
        cand = index.candidates(qs.q, qs.cu_host, live, n_cand, nprobe or default_probe(qs.q.device), cu_dev=qs.cu,
                                qid=qs.qid, ordered=ordered, pool=ivf.CPU_POOL_PER_CANDIDATE * n_cand if on_cpu else None,
                                widths=widths, all_live=all_live)
    else:
        kk = min(k_tokens or DEFAULT_K_TOKENS, index.ntotal)
        sims, pos = index.search(qs.q, kk)
        offsets = state.tokens.offsets
        rows = torch.searchsorted(offsets, pos.to(offsets.device), right=True) - 1
        rows = torch.where(pos >= 0, rows, torch.full_like(rows, -1))
        cand = approximate_candidates(sims.to(qs.q.device), rows, live, qs.cu, n_cand)
    if sparse is not None:
        extra = sparse_candidates(state, [sparse] if qs.single else sparse, qs.n, live, n_sparse)
        cand = union(cand, extra)
    return cand


# A batch of more than PIPELINE_QUERIES queries runs in parts of that many: on a GPU the host turns
# one part's scores into hits while the device works on the next (else the device waits for it)
PIPELINE_QUERIES = 256


def part(qs: Queries, a: int, b: int) -> Queries:
    """Queries a .. b - 1 of the batch ``qs`` (views; offsets counted from the part's first token)."""
    if a == 0 and b == qs.n:
        return qs
    t0, t1 = qs.cu_host[a], qs.cu_host[b]
    return Queries(qs.q[t0:t1], qs.cu[a : b + 1] - t0, [c - t0 for c in qs.cu_host[a : b + 1]], False,
                   None if qs.qid is None else qs.qid[t0:t1] - a)


def pipelined(state, qs: Queries, k: int, live: torch.Tensor, n_live: int, keys: np.ndarray,
              options: dict) -> list[list[Hit]]:
    """:func:`search`'s candidates, rerank and hits, a part of PIPELINE_QUERIES queries at a time
    (the batch whole where it has sparse vectors): each part's launches are queued before the
    host names the previous part's hits."""
    step = qs.n if options.get("sparse") is not None else PIPELINE_QUERIES
    out, pending = [], None
    for a in range(0, qs.n, step):
        p = part(qs, a, min(qs.n, a + step))
        cand = candidates(state, p, k, live, n_live=n_live, **options)
        queued = hits_start(state.tokens.score(p.q, p.cu, cand, p.longest), cand, k)
        if pending is not None:
            out += hits_end(pending, keys)
        pending = queued
    return out + hits_end(pending, keys)


def search(state, qs: Queries, k: int, where=None, *, exact: bool = False, **options) -> list[list[Hit]]:
    """Top-k documents per query by exact MaxSim among the candidates (see the module docstring);
    ``exact=True`` scores every (matching) live document instead."""
    check_k(k)
    keys = state.snap.row_keys()
    if where is None:  # the snapshot counts its live rows: no wait for the device
        live, n_live = state.live, state.snap.n_live
    else:
        live = allowed_rows(state, where)
        n_live = int(live.sum())
    k = min(k, max(1, n_live))  # fewer hits, not a huge allocation, when k exceeds the documents
    if exact or (state.index is not None and state.index.kind == "flat" and qs.q.device.type == "cpu"
                 and options.get("k_tokens") is None and options.get("n_candidates") is None):
        # On a CPU a flat index's candidate stage is itself one GEMM over every stored token, as
        # much as exhaustive MaxSim: scoring every document exactly is then never slower (and exact;
        # it covers whatever a sparse channel would add, and nprobe has no meaning here). Only the
        # flat index's own options route through it (which fills it on first use).
        sparse = options.get("sparse")
        if sparse is not None:  # checked as the sparse channel would check it
            query_sparse([sparse] if qs.single else sparse, qs.n)
        return exhaustive(state, qs, k, live)
    out = pipelined(state, qs, k, live, n_live, keys, options)
    short = [i for i, h in enumerate(out) if len(h) < k]
    if short:
        short = [i for i in short if len(out[i]) < n_live]
    if short:
        # Filters can leave too few candidates: score every matching document for those queries.
        matching = torch.nonzero(live).flatten()
        for i in short:
            a, b = qs.cu_host[i], qs.cu_host[i + 1]
            cu = torch.tensor([0, b - a], dtype=torch.int32, device=qs.q.device)
            s = state.tokens.score(qs.q[a:b], cu, matching[None], b - a)
            out[i] = hits(s, matching[None], keys, k)[0]
    return out


def rerank(state, qs: Queries, candidate_ids, k: int | None) -> list[list[Hit]]:
    """Exact MaxSim of each query against its own candidate ids (one list per query)."""
    def is_list(x) -> bool:
        if getattr(x, "ndim", 1) == 0:  # a 0-d array has __len__ but no length
            return False
        return not isinstance(x, (str, bytes, dict)) and hasattr(x, "__len__") and hasattr(x, "__iter__")

    expected = "a list of ids" if qs.single else "one list of ids per query"
    if not is_list(candidate_ids):
        raise InvalidTypeError(f"candidate_ids: expected {expected}, got {type(candidate_ids).__name__}")
    lists = [candidate_ids] if qs.single else list(candidate_ids)
    if len(lists) != qs.n:
        raise InvalidInputError(f"candidate_ids: expected {qs.n} lists (one per query), got {len(lists)}")
    for i, c in enumerate(lists):
        at = "candidate_ids" if qs.single else f"candidate_ids[{i}]"
        if not is_list(c):
            raise InvalidTypeError(f"{at}: expected a list of ids, got {type(c).__name__}")
        for j, v in enumerate(c.tolist() if hasattr(c, "tolist") else c):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer, str)):
                raise InvalidTypeError(f"{at}[{j}]: expected an int or str id, got {type(v).__name__}")
    width = max((len(c) for c in lists), default=0)
    cand = torch.full((len(lists), width), -1, dtype=torch.int64)
    for i, c in enumerate(lists):
        if len(c):
            cand[i, : len(c)] = torch.from_numpy(state.snap.rows(c))
    cand = cand.to(qs.q.device)
    scores = state.tokens.score(qs.q, qs.cu, cand, qs.longest)
    return hits(scores, cand, state.snap.row_keys(), k)
