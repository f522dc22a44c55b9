"""The engine's state: what one committed snapshot looks like to searches, and how a writer moves
it forward.

A :class:`State` is immutable: the store snapshot it serves, the resident tokens (a view of
every row), the live mask and the token index. Searches take the current state once and use only
it, so a write never changes what a running search reads. :class:`Engine` (one per database,
driven by one writer at a time) builds a state from a snapshot and follows the store's commits:

- appended segments: their tokens are appended to the resident pages and their codes to the
  index (IVF: assigned to the current centroids, persisted per segment); once the corpus calls
  for more lists than the centroids have, or the live tokens exceed ``RETRAIN_GROWTH`` times
  those they were trained on, the index is retrained and every segment re-assigned (amortised:
  the retrain costs grow geometrically);
- deletes: a new live mask;
- anything else (a compaction rewrote segments): a rebuild, after letting go of the old
  resident memory.
"""

from __future__ import annotations

import os
import time
import uuid
import warnings
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from mvdb.engine import codes as codes_tier
from mvdb.engine import ivf
from mvdb.engine.codes import Residuals
from mvdb.engine.flat import FlatIndex, FlatView, build_flat
from mvdb.engine.ondisk import DiskTokens
from mvdb.engine.progress import Progress
from mvdb.engine.resident import Resident, Tokens
from mvdb.errors import CorruptionError, InvalidInputError

FLAT_MAX_TOKENS = 1 << 20  # "auto" on a GPU: exact token search below this many tokens, centroid lists above
# "auto" on a CPU: below this many tokens no token index is trained and searches score every
# document exactly (the flat index is filled only if a search asks for its options); from it on,
# the lists answer faster at recall@10 >= 0.98 (2 cores, queries of 4-64 tokens in batches of 16:
# even with exhaustive MaxSim near 0.6-0.9M tokens, 1.5-4.4x faster at 1.2-3.3M, but at 0.8M
# their recall is 0.975 on one corpus: docs/benchmarks.md, cpu).
CPU_FLAT_MAX_TOKENS = 1 << 20
ENCODE_CHUNK = 1 << 20  # tokens encoded into residual codes at a time
CODES_TIERS = ("host", "disk")  # tiers whose exact tokens are off the device: codes rank the pool


