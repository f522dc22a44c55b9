"""The IVF token index ("centroid lists"): spherical k-means centroids, every stored token's list
(its nearest centroid), and per list the document rows holding such a token (CSR).

A query token is scored against every centroid (one GEMM) and probes its ``nprobe`` best lists; a
document is credited, per query token, with the best probed centroid it holds minus the
nprobe-th (the value imputed where it holds none), summed over the query's tokens
(mvdb.kernels.lists). The best ``n_candidates`` go to the exact rerank. The index holds no second
copy of the vectors, and it is persisted (centroids + per-segment codes, see
mvdb.engine.persist), so opening neither retrains nor re-assigns.

:class:`Lists` objects are immutable: adding rows returns a new one (the old one keeps serving
searches that started before), merging the new rows into each list without re-sorting the old.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from mvdb.engine.codes import AppendBuffer
from mvdb.kernels.host import upload
from mvdb.kernels.lists import credit_lists, credit_lists_fixed, fixed_gains, list_bounds, token_queries

try:
    import faiss
except ImportError:  # FAISS is an extra (mvdb[cpu] or mvdb[gpu]); without it the token index is pure torch
    faiss = None

# Retrain once the live tokens exceed this many times those the centroids were trained on (or the
# corpus calls for more lists). The k-means sample is bounded (TRAIN_MAX), so a retrain at the same
# list count only helps where the data drifted; with the default list count (2 sqrt(N)) the list
# count doubles every 4x anyway, and retraining more often costs growth its speed
# (docs/benchmarks.md, findings).
RETRAIN_GROWTH = 4.0
TRAIN_PER_LIST = 40  # k-means sample: tokens per list
TRAIN_PER_LIST_GPU = 160  # where k-means runs on the GPU: a larger sample is cheap there and lifts recall
KMEANS_NITER = 10
# Retrains start cold, like a bulk build: a warm start from the centroids being replaced leaves
# lists of uneven length, which every probe walks.
# What trains the centroids where FAISS has the GPU: "faiss" (Clustering over a GpuIndexFlatIP) or
# "torch-fp16" (:func:`kmeans` with float16 GEMMs: faster, a little less recall).
KMEANS_GPU = "faiss"
# Two-level k-means (CPU, many lists) is cheap per point; a larger sample makes up for part of
# what it loses against flat k-means.
TRAIN_PER_LIST_TWO_LEVEL = 100
TRAIN_MAX = 1 << 21  # tokens in a k-means sample at most
ASSIGN_CHUNK = 1 << 22  # tokens per assignment step
# The crediting kernel runs a program per query token; where a launch has fewer than
# CREDIT_PROGRAMS tokens (a search of a few queries), each token's rows are split into parts (a
# power of two, at most CREDIT_SPANS), a program each, so that the GPU still fills (a single
# query is fastest in 4 parts; from 5 queries on, more parts than 2 cost more than they give:
# each part walks its lists in blocks of 2048 entries mostly masked).
CREDIT_PROGRAMS = 128
CREDIT_SPANS = 16
# On a CPU, from this many lists on, k-means runs in two levels and tokens are assigned through a
# coarse quantizer over the centroids (COARSE_PROBE groups deep): minutes become seconds.
CPU_COARSE_NLIST = 1024
# The torch crediting's score table on a CPU, bytes at a time: one query's, which stays in the
# caches (docs/scale.md, "The 2-core CPU")
CPU_SCRATCH = 1 << 20
COARSE_PROBE = 6
# Lists a GPU trains per sqrt(tokens) (default_nlist). A CPU trains 4x as many: its exact rerank is
# what a search costs there, and finer lists hand it a narrower pool at the same recall, for a
# longer build.
LISTS_PER_SQRT = 2
CPU_LISTS_PER_SQRT = 8
# On a CPU the lists' pool is wider than what the exact stage reranks, and ranked again first by
# centroid interaction (:func:`interaction`: every token of a document stands for its list's
# centroid). The crediting sees only the probed lists, so a long document whose matches fell in
# other lists ranks low there; the interaction sees every token, at a small part of an exact
# score's cost (a table lookup per token instead of a dot product).
CPU_POOL_PER_CANDIDATE = 4
# The interaction's maximum over a document's tokens is a soft one (a sum of exponentials, one
# embedding_bag: a hard maximum over gathered rows is about four times slower in torch on a CPU), this
# sharp (a softer one credits a document for every near match, which favours long ones); a
# similarity more than SOFT_FLOOR below the query token's best centroid counts as that (which
# keeps the exponentials clear of subnormal floats, slow on a CPU).
SHARPNESS = 128.0
SOFT_FLOOR = 0.5
INTERACTION_GROUPS = 8  # groups of similar length the interaction reads its rows in
PROBE_BLOCK = 128  # centroids a block when a CPU picks a token's probes (top_rows)


def require_faiss():
    if faiss is None:
        raise ImportError('mvdb needs FAISS here: pip install "mvdb[cpu]" (or "mvdb[gpu]" on a CUDA machine)')


def gpu_available() -> bool:
    """FAISS with GPU support and a GPU it can see."""
    return faiss is not None and hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def index_backend(device: torch.device | str | None = None) -> str:
    """What runs the token index (flat search, k-means) of a database on ``device`` (default: CUDA
    when available): "faiss-gpu" (a CUDA device and faiss-gpu), "faiss-cpu" (a CPU device and
    FAISS), else "torch" (FAISS not installed, or a CUDA device where FAISS has no GPU: torch on
    the GPU beats FAISS on the host)."""
    dev = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda":
        return "faiss-gpu" if gpu_available() else "torch"
    return "faiss-cpu" if faiss is not None else "torch"


def default_nlist(n_tokens: int, per_sqrt: int = LISTS_PER_SQRT) -> int:
    """About ``per_sqrt`` * sqrt(N) lists (a power of two, at most 65536, at least 39 tokens each):
    assigning costs N x nlist dot products, so more lists trade build time for finer lists."""
    n = 1
    while n < per_sqrt * n_tokens**0.5 and n < 65536 and 2 * n * 39 <= n_tokens:
        n *= 2
    return n


def sample(n: int, m: int, seed: int = 0) -> np.ndarray:
    """``min(n, m)`` distinct indices below ``n``, seeded, ascending (without a permutation of n)."""
    rng = np.random.default_rng(seed)
    if m >= n:
        return np.arange(n)
    if 4 * m > n:
        return np.sort(rng.permutation(n)[:m])
    x = np.unique(rng.integers(0, n, m + m // 8 + 16))
    while len(x) < m:
        x = np.unique(np.concatenate([x, rng.integers(0, n, m)]))
    return np.sort(rng.choice(x, m, replace=False))


def train_centroids(sample: torch.Tensor, nlist: int, seed: int = 0, niter: int | None = None,
                    two_level: bool = False, device: torch.device | None = None) -> torch.Tensor:
    """Spherical k-means -> float32 [nlist, dim] on the CPU: FAISS (on the GPU with faiss-gpu), or
    :func:`kmeans` in torch on ``device`` where index_backend says "torch".

    ``two_level``: about sqrt(nlist) coarse clusters, each split into its share of the lists
    (faiss.contrib.clustering.two_level_clustering): each point meets sqrt(nlist) centroids per
    iteration instead of nlist, what a CPU can afford for thousands of lists."""
    niter = KMEANS_NITER if niter is None else niter
    dev = torch.device(device) if device is not None else sample.device
    if index_backend(dev) == "faiss-gpu" and KMEANS_GPU == "torch-fp16" and not two_level:
        return kmeans(sample.to(dev, torch.float32), nlist, niter, seed, half=True).cpu()
    if index_backend(dev) == "torch":
        x = sample.to(dev, torch.float32)
        if two_level and nlist >= 4:
            return two_level_kmeans(x, max(2, round(nlist**0.5)), nlist, niter, seed).cpu()
        return kmeans(x, nlist, niter, seed).cpu()
    require_faiss()
    x = np.ascontiguousarray(sample.float().cpu().numpy())
    dim = x.shape[1]
    if two_level and nlist >= 4:
        from faiss.contrib.clustering import two_level_clustering

        cent, _ = two_level_clustering(x, max(2, round(nlist**0.5)), nlist, clustering_niter=niter, spherical=True,
                                       seed=seed)
        return torch.from_numpy(np.ascontiguousarray(cent, dtype=np.float32))
    cl = faiss.Clustering(dim, nlist)
    cl.niter, cl.seed, cl.spherical = niter, seed, True
    cl.max_points_per_centroid = max(1, x.shape[0] // nlist + 1)  # the caller sized the sample
    if gpu_available():
        res = faiss.StandardGpuResources()
        quantizer = faiss.GpuIndexFlatIP(res, dim)
    else:
        quantizer = faiss.IndexFlatIP(dim)
    cl.train(x, quantizer)
    return torch.from_numpy(faiss.vector_to_array(cl.centroids).reshape(nlist, dim).copy())


def kmeans(x: torch.Tensor, k: int, niter: int = KMEANS_NITER, seed: int = 0, half: bool = False) -> torch.Tensor:
    """Spherical k-means in torch, FAISS ``Clustering``'s algorithm: k distinct points to start,
    ``niter`` rounds of assign (one GEMM + argmax per chunk), mean and normalise; an empty cluster
    takes a perturbed copy of a centroid drawn in proportion to cluster sizes. x float32 [n, dim]
    -> unit-norm float32 [k, dim] on x's device. ``half``: the assignment GEMM in float16 (tensor
    cores on a GPU); the means stay float32."""
    g = torch.Generator().manual_seed(seed)
    n = x.shape[0]
    start = torch.randperm(n, generator=g)[:k] if n >= k else torch.randint(0, n, (k,), generator=g)
    c = torch.nn.functional.normalize(x[start.to(x.device)], dim=1)
    for _ in range(niter):
        a = assign(x, c.half() if half else c).long()
        c = torch.nn.functional.normalize(torch.zeros_like(c).index_add_(0, a, x), dim=1)
        counts = torch.bincount(a, minlength=k)
        empty = torch.nonzero(counts == 0).flatten()
        if empty.numel():
            donor = torch.multinomial(counts.float().cpu(), empty.numel(), replacement=True, generator=g).to(c.device)
            noise = torch.randn(empty.numel(), c.shape[1], generator=g).to(c.device)
            c[empty] = torch.nn.functional.normalize(c[donor] + 1e-3 * noise, dim=1)
    return c


def two_level_kmeans(x: torch.Tensor, n_coarse: int, k: int, niter: int = KMEANS_NITER, seed: int = 0) -> torch.Tensor:
    """:func:`kmeans` in two levels (as faiss.contrib.clustering.two_level_clustering): ``n_coarse``
    clusters, each split into lists in proportion to its points, ``k`` in all."""
    coarse = kmeans(x, n_coarse, niter, seed)
    a = assign(x, coarse).long()
    counts = torch.bincount(a, minlength=n_coarse)
    cum = counts.cumsum(0) * k // x.shape[0]
    share = (cum - torch.cat([cum.new_zeros(1), cum[:-1]])).tolist()
    order = torch.argsort(a, stable=True)
    bounds = [0] + counts.cumsum(0).tolist()
    out = [kmeans(x[order[bounds[i] : bounds[i + 1]]], share[i], niter, seed + 1 + i)
           for i in range(n_coarse) if share[i] > 0]
    return torch.cat(out)


def assign(x: torch.Tensor, centroids: torch.Tensor, scratch: int = 1 << 30) -> torch.Tensor:
    """Each row's nearest centroid by inner product (centroids are unit norm) -> int32 [n]; rows in
    chunks whose [rows, nlist] similarity block stays near ``scratch`` bytes."""
    out = torch.empty(x.shape[0], dtype=torch.int32, device=x.device)
    c = centroids.to(x.device)
    chunk = max(256, scratch // (c.shape[0] * c.element_size()))
    for i in range(0, x.shape[0], chunk):
        out[i : i + chunk] = (x[i : i + chunk].to(c.dtype) @ c.T).argmax(dim=1).int()
    return out


class Lists:
    """Centroids and, per list, the document rows holding one of its tokens (CSR, rows ascending).

    ``entry`` is the centroids' manifest entry (id, nlist, trained_tokens)."""

    kind = "ivf"

    def __init__(self, centroids: torch.Tensor, list_offsets: torch.Tensor, list_rows: torch.Tensor, n_rows: int,
                 n_tokens: int, entry: dict, token_lists: tuple | None = None):
        self.device = list_offsets.device
        self.nlist, self.dim = centroids.shape
        self.centroids = centroids
        self.list_offsets, self.list_rows = list_offsets, list_rows
        self.n_rows, self.ntotal = n_rows, n_tokens
        self.entry = entry
        self.trained_tokens = entry["trained_tokens"]
        self.backend = index_backend(self.device)  # what trains and assigns (the lists are searched in torch)
        self.build_seconds: dict = {}
        # on a CPU, every token's list in row order and each row's first token (append-only
        # buffers shared with the indexes grown from this one; this one reads its first rows)
        self._token_lists = token_lists

    @property
    def token_lists(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(each token's list, int32 [ntotal]; each row's first token, int64 [n_rows + 1]), on a
        CPU only (what :func:`interaction` reads), else None."""
        if self._token_lists is None:
            return None
        lists, firsts = self._token_lists
        return lists.data[: self.ntotal], firsts.data[: self.n_rows + 1]

    @classmethod
    def empty(cls, centroids: torch.Tensor, entry: dict, device: torch.device) -> Lists:
        half = device.type == "cuda"
        c = centroids.to(device, torch.float16 if half else torch.float32)
        token_lists = None
        if device.type == "cpu":
            token_lists = (AppendBuffer((), torch.int32, device), AppendBuffer((), torch.int64, device))
            token_lists[1].append(torch.zeros(1, dtype=torch.int64))
        return cls(c, torch.zeros(c.shape[0] + 1, dtype=torch.int64, device=device),
                   torch.zeros(0, dtype=torch.int32, device=device), 0, 0, entry, token_lists)

    def _grown_token_lists(self, codes: torch.Tensor, row_offsets: torch.Tensor) -> tuple | None:
        """The token lists' buffers with the new rows appended (fresh copies where another index
        already appended past this one's rows)."""
        if self._token_lists is None:
            return None
        lists, firsts = self._token_lists
        if lists.n != self.ntotal or firsts.n != self.n_rows + 1:
            old_lists, old_firsts = self.token_lists
            lists, firsts = AppendBuffer((), torch.int32, self.device), AppendBuffer((), torch.int64, self.device)
            lists.append(old_lists)
            firsts.append(old_firsts)
        lists.append(codes.to(self.device, torch.int32))
        firsts.append(self.ntotal + row_offsets[1:].to(self.device, torch.int64))
        return lists, firsts

    def bounds(self) -> torch.Tensor:
        """Where each list's entries enter each of CREDIT_SPANS spans of the rows
        (mvdb.kernels.lists.list_bounds), for splitting the crediting kernel's work; computed on
        first use (one pass over the entries) and kept with this immutable index."""
        b = getattr(self, "_bounds", None)
        if b is None:
            b = self._bounds = list_bounds(self.list_offsets, self.list_rows, self.n_rows, CREDIT_SPANS)
        return b

    @staticmethod
    def parts_for(n_tokens: int) -> int:
        """Parts per token for a launch of ``n_tokens`` tokens (see CREDIT_PROGRAMS)."""
        parts = 1
        while parts < CREDIT_SPANS and n_tokens * parts < CREDIT_PROGRAMS:
            parts *= 2
        return parts

    @property
    def approximate(self) -> bool:
        """Assign through a coarse quantizer (CPU, many lists) rather than against every centroid."""
        return self.device.type == "cpu" and self.nlist >= CPU_COARSE_NLIST

    def _coarse(self):
        """A coarse quantizer over the centroids themselves (about sqrt(nlist) groups), probed
        ``COARSE_PROBE`` groups deep: a token meets about (1 + COARSE_PROBE) sqrt(nlist)
        centroids instead of nlist (its nearest centroid or a close second). Built on first use.
        :class:`TorchCoarse` (batched GEMMs per group) also where FAISS is installed: a FAISS
        IndexIVFFlat over the centroids scans per token, which is slower on a CPU."""
        ix = getattr(self, "_coarse_index", None)
        if ix is None:
            ix = self._coarse_index = TorchCoarse(self.centroids.float().cpu(), max(2, round(self.nlist**0.5)))
        return ix

    def assign(self, tokens: torch.Tensor, scales: torch.Tensor | None) -> torch.Tensor:
        """Lists of stored tokens (float16, or int8 with scales) -> int32 codes on the device."""
        out = []
        for i in range(0, tokens.shape[0], ASSIGN_CHUNK):
            x = tokens[i : i + ASSIGN_CHUNK].to(self.device)
            if scales is not None:
                x = x.float() * scales[i : i + ASSIGN_CHUNK].to(self.device)[:, None]
            if self.approximate:
                out.append(self._coarse().assign(x.float()))
            else:
                out.append(assign(x, self.centroids))
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.int32, device=self.device)

    def with_rows(self, codes: torch.Tensor, row_offsets: torch.Tensor) -> Lists:
        """A new index that also holds rows n_rows.. (their tokens' ``codes`` in row order;
        ``row_offsets`` [new rows + 1] relative token offsets). Old entries keep their order; the
        new rows (all later than every old one) go to the end of each list."""
        dev = self.device
        n_new = row_offsets.numel() - 1
        lengths = (row_offsets[1:] - row_offsets[:-1]).to(dev)
        row_of = torch.repeat_interleave(torch.arange(self.n_rows, self.n_rows + n_new, device=dev), lengths)
        key = torch.unique(codes.to(dev).long() * (self.n_rows + n_new) + row_of)  # by list, then row
        del row_of
        new_rows = (key % max(1, self.n_rows + n_new)).int()
        new_counts = torch.bincount(key // max(1, self.n_rows + n_new), minlength=self.nlist)
        shift = torch.zeros(self.nlist + 1, dtype=torch.int64, device=dev)
        shift[1:] = new_counts.cumsum(0)  # new entries before the end of each list
        offsets = self.list_offsets + shift
        rows = torch.empty(offsets[-1].item(), dtype=torch.int32, device=dev)
        n_old = self.list_rows.numel()
        step = 1 << 24
        for a in range(0, n_old, step):  # old entries move down by the new entries of earlier lists
            b = min(n_old, a + step)
            pos = torch.arange(a, b, device=dev)
            which = torch.searchsorted(self.list_offsets, pos, right=True) - 1
            rows[pos + shift[which]] = self.list_rows[a:b]
        if new_rows.numel():
            lists = key // max(1, self.n_rows + n_new)
            rank = torch.arange(new_rows.numel(), device=dev) - (shift[1:] - new_counts)[lists]
            rows[self.list_offsets[lists + 1] + shift[lists] + rank] = new_rows
        return Lists(self.centroids, offsets, rows, self.n_rows + n_new, self.ntotal + int(codes.numel()), self.entry,
                     self._grown_token_lists(codes, row_offsets))

    def candidates(self, q: torch.Tensor, cu: list[int], live: torch.Tensor, n_candidates: int, nprobe: int,
                   scratch_bytes: int = 1 << 30, backend: str = "auto", cu_dev: torch.Tensor | None = None,
                   qid: torch.Tensor | None = None, ordered: bool = True, pool: int | None = None,
                   widths: list[int] | None = None, all_live: bool = False) -> torch.Tensor:
        """Per query, the ``n_candidates`` live rows with the best approximate scores, batched.

        q [Tq, dim] packed query tokens, ``cu`` their offsets (host ints). Every query token is
        scored against every centroid (one GEMM) and probes its ``nprobe`` best lists. A row's
        approximate score sums, over the query's tokens, the similarity of the best probed centroid
        among the row's tokens minus the nprobe-th (the value imputed where the row holds none);
        see mvdb.kernels.lists. Queries go in chunks whose score tables stay near
        ``scratch_bytes``. Returns [Nq, n_candidates] rows, -1 where fewer rows exist; best first
        where ``ordered`` (else in any order: a sorted top-k costs more host time than the rest of
        its selection). ``cu_dev`` / ``qid``: the offsets and each token's query already on the
        device (mvdb.engine.search.Queries), else made here. ``pool`` (a CPU's index): the best
        ``pool`` rows by that score are ranked again by :func:`interaction`, and its best
        ``n_candidates`` returned. ``widths`` (with ``pool``): query i's own number of candidates
        (at most ``n_candidates``; its pool shrinks in proportion), -1 past it. ``all_live``: the
        caller knows every row is live (the GPU then does not mask the dead ones).
        """
        nq, dev = len(cu) - 1, q.device
        out = torch.full((nq, n_candidates), -1, dtype=torch.int64, device=dev)
        if nq == 0 or self.n_rows == 0:
            return out
        p = max(1, min(nprobe, self.nlist))
        n = min(n_candidates, self.n_rows)
        if not (backend == "triton" or (backend == "auto" and dev.type == "cuda")):
            return self._candidates_torch(q, cu, ~live, out, n, p, ordered, min(scratch_bytes, CPU_SCRATCH), pool,
                                          widths)
        # the Triton path: fixed-point scores (int32), every token its own program
        sim = q.to(self.centroids.dtype) @ self.centroids.T  # [Tq, nlist]
        sv, probes = sim.topk(p, dim=1)
        del sim
        gains = sv.float() - sv[:, -1:].float()  # >= 0, non-increasing along the probes
        gains, _ = fixed_gains(gains, cu_dev if cu_dev is not None else upload(torch.tensor(cu), dev))
        if qid is None:
            qid = token_queries(cu, q.shape[0], dev)
        chunk = max(1, scratch_bytes // max(1, self.n_rows * 4))
        dead = None if all_live else ~live
        for a in range(0, nq, chunk):
            b = min(nq, a + chunk)
            parts = self.parts_for(cu[b] - cu[a])
            score = credit_lists_fixed(self.list_offsets, self.list_rows, self.n_rows, probes, gains,
                                       cu[a : b + 1], qid, q_base=a, parts=parts,
                                       bounds=self.bounds() if parts > 1 else None)
            lowest = torch.iinfo(score.dtype).min  # dead rows rank last
            if dead is not None:
                score.masked_fill_(dead[None], lowest)
            top = score.topk(n, dim=1, sorted=ordered)
            out[a:b, :n] = top.indices.masked_fill(top.values == lowest, -1)
            del score
        return out

    def _candidates_torch(self, q, cu, dead, out, n, nprobe, ordered, scratch_bytes, pool, widths=None):
        """:meth:`candidates` in torch (a CPU): a chunk of queries at a time (their score table
        stays in the caches), each chunk's centroid scores kept for :func:`interaction`."""
        nq = len(cu) - 1
        chunk = max(1, scratch_bytes // max(1, self.n_rows * 4 * (max(cu[i + 1] - cu[i] for i in range(nq)) + 1)))
        token_lists = self.token_lists
        wide = min(self.n_rows, pool or 0)
        again = token_lists is not None and wide > n
        for a in range(0, nq, chunk):
            b = min(nq, a + chunk)
            # [nlist, chunk tokens]: the layout the interaction reads (a transpose costs as much as the GEMM)
            sim_t = self.centroids @ q[cu[a] : cu[b]].to(self.centroids.dtype).T
            sv, probes = top_rows(sim_t, nprobe)
            gains = sv.float() - sv[:, -1:].float()
            cu_chunk = torch.tensor(cu[a : b + 1]) - cu[a]
            score = credit_lists(self.list_offsets, self.list_rows, self.n_rows, probes, gains, cu_chunk,
                                 backend="torch")
            score.masked_fill_(dead[None], float("-inf"))  # dead rows rank last
            if widths is None or not again:
                top = score.topk(wide if again else n, dim=1, sorted=ordered and not again)
                rows = top.indices.masked_fill(top.values == float("-inf"), -1)
            if not again:
                out[a:b, :n] = rows
                continue
            for i in range(b - a):
                if widths is None:
                    n_i, rows_i = n, rows[i]
                else:  # this query's own width, and a pool in proportion
                    n_i = max(1, min(n, widths[a + i]))
                    top = score[i].topk(min(self.n_rows, max(n_i, wide * n_i // n)), sorted=False)
                    rows_i = top.indices.masked_fill(top.values == float("-inf"), -1)
                ci = interaction(sim_t[:, cu[a + i] - cu[a] : cu[a + i + 1] - cu[a]], rows_i, *token_lists)
                best = ci.topk(n_i, sorted=ordered)
                out[a + i, :n_i] = rows_i[best.indices].masked_fill(best.values == float("-inf"), -1)
            del score
        return out


def top_rows(sim_t: torch.Tensor, k: int, block: int = PROBE_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """``sim_t.T.topk(k, dim=1)`` (per column of sim_t [n, t] its k largest rows, best first: [t, k]
    values and row numbers) through blocks of ``block`` rows: the k largest of a column lie in the
    k blocks with the largest maxima, so only those blocks' rows (and any past the last whole
    block) are ranked; on a CPU a quarter of the time of a top-k over every row."""
    n, t = sim_t.shape
    nb = n // block
    if nb <= k or t == 0:
        return sim_t.T.topk(k, dim=1)
    head = sim_t[: nb * block].view(nb, block, t).amax(dim=1).topk(k, dim=0, sorted=False).indices  # [k, t]
    rows = (head[:, None, :] * block + torch.arange(block, device=sim_t.device)[None, :, None]).reshape(k * block, t)
    if nb * block < n:
        rows = torch.cat([rows, torch.arange(nb * block, n, device=sim_t.device)[:, None].expand(-1, t)])
    v, j = sim_t.gather(0, rows).topk(k, dim=0)
    return v.T, rows.gather(0, j).T


def interaction(sim_t: torch.Tensor, rows: torch.Tensor, token_lists: torch.Tensor, firsts: torch.Tensor,
                groups: int = INTERACTION_GROUPS) -> torch.Tensor:
    """Centroid interaction of one query with the rows ``rows`` [P] (-1: none) -> float32 [P]:
    over the query's tokens, the best similarity of a centroid whose list holds one of the row's
    tokens (PLAID's approximate score), each maximum a soft one (see SHARPNESS). sim_t [nlist, Lq]:
    every centroid against the query's tokens; token_lists / firsts: :attr:`Lists.token_lists`.
    A row without tokens scores 0 (as its exact MaxSim), -1 scores -inf.

    The rows go in ``groups`` groups of similar length; a group's tokens' lists are read as
    windows of its longest length (one copy a row, from a view whose rows overlap), and each
    window is three bags of one embedding_bag, the row's own tokens the middle one (a window that
    would run past the array's end starts earlier)."""
    out = torch.full(rows.shape, float("-inf"))
    ok = rows >= 0
    r = rows.clamp_min(0)
    starts = firsts[r]
    lens = (firsts[r + 1] - starts) * ok
    out[ok & (lens == 0)] = 0.0
    which = torch.nonzero(lens > 0).flatten()
    if not which.numel():
        return out
    lens, order = lens[which].sort()
    which = which[order]
    starts = starts[which]
    best = sim_t.float().amax(dim=0, keepdim=True)
    weights = sim_t.float() - best
    # [nlist, Lq] in bfloat16 (float32's range; its 3 digits move a token's score by 1e-4): the
    # embedding_bag reads half the bytes
    weights = weights.clamp_(min=-SOFT_FLOOR).mul_(SHARPNESS).exp_().to(torch.bfloat16).contiguous()
    n_tok = token_lists.numel()
    cuts = torch.linspace(0, which.numel(), groups + 1).long().unique().tolist()
    soft = torch.empty((which.numel(), sim_t.shape[1]))
    for a, b in zip(cuts, cuts[1:]):
        longest = int(lens[b - 1])
        start = starts[a:b].clamp_max(n_tok - longest)
        windows = token_lists.as_strided((n_tok - longest + 1, longest), (1, 1))
        ids = windows.index_select(0, start).flatten()
        base = torch.arange(b - a) * longest
        head = base + (starts[a:b] - start)
        # offsets in the ids' dtype (int32): offsets of another dtype make embedding_bag copy the ids
        bags = torch.stack([base, head, head + lens[a:b]], dim=1).flatten().to(ids.dtype)
        soft[a:b] = torch.nn.functional.embedding_bag(ids, weights, bags, mode="sum")[1::3].float()
    out[which] = soft.log_().sum(dim=1) / SHARPNESS + float(best.sum())
    return out


class TorchCoarse:
    """FAISS ``IndexIVFFlat`` over the centroids, in torch: the centroids in ``groups`` k-means
    groups; a token is compared with the centroids of its ``probe`` nearest groups only."""

    def __init__(self, centroids: torch.Tensor, groups: int, probe: int = COARSE_PROBE):
        self.centroids = centroids  # float32 [nlist, dim]
        self.heads = kmeans(centroids, groups, seed=1)
        member = assign(centroids, self.heads).long()
        self.order = torch.argsort(member, stable=True)  # centroid ids, group by group
        self.bounds = [0] + torch.bincount(member, minlength=groups).cumsum(0).tolist()
        self.probe = min(probe, groups)

    def assign(self, x: torch.Tensor, chunk: int = 1 << 18) -> torch.Tensor:
        """Nearest centroid among the probed groups' -> int32 [n]."""
        out = torch.empty(x.shape[0], dtype=torch.int32)
        for a in range(0, x.shape[0], chunk):
            xs = x[a : a + chunk]
            probes = (xs @ self.heads.T).topk(self.probe, dim=1).indices.flatten()  # [m * probe]
            by_group = torch.argsort(probes, stable=True)
            starts = [0] + torch.bincount(probes, minlength=len(self.bounds) - 1).cumsum(0).tolist()
            best = torch.full((xs.shape[0],), float("-inf"))
            arg = torch.zeros(xs.shape[0], dtype=torch.int64)
            for g in range(len(self.bounds) - 1):
                rows = by_group[starts[g] : starts[g + 1]] // self.probe
                if not rows.numel():
                    continue
                ids = self.order[self.bounds[g] : self.bounds[g + 1]]
                v, j = (xs[rows] @ self.centroids[ids].T).max(dim=1)
                better = v > best[rows]
                best[rows[better]], arg[rows[better]] = v[better], ids[j[better]]
            out[a : a + chunk] = arg.int()
        return out


def build_lists(centroids: torch.Tensor, entry: dict, codes: torch.Tensor, row_offsets: torch.Tensor,
                device: torch.device) -> Lists:
    """Lists over every row from scratch (codes [T] in row order, row_offsets [n_rows + 1])."""
    t0 = time.perf_counter()
    out = Lists.empty(centroids, entry, device).with_rows(codes, row_offsets)
    out.build_seconds["lists"] = time.perf_counter() - t0
    return out
