"""Token pooling: fewer vectors a document, by clustering its tokens and keeping the cluster means.

``mvdb.pool(docs, pool_factor=2)`` clusters each document's tokens by Ward linkage on cosine
distance (``1 - cos(a, b)``), into ``tokens // pool_factor`` clusters (at least one),
keeps the first ``protected`` tokens (a ``[CLS]``) as they are, and replaces each cluster by the
mean of its tokens: the scheme of Clavie, Chaffin and Adams (2024) that PyLate, colpali-engine and
Sentence Transformers' ``HierarchicalTokenPooling`` ship, which keeps retrieval quality at half the
vectors. The clusters are those of SciPy's ``linkage(condensed, "ward")`` cut by ``fcluster(...,
"maxclust")``, except on exact distance ties.

The clustering runs on many documents at once (padded to a batch's longest), on the documents'
own device: greedy agglomeration with the Lance-Williams update of Ward's distance, one merge of
every document per step. Ward's linkage is monotone, so stopping each document after ``tokens -
clusters`` merges gives the same partition as cutting its full dendrogram at that many clusters.
"""

from __future__ import annotations

import numbers

import numpy as np
import torch

from mvdb.errors import InvalidInputError, InvalidTypeError

__all__ = ["POOLING_KEY", "check_pooling_encoder", "describe", "pool", "pool_checked", "pool_packed", "pooling_arg",
           "resolve_open", "resolve_pooling", "with_pooling"]

POOLING_KEY = "pooling"  # the manifest config's key of a database's pooling: {"pool_factor", "protected"}

BATCH_TOKENS = 1 << 21  # a clustering batch on a CPU: its documents x their longest, squared
GPU_BATCH_TOKENS = 1 << 28  # on a GPU (1 GB of float32 distances): a merge step is a few launches for every document


