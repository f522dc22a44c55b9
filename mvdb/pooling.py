"""Token pooling: fewer vectors a document, by clustering its tokens and keeping the cluster means.

``mvdb.pool(docs, pool_factor=2)`` clusters each document's tokens by Ward linkage on cosine
distance (``1 - cos(a, b)``), into ``tokens // pool_factor`` clusters (at least one),
keeps the first ``protected`` tokens (a ``[CLS]``) as they are, and replaces each cluster by the
mean of its tokens: the scheme of Clavie, Chaffin and Adams (2024) that PyLate, colpali-engine and
Sentence Transformers' ``HierarchicalTokenPooling`` ship, which keeps retrieval quality at half the
vectors. The clusters are those of SciPy's ``linkage(condensed, "ward")`` cut by ``fcluster(...,
"maxclust")``, except on exact distance ties.

The clustering runs on many documents at once, on the documents' own device: each document's
distances (float32, as Sentence Transformers computes them), then greedy agglomeration with SciPy's
Ward update in float64 (:mod:`mvdb.kernels.ward`: on a GPU one Triton program a document, every
merge in one launch; on a CPU one torch step merges every document once). Ward's linkage is
monotone, so stopping each document after ``tokens - clusters`` merges gives the same partition as
cutting its full dendrogram at that many clusters.
"""

from __future__ import annotations

import json
import numbers

import numpy as np
import torch

from mvdb.errors import InvalidInputError, InvalidTypeError

__all__ = ["POOLING_KEY", "check_pooling_encoder", "describe", "disagreement", "pool", "pool_checked", "pool_for_store",
           "pool_packed", "pooling_arg", "resolve_open", "resolve_pooling", "with_pooling"]

POOLING_KEY = "pooling"  # the manifest config's key of a database's pooling: {"pool_factor", "protected"}

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
    if not tensors:
        return ([], []) if return_groups else []
    lens = np.array([t.shape[0] for t in tensors], dtype=np.int64)
    dtypes = {t.dtype for t in tensors}
    packed = torch.cat([t.float() for t in tensors]) if len(dtypes) > 1 else torch.cat(tensors)
    means, new_lens, labels = _pool_core(packed, lens, pool_factor, protected)
    if normalize:
        means = torch.nn.functional.normalize(means, dim=-1)
    if kind is np.ndarray:
        parts = np.split(means.cpu().numpy(), np.cumsum(new_lens)[:-1])
    elif len(dtypes) == 1:
        parts = list(torch.split(means.to(tensors[0].dtype), new_lens.tolist()))
    else:
        parts = [p.to(t.dtype) for p, t in zip(torch.split(means, new_lens.tolist()), tensors)]
    if return_groups:
        return parts, np.split(labels.cpu().numpy(), np.cumsum(lens)[:-1])
    return parts


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
    return pool_for_store(tokens, lengths, rec, dtype, device)


def pool_for_store(tokens, lengths, rec: dict, dtype: str, device=None):
    """``pool_packed`` of documents already checked for a store of ``dtype``: the means of values
    within the range stay within it, so a float16 store's come back as float16."""
    return pool_packed(tokens, lengths, rec, device=device, out_dtype=np.float16 if dtype == "float16" else np.float32)


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


def disagreement(stores: list) -> str | None:
    """Where the stores (a sharded database's shards) disagree on pooling, what they hold in words:
    two records, or a record on one and unpooled documents on another (a shard written on its
    own); None where they agree."""
    records = {json.dumps(st.config[POOLING_KEY], sort_keys=True) for st in stores if st.config.get(POOLING_KEY)}
    unpooled = [st.path for st in stores if not st.config.get(POOLING_KEY) and len(st)]
    if len(records) > 1 or (records and unpooled):
        return ", ".join(sorted(records)) + ("; unpooled documents in " + ", ".join(map(str, unpooled)) if unpooled else "")
    return None


