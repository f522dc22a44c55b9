"""A readers-writer lock: many readers at once, or one writer; a waiting writer holds off new
readers (so a stream of searches cannot starve an add)."""

from __future__ import annotations

import threading
from contextlib import contextmanager


class RWLock:
    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = None  # the thread holding the write side
        self._depth = 0  # re-entries of that thread
        self._waiting = 0
        self._mine = threading.local()  # this thread's read depth (re-entrant reads never wait)

    @contextmanager
    def read(self):
        me = threading.get_ident()
        depth = getattr(self._mine, "depth", 0)
        with self._cond:
            if self._writer == me:  # a writer may read what it holds
                self._depth += 1
            elif depth:
                self._readers += 1
            else:
                while self._writer is not None or self._waiting:
                    self._cond.wait()
                self._readers += 1
        self._mine.depth = depth + 1
        try:
            yield
        finally:
            self._mine.depth = depth
            with self._cond:
                if self._writer == me:
                    self._depth -= 1
                else:
                    self._readers -= 1
                    if not self._readers:
                        self._cond.notify_all()

    @contextmanager
    def write(self):
        me = threading.get_ident()
        with self._cond:
            if self._writer == me:
                self._depth += 1
            else:
                self._waiting += 1
                try:
                    while self._writer is not None or self._readers:
                        self._cond.wait()
                finally:
                    self._waiting -= 1
                self._writer, self._depth = me, 1
        try:
            yield
        finally:
            with self._cond:
                self._depth -= 1
                if not self._depth:
                    self._writer = None
                    self._cond.notify_all()