def host_available() -> int:
    """Bytes of host memory available (Linux MemAvailable; elsewhere the free pages)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True, eq=False)
class State:
    snap: object  # mvdb.storage.Snapshot
    tokens: Tokens | None
    live: torch.Tensor  # [n_rows] bool on the device
    index: object | None  # FlatView | ivf.Lists
    residuals: Residuals | None = None  # the compressed tier (where the exact tokens are off the device)
    cache: dict = field(default_factory=dict)  # per-state derived data (metadata, sparse postings)

    @property
    def generation(self) -> int:
        return self.snap.generation

    @property
    def n_rows(self) -> int:
        return self.snap.n_rows

    @property
    def dim(self) -> int | None:
        return self.snap.dim

    def segment_names(self) -> list[str]:
        return [s["name"] for s in self.snap.manifest["segments"]]


def _lengths(snap, first_segment: int = 0) -> np.ndarray:
    parts = [np.diff(np.asarray(r.offsets)) for r in snap.readers[first_segment:]]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)


def _token_bytes(snap) -> int:
    int8 = snap.dtype == "int8"
    return (snap.dim or 0) * (1 if int8 else 2) + (4 if int8 else 0)


def stored_config(manifest: dict) -> dict:
    """The index choice recorded with the data; older databases: inferred from their index files."""
    cfg = dict((manifest.get("config") or {}).get("index") or {})
    if not cfg:
        has_ivf = any(e.get("kind") == "centroids" for e in manifest.get("index_files", []))
        cfg = {"kind": "ivf" if has_ivf else "auto", "nlist": None}
    return cfg


def resolve_config(store, index: str | None, nlist: int | None) -> dict:
    """The index configuration for this handle: the stored one, unless an argument says otherwise
    (honoured, with a warning naming both; recorded when the handle can write)."""
    manifest = store.manifest
    recorded = "index" in (manifest.get("config") or {})
    cfg = stored_config(manifest)
    new = {"kind": index if index is not None else cfg["kind"], "nlist": nlist if nlist is not None else cfg["nlist"]}
    # a choice was made before: recorded, or (older databases) visible in their IVF index files
    known = recorded or any(e.get("kind") == "centroids" for e in manifest.get("index_files", []))
    if known and new != cfg:
        asked = ", ".join(f"{k}={v!r}" for k, v in (("index", index), ("nlist", nlist)) if v is not None)
        warnings.warn(f"{store.path}: {asked} asked for; the database was built with index={cfg['kind']!r}, "
                      f"nlist={cfg['nlist']!r}: using {asked}"
                      + ("" if store.read_only else " (and recording it)"), stacklevel=4)
    if not store.read_only and (not recorded or new != cfg):
        store.commit_config(dict(store.config, index=new))
    return new


class Engine:
    """Builds states from store snapshots and moves them forward; see the module docstring."""

    def __init__(self, store, device: torch.device, residency: str, config: dict, progress: Progress | None = None,
                 max_gpu_bytes: int | None = None, code_bits: int | None = None, prerank: str = "auto"):
        self.store, self.device, self.residency = store, device, residency
        self.prerank = prerank  # what ranks the device tier's pool: "lists", "codes" ("auto": lists)
        if prerank == "codes" and config.get("kind") == "flat":
            raise InvalidInputError("prerank='codes': the codes rank a pool from the IVF lists, so it needs index 'ivf' "
                                    "or 'auto', got 'flat'")
        self.max_gpu_bytes = max_gpu_bytes
        # the codes tiers' rate (None: codes_tier.default_bits of the store's dtype)
        self.code_bits = None if code_bits is None else int(code_bits)
        self.config = dict(config)
        self.progress = progress or Progress()
        self.resident: Resident | None = None
        self.flat: FlatIndex | None = None
        self.growing: codes_tier.Growing | None = None  # the compressed tier's buffers (codes tiers)
        self.tier = "device"  # where the exact tokens are: "device", or "host" (codes on the device)
        self.load_seconds = 0.0
        self.state = self.build(store.snapshot())

    # ---- decisions

    def kind(self, n_tokens: int) -> str:
        k = self.config["kind"]
        if k != "auto":
            return k
        if self.codes_rank():  # the codes rank the pool: they need the lists' centroids
            return "ivf"
        limit = CPU_FLAT_MAX_TOKENS if self.device.type == "cpu" else FLAT_MAX_TOKENS
        return "flat" if n_tokens < limit else "ivf"

    def codes_rank(self) -> bool:
        """Whether residual codes on the device rank the pool: the codes tiers, and the device
        tier with ``prerank="codes"``."""
        return self.tier in CODES_TIERS or self.prerank == "codes"

    def pick_tier(self, snap) -> str:
        """Where the exact tokens live: "device" (where searches compute), "host" (pinned host
        memory, read in place by the rerank; codes on the device rank the pool) or "disk" (read
        from the segments per search; codes on the device). ``residency`` names one, or "auto":
        the device when the tokens fit 80% of its free memory (and ``max_gpu_bytes``), else host
        memory when they fit 80% of what the host has available, else disk. Memory this engine
        already holds counts as available (it is let go of before a rebuild), as do blocks PyTorch
        has cached but not handed out. On a CPU the device is the host: "device" or "disk"
        ("host" there means the codes tier over tokens in memory)."""
        if self.residency != "auto":
            return self.residency
        n_tokens = sum(s["n_tokens"] for s in snap.manifest["segments"])
        need = n_tokens * _token_bytes(snap)
        held = self.resident.capacity_bytes if self.resident is not None else 0
        if self.device.type == "cuda":
            if self.prerank == "codes":  # the device tier then holds every token's codes too
                bits = self.code_bits or codes_tier.default_bits(snap.dtype)
                need += n_tokens * (4 + codes_tier.n_bytes(snap.dim, bits))
            free, _ = torch.cuda.mem_get_info(self.device)
            cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
            room = 0.8 * (free + held + cached) - (2 << 30)
            if self.max_gpu_bytes is not None:
                room = min(room, self.max_gpu_bytes)
            if need <= room:
                return "device"
            return "host" if need <= 0.8 * (host_available() + held) - (2 << 30) else "disk"
        return "device" if need <= 0.8 * (host_available() + held) else "disk"

    # ---- full build

    def release(self) -> None:
        """Let go of the resident tokens and indexes (before a rebuild, or at close)."""
        self.resident = self.flat = self.growing = None
        self.state = None

    def build(self, snap, retrain: bool = False) -> State:
        dim = snap.dim
        if not dim:
            self.resident = None
            return State(snap, None, torch.zeros(0, dtype=torch.bool, device=self.device), None)
        self.tier = self.pick_tier(snap)
        self.resident = None  # before loading: a rebuild must not hold two copies
        t0 = time.perf_counter()
        if self.tier == "disk":
            tokens = DiskTokens(snap, self.device)
        else:
            home = torch.device("cpu") if self.tier == "host" else self.device
            res = Resident(dim, snap.dtype == "int8", home, self.device, staged=self.tier == "host")
            pin = home.type == "cpu" and self.device.type == "cuda"
            n_tok = sum(s["n_tokens"] for s in snap.manifest["segments"])
            with self.progress.step("loading tokens", n_tok, "tokens") as step:
                whole = self.store.load_all(home, pin, include_deleted=True, snap=snap)
                step.update(n_tok)
            tokens = res.adopt(whole.tokens, whole.scales, _lengths(snap))
            self.resident = res
        self.load_seconds = time.perf_counter() - t0
        live = torch.from_numpy(snap.live.copy()).to(self.device)
        state = State(snap, tokens, live, None)
        index, snap = self._make_index(state, retrain)
        return State(snap, tokens, live, index, self.residuals())

    def residuals(self) -> Residuals | None:
        """The compressed tier's current view (None where the exact tokens are on the device)."""
        return self.growing.current if self.growing is not None else None

    def _make_index(self, state: State, retrain: bool = False):
        tokens = state.tokens
        if self.kind(tokens.n_tokens) == "flat" or tokens.n_tokens == 0:  # IVF trains once there are tokens
            self.flat = None
            view = build_flat(tokens, self.device, lazy=self.device.type == "cpu")
            self.flat = view.index
            return view, state.snap
        self.flat = None
        return self._ivf(state, retrain)

    # ---- the IVF index and its files

    def _read(self, entry: dict, shape: tuple, dtype) -> torch.Tensor | None:
        try:
            a = self.store.read_index_file(entry)
        except (OSError, CorruptionError, ValueError):
            return None
        return torch.from_numpy(a) if a.shape == shape and a.dtype == dtype else None

    def live_tokens(self, state: State) -> int:
        t = state.tokens
        if t is None or not t.n_rows:
            return 0
        off = t.host_offsets.numpy()
        return int(np.diff(off)[state.snap.live].sum())

    def _target_nlist(self, state: State) -> int:
        """The list count a build of this state trains: the configured one, else default_nlist of
        the live tokens; never more than the stored tokens (k-means needs n >= nlist)."""
        tokens = state.tokens
        per_sqrt = ivf.CPU_LISTS_PER_SQRT if self.device.type == "cpu" else ivf.LISTS_PER_SQRT
        nlist = self.config["nlist"] or ivf.default_nlist(self.live_tokens(state) or tokens.n_tokens, per_sqrt)
        return min(nlist, 1 << max(0, tokens.n_tokens.bit_length() - 1))

    def _outgrown(self, state: State, index) -> bool:
        """Retrain after an add once the live tokens exceed RETRAIN_GROWTH x those the centroids
        were trained on, or once the corpus calls for more lists than they have (so a grown
        database ends with the list count of a bulk build of the same size)."""
        return (self.live_tokens(state) > ivf.RETRAIN_GROWTH * index.trained_tokens
                or self._target_nlist(state) > index.nlist)

    def _train(self, state: State) -> tuple[torch.Tensor, dict]:
        tokens = state.tokens
        n = self.live_tokens(state) or tokens.n_tokens
        nlist = self._target_nlist(state)
        two_level = self.device.type == "cpu" and nlist >= ivf.CPU_COARSE_NLIST
        per = ivf.TRAIN_PER_LIST_TWO_LEVEL if two_level else ivf.TRAIN_PER_LIST
        if self.device.type == "cuda":  # k-means on the GPU (faiss-gpu, else torch)
            per = max(per, ivf.TRAIN_PER_LIST_GPU)
        # at most TRAIN_MAX tokens, but never fewer than TRAIN_PER_LIST a list (FAISS's minimum)
        want = min(max(ivf.TRAIN_MAX, ivf.TRAIN_PER_LIST * nlist), per * nlist)
        take = torch.from_numpy(ivf.sample(tokens.n_tokens, want))
        how = "two-level k-means" if two_level else "k-means"
        with self.progress.step(f"training {nlist} centroids ({how}) on {take.numel():,} tokens"):
            tok, sc = tokens.take(take.to(tokens.home))
            sample = tok.float()
            if sc is not None:
                sample = sample * sc[:, None]
            centroids = ivf.train_centroids(sample, nlist, two_level=two_level, device=self.device)
        entry = {"kind": "centroids", "id": uuid.uuid4().hex[:12], "nlist": nlist, "trained_tokens": n}
        return centroids, entry

    def _ivf(self, state: State, retrain: bool = False):
        """Load the persisted centroids and codes; train / assign what is missing (and persist it
        when writable). Files that fail their checksum are recomputed: the segments are the record.
        Returns (lists, the snapshot after any index commit)."""
        t0 = time.perf_counter()
        snap, store = state.snap, self.store
        entries = snap.manifest.get("index_files", [])
        cent = next((e for e in entries if e.get("kind") == "centroids"), None)
        nlist = self.config["nlist"]
        centroids = None
        # reuse unless a different nlist was asked for (one clamped for a small corpus counts as it)
        if cent is not None and not retrain and (nlist in (None, cent["nlist"]) or cent["trained_tokens"] < nlist):
            centroids = self._read(cent, (cent["nlist"], snap.dim), np.float32)
        fresh = centroids is None
        saved = True
        if fresh:
            centroids, cent = self._train(state)
            if not store.read_only:
                saved = self._save(cent, f"centroids-{cent['id']}.npy", centroids.numpy())
        t1 = time.perf_counter()
        lists = ivf.Lists.empty(centroids, cent, self.device)
        codes, written = self._codes(state, lists, cent, entries, 0, save=saved)
        lists = lists.with_rows(codes, state.tokens.offsets)
        t2 = time.perf_counter()
        self.growing, residuals = None, None
        if self.codes_rank():
            residuals, more = self._residuals(state, lists, cent, entries, codes, 0, save=saved)
            written += more
        t3 = time.perf_counter()
        if saved and (fresh or written):
            keep = [e for e in entries if e.get("kind") in ("codes", "buckets", "residuals")
                    and e["centroids"] == cent["id"]]
            snap = self._commit_index(snap, [cent] + keep + written)
        lists.build_seconds = {"train": t1 - t0, "assign": t2 - t1, **({"codes": t3 - t2} if residuals else {})}
        return lists, snap

    def _save(self, entry: dict, name: str, array: np.ndarray) -> bool:
        """Write one derived index file into ``entry``; a failure (disk full, say) is a warning:
        the index stays in memory, consistent with the committed data, and is rebuilt next open."""
        try:
            entry.update(self.store.write_index_file(name, array))
            return True
        except OSError as e:
            warnings.warn(f"mvdb: could not persist the index ({e}); it is kept in memory and rebuilt "
                          f"when the database is next opened", RuntimeWarning, stacklevel=3)
            return False

    def _codes(self, state: State, lists: ivf.Lists, cent: dict, entries: list, first_segment: int,
               save: bool = True):
        """Codes of the snapshot's segments from ``first_segment`` on: read, else assigned (and
        written when writable) -> (codes on the device, new manifest entries)."""
        snap, tokens = state.snap, state.tokens
        have = {e["segment"]: e for e in entries if e.get("kind") == "codes" and e["centroids"] == cent["id"]}
        segs = snap.manifest["segments"]
        start = sum(s["n_tokens"] for s in segs[:first_segment])
        total = sum(s["n_tokens"] for s in segs[first_segment:])
        out, written = [], []
        with self.progress.step(f"assigning tokens to {lists.nlist} lists", total, "tokens") as step:
            for seg in segs[first_segment:]:
                stop = start + seg["n_tokens"]
                e = have.get(seg["name"])
                c = self._read(e, (seg["n_tokens"],), np.int32) if e is not None else None
                if c is None:
                    parts = [lists.assign(t, s) for t, s in tokens.chunks(start, stop)]
                    c = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int32, device=self.device)
                    if save and not self.store.read_only:
                        stem = seg["name"].rsplit(".", 1)[0]
                        e = {"kind": "codes", "centroids": cent["id"], "segment": seg["name"]}
                        save = self._save(e, f"codes-{cent['id']}-{stem}.npy", c.cpu().numpy())
                        if save:
                            written.append(e)
                out.append(c.to(self.device))
                step.update(seg["n_tokens"])
                start = stop
        codes = torch.cat(out) if out else torch.zeros(0, dtype=torch.int32, device=self.device)
        return codes, written

    def _residuals(self, state: State, lists: ivf.Lists, cent: dict, entries: list, list_codes: torch.Tensor,
                   first_segment: int, save: bool = True) -> tuple[Residuals, list]:
        """The compressed tier for the snapshot's segments from ``first_segment`` on (``list_codes``:
        those segments' tokens' lists): the buckets (read, else trained on a sample of residuals)
        and each segment's residual codes (read, else encoded; written when writable). Appends to
        ``self.growing`` (a fresh one from segment 0) -> (its view, new manifest entries)."""
        from mvdb.kernels.codes import encode, train_buckets
        from mvdb.kernels.codes.naive import n_bytes

        snap, tokens = state.snap, state.tokens
        bits = self.code_bits or codes_tier.default_bits(snap.dtype)
        dim, written = snap.dim, []
        centroids = lists.centroids.float()
        if first_segment == 0 or self.growing is None:
            have = next((e for e in entries if e.get("kind") == "buckets" and e["centroids"] == cent["id"]
                         and e["bits"] == bits), None)
            table = self._read(have, (dim, 2 * (1 << bits) - 1), np.float32) if have is not None else None
            if table is None:
                take = torch.from_numpy(ivf.sample(tokens.n_tokens, min(1 << 20, 64 * lists.nlist), seed=3))
                tok, sc = tokens.take(take.to(tokens.home))
                x = tok.to(self.device).float() * (sc.to(self.device)[:, None] if sc is not None else 1)
                res = x - centroids[list_codes[take.to(list_codes.device)].long()].to(self.device)
                cutoffs, weights = train_buckets(res, bits)
                table = torch.cat([cutoffs, weights], dim=1).cpu()
                have = {"kind": "buckets", "centroids": cent["id"], "bits": bits}
                if save and not self.store.read_only and self._save(have, f"buckets-{cent['id']}-b{bits}.npy",
                                                                    table.numpy()):
                    written.append(have)
            table = table.to(self.device)
            self.growing = codes_tier.Growing(bits, lists.centroids, table[:, (1 << bits) - 1:],
                                              table[:, : (1 << bits) - 1], have, self.device)
        g = self.growing
        have = {e["segment"]: e for e in entries if e.get("kind") == "residuals" and e["centroids"] == cent["id"]
                and e["bits"] == bits}
        segs = snap.manifest["segments"]
        start = sum(seg["n_tokens"] for seg in segs[:first_segment])
        at = 0  # into list_codes (which starts at first_segment)
        new_lists, new_codes = [], []  # appended once, after every segment's codes: a failure appends nothing
        with self.progress.step(f"encoding residuals ({bits} bits)", sum(x["n_tokens"] for x in segs[first_segment:]),
                                "tokens") as step:
            for seg in segs[first_segment:]:
                n = seg["n_tokens"]
                lc = list_codes[at : at + n]
                e = have.get(seg["name"])
                c = self._read(e, (n, n_bytes(dim, bits)), np.uint8) if e is not None else None
                if c is None:
                    parts, t0 = [], 0
                    for tok_page, sc_page in tokens.chunks(start, start + n):
                        for a in range(0, tok_page.shape[0], ENCODE_CHUNK):
                            x = tok_page[a : a + ENCODE_CHUNK].to(self.device).float()
                            if sc_page is not None:
                                x = x * sc_page[a : a + ENCODE_CHUNK].to(self.device)[:, None]
                            parts.append(encode(x, lc[t0 : t0 + x.shape[0]].to(self.device),
                                                centroids.to(self.device), g.cutoffs.to(self.device), bits))
                            t0 += x.shape[0]
                    c = torch.cat(parts) if parts else torch.zeros((0, n_bytes(dim, bits)), dtype=torch.uint8)
                    if save and not self.store.read_only:
                        stem = seg["name"].rsplit(".", 1)[0]
                        e = {"kind": "residuals", "centroids": cent["id"], "bits": bits, "segment": seg["name"]}
                        save = self._save(e, f"residuals-{cent['id']}-b{bits}-{stem}.npy", c.cpu().numpy())
                        if save:
                            written.append(e)
                new_lists.append(lc)
                new_codes.append(c.to(self.device))
                step.update(n)
                at += n
                start += n
        if new_lists:
            g.append(torch.cat(new_lists), torch.cat(new_codes))
        return g.current, written

    def _commit_index(self, snap, entries: list):
        """Name ``entries`` in a new manifest (codes of segments no longer stored are dropped);
        returns the snapshot after the commit (same rows as ``snap``)."""
        if self.store.read_only:
            return snap
        names = {s["name"] for s in snap.manifest["segments"]}
        latest = {e["name"]: e for e in entries}  # a file written again (it was damaged): its new entry
        try:
            self.store.commit_index([e for e in latest.values() if e.get("kind") not in ("codes", "residuals")
                                     or e["segment"] in names])
        except OSError as e:
            warnings.warn(f"mvdb: could not commit the index files ({e}); the index is kept in memory and "
                          f"rebuilt when the database is next opened", RuntimeWarning, stacklevel=3)
        return self.store.snapshot()

    # ---- following the store

    def follow(self, snap=None) -> State:
        """The state of ``snap`` (default: the store's current snapshot), reached incrementally
        from the current state when only documents were appended or deleted."""
        snap = self.store.snapshot() if snap is None else snap
        st = self.state
        if st is not None and snap.generation == st.generation:
            return st
        if st is not None and st.tokens is not None and snap.dim == st.dim:
            old, new = st.segment_names(), [s["name"] for s in snap.manifest["segments"]]
            if new[: len(old)] == old:
                try:
                    if len(new) > len(old):
                        st = self._append(st, snap, len(old))
                    else:
                        st = replace(st, snap=snap, live=torch.from_numpy(snap.live.copy()).to(self.device), cache={})
                except torch.cuda.OutOfMemoryError:  # pages no longer fit: start over, maybe on the host
                    warnings.warn(f"{self.store.path}: out of device memory while adding; reloading the "
                                  "database (its tokens may move to host memory)", stacklevel=3)
                    self.release()
                    st = self.build(self.store.snapshot())
                    self.state = st
                    return st
                st = self._follow_index(st)
                self.state = st
                return st
        self.release()
        self.state = self.build(snap)
        return self.state

    def _follow_index(self, st: State) -> State:
        """A reader follows a writer's retrain (new centroids named in the manifest)."""
        if not isinstance(st.index, ivf.Lists):
            return st
        cent = next((e for e in st.snap.manifest.get("index_files", []) if e.get("kind") == "centroids"), None)
        if cent is None or cent["id"] == st.index.entry["id"]:
            return st
        index, snap = self._ivf(st)
        return replace(st, snap=snap, index=index, residuals=self.residuals())

    def _append(self, st: State, snap, first: int) -> State:
        lengths = _lengths(snap, first)
        old_rows = st.tokens.n_rows

        def loader(pieces):
            self.store.load_all(None, False, include_deleted=True, from_segment=first, snap=snap, out=pieces)

        tokens = DiskTokens(snap, self.device) if self.tier == "disk" else self.resident.load(loader, lengths)
        live = torch.from_numpy(snap.live.copy()).to(self.device)
        new = State(snap, tokens, live, None)
        index = st.index
        if isinstance(index, FlatView):
            if self.kind(tokens.n_tokens) == "flat":  # the add's tokens go in (lazy, CPU: on first search)
                return replace(new, index=index.index.view(tokens))
            self.flat = None  # let go of the flat index (a filled one holds float32 copies of the tokens)
            index, snap = self._ivf(new)  # grown past the flat index's range: train the IVF index now
            return replace(new, snap=snap, index=index, residuals=self.residuals())
        if index is None:
            index, snap = self._make_index(new)
            return replace(new, snap=snap, index=index, residuals=self.residuals())
        if not self.store.read_only and self._outgrown(new, index):
            index, snap = self._ivf(new, retrain=True)
            return replace(new, snap=snap, index=index, residuals=self.residuals())
        entries = snap.manifest.get("index_files", [])
        save = "crc32" in index.entry
        codes, written = self._codes(new, index, index.entry, entries, first, save=save)
        rel = tokens.offsets[old_rows:] - tokens.offsets[old_rows]
        index = index.with_rows(codes, rel)
        if st.residuals is not None:  # the compressed tier follows: the new tokens' codes appended
            _, more = self._residuals(new, index, index.entry, entries, codes, first, save=save)
            written += more
        if written:
            snap = self._commit_index(snap, entries + written)
        return replace(new, snap=snap, index=index, residuals=self.residuals())

    def stats(self, st: State) -> dict:
        """What ``Database.stats`` reports about a state."""
        m, t, idx = st.snap.manifest, st.tokens, st.index
        return {
            "documents": st.snap.n_live,
            "rows": st.n_rows,
            "tokens": t.n_tokens if t is not None else 0,
            "dim": m["dim"],
            "dtype": m["dtype"],
            "id_type": m["id_type"],
            "segments": len(m["segments"]),
            "deleted": sum(len(s["deleted"]) for s in m["segments"]),
            "device": str(self.device),
            "residency": None if t is None else ("disk" if self.tier == "disk" else "host" if t.on_host else "device"),
            # where the exact tokens are, and whether a compressed tier ranks the pool on the device
            "tier": None if t is None else (f"codes+{self.tier}" if st.residuals is not None else
                                            "host" if t.on_host else "device"),
            "codes_bits": st.residuals.bits if st.residuals is not None else None,
            "codes_bytes": st.residuals.nbytes if st.residuals is not None else 0,
            "resident_bytes": t.token_bytes if t is not None and self.tier != "disk" else 0,
            "resident_capacity_bytes": t.capacity_bytes if t is not None else 0,
            "pages": len(t.pages) if t is not None else 0,
            "page_allocations": self.resident.allocations if self.resident is not None else 0,
            "index": idx.kind if idx is not None else None,
            # what runs the token index: "faiss-gpu", "faiss-cpu" or "torch" (no FAISS installed)
            "index_backend": getattr(idx, "backend", None) or ivf.index_backend(self.device),
            "index_config": dict(self.config),
            "nlist": getattr(idx, "nlist", None) or None,
            "trained_tokens": getattr(idx, "trained_tokens", None),
            "index_tokens": getattr(idx, "filled", idx.ntotal) if idx is not None else 0,
            "build_seconds": {"load": self.load_seconds, **(idx.build_seconds if idx is not None else {})},
            "generation": m["generation"],
        }