def pool(docs, pool_factor: float = 2, *, protected: int = 1, normalize: bool = True, return_groups: bool = False):
    """Pool each document's tokens -> a list of [M_i, dim] arrays of the input's kind (numpy
    float32, or torch tensors on their device and dtype), ``M_i = protected + max(1, (L_i -
    protected) // pool_factor)`` where a document has more tokens to pool than that.

    ``pool_factor``: >= 1 (1: nothing pooled); fractional values keep ``1 / pool_factor`` of the
    tokens. ``protected``: leading tokens kept as they are (0: none). ``normalize``: unit-length
    output vectors (the cluster means of unit vectors are shorter). ``return_groups``: also return,
    for each document, an int64 array of its L_i tokens' output rows (which pooled vector each
    token went into).
    """
    _check_factor(pool_factor, "")
    _check_protected(protected, "protected")
    if not isinstance(docs, (list, tuple)):
        raise InvalidTypeError(f"docs: expected a list of [tokens, dim] arrays, got {type(docs).__name__}")
    tensors, kind = [], None
    for i, d in enumerate(docs):
        if isinstance(d, torch.Tensor):
            t = d
        elif isinstance(d, np.ndarray):
            t = torch.from_numpy(np.ascontiguousarray(d, dtype=np.float32))
        else:
            raise InvalidTypeError(f"docs[{i}]: expected a numpy array or torch tensor, got {type(d).__name__}")
        if t.ndim != 2 or t.shape[0] == 0 or not t.is_floating_point():
            raise InvalidInputError(f"docs[{i}]: expected a non-empty [tokens, dim] float array, got shape "
                                    f"{tuple(t.shape)} of {t.dtype}")
        if tensors and t.device != tensors[0].device:
            raise InvalidInputError(f"docs[{i}]: expected every document on {tensors[0].device} like docs[0], "
                                    f"got {t.device}")
        if tensors and t.shape[1] != tensors[0].shape[1]:
            raise InvalidInputError(f"docs[{i}]: expected dim {tensors[0].shape[1]} like docs[0], got {t.shape[1]}")
        kind = kind or type(d)
        tensors.append(t)
    out, groups = [None] * len(tensors), [None] * len(tensors)
    todo = []
    for i, t in enumerate(tensors):
        n = t.shape[0] - min(protected, t.shape[0])
        k = max(int(n // pool_factor), 1)
        if k < n:
            todo.append((i, n, k))
        else:  # nothing to merge
            out[i], groups[i] = t, torch.arange(t.shape[0])
    todo.sort(key=lambda r: r[1])
    budget = GPU_BATCH_TOKENS if tensors and tensors[0].device.type == "cuda" else BATCH_TOKENS
    start = 0
    while start < len(todo):
        end, widest = start, 0
        while end < len(todo) and (end == start or (end - start + 1) * max(widest, todo[end][1]) ** 2 <= budget):
            widest = max(widest, todo[end][1])
            end += 1
        batch = todo[start:end]
        labels, means = _ward_batch([tensors[i][protected:] for i, _, _ in batch], [k for _, _, k in batch])
        labels = labels.cpu()  # one copy a batch, not one a document
        for row, (i, n, k) in enumerate(batch):
            t = tensors[i]
            out[i] = torch.cat([t[:protected], means[row, :k].to(t.dtype)])
            groups[i] = torch.cat([torch.arange(protected), protected + labels[row, :n]])
        start = end
    result = []
    for t in out:
        if normalize:
            t = torch.nn.functional.normalize(t.float(), dim=-1).to(t.dtype)
        result.append(t.numpy() if kind is np.ndarray else t)
    if return_groups:
        return result, [g.numpy().astype(np.int64) for g in groups]
    return result


def pooling_arg(pool_factor, protected=None) -> dict | None:
    """``pool_factor`` / ``pool_protected`` as given to ``mvdb.open``, ``add``, ``add_texts`` or
    ``mvdb ingest`` -> the pooling they ask for ({"pool_factor", "protected"}), or None where
    ``pool_factor`` is None (the database's recorded pooling applies). ``protected`` None: 1."""
    if pool_factor is None:
        if protected is not None:
            raise InvalidInputError(f"pool_protected: given ({protected!r}) without pool_factor; pass both")
        return None
    _check_factor(pool_factor, " (1: no pooling)")
    if pool_factor == float("inf"):  # recorded in JSON: a finite number
        raise InvalidInputError(f"pool_factor: expected a number >= 1 (1: no pooling), got {pool_factor}")
    protected = 1 if protected is None else protected
    _check_protected(protected, "pool_protected")
    factor = int(pool_factor) if float(pool_factor).is_integer() else float(pool_factor)
    return {"pool_factor": factor, "protected": int(protected)}


def _check_factor(pool_factor, note: str) -> None:
    if isinstance(pool_factor, bool) or not isinstance(pool_factor, numbers.Real):
        raise InvalidTypeError(f"pool_factor: expected a number >= 1, got {type(pool_factor).__name__}")
    if not pool_factor >= 1:
        raise InvalidInputError(f"pool_factor: expected a number >= 1{note}, got {pool_factor}")


def _check_protected(protected, name: str) -> None:
    if isinstance(protected, bool) or not isinstance(protected, numbers.Integral):
        raise InvalidTypeError(f"{name}: expected an int >= 0, got {type(protected).__name__}")
    if protected < 0:
        raise InvalidInputError(f"{name}: expected an int >= 0, got {protected}")


def describe(rec: dict | None, none: str = "no pooling") -> str:
    """A pooling record in words (``none`` where it pools nothing)."""
    if rec is None or rec.get("pool_factor", 1) == 1:
        return none
    return f"pool_factor {rec['pool_factor']}, {rec['protected']} protected leading token(s)"


def check_pooling_encoder(encoder, pooling: dict | None) -> None:
    """InvalidInputError where a database that pools its documents would pool again the tokens of
    a model (an :class:`mvdb.Encoder`) that pools them itself (its own pooling module)."""
    own = encoder.pools_tokens if encoder is not None else None
    if own and pooling and pooling.get("pool_factor", 1) != 1:
        raise InvalidInputError(
            f"encoder {encoder.name}: pools its document tokens itself ({own}); the database pools them too "
            f"(pool_factor {pooling['pool_factor']}): they would be pooled twice. Use the model without its "
            f"pooling module, or a database without pool_factor")


def resolve_open(asked: dict | None, recorded: dict | None, path, n_live: int, encoder=None,
                 read_only: bool = False) -> tuple[dict | None, bool]:
    """``resolve_pooling`` for opening a database (or an ingest into one) with ``asked``: also
    refused where ``encoder`` pools itself, or where a new record would be written to a database
    opened ``read_only``. The caller records the pooling where it is new."""
    rec, new = resolve_pooling(asked, recorded, path, n_live)
    check_pooling_encoder(encoder, rec)  # before anything is recorded
    if new and read_only:
        raise InvalidInputError(f"{path}: pool_factor={asked['pool_factor']} would record pooling, but the "
                                f"database is opened read_only")
    return rec, new


def pool_checked(tokens, lengths, rec: dict, dtype: str, device=None):
    """``pool_packed`` of documents first checked as the store will check them (finite, within
    ``dtype``'s range), so that an error names a document and token as given, not a pooled one."""
    from mvdb.storage import validate

    validate.in_range(tokens, lengths, dtype)
    return pool_packed(tokens, lengths, rec, device=device)


def resolve_pooling(asked: dict | None, recorded: dict | None, path, n_live: int) -> tuple[dict | None, bool]:
    """The pooling a write applies (None: none) and whether the database is to record it.

    A database pools its documents one way: ``asked`` (``pooling_arg``'s) must match the recorded
    pooling; a database with no record takes one while it holds no documents (pool_factor 1 asks
    for none, and records nothing). InvalidInputError names both where they conflict."""
    if asked is None or asked == recorded:
        return recorded, False
    none = asked["pool_factor"] == 1
    if recorded is None and none:
        return None, False
    if recorded is not None:
        raise InvalidInputError(
            f"{path}: its documents are pooled with {describe(recorded)} (recorded in the database); "
            f"{describe(asked)} was asked: one database pools its documents one way. Leave pool_factor "
            f"out (the recorded pooling applies), or write to a new database")
    if n_live:
        raise InvalidInputError(
            f"{path}: holds {n_live:,} documents stored without pooling; {describe(asked)} would mix "
            f"pooled and unpooled documents. Add them unpooled, or pool into a new database "
            f"(mvdb.open(new_path, pool_factor=...))")
    return asked, True


def with_pooling(config: dict | None, rec: dict | None) -> dict | None:
    """``config`` (a store's manifest config, or the one a write already commits) with the pooling
    ``rec`` recorded in it; ``config`` as it was where ``rec`` is None."""
    if rec is None:
        return config
    return dict(config or {}, **{POOLING_KEY: dict(rec)})


def pool_packed(tokens, lengths, rec: dict, device=None, return_groups: bool = False):
    """Packed documents (tokens [T, dim], lengths [n]: numpy or torch) pooled as ``rec`` says ->
    (float32 numpy tokens, int64 numpy lengths). The clustering runs on ``device`` (default: the
    tokens' own). A document whose tokens are all unit length gets unit-length pooled vectors, as
    its inputs (the means of unit vectors are shorter); other documents keep the plain means.
    ``return_groups``: also each document's groups (``pool``'s)."""
    t = tokens if isinstance(tokens, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(tokens))
    if device is not None:
        t = t.to(device)
    t = t.float()
    lens = np.asarray(lengths.cpu() if isinstance(lengths, torch.Tensor) else lengths, dtype=np.int64)
    docs = list(torch.split(t, lens.tolist()))
    if not docs:
        empty = np.zeros((0, t.shape[1]), np.float32), np.zeros(0, np.int64)
        return (*empty, []) if return_groups else empty
    pooled = pool(docs, rec["pool_factor"], protected=rec["protected"], normalize=False, return_groups=return_groups)
    groups = None
    if return_groups:
        pooled, groups = pooled
    norms = torch.linalg.vector_norm(t, dim=1)
    unit = torch.ones(len(docs), dtype=torch.bool, device=t.device)
    bad = (norms - 1).abs() > 1e-2
    if bad.any():
        doc_of = torch.repeat_interleave(torch.arange(len(docs), device=t.device),
                                         torch.from_numpy(lens).to(t.device))
        unit[doc_of[bad]] = False
    unit = unit.cpu().tolist()
    out = [torch.nn.functional.normalize(p, dim=-1) if u else p for p, u in zip(pooled, unit)]
    new_lengths = np.array([p.shape[0] for p in out], dtype=np.int64)
    if return_groups:
        return torch.cat(out).cpu().numpy(), new_lengths, groups
    return torch.cat(out).cpu().numpy(), new_lengths


def _ward_batch(docs: list[torch.Tensor], ks: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Ward clusters of each [n_i, dim] document into ks[i] clusters -> ([b, n] cluster ids,
    0..ks[i]-1 numbered in the order of their first token, then padding; [b, n, dim] float32
    cluster means, the first ks[i] rows of each document's)."""
    device = docs[0].device
    b, n, dim = len(docs), max(d.shape[0] for d in docs), docs[0].shape[1]
    lengths = torch.tensor([d.shape[0] for d in docs], device=device)
    x = torch.zeros(b, n, dim, dtype=torch.float32, device=device)
    for i, d in enumerate(docs):
        x[i, : d.shape[0]] = d.float()
    # cosine distance (of the directions, whatever the lengths) in float32, as Sentence Transformers
    # computes it; SciPy then merges in float64: the same merges but where two distances nearly tie
    u = torch.nn.functional.normalize(x, dim=-1)
    dist = (1 - u @ u.transpose(1, 2)).clamp_(0, 2)
    pos = torch.arange(n, device=device)
    valid = pos[None, :] < lengths[:, None]
    inf = torch.tensor(float("inf"), device=device)
    dist = torch.where(valid[:, :, None] & valid[:, None, :] & (pos[:, None] != pos[None, :]), dist, inf)
    size = valid.to(torch.float32)
    rep = pos.expand(b, n).clone()  # each token's cluster, named by one of its tokens
    merges = lengths - torch.tensor(ks, device=device)
    rows = torch.arange(b, device=device)
    near, near_at = dist.min(-1)  # each row's nearest cluster: one row's rescan a step, not the matrix's
    flat = dist.view(b * n, n)
    for step in range(int(merges.max())):
        live = merges > step
        m, i = near.min(-1)
        j = near_at[rows, i]
        a, c = torch.minimum(i, j), torch.maximum(i, j)  # c joins a
        na, nc, nk = size[rows, a][:, None], size[rows, c][:, None], size
        da, dc = dist[rows, a], dist[rows, c]
        new = torch.sqrt(((na + nk) * da * da + (nc + nk) * dc * dc - nk * (m * m)[:, None]).clamp_(min=0)
                         / (na + nc + nk))
        new = torch.where(torch.isinf(da) | torch.isinf(dc), inf, new)  # dead or padded tokens, a and c
        lb, a_l, c_l, new_l = rows[live], a[live], c[live], new[live]
        dist[lb, a_l, :] = new_l
        dist[lb, :, a_l] = new_l
        dist[lb, c_l, :] = inf
        dist[lb, :, c_l] = inf
        size[lb, a_l] += size[lb, c_l]
        size[lb, c_l] = 0
        rep = torch.where(live[:, None] & (rep == c[:, None]), a[:, None].expand(b, n), rep)
        # the nearest of every other row: a row whose nearest was a or c looks again; the others
        # compare their old nearest with their new distance to a
        stale = live[:, None] & ((near_at == a[:, None]) | (near_at == c[:, None]))
        closer = live[:, None] & (new < near)
        near = torch.where(closer, new, near)
        near_at = torch.where(closer, a[:, None].expand(b, n), near_at)
        stale[lb, a_l] = True
        idx = stale.flatten().nonzero().flatten()
        if idx.numel():
            v, at = flat[idx].min(-1)
            near.view(-1)[idx], near_at.view(-1)[idx] = v, at
        near[lb, c_l] = inf
    root = (rep == pos[None, :]) & valid
    dense = torch.cumsum(root.to(torch.int64), dim=1) - 1
    labels = dense.gather(1, rep)
    # every document's cluster sums in one scatter: cluster l of document r is row r * n + l
    at = (rows[:, None] * n + labels)[valid]
    sums = torch.zeros(b * n, dim, device=device).index_add_(0, at, x[valid])
    counts = torch.bincount(at, minlength=b * n).clamp_(min=1).to(torch.float32)
    return labels, (sums / counts[:, None]).view(b, n, dim)
