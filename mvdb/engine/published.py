"""The published state of one database handle: the :class:`~mvdb.engine.state.State` searches
read, the locks around it, and how a committed write moves it forward.

Reads (``with pub.read() as st``) run concurrently, each on the state that was current when it
began. Writes (``with pub.write():`` then ``pub.advance()`` after the store committed) are
serialised with each other; an incremental follow builds the next state while searches go on over
the old one and swaps it in under the exclusive side of the lock. A rebuild (after a compaction)
lets go of the old resident memory first, so it holds searches off while it reloads.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

from mvdb.engine.rwlock import RWLock
from mvdb.errors import InvalidInputError


class Published:
    def __init__(self, engine, store):
        self.engine = engine
        self.store = store
        self.state = engine.state
        self._writer = threading.RLock()  # one write at a time in this process
        self._rw = RWLock()  # reads share it; publishing a state (and close) takes it alone
        self._behind = False  # the store committed a state this handle has not followed yet

    @contextmanager
    def read(self):
        """The current state, held for the duration of one read."""
        with self._rw.read():
            st = self.state
            if st is None:
                raise InvalidInputError(f"{self.store.path}: the database is closed")
            yield st

    @contextmanager
    def write(self, catch_up: bool = True):
        """One write at a time; first follows a commit an earlier write could not follow."""
        with self._writer:
            if catch_up and self._behind:
                self.advance()
            yield

    @property
    def behind(self) -> bool:
        return self._behind

    def advance(self) -> None:
        """Move to the store's latest commit (inside ``write()``). When that fails after the store
        committed (an I/O or memory error), searches go on over the previous state and the next
        write (or ``refresh()``) tries again before its own work."""
        self._behind = True
        snap = self.store.snapshot()
        st = self.state
        names = [s["name"] for s in snap.manifest["segments"]]
        incremental = st is not None and st.tokens is not None and snap.dim == st.dim and \
            names[: len(st.segment_names())] == st.segment_names()
        if incremental:
            new = self.engine.follow(snap)  # searches go on with the old state meanwhile
            with self._rw.write():
                self.state = new
        else:
            with self._rw.write():  # a rebuild: let go of the old resident memory first
                self.state = None
                self.engine.release()
                self.state = self.engine.follow(snap)
        self._behind = False

    def close(self) -> None:
        with self._writer, self._rw.write():
            self.state = None
            self.engine.release()
            self.store.close()