def with_pooling(config: dict | None, rec: dict | None) -> dict | None:
    """``config`` (a store's manifest config, or the one a write already commits) with the pooling
    ``rec`` recorded in it; ``config`` as it was where ``rec`` is None."""
    if rec is None:
        return config
    return dict(config or {}, **{POOLING_KEY: dict(rec)})


def pool_packed(tokens, lengths, rec: dict, device=None, return_groups: bool = False, out_dtype=np.float32):
    """Packed documents (tokens [T, dim], lengths [n]: numpy or torch) pooled as ``rec`` says ->
    (numpy tokens of ``out_dtype``, int64 numpy lengths). The clustering runs on ``device`` (default: the
    tokens' own). A document whose tokens are all unit length gets unit-length pooled vectors, as
    its inputs (the means of unit vectors are shorter); other documents keep the plain means.
    ``return_groups``: also each document's groups (``pool``'s)."""
    t = tokens if isinstance(tokens, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(tokens))
    if device is not None:
        t = t.to(device)
    lens = np.asarray(lengths.cpu() if isinstance(lengths, torch.Tensor) else lengths, dtype=np.int64)
    if not len(lens):
        empty = np.zeros((0, t.shape[1]), np.float32), np.zeros(0, np.int64)
        return (*empty, []) if return_groups else empty
    means, new_lens, labels = _pool_core(t, lens, rec["pool_factor"], rec["protected"])
    unit = _unit_docs(t, lens)
    unit_rows = torch.repeat_interleave(unit, torch.from_numpy(new_lens).to(t.device))
    means = torch.where(unit_rows[:, None], torch.nn.functional.normalize(means, dim=-1), means)
    means = means.to(torch.float16 if np.dtype(out_dtype) == np.float16 else torch.float32).cpu().numpy()
    if return_groups:
        return means, new_lens, np.split(labels.cpu().numpy(), np.cumsum(lens)[:-1])
    return means, new_lens


UNIT_TOL = 1e-2  # a token this close to length 1 counts as a unit vector


def _unit_docs(t: torch.Tensor, lens: np.ndarray) -> torch.Tensor:
    """bool [n]: the documents (of packed tokens ``t``) whose tokens are all unit length (norms in
    float32, without a float32 copy of the tokens)."""
    bad = ((torch.linalg.vector_norm(t, dim=1, dtype=torch.float32) - 1).abs() > UNIT_TOL).to(torch.int32)
    doc_of = torch.repeat_interleave(torch.arange(len(lens), device=t.device), torch.from_numpy(lens).to(t.device))
    return torch.zeros(len(lens), dtype=torch.int32, device=t.device).index_add_(0, doc_of, bad) == 0


GPU_CHUNK_BYTES = 1 << 30  # a clustering launch's distances and tokens on a GPU
CPU_CHUNK_BYTES = 1 << 25  # on a CPU: each merge step then stays in cache


