"""Readiness (``GET /ready``): whether the server's database has warmed up.

``/health`` answers as soon as the server listens (liveness); ``/ready`` answers 503 while the
database warms up (``db.warmup()``: every kernel variant its searches launch compiled and tuned)
and 200 once it is done, so that a load balancer or a Kubernetes readiness probe sends queries
only to a server that answers them at the warm speed. A warm-up that fails leaves the server
ready (searches then compile what they need) with the error in the answer. A server that shuts
down first ends the warm-up (:meth:`Readiness.close`) before it closes the database: a warm-up
thread still inside torch when the interpreter exits aborts the process.
"""

from __future__ import annotations

import threading
import time


class Readiness:
    def __init__(self):
        self._done = threading.Event()
        self.started = time.time()
        self.warmup: dict | None = None
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def set(self, warmup: dict | None = None, error: str | None = None) -> None:
        self.warmup, self.error = warmup, error
        self._done.set()

    def start(self, db, max_query_tokens: int | None = None, on_done=None) -> threading.Thread:
        """Warm ``db`` up in a thread of its own; ``on_done(state)`` when it ends."""
        def run():
            try:
                self.set(db.warmup(max_query_tokens, stop=self._stop))
            except Exception as e:  # noqa: BLE001 - the server serves regardless, and says why
                self.set(error=f"{type(e).__name__}: {e}")
            if on_done is not None and not self._stop.is_set():  # a server shutting down says nothing
                on_done(self.state())

        self._thread = threading.Thread(target=run, name="mvdb-warmup", daemon=True)
        self._thread.start()
        return self._thread

    def close(self, timeout: float | None = None) -> bool:
        """End the warm-up: no further search starts, the one running finishes; waits for it up to
        ``timeout`` seconds (None: as long as it takes) -> whether the warm-up thread has ended."""
        self._stop.set()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def state(self) -> dict:
        ready = self._done.is_set()
        out = {"ready": ready, "warming_s": None if ready else time.time() - self.started}
        if ready:
            out.update(warmup=self.warmup, error=self.error)
        return out


READY = Readiness()
READY.set()  # what a server that was given no warm-up reports
