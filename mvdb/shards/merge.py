"""Per-shard results merged into one: top-k hits (local threads and Ray actors alike), verify
reports and stats. ``Hit`` is imported on first merge, so merging reports (``mvdb verify``) loads
no engine."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mvdb.storage import VerifyReport

if TYPE_CHECKING:
    from mvdb.engine.search import Hit


def merge(per_shard, k: int | None) -> list[Hit]:
    """Per-shard hit lists merged by score (the best k, or all). Each shard's list is its exact
    top-k, so the best k of their union is the exact top-k over the shards."""
    from mvdb.engine.search import Hit

    hits = sorted((Hit(*h) for hs in per_shard for h in hs), key=lambda h: -h.score)
    return hits if k is None else hits[:k]


def merge_queries(per_shard: list, k: int | None, single: bool):
    """The answers of several shards to one query (``single``: each a hit list) or to a batch
    (each a list of hit lists, one per query) merged the same way. Shards with nothing stored are
    left out by the caller; with none left, the empty answer is the caller's to give."""
    if single:
        return merge(per_shard, k)
    return [merge([p[qi] for p in per_shard], k) for qi in range(len(per_shard[0]))]


def merge_reports(named) -> VerifyReport:
    """(shard name, VerifyReport) pairs as one report: each problem prefixed by its shard's name,
    documents and segments summed."""
    named = list(named)
    return VerifyReport(problems=[f"{name}: {p}" for name, r in named for p in r.problems],
                        n_docs=sum(r.n_docs for _, r in named), n_segments=sum(r.n_segments for _, r in named))


# Database.stats() keys that add up over shards, and those that describe every shard alike
SUMMED = ("documents", "rows", "tokens", "segments", "deleted", "resident_bytes", "resident_capacity_bytes",
          "pages", "index_tokens", "codes_bytes")
SHARED = ("dim", "dtype", "id_type", "residency", "index", "tier", "codes_bits")


def merge_stats(per_shard: list[dict], path=None) -> dict:
    """Per-shard ``Database.stats()`` dicts as one dict with the same keys where they make sense:
    counts (``SUMMED``) added up; ``dim``, ``dtype``, ``id_type``, ``residency``, ``index``, ``tier`` and
    ``codes_bits`` the value the shards agree on (shards with none yet, e.g. an empty shard's ``dim``, left out; None if they
    differ); ``devices`` each shard's device; ``shards`` the per-shard dicts themselves."""
    out: dict = {"path": path}
    for key in SUMMED:
        out[key] = sum(int(p.get(key) or 0) for p in per_shard)
    for key in SHARED:
        values = {p.get(key) for p in per_shard} - {None}
        out[key] = values.pop() if len(values) == 1 else None
    out["encoder"] = next((p["encoder"] for p in per_shard if p.get("encoder")), None)  # recorded on every shard
    out["pooling"] = next((p["pooling"] for p in per_shard if p.get("pooling")), None)  # recorded on every shard
    out["devices"] = [p.get("device") for p in per_shard]
    out["shards"] = list(per_shard)
    return out


def single_query(queries) -> bool:
    """One query ([Lq, dim] array or tensor) rather than a batch (a list, or [Nq, Lq, dim]), as
    ``Database.search`` tells them apart (``mvdb.engine.search.is_batch``); anything else is an
    InvalidTypeError, as there. The shards validate the queries themselves."""
    from mvdb.engine.search import is_batch
    from mvdb.errors import InvalidTypeError

    if not isinstance(queries, (list, tuple)) and not hasattr(queries, "ndim"):
        raise InvalidTypeError(f"queries: expected a numpy array, torch tensor or list, got {type(queries).__name__}")
    return not is_batch(queries)
