"""Per-shard results merged into one: top-k hits (local threads and Ray actors alike) and verify
reports. ``Hit`` is imported on first merge, so merging reports (``mvdb verify``) loads no engine."""

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