def _pool_core(t: torch.Tensor, lens: np.ndarray, pool_factor, protected: int):
    """Packed tokens ``t`` [T, dim] of documents of ``lens`` tokens -> (float32 [M, dim] cluster
    means, int64 numpy [n] pooled lengths, int64 [T] each token's row in its document's output).
    Runs on ``t``'s device: a few launches a chunk of documents, none a document."""
    device = t.device
    prot = np.minimum(lens, protected)
    n = lens - prot
    if float(pool_factor).is_integer():
        k = np.maximum(n // int(pool_factor), 1)
    else:
        k = np.maximum(np.floor_divide(n.astype(np.float64), float(pool_factor)).astype(np.int64), 1)
    pooled = k < n
    new_lens = np.where(pooled, prot + k, lens)
    starts = np.zeros(len(lens), dtype=np.int64)
    starts[1:] = np.cumsum(lens)[:-1]
    doc_of = torch.repeat_interleave(torch.arange(len(lens), device=device), torch.from_numpy(lens).to(device))
    labels = torch.arange(t.shape[0], device=device) - torch.from_numpy(starts).to(device)[doc_of]
    todo = np.flatnonzero(pooled)
    todo = todo[np.argsort(n[todo], kind="stable")]
    cuda = device.type == "cuda"
    budget = GPU_CHUNK_BYTES if cuda else CPU_CHUNK_BYTES
    # the Triton kernel's widths are powers of two; torch's steps pad to a chunk's longest
    width = np.maximum(16, 1 << np.ceil(np.log2(np.maximum(n[todo], 1))).astype(np.int64)) if cuda else n[todo]
    at = 0
    while at < len(todo):
        w = int(width[at])
        end = at + 1
        while end < len(todo) and (end - at + 1) * _chunk_bytes(int(width[end]), t.shape[1]) <= budget and (
                not cuda or width[end] == w):
            end += 1
        w = int(width[end - 1])
        chunk = todo[at:end]
        first = starts[chunk] + prot[chunk]
        lab, idx, valid = _cluster(t, first, n[chunk], k[chunk], w)
        labels[idx[valid]] = (torch.from_numpy(prot[chunk]).to(device)[:, None] + lab)[valid]
        at = end
    out_starts = np.zeros(len(lens), dtype=np.int64)
    out_starts[1:] = np.cumsum(new_lens)[:-1]
    rows = torch.from_numpy(out_starts).to(device)[doc_of] + labels
    total = int(new_lens.sum())
    sums = torch.zeros(total, t.shape[1], dtype=torch.float32, device=device).index_add_(0, rows, t.float())
    counts = torch.bincount(rows, minlength=total).clamp_(min=1).to(torch.float32)
    return sums / counts[:, None], new_lens, labels


def _chunk_bytes(width: int, dim: int) -> int:
    """A document's share of a clustering chunk at its peak: its distances (float32, the mask of
    the real ones, then float64) and its tokens (gathered, then float32)."""
    return width * width * 14 + width * dim * 8


def _cluster(t: torch.Tensor, first: np.ndarray, n: np.ndarray, k: np.ndarray, width: int):
    """Ward clusters of documents whose tokens to pool are t[first[i] : first[i] + n[i]], n[i] <=
    ``width``, into k[i] each -> (int64 [b, width] cluster ids, 0..k[i]-1 numbered in the order of
    their first token; int64 [b, width] the tokens' rows in ``t``; bool [b, width] which are tokens)."""
    from mvdb.kernels.ward import merge

    device = t.device
    pos = torch.arange(width, device=device)
    nt = torch.from_numpy(n).to(device)
    valid = pos[None, :] < nt[:, None]
    idx = (torch.from_numpy(first).to(device)[:, None] + pos[None, :]).clamp_(max=t.shape[0] - 1)
    x = t[idx].float()
    x.mul_(valid[..., None])
    # cosine distance 1 - <a, b>, in float32, as Sentence Transformers computes it; of the
    # directions where a document's tokens are not unit vectors
    norms = torch.linalg.vector_norm(x, dim=-1)
    off = (((norms - 1).abs() > UNIT_TOL) & valid).any(1)
    x.mul_(torch.where(off[:, None], 1 / norms.clamp(min=1e-12), 1.0)[..., None])
    dist = torch.bmm(x, x.transpose(1, 2)).neg_().add_(1).clamp_(0, 2)
    del x
    dist.masked_fill_(~(valid[:, :, None] & valid[:, None, :] & (pos[:, None] != pos[None, :])), float("inf"))
    dist = dist.double()  # SciPy merges in float64
    near, near_at = dist.min(-1)
    rep = merge(dist, near, near_at, nt, torch.from_numpy(k).to(device))
    root = (rep == pos[None, :]) & valid
    dense = torch.cumsum(root.to(torch.int64), dim=1) - 1
    return dense.gather(1, rep), idx, valid
