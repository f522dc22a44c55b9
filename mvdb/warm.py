"""``db.warmup()``: compile, and autotune or load the stored winners of, every kernel variant the
searches of a database launch, before the first user query meets them.

A variant is keyed by a few buckets, never by a raw size (docs/architecture.md, "The first query"):
the longest query's bucket (up to 32 tokens, 33-64, then powers of two), the batch's work (where
int8 queries are quantized), the tier and the dtype. Warming runs the database's own search path
(candidates, then the exact rerank) over queries cut from its stored documents, for each query
bucket up to ``max_query_tokens`` and each batch size of ``WARM_BATCHES``, and exhaustive MaxSim
(``exact=True``, also what filters fall back to) once per bucket: every launch a search of this
database makes afterwards finds its variant compiled and its config chosen. Autotune winners are
stored on disk (mvdb.kernels.winners), so a later process pays only the compiles' cache loads.
"""

from __future__ import annotations

import time

import numpy as np

from mvdb.engine.progress import Progress
from mvdb.errors import InvalidInputError, InvalidTypeError
from mvdb.kernels.maxsim.tuning import LQ_BUCKETS

WARM_BATCHES = (1, 4, 16, 64, 256, 1024)  # batch sizes a warm-up searches with (the work buckets of int8 launches)
DEFAULT_QUERY_TOKENS = 64  # without an encoder that says otherwise: queries of up to this many tokens
SOURCE_DOCS = 64  # stored documents the warm-up's queries are cut from


def query_lengths(max_query_tokens: int) -> list[int]:
    """One query length per query bucket up to ``max_query_tokens`` (the bucket's longest)."""
    out = [b for b in LQ_BUCKETS if b < max_query_tokens] + [max_query_tokens]
    return sorted(set(out))


def default_query_tokens(encoder, recorded: dict | None = None) -> int:
    """The longest query a database's searches are expected to send: its encoder's query limit
    (the open encoder's, else the one its texts were added with, ``recorded``) where it has one
    above the default, else DEFAULT_QUERY_TOKENS."""
    limit = getattr(encoder, "query_max_tokens", None)
    if limit is None and isinstance(recorded, dict):
        limit = recorded.get("query_max_tokens")
    ok = isinstance(limit, int) and not isinstance(limit, bool) and limit > 0
    return max(DEFAULT_QUERY_TOKENS, min(int(limit), 1 << 16)) if ok else DEFAULT_QUERY_TOKENS


def check_query_tokens(value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidTypeError(f"max_query_tokens: expected a positive int, got {type(value).__name__}")
    if not 1 <= value <= 1 << 16:
        raise InvalidInputError(f"max_query_tokens: expected 1 to 65536, got {value}")
    return int(value)


def check_stop(stop):
    """``warmup``'s ``stop``: None or a ``threading.Event`` (anything with ``is_set()``)."""
    if stop is not None and not callable(getattr(stop, "is_set", None)):
        raise InvalidTypeError(f"stop: expected a threading.Event or None, got {type(stop).__name__}")
    return stop


def warm(db, source: list[np.ndarray], max_query_tokens: int, batch_sizes=WARM_BATCHES,
         progress: Progress | None = None, exact: bool = True, stop=None) -> dict:
    """Search ``db`` with queries cut from the token arrays ``source`` (stored documents) at every
    length of :func:`query_lengths` and batch size of ``batch_sizes``, plus (``exact``) one
    exhaustive search per length -> {"seconds", "searches", "query_lengths", "batch_sizes",
    "stopped"}. ``stop``: a ``threading.Event``; once set, no further search starts ("stopped":
    True, "searches": those that ran)."""
    t0 = time.perf_counter()
    lengths = query_lengths(max_query_tokens)
    pool = np.concatenate([np.asarray(s, dtype=np.float32) for s in source if len(s)])
    rng = np.random.default_rng(0)

    def query(n: int) -> np.ndarray:
        at = rng.integers(0, max(1, pool.shape[0] - n + 1))
        q = pool[at : at + n]
        return q if q.shape[0] == n else np.resize(q, (n, pool.shape[1]))  # a pool shorter than n: repeated

    steps = [(lq, b, False) for lq in lengths for b in batch_sizes] + [(lq, 1, True) for lq in lengths if exact]
    done = 0
    with (progress or Progress()).step("warming up the kernels", total=len(steps), unit="searches") as step:
        for lq, b, exact in steps:
            if stop is not None and stop.is_set():
                break
            qs = [query(lq) for _ in range(b)]
            db.search(qs[0] if b == 1 else qs, k=10, exact=exact)
            done += 1
            step.update()
    return {"seconds": time.perf_counter() - t0, "searches": done, "query_lengths": lengths,
            "batch_sizes": list(batch_sizes), "stopped": done < len(steps)}
