"""The database: a segment store, a FAISS token index, and the fused MaxSim rerank.

    db = mvdb.open("my.mvdb")
    ids = db.add(doc_embs)                  # list of [L_i, dim] arrays / tensors
    hits = db.search(q_embs, k=10)          # one query [Lq, dim] -> list[Hit]; a batch -> list[list[Hit]]
    hits = db.rerank(q_embs, candidate_ids) # exact MaxSim over stored documents

Search is two stages in one batched pass: every query token asks the token index for its nearest
stored tokens; tokens map to their documents on the device; documents get an approximate score
(missing tokens imputed with that query token's k'-th similarity); the best ``n_candidates`` per
query are scored exactly by ``maxsim_candidates`` over the resident CSR store.
"""

from __future__ import annotations

import time
from json import loads as json_loads
from typing import NamedTuple

import numpy as np
import torch

from mvdb.errors import InvalidInputError, InvalidTypeError
from mvdb.index import DEFAULT_NPROBE, TokenIndex, approximate_candidates
from mvdb.kernels import maxsim_candidates, maxsim_varlen
from mvdb.storage import Store
from mvdb.storage._validate import decode_id


# Defaults chosen so that nobody needs to tune them (see tests/test_database.py recall test).
DEFAULT_K_TOKENS = 512  # nearest stored tokens per query token (128 gave recall@10 0.83 on the synthetic corpus)
DEFAULT_CANDIDATES = 256  # documents reranked exactly per query


class Hit(NamedTuple):
    id: object
    score: float


def _device(device) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    d = torch.device(device)
    if d.type == "cuda" and not torch.cuda.is_available():
        raise InvalidInputError(f"device: {device!r} asked for, but CUDA is not available here")
    return d


