"""Progress of long engine steps (index training, assignment, loading) on stderr.

Nothing is printed for a step that ends within a second; after that, one line per step is
updated in place at most twice a second and finished with the step's time. ``MVDB_PROGRESS=0``
(or ``enabled=False``) turns it off.
"""

from __future__ import annotations

import sys
import time

from mvdb.kernels import settings


class Progress:
    def __init__(self, enabled: bool | None = None, stream=None, after: float = 1.0):
        self.enabled = settings.progress() if enabled is None else enabled
        self.stream = stream or sys.stderr
        self.after = after

    def step(self, what: str, total: int | None = None, unit: str = "") -> "_Step":
        return _Step(self, what, total, unit)


class _Step:
    def __init__(self, owner: Progress, what: str, total, unit: str):
        self.owner, self.what, self.total, self.unit = owner, what, total, unit
        self.done, self.t0, self.last, self.shown = 0, time.perf_counter(), 0.0, False
        self.shown_done = -1  # the count the line on screen shows

    def __enter__(self) -> "_Step":
        return self

    def update(self, n: int = 1) -> None:
        self.done += n
        self._show(False)

    def _show(self, final: bool) -> None:
        if not self.owner.enabled:
            return
        if final and self.shown and self.total and self.shown_done == self.total:  # the last update said it all
            self.owner.stream.write("\n")
            self.owner.stream.flush()
            return
        now = time.perf_counter()
        elapsed = now - self.t0
        if elapsed < self.owner.after or (not final and now - self.last < 0.5):
            return
        self.last, self.shown, self.shown_done = now, True, self.done
        part = ""
        if self.total:
            part = f" {self.done:,}/{self.total:,}{(' ' + self.unit) if self.unit else ''}"
        end = "\n" if final else ""
        self.owner.stream.write(f"\rmvdb: {self.what}{part} ({elapsed:.1f} s){end}")
        self.owner.stream.flush()

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self._show(True)
        elif self.shown:
            self.owner.stream.write("\n")
