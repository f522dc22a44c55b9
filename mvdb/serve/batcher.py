"""Searches of concurrent requests, run together: the server's requests queue here, and a worker
thread takes everything waiting (up to ``max_queries`` queries) as one batch. Requests with the
same options (k, where, candidate settings, exact, whether they carry sparse vectors) become one
``db.search`` call over all their queries; each request gets its own slice back.

Batching costs a lone request nothing (it is searched as soon as the worker is free); under load
the queue fills while the worker searches, so batches grow with the load, which is what lets many
clients approach the batched throughput of one process. ``window_s`` optionally waits that long
for more requests after the first.

A batch that fails (one request's bad query) is retried request by request, so each request gets
its own result or its own error.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Job:
    queries: list  # 2-D arrays
    single: bool  # the request held one query (not a batch)
    options: dict  # search keyword arguments other than sparse
    sparse: list | None  # one entry per query, or None
    raw: tuple  # (queries, sparse) as the request gave them: for the one-by-one retry
    future: Future = field(default_factory=Future)

    @property
    def key(self) -> str:
        return json.dumps([self.options, self.sparse is not None], sort_keys=True, default=str)


def split(queries, sparse):
    """A request's queries as a list of 2-D arrays and whether it held one; None where the form is
    not one the batcher joins (the library then sees the request as it came)."""
    if isinstance(queries, np.ndarray) and queries.dtype.kind in "fiu" and queries.ndim in (2, 3):
        single = queries.ndim == 2
        qs = [queries] if single else list(queries)
    elif isinstance(queries, list) and queries and all(
            isinstance(q, np.ndarray) and q.ndim == 2 and q.dtype.kind in "fiu" for q in queries):
        single, qs = False, queries
    else:
        return None
    if sparse is None:
        return qs, single, None
    if single:
        return qs, single, [sparse]
    if isinstance(sparse, list) and len(sparse) == len(qs):
        return qs, single, sparse
    return None


class Batcher:
    """``threads`` search threads take the submitted jobs; with 0, the owner calls :meth:`run`
    (the engine process of a server with workers: mvdb.serve.workers)."""

    def __init__(self, db, *, max_queries: int = 256, window_s: float = 0.0, threads: int = 1):
        self.db = db
        self.max_queries = max_queries
        self.window_s = window_s
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._held: Job | None = None
        self.batches = 0
        self.queries = 0
        self.search_s = 0.0  # wall seconds inside db.search (busy share = its growth / elapsed)
        self._workers = [threading.Thread(target=self._run, name=f"mvdb-search-{i}", daemon=True)
                         for i in range(threads)]
        self._lock = threading.Lock()  # one worker at a time takes jobs off the queue
        for w in self._workers:
            w.start()

    def submit(self, job: Job) -> Future:
        self._q.put(job)
        return job.future

    def search(self, queries, sparse, options: dict) -> Future:
        """``db.search(queries, sparse=sparse, **options)`` as a future: joined with other
        requests where the form allows, else run by itself on a worker."""
        return self.submit(self.job(queries, sparse, options))

    @staticmethod
    def job(queries, sparse, options: dict) -> Job:
        """The search request as a job (for :meth:`submit`, or :meth:`run` by the caller)."""
        parts = split(queries, sparse)
        if parts is None:  # a form the batcher does not join: the library names what is wrong
            return Job([], True, options, None, (queries, sparse))
        qs, single, sp = parts
        return Job(qs, single, options, sp, (queries, sparse))

    def run(self, jobs: list[Job]) -> None:
        """Search ``jobs`` now, in this thread: those with the same options together, up to
        ``max_queries`` queries a search; each job's future gets its answer or its error."""
        groups: dict[str, list[Job]] = {}
        for j in jobs:
            try:
                key = j.key if j.queries else f"alone-{id(j)}"
            except Exception:  # noqa: BLE001 - options that do not serialise (a where with mixed key types): alone
                key = f"alone-{id(j)}"
            groups.setdefault(key, []).append(j)
        for group in groups.values():
            part, n = [], 0
            for j in group:
                if part and n + len(j.queries) > self.max_queries:
                    self._search(part)
                    part, n = [], 0
                part.append(j)
                n += len(j.queries)
            self._search(part)

    @property
    def counters(self) -> dict:
        return {"batches": self.batches, "batched_queries": self.queries, "search_s": self.search_s}

    def close(self) -> None:
        for _ in self._workers:
            self._q.put(None)
        for w in self._workers:
            w.join(timeout=60)

    # ---- the worker

    def _take(self) -> list[Job] | None:
        with self._lock:
            first = self._held or self._q.get()
            self._held = None
            if first is None:
                return None
            jobs, n = [first], max(1, len(first.queries))
            deadline = time.monotonic() + self.window_s
            while n < self.max_queries:
                wait = deadline - time.monotonic()
                try:
                    job = self._q.get(timeout=wait) if wait > 0 else self._q.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    self._q.put(None)  # leave the stop signal for this or another worker
                    break
                if n + len(job.queries) > self.max_queries:
                    self._held = job  # first in the next batch
                    break
                jobs.append(job)
                n += max(1, len(job.queries))
            return jobs

    def _run(self) -> None:
        while True:
            jobs = self._take()
            if jobs is None:
                return
            self.run(jobs)

    def _search(self, group: list[Job]) -> None:
        if len(group) == 1:
            self._alone(group[0])
            return
        queries = [q for j in group for q in j.queries]
        sparse = [s for j in group for s in j.sparse] if group[0].sparse is not None else None
        shape, dtype = queries[0].shape, queries[0].dtype
        if all(q.shape == shape and q.dtype == dtype for q in queries):
            queries = np.stack(queries)  # one [Nq, Lq, dim] array: one conversion and copy, not one per query
        try:
            out = self._counted_search(queries, sparse, group[0].options, len(queries))
        except Exception:  # noqa: BLE001 - some request's input: each one on its own
            for j in group:
                self._alone(j)
            return
        at = 0
        for j in group:
            part = out[at : at + len(j.queries)]
            at += len(j.queries)
            j.future.set_result(part[0] if j.single else part)

    def _alone(self, job: Job) -> None:
        try:
            queries, sparse = job.raw
            out = self._counted_search(queries, sparse, job.options, len(job.queries))
        except BaseException as e:  # noqa: BLE001 - handed to the request
            job.future.set_exception(e)
            return
        job.future.set_result(out)

    def _counted_search(self, queries, sparse, options: dict, n: int):
        """``db.search``; a search that answers counts as one batch of ``n`` queries and adds its
        seconds to ``search_s``."""
        t0 = time.perf_counter()
        out = self.db.search(queries, sparse=sparse, **options)
        self.search_s += time.perf_counter() - t0
        self.batches += 1
        self.queries += n
        return out
