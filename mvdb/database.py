"""The database: a segment store, a FAISS token index, and the fused MaxSim rerank.

    db = mvdb.open("my.mvdb")
    ids = db.add(doc_embs)                  # list of [L_i, dim] arrays / tensors
    hits = db.search(q_embs, k=10)          # one query [Lq, dim] -> list[Hit]; a batch -> list[list[Hit]]
    hits = db.rerank(q_embs, candidate_ids) # exact MaxSim over stored documents

Search is two stages in one batched pass. Candidates come from the token index: on small
corpora ("flat") every query token retrieves its nearest stored tokens, which map to their
documents on the device, and documents get an approximate score (missing tokens imputed with that
query token's k'-th similarity); on large ones ("ivf") every query token probes its best centroid
lists and documents are credited with the best probed centroid they hold (see mvdb/index.py).
The best ``n_candidates`` per query are scored exactly by ``maxsim_candidates`` over the resident
CSR store. The IVF index (centroids and per-segment codes) is persisted with the manifest.
"""

from __future__ import annotations

import time
import uuid
from json import loads as json_loads
from typing import NamedTuple

import numpy as np
import torch

from mvdb.errors import CorruptionError, InvalidInputError, InvalidTypeError
from mvdb.index import (
    DEFAULT_LISTS_CANDIDATES,
    DEFAULT_LISTS_PROBE,
    FLAT_MAX_TOKENS,
    RETRAIN_GROWTH,
    CentroidLists,
    TokenIndex,
    approximate_candidates,
    default_nlist,
    train_centroids,
)
from mvdb.kernels import maxsim_candidates, maxsim_varlen
from mvdb.storage import Store


# Defaults chosen so that nobody needs to tune them (see tests/test_database.py recall test).
DEFAULT_K_TOKENS = 512  # flat index: nearest stored tokens per query token
DEFAULT_CANDIDATES = 256  # flat index: documents reranked exactly per query (IVF: see mvdb.index)
DEFAULT_SPARSE_CANDIDATES = 100  # documents the sparse (lexical) channel adds per query


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
        for i, t in enumerate(items):
            if t.dim() != 2 or t.shape[1] != dim:
                raise InvalidInputError(f"query {i}: expected shape [Lq, {dim}], got {tuple(t.shape)}")
            if t.shape[0] == 0:
                raise InvalidInputError(f"query {i}: empty (0 tokens)")
        lens = [t.shape[0] for t in items]
        q = torch.cat([t.to(device, torch.float32) for t in items]) if items else torch.zeros(0, dim, device=device)
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
        q = t.to(device, torch.float32).reshape(-1, dim)
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lens, dtype=torch.int64).cumsum(0)
    if q.numel() and not bool(torch.isfinite(q).all()):  # one check for the batch; then name the query
        bad = (~torch.isfinite(q).all(dim=1)).nonzero()[0, 0].item()
        i = int(torch.searchsorted(cu, torch.tensor(bad, dtype=torch.int32), right=True)) - 1
        raise InvalidInputError(f"query {i}: contains NaN or Inf")
    return q, cu.to(device), single