def _queries(queries, dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """One query [Lq, dim] or a batch (list, or [Nq, Lq, dim]) -> packed float32 q, cu_q, single."""
    def as_tensor(x, where):
        if isinstance(x, np.ndarray):
            if x.dtype.kind not in "fiu":
                raise InvalidTypeError(f"{where}: expected a numeric array, got dtype {x.dtype}")
            return torch.from_numpy(np.ascontiguousarray(x))
        if isinstance(x, torch.Tensor):
            return x.detach()
        raise InvalidTypeError(f"{where}: expected a numpy array or torch tensor, got {type(x).__name__}")

    if isinstance(queries, (list, tuple)):
        items, single = [as_tensor(x, f"queries[{i}]") for i, x in enumerate(queries)], False
    else:
        t = as_tensor(queries, "queries")
        if t.dim() == 2:
            items, single = [t], True
        elif t.dim() == 3:
            items, single = list(t), False
        else:
            raise InvalidInputError(f"queries: expected [Lq, dim], [Nq, Lq, dim] or a list, got shape {tuple(t.shape)}")
    for i, t in enumerate(items):
        if t.dim() != 2 or t.shape[1] != dim:
            raise InvalidInputError(f"query {i}: expected shape [Lq, {dim}], got {tuple(t.shape)}")
        if t.shape[0] == 0:
            raise InvalidInputError(f"query {i}: empty (0 tokens)")
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise InvalidInputError(f"query {i}: contains NaN or Inf")
    q = torch.cat([t.float().to(device) for t in items]) if items else torch.zeros(0, dim, device=device)
    lens = torch.tensor([t.shape[0] for t in items], dtype=torch.int64)
    cu = torch.zeros(len(items) + 1, dtype=torch.int32)
    cu[1:] = lens.cumsum(0)
    return q, cu.to(device), single


def _check_k(k, name: str = "k") -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise InvalidTypeError(f"{name}: expected a positive int, got {type(k).__name__}")
    if k <= 0:
        raise InvalidInputError(f"{name}: expected a positive int, got {k}")


def _hits(scores: torch.Tensor, rows: torch.Tensor, ids: np.ndarray, k: int | None) -> list[list[Hit]]:
    """Best-first hits per query from scores/rows [Nq, K] (padding rows -1 / -inf dropped)."""
    n = scores.shape[1] if k is None else min(k, scores.shape[1])
    top = scores.topk(n, dim=1) if n else None
    out = []
    for qi in range(scores.shape[0]):
        if top is None:
            out.append([])
            continue
        vals = top.values[qi].tolist()
        sel = rows[qi].gather(0, top.indices[qi]).tolist()
        out.append([Hit(decode_id(ids[r]), v) for r, v in zip(sel, vals) if r >= 0 and v != float("-inf")])
    return out


class Database:
    """See the module docstring; create with :func:`mvdb.open`."""

    def __init__(self, path, *, dim=None, dtype=None, device="auto", read_only=False, index="auto"):
        self.device = _device(device)
        if index not in ("auto", "flat", "ivf"):
            raise InvalidInputError(f"index: expected 'auto', 'flat' or 'ivf', got {index!r}")
        self.index_kind = index
        self.store = Store(path, dim=dim, dtype=dtype, read_only=read_only)
        try:
            self._build()
        except BaseException:
            self.store.close()
            raise

    # ---- resident state: every row of the snapshot, in row order, plus the token index

    def _build(self) -> None:
        snap = self.store._snap
        dim = self.store.dim or 0
        readers = snap.readers
        if not dim:
            self._tokens, self._scales, self._index = None, None, None
            self._row_offsets = torch.zeros(1, dtype=torch.int64, device=self.device)
            self._row_ids = np.zeros(0, np.int64)
            self._live = torch.zeros(0, dtype=torch.bool, device=self.device)
            self._generation = self.store.generation
            return
        t0 = time.perf_counter()
        whole = self.store.load_all(device=self.device, include_deleted=True)
        self.load_seconds = time.perf_counter() - t0
        self._tokens, self._scales, self._row_offsets = whole.tokens, whole.scales, whole.offsets
        self._row_ids = np.concatenate([r.ids for r in readers]) if readers else np.zeros(0, np.int64)
        self._take_snapshot_state()
        self._index = TokenIndex.build(self._tokens, self._scales, self.device, self.index_kind)

    def _take_snapshot_state(self) -> None:
        """The live mask and generation of the store's current snapshot."""
        self._live = torch.from_numpy(self.store._snap.live.copy()).to(self.device)
        self._generation = self.store.generation

    def _sync(self) -> None:
        if self.store.generation != self._generation:
            self._build()

    # ---- the public API

    @property
    def dim(self) -> int | None:
        return self.store.dim

    def __len__(self) -> int:
        return len(self.store)

    def __contains__(self, doc_id) -> bool:
        return doc_id in self.store

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.store.close()
        self._tokens = self._index = None

    def add(self, docs, ids=None, metadata=None) -> list:
        """Store documents ([L_i, dim] arrays / tensors) and index their tokens; returns their ids.

        Incremental: the new segments' tokens are appended to the resident store and the index.
        """
        before = len(self.store._snap.readers)
        out = self.store.add(docs, ids=ids, metadata=metadata)
        new = self.store._snap.readers[before:]
        if self._tokens is None or self._tokens.shape[1] != self.store.dim or not new:
            self._build()
            return out
        first_new = self._tokens.shape[0]
        more = self.store.load_all(device=self.device, include_deleted=True, from_segment=before)
        self._tokens = torch.cat([self._tokens, more.tokens])
        if self._scales is not None:
            self._scales = torch.cat([self._scales, more.scales])
        self._row_offsets = torch.cat([self._row_offsets, self._row_offsets[-1] + more.offsets[1:]])
        self._index.add_stored(self._tokens, self._scales, start=first_new)  # no retraining
        self._row_ids = np.concatenate([self._row_ids] + [r.ids for r in new])
        self._take_snapshot_state()
        return out

    def delete(self, ids) -> None:
        self.store.delete(ids)
        self._take_snapshot_state()

    def compact(self) -> int:
        n = self.store.compact()
        self._build()
        return n

    def refresh(self) -> bool:
        changed = self.store.refresh()
        self._sync()
        return changed

    def get(self, ids) -> list[np.ndarray]:
        return self.store.get(ids)

    def metadata(self, ids) -> list:
        return self.store.metadata(ids)

    def verify(self):
        return self.store.verify()

    def stats(self) -> dict:
        m = self.store.manifest
        return {
            "path": self.store.path,
            "documents": len(self.store),
            "rows": int(self._row_ids.shape[0]),
            "tokens": int(self._tokens.shape[0]) if self._tokens is not None else 0,
            "dim": m["dim"],
            "dtype": m["dtype"],
            "segments": len(m["segments"]),
            "deleted": sum(len(s["deleted"]) for s in m["segments"]),
            "device": str(self.device),
            "index": self._index.kind if self._index is not None else None,
            "generation": m["generation"],
        }

    def _allowed(self, where: dict) -> torch.Tensor:
        """Rows whose metadata match ``where`` ({field: value} or {field: {"$in": [...]}}, all must hold)."""
        if not isinstance(where, dict) or not where:
            raise InvalidTypeError(f"where: expected a non-empty dict of field conditions, got {where!r}")
        conds = []
        for field, cond in where.items():
            if isinstance(cond, dict):
                if set(cond) != {"$in"} or not isinstance(cond["$in"], (list, tuple)):
                    raise InvalidInputError(f"where[{field!r}]: expected a value or {{'$in': [values]}}, got {cond!r}")
                conds.append((field, list(cond["$in"])))
            else:
                conds.append((field, [cond]))
        if getattr(self, "_meta_gen", None) != self._generation:
            n = int(self._row_ids.shape[0])
            self._meta = [json_loads(m) for m in self.store._metadata_rows(np.arange(n))] if n else []
            self._meta_gen = self._generation
        ok = [isinstance(m, dict) and all(f in m and m[f] in vals for f, vals in conds) for m in self._meta]
        return torch.tensor(ok, dtype=torch.bool, device=self.device) & self._live

    def search(self, queries, k: int = 10, where=None, *, n_candidates: int | None = None,
               k_tokens: int | None = None, nprobe: int | None = None):
        """Top-k documents by exact MaxSim among the token index's candidates.

        ``where`` filters on metadata: {"lang": "en"} or {"lang": {"$in": ["en", "fr"]}}; when the
        candidates hold fewer than k matches but more exist, matching documents are scored exactly.
        """
        _check_k(k)
        if not len(self.store):
            if self.dim:
                _, cu, single = _queries(queries, self.dim, self.device)
                return [] if single else [[] for _ in range(cu.numel() - 1)]
            batch = isinstance(queries, (list, tuple)) or getattr(queries, "ndim", 2) == 3
            return [[] for _ in range(len(queries))] if batch else []
        self._sync()
        q, cu_q, single = _queries(queries, self.dim, self.device)
        n_cand = n_candidates or max(DEFAULT_CANDIDATES, 8 * k)
        kk = min(k_tokens or DEFAULT_K_TOKENS, self._index.ntotal)
        self._index.nprobe = nprobe or DEFAULT_NPROBE
        sims, pos = self._index.search(q, kk)
        rows = torch.searchsorted(self._row_offsets, pos.to(self.device), right=True) - 1
        rows = torch.where(pos >= 0, rows, torch.full_like(rows, -1))
        live = self._live if where is None else self._allowed(where)
        cand = approximate_candidates(sims.to(self.device), rows, live, cu_q, n_cand)
        scores = maxsim_candidates(q, cu_q, self._tokens, self._row_offsets, cand, self._scales, check=False)
        hits = _hits(scores, cand, self._row_ids, k)
        n_match = int(live.sum())
        short = [i for i, h in enumerate(hits) if len(h) < min(k, n_match)]
        if short:
            # Filters can leave too few candidates: score every matching document for those queries.
            allowed = torch.nonzero(live).flatten()
            for i in short:
                qi = q[int(cu_q[i]) : int(cu_q[i + 1])]
                cu = torch.tensor([0, qi.shape[0]], dtype=torch.int32, device=self.device)
                s = maxsim_candidates(qi, cu, self._tokens, self._row_offsets, allowed[None], self._scales, check=False)
                hits[i] = _hits(s, allowed[None], self._row_ids, k)[0]
        return hits[0] if single else hits

    def rerank(self, queries, candidate_ids, k: int | None = None):
        """Exact MaxSim of each query against its own candidate ids (one list, or one per query)."""
        if k is not None:
            _check_k(k)
        self._sync()
        q, cu_q, single = _queries(queries, self.dim, self.device)
        lists = [candidate_ids] if single else list(candidate_ids)
        if len(lists) != cu_q.numel() - 1:
            raise InvalidInputError(f"candidate_ids: expected {cu_q.numel() - 1} lists (one per query), got {len(lists)}")
        width = max((len(c) for c in lists), default=0)
        cand = torch.full((len(lists), width), -1, dtype=torch.int64)
        for i, c in enumerate(lists):
            if len(c):
                cand[i, : len(c)] = torch.from_numpy(self.store._rows(c))
        cand = cand.to(self.device)
        scores = maxsim_candidates(q, cu_q, self._tokens, self._row_offsets, cand, self._scales, check=False)
        hits = _hits(scores, cand, self._row_ids, k)
        return hits[0] if single else hits


def open(path, *, dim=None, dtype=None, device="auto", read_only=False, index="auto") -> Database:  # noqa: A001
    """Open (or create) a database directory. ``dtype``: "float16" (the default) or "int8" for a new
    database; for an existing one, None or the stored dtype;
    ``index``: "flat" (exact), "ivf", or "auto" (flat below 4M tokens)."""
    return Database(path, dim=dim, dtype=dtype, device=device, read_only=read_only, index=index)


def rerank(query, docs, k: int | None = None) -> list[Hit]:
    """Rerank-only: exact MaxSim of one query [Lq, dim] against documents given inline (not stored).

    Hit ids are positions in ``docs``.
    """
    if k is not None:
        _check_k(k)
    if not isinstance(docs, (list, tuple)) or not docs:
        raise InvalidInputError("docs: expected a non-empty list of [L, dim] arrays / tensors")
    q = query if isinstance(query, torch.Tensor) else torch.from_numpy(np.asarray(query))
    if q.dim() != 2:
        raise InvalidInputError(f"query: expected [Lq, dim], got shape {tuple(q.shape)}")
    dim = q.shape[1]
    d_list = [d if isinstance(d, torch.Tensor) else torch.from_numpy(np.asarray(d)) for d in docs]
    for i, d in enumerate(d_list):
        if d.dim() != 2 or d.shape[1] != dim:
            raise InvalidInputError(f"document {i}: expected shape [L, {dim}], got {tuple(d.shape)}")
    device = q.device
    qp, cu_q, _ = _queries(q, dim, device)
    d = torch.cat([x.float().to(device) for x in d_list])
    cu_d = torch.zeros(len(d_list) + 1, dtype=torch.int32)
    cu_d[1:] = torch.tensor([x.shape[0] for x in d_list]).cumsum(0)
    scores = maxsim_varlen(qp, cu_q, d, cu_d.to(device))
    rows = torch.arange(len(d_list), device=device)[None]
    return _hits(scores, rows, np.arange(len(d_list)), k)[0]
