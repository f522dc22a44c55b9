"""Readiness (``GET /ready``): whether the server's database has warmed up.

``/health`` answers as soon as the server listens (liveness); ``/ready`` answers 503 while the
database warms up (``db.warmup()``: every kernel variant its searches launch compiled and tuned)
and 200 once it is done, so that a load balancer or a Kubernetes readiness probe sends queries
only to a server that answers them at the warm speed. A warm-up that fails leaves the server
ready (searches then compile what they need) with the error in the answer.
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

    def set(self, warmup: dict | None = None, error: str | None = None) -> None:
        self.warmup, self.error = warmup, error
        self._done.set()

    def start(self, db, max_query_tokens: int | None = None, on_done=None) -> threading.Thread:
        """Warm ``db`` up in a thread of its own; ``on_done(state)`` when it ends."""
        def run():
            try:
                self.set(db.warmup(max_query_tokens))
            except Exception as e:  # noqa: BLE001 - the server serves regardless, and says why
                self.set(error=f"{type(e).__name__}: {e}")
            if on_done is not None:
                on_done(self.state())

        t = threading.Thread(target=run, name="mvdb-warmup", daemon=True)
        t.start()
        return t

    def state(self) -> dict:
        ready = self._done.is_set()
        out = {"ready": ready, "warming_s": None if ready else time.time() - self.started}
        if ready:
            out.update(warmup=self.warmup, error=self.error)
        return out


READY = Readiness()
READY.set()  # what a server that was given no warm-up reports