def _union(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per row, the candidates of a and b without repeats (-1 pads the rest)."""
    c = torch.cat([a, b.to(a.device)], dim=1).sort(dim=1, descending=True).values
    dup = torch.zeros_like(c, dtype=torch.bool)
    dup[:, 1:] = c[:, 1:] == c[:, :-1]
    return torch.where(dup, -1, c)


def _check_k(k, name: str = "k") -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise InvalidTypeError(f"{name}: expected a positive int, got {type(k).__name__}")
    if k <= 0:
        raise InvalidInputError(f"{name}: expected a positive int, got {k}")


def _hits(scores: torch.Tensor, rows: torch.Tensor, ids: np.ndarray, k: int | None) -> list[list[Hit]]:
    """Best-first hits per query from scores/rows [Nq, K] (padding rows -1 / -inf dropped)."""
    n = scores.shape[1] if k is None else min(k, scores.shape[1])
    if n == 0:
        return [[] for _ in range(scores.shape[0])]
    top = scores.topk(n, dim=1)
    sel = rows.gather(1, top.indices)
    ok = (sel >= 0) & ~torch.isneginf(top.values)
    vals, sel, ok = top.values.tolist(), sel.cpu().numpy(), ok.tolist()
    keys = ids[np.maximum(sel, 0)]
    keys = [[x.decode() for x in r] for r in keys.tolist()] if keys.dtype.kind == "S" else keys.tolist()
    return [[Hit(i, v) for i, v, good in zip(kr, vr, okr) if good] for kr, vr, okr in zip(keys, vals, ok)]


class Database:
    """See the module docstring; create with :func:`mvdb.open`."""

    def __init__(self, path, *, dim=None, dtype=None, device="auto", read_only=False, index="auto", nlist=None,
                 residency="auto"):
        self.device = _device(device)
        if residency not in ("auto", "device", "host"):
            raise InvalidInputError(f"residency: expected 'auto', 'device' or 'host', got {residency!r}")
        self.residency_asked = residency
        if index not in ("auto", "flat", "ivf"):
            raise InvalidInputError(f"index: expected 'auto', 'flat' or 'ivf', got {index!r}")
        if nlist is not None and (isinstance(nlist, bool) or not isinstance(nlist, int) or nlist < 1):
            raise InvalidInputError(f"nlist: expected a positive int or None, got {nlist!r}")
        self.index_kind, self.nlist = index, nlist
        self.store = Store(path, dim=dim, dtype=dtype, read_only=read_only)
        try:
            self._build()
        except BaseException:
            self.store.close()
            raise

    # ---- resident state: every row of the snapshot, in row order, plus the token index

    def _build(self, retrain: bool = False) -> None:
        snap = self.store._snap
        dim = self.store.dim or 0
        readers = snap.readers
        self._segments = [seg["name"] for seg in snap.manifest["segments"]]
        if not dim:
            self._tokens, self._scales, self._index = None, None, None
            self._home, self._on_host = self.device, False
            self._row_offsets = torch.zeros(1, dtype=torch.int64, device=self.device)
            self._row_ids = np.zeros(0, np.int64)
            self._live = torch.zeros(0, dtype=torch.bool, device=self.device)
            self._generation = self.store.generation
            return
        t0 = time.perf_counter()
        self._home = self._residency()
        self._on_host = self._home.type == "cpu" and (self.device.type != "cpu" or self.residency_asked == "host")
        whole = self.store.load_all(device=self._home, pin=self._on_host, include_deleted=True)
        self.load_seconds = time.perf_counter() - t0
        self._tokens, self._scales = whole.tokens, whole.scales
        self._host_offsets = whole.offsets.cpu()
        self._row_offsets = whole.offsets.to(self.device)
        self._row_ids = np.concatenate([r.ids for r in readers]) if readers else np.zeros(0, np.int64)
        self._take_snapshot_state()
        self._index = self._make_index(retrain)

    def _residency(self) -> torch.device:
        """Where the tokens live: on the device, or (when they would not fit, or asked) in pinned
        host memory, with each search copying only its candidates to the device."""
        if self.residency_asked == "host":
            return torch.device("cpu")
        if self.residency_asked == "device" or self.device.type != "cuda":
            return self.device
        segs = self.store.manifest["segments"]
        width = self.store.dim * (1 if self.store.dtype == "int8" else 2) + (4 if self.store.dtype == "int8" else 0)
        need = sum(s["n_tokens"] for s in segs) * width
        free, _ = torch.cuda.mem_get_info(self.device)
        return self.device if need <= 0.8 * free - (2 << 30) else torch.device("cpu")

    def _kind(self) -> str:
        if self.index_kind != "auto":
            return self.index_kind
        return "flat" if self._tokens.shape[0] < FLAT_MAX_TOKENS else "ivf"

    def _make_index(self, retrain: bool = False):
        if self._kind() == "flat" or self._tokens.shape[0] == 0:  # IVF trains once there are tokens
            return TokenIndex.build(self._tokens, self._scales, self.device)
        return self._ivf(retrain)

    # ---- the IVF index: centroids + per-segment codes, persisted as index files of the manifest

    def _ivf(self, retrain: bool = False) -> CentroidLists:
        """Load the persisted centroids and codes; train / assign what is missing (and persist it
        when writable). Files that fail their checksum are recomputed: the segments are the record."""
        t0 = time.perf_counter()
        store, n = self.store, int(self._tokens.shape[0])
        entries = store.manifest.get("index_files", [])
        cent = next((e for e in entries if e.get("kind") == "centroids"), None)
        centroids = None
        # reuse unless a different nlist was asked for (one clamped for a small corpus counts as it)
        if cent is not None and not retrain and (self.nlist in (None, cent["nlist"]) or cent["trained_tokens"] < self.nlist):
            centroids = self._read_index(cent, (cent["nlist"], self.dim), np.float32)
        if centroids is None:
            nlist = min(self.nlist or default_nlist(n), 1 << max(0, n.bit_length() - 1))  # k-means needs n >= nlist
            g = torch.Generator(device=self._tokens.device).manual_seed(0)
            take = torch.randperm(n, device=self._tokens.device, generator=g)[: min(n, 40 * nlist)]
            sample = self._tokens[take].float()
            if self._scales is not None:
                sample = sample * self._scales[take, None]
            centroids = train_centroids(sample, nlist)
            del sample
            cent = {"kind": "centroids", "id": uuid.uuid4().hex[:12], "nlist": nlist, "trained_tokens": n}
            if not store.read_only:
                cent.update(store.write_index_file(f"centroids-{cent['id']}.npy", centroids.numpy()))
        t1 = time.perf_counter()
        lists = CentroidLists(centroids, torch.zeros(0, dtype=torch.int32), self._row_offsets[:1])
        codes, written = self._codes(lists, cent, entries, 0)
        lists.add(codes, self._row_offsets)
        lists.trained_tokens, lists.entry = cent["trained_tokens"], cent
        t2 = time.perf_counter()
        if written or cent not in entries:
            self._commit_index([cent] + [e for e in entries if e.get("kind") == "codes" and e["centroids"] == cent["id"]]
                               + written)
        lists.build_seconds = {"train": t1 - t0, "assign": t2 - t1}
        return lists

    def _read_index(self, entry: dict, shape: tuple, dtype) -> torch.Tensor | None:
        try:
            a = self.store.read_index_file(entry)
        except (OSError, CorruptionError, ValueError):
            return None
        return torch.from_numpy(a) if a.shape == shape and a.dtype == dtype else None

    def _codes(self, lists: CentroidLists, cent: dict, entries: list, first_segment: int):
        """Codes of the snapshot's segments from ``first_segment`` on: read, else assigned (and
        written when writable) -> (codes on the device, new manifest entries)."""
        have = {e["segment"]: e for e in entries if e.get("kind") == "codes" and e["centroids"] == cent["id"]}
        segs = self.store.manifest["segments"]
        start = sum(s["n_tokens"] for s in segs[:first_segment])
        out, written = [], []
        for seg in segs[first_segment:]:
            stop = start + seg["n_tokens"]
            e = have.get(seg["name"])
            c = self._read_index(e, (seg["n_tokens"],), np.int32) if e is not None else None
            if c is None:
                c = lists.assign(self._tokens[start:stop], None if self._scales is None else self._scales[start:stop])
                if not self.store.read_only:
                    stem = seg["name"].rsplit(".", 1)[0]
                    e = {"kind": "codes", "centroids": cent["id"], "segment": seg["name"]}
                    e.update(self.store.write_index_file(f"codes-{cent['id']}-{stem}.npy", c.cpu().numpy()))
                    written.append(e)
            out.append(c.to(self.device))
            start = stop
        return (torch.cat(out) if out else torch.zeros(0, dtype=torch.int32, device=self.device)), written

    def _commit_index(self, entries: list) -> None:
        """Name ``entries`` in a new manifest (codes of segments no longer stored are dropped)."""
        if self.store.read_only:
            return
        names = {s["name"] for s in self.store.manifest["segments"]}
        self.store.commit_index([e for e in entries if e.get("kind") != "codes" or e["segment"] in names])
        self._generation = self.store.generation

    def _append_segments(self, first: int) -> None:
        """Bring the resident tokens and the index up to the snapshot, which appended segments
        from index ``first`` on (no retraining)."""
        new = self.store._snap.readers[first:]
        first_new = self._tokens.shape[0]
        more = self.store.load_all(device=self._home, pin=self._on_host, include_deleted=True, from_segment=first)
        self._tokens = torch.cat([self._tokens, more.tokens])
        if self._scales is not None:
            self._scales = torch.cat([self._scales, more.scales])
        self._host_offsets = torch.cat([self._host_offsets, self._host_offsets[-1] + more.offsets[1:].cpu()])
        self._row_offsets = self._host_offsets.to(self.device)
        self._row_ids = np.concatenate([self._row_ids] + [r.ids for r in new])
        self._segments = [seg["name"] for seg in self.store.manifest["segments"]]
        self._take_snapshot_state()
        if isinstance(self._index, TokenIndex):
            if self._kind() == "flat":
                self._index.add_stored(self._tokens, self._scales, start=first_new)
            else:  # grown past the flat index's range: train the IVF index now
                self._index = self._make_index()
            return
        entries = self.store.manifest.get("index_files", [])
        codes, written = self._codes(self._index, self._index.entry, entries, first)
        self._index.add(codes, self._row_offsets)
        if written:
            self._commit_index(entries + written)

    def _take_snapshot_state(self) -> None:
        """The live mask and generation of the store's current snapshot."""
        self._live = torch.from_numpy(self.store._snap.live.copy()).to(self.device)
        self._generation = self.store.generation

    def _sync(self) -> None:
        """Follow the store's snapshot: deletes and index commits only refresh the live mask;
        appended segments are loaded and indexed incrementally; anything else rebuilds."""
        if self.store.generation == self._generation:
            return
        names = [seg["name"] for seg in self.store.manifest["segments"]]
        if self._tokens is not None and names[: len(self._segments)] == self._segments:
            if len(names) > len(self._segments):
                self._append_segments(len(self._segments))
            else:
                self._take_snapshot_state()
        else:
            self._build()

    def _score(self, q: torch.Tensor, cu_q: torch.Tensor, cand: torch.Tensor, budget: int = 1 << 31) -> torch.Tensor:
        """Exact MaxSim of each query against its candidate rows [Nq, K] (-1 = padding -> -inf).

        Device-resident tokens are read in place. Host-resident ones: per chunk of queries, the
        distinct candidates' tokens are gathered on the host, copied to the device (about
        ``budget`` bytes at a time) and scored there.
        """
        if not self._on_host:
            return maxsim_candidates(q, cu_q, self._tokens, self._row_offsets, cand, self._scales, check=False)
        nq, width = cand.shape
        out = torch.full((nq, width), float("-inf"), device=self.device)
        row_bytes = max(1, self._tokens.shape[0] // max(1, len(self._host_offsets) - 1)) * self._tokens[:1].nbytes
        chunk = max(1, budget // max(1, width * row_bytes))
        pin = self.device.type == "cuda"
        for a in range(0, nq, chunk):
            b = min(nq, a + chunk)
            c = cand[a:b]
            valid = c >= 0
            if not bool(valid.any()):
                continue
            rows, inv = torch.unique(c[valid], return_inverse=True)
            rows = rows.cpu()
            starts, ends = self._host_offsets[rows], self._host_offsets[rows + 1]
            lens = ends - starts
            local = torch.zeros(rows.numel() + 1, dtype=torch.int64)
            local[1:] = lens.cumsum(0)
            idx = torch.repeat_interleave(starts - local[:-1], lens) + torch.arange(int(local[-1]))
            tok = self._tokens.index_select(0, idx)
            sc = self._scales.index_select(0, idx) if self._scales is not None else None
            if pin:
                tok = tok.pin_memory()
                sc = sc.pin_memory() if sc is not None else None
            tok = tok.to(self.device, non_blocking=True)
            sc = sc.to(self.device, non_blocking=True) if sc is not None else None
            lc = torch.full_like(c, -1)
            lc[valid] = inv
            cu = cu_q[a : b + 1] - cu_q[a]
            qa = q[int(cu_q[a]) : int(cu_q[b])]
            out[a:b] = maxsim_candidates(qa, cu, tok, local.to(self.device), lc, sc, check=False)
        return out

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

    def add(self, docs, ids=None, metadata=None, sparse=None) -> list:
        """Store documents ([L_i, dim] arrays / tensors) and index their tokens; returns their ids.
        ``sparse``: optional per-document sparse vectors ({term: weight} dicts or (terms, weights)
        pairs, e.g. BM25 or SPLADE weights) for the lexical channel of :meth:`search`.

        Incremental: the new segments' tokens are appended to the resident store and the index
        (IVF: assigned to the existing centroids, no retraining; their codes are persisted).
        """
        self._sync()
        out = self.store.add(docs, ids=ids, metadata=metadata, sparse=sparse)
        if self._tokens is None or self._tokens.shape[1] != self.store.dim:
            self._build()
        else:
            self._sync()
        return out

    def delete(self, ids) -> None:
        self.store.delete(ids)
        self._take_snapshot_state()

    def compact(self) -> int:
        """Rewrite segments holding deleted documents (their tokens leave the index); the IVF index
        is retrained once the corpus holds RETRAIN_GROWTH times the tokens it was trained on."""
        self._sync()
        n = self.store.compact()
        total = sum(s["n_tokens"] for s in self.store.manifest["segments"])
        trained = getattr(self._index, "trained_tokens", None)
        self._build(retrain=bool(trained) and total > RETRAIN_GROWTH * trained)
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
            "residency": None if self._tokens is None else ("host" if self._on_host else "device"),
            "index": self._index.kind if self._index is not None else None,
            "nlist": getattr(self._index, "nlist", None) or None,
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

    def _sparse_index(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The inverted index of the stored sparse vectors on the device: per term, the rows
        holding it and their weights (term_ptr [vocab + 1], rows, weights); rebuilt when the
        snapshot changes."""
        if getattr(self, "_sparse_gen", None) != self._generation:
            n = int(self._row_ids.shape[0])
            off, terms, weights = self.store.sparse_rows(np.arange(n)) if n else (
                np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.float32))
            vocab = int(terms.max()) + 1 if terms.size else 0
            rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(off))
            order = np.argsort(terms, kind="stable")  # term-major, rows ascending within a term
            ptr = np.zeros(vocab + 1, dtype=np.int64)
            np.cumsum(np.bincount(terms, minlength=vocab), out=ptr[1:])
            self._sparse = tuple(torch.from_numpy(x).to(self.device)
                                 for x in (ptr, rows[order], weights[order].astype(np.float32)))
            self._sparse_gen = self._generation
        return self._sparse

    def _sparse_candidates(self, sparse, n_queries: int, live: torch.Tensor, n: int) -> torch.Tensor:
        """Rows with the highest sparse dot product per query [n_queries, n] (-1 where fewer live
        rows share a term with the query), from the postings of the query's terms only."""
        if not isinstance(sparse, (list, tuple)) or len(sparse) != n_queries:
            got = type(sparse).__name__ + (f" of {len(sparse)}" if isinstance(sparse, (list, tuple)) else "")
            raise InvalidInputError(f"sparse: expected a list of {n_queries} query sparse vectors (one per query), got {got}")
        from mvdb.storage import _validate

        q_off, q_terms, q_weights = _validate.sparse(list(sparse), n_queries)
        ptr, post_rows, post_w = self._sparse_index()
        n_rows = int(self._row_ids.shape[0])
        out = torch.full((n_queries, n), -1, dtype=torch.int64, device=self.device)
        n = min(n, n_rows)
        if not n or ptr.numel() <= 1:
            return out
        vocab = ptr.numel() - 1
        q_idx = np.repeat(np.arange(n_queries), np.diff(q_off))
        known = q_terms < vocab  # terms no document holds score nothing
        q_idx, q_terms, q_weights = (torch.from_numpy(x[known]).to(self.device) for x in (q_idx, q_terms, q_weights))
        chunk = max(1, (1 << 27) // max(1, n_rows))  # queries per dense [chunk, rows] score table
        for c0 in range(0, n_queries, chunk):
            sel = (q_idx >= c0) & (q_idx < c0 + chunk)
            qi, t, qw = q_idx[sel] - c0, q_terms[sel].long(), q_weights[sel]
            start, length = ptr[t], ptr[t + 1] - ptr[t]
            total = int(length.sum())
            scores = torch.zeros(min(chunk, n_queries - c0), n_rows, dtype=torch.float32, device=self.device)
            if total:
                rep = torch.repeat_interleave(torch.arange(t.numel(), device=self.device), length, output_size=total)
                first = torch.cumsum(length, 0) - length  # where each posting list starts in the expansion
                pos = start[rep] + torch.arange(total, device=self.device) - first[rep]
                scores.index_put_((qi[rep], post_rows[pos]), post_w[pos] * qw[rep], accumulate=True)
            scores = scores.masked_fill(~live[None, :] | (scores <= 0), float("-inf"))
            top = scores.topk(n, dim=1)
            out[c0 : c0 + scores.shape[0], :n] = torch.where(torch.isfinite(top.values), top.indices, -1)
        return out

    def search(self, queries, k: int = 10, where=None, *, n_candidates: int | None = None,
               k_tokens: int | None = None, nprobe: int | None = None, sparse=None, n_sparse: int | None = None):
        """Top-k documents by exact MaxSim among the token index's candidates.

        ``where`` filters on metadata: {"lang": "en"} or {"lang": {"$in": ["en", "fr"]}}; when the
        candidates hold fewer than k matches but more exist, matching documents are scored exactly.
        ``sparse``: the queries' sparse vectors (one, or a list for a batch; the same forms as
        ``add``): the ``n_sparse`` documents (default 100) with the highest sparse dot product join
        the candidates before the exact MaxSim rerank.
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
        ivf = isinstance(self._index, CentroidLists)
        n_cand = n_candidates or max(DEFAULT_LISTS_CANDIDATES if ivf else DEFAULT_CANDIDATES, 8 * k)
        for name, v in (("n_candidates", n_candidates), ("k_tokens", k_tokens), ("nprobe", nprobe)):
            if v is not None:
                _check_k(v, name)
        live = self._live if where is None else self._allowed(where)
        if ivf:
            self._index.nprobe = nprobe or DEFAULT_LISTS_PROBE
            cand = self._index.candidates(q, cu_q, live, n_cand)
        else:
            kk = min(k_tokens or DEFAULT_K_TOKENS, self._index.ntotal)
            sims, pos = self._index.search(q, kk)
            rows = torch.searchsorted(self._row_offsets, pos.to(self.device), right=True) - 1
            rows = torch.where(pos >= 0, rows, torch.full_like(rows, -1))
            cand = approximate_candidates(sims.to(self.device), rows, live, cu_q, n_cand)
        if sparse is not None:
            _check_k(n_sparse or DEFAULT_SPARSE_CANDIDATES, "n_sparse")
            extra = self._sparse_candidates([sparse] if single else sparse, cu_q.numel() - 1, live,
                                            n_sparse or DEFAULT_SPARSE_CANDIDATES)
            cand = _union(cand, extra)
        scores = self._score(q, cu_q, cand)
        hits = _hits(scores, cand, self._row_ids, k)
        short = [i for i, h in enumerate(hits) if len(h) < k]
        if short:
            n_match = int(live.sum())
            short = [i for i in short if len(hits[i]) < n_match]
        if short:
            # Filters can leave too few candidates: score every matching document for those queries.
            allowed = torch.nonzero(live).flatten()
            for i in short:
                qi = q[int(cu_q[i]) : int(cu_q[i + 1])]
                cu = torch.tensor([0, qi.shape[0]], dtype=torch.int32, device=self.device)
                s = self._score(qi, cu, allowed[None])
                hits[i] = _hits(s, allowed[None], self._row_ids, k)[0]
        return hits[0] if single else hits

    def rerank(self, queries, candidate_ids, k: int | None = None):
        """Exact MaxSim of each query against its own candidate ids (one list, or one per query)."""
        if k is not None:
            _check_k(k)
        self._sync()
        if self.dim is None:
            raise InvalidInputError(f"rerank: the database at {self.store.path} is empty (no documents to score)")
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
        scores = self._score(q, cu_q, cand)
        hits = _hits(scores, cand, self._row_ids, k)
        return hits[0] if single else hits


def open(path, *, dim=None, dtype=None, device="auto", read_only=False, index="auto", nlist=None,  # noqa: A001
         residency="auto", devices=None):
    """Open (or create) a database directory. ``dtype``: "float16" (the default) or "int8" for a new
    database; for an existing one, None or the stored dtype; ``index``: "flat" (exact token
    search), "ivf" (centroid lists, persisted), or "auto" (flat below 1M tokens); ``nlist``: IVF
    lists when training (default about 2 * sqrt(tokens), a power of two); ``residency``: where the
    stored tokens live for the exact rerank: "device", "host" (pinned memory, candidates copied per
    search), or "auto" (the device when they fit in 80% of its free memory); ``devices``: a list
    of devices to shard the documents over, one shard each (:class:`mvdb.sharded.ShardedDatabase`;
    a directory created sharded is always opened sharded, on ``devices`` or on ``device``)."""
    from mvdb.sharded import ShardedDatabase, is_sharded

    if devices is not None or is_sharded(path):
        return ShardedDatabase(path, devices=devices, dim=dim, dtype=dtype, device=device, read_only=read_only,
                               index=index, nlist=nlist, residency=residency)
    return Database(path, dim=dim, dtype=dtype, device=device, read_only=read_only, index=index, nlist=nlist,
                    residency=residency)


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
