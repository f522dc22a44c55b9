"""``mvdb serve --workers N``: HTTP in N processes, the database in one.

One Python process cannot both answer thousands of HTTP requests a second and keep a GPU fed:
parsing, decoding and encoding take a few hundred microseconds of interpreter time per request,
all under one GIL (README "Serving" has the measurement). So with ``--workers`` above 1:

- the main process opens the database and serves it behind a local socket
  (``multiprocessing.connection``, a Unix socket in a private temporary directory, with a random
  key): the engine, whose one search loop batches the searches of every worker (:class:`Dispatcher`);
- N worker processes share the listening socket, each running the same FastAPI application
  (mvdb.serve.app) over :class:`RemoteDatabase`, which forwards every call to the engine. A
  worker's own batcher joins its concurrent searches into one call, and the engine's joins the
  workers' calls, so the GPU still sees one batch;
- writes are acknowledged by the worker only after the engine committed them; a worker dies with
  the main process (``PR_SET_PDEATHSIG``), so a killed server leaves no process holding the port.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import signal
import tempfile
import threading
import time
from multiprocessing.connection import Client, Listener
from types import SimpleNamespace

from mvdb.errors import MvdbError, ServerError
from mvdb.serve import texts
from mvdb.serve.readiness import READY

WRITES = {"add", "add_encoded", "delete", "compact", "refresh"}
# and the text calls (mvdb.serve.texts.CALLS), which take the database as their first argument
CALLS = {"search", "candidates", "rerank", "add", "add_encoded", "delete", "get", "metadata", "contains", "compact", "refresh",
         "verify", "stats", "__len__"}
READY_CALL = "ready_state"  # a worker's /ready: the engine's mvdb.serve.readiness state


class Dispatcher:
    """The main process's side: answers the workers' calls with the real database.

    One thread, the search loop, waits on every worker connection at once, takes the search
    requests that have arrived (those that came in while the last search ran), searches them as
    one batch (mvdb.serve.batcher) and sends each answer; no other thread runs Python while it
    does, so the GPU's host work is not slowed by threads taking turns with the interpreter lock
    (with a thread per connection, batches took about twice their in-process time under many
    clients). Other calls (add, get, stats, ...) go to a small thread
    pool, which answers on the connection and hands it back to the loop.
    """

    def __init__(self, db, batcher, window_s: float = 0.0, readiness=None):
        from concurrent.futures import ThreadPoolExecutor
        from multiprocessing import Pipe

        self.db, self.batcher, self.window_s = db, batcher, window_s
        self.readiness = readiness if readiness is not None else READY  # what the workers' /ready reports
        self.dir = tempfile.mkdtemp(prefix="mvdb-serve-")
        self.address = os.path.join(self.dir, "engine.sock")
        self.authkey = os.urandom(32)
        self._listener = Listener(self.address, family="AF_UNIX", authkey=self.authkey)
        self._closed = False
        self.take_s = 0.0  # the loop's seconds reading calls, and running batches (search + answers)
        self.run_s = 0.0
        self.calls = 0  # searches read by the loop
        self._conns: set = set()  # connections the loop waits on
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = Pipe(duplex=False)  # a new or returned connection; closing
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="mvdb-engine-read")
        # writes wait for the database's one writer anyway: their own thread, so that queued writes
        # never hold every reader's thread
        self._writes = ThreadPoolExecutor(1, thread_name_prefix="mvdb-engine-write")
        threading.Thread(target=self._accept, name="mvdb-engine-accept", daemon=True).start()
        self._loop_thread = threading.Thread(target=self._loop, name="mvdb-engine-search", daemon=True)
        self._loop_thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn = self._listener.accept()
            except (OSError, EOFError):
                if self._closed:
                    return
                continue
            except Exception:  # noqa: BLE001 - a peer without the key: refuse it, go on
                continue
            self._give_back(conn)

    def _give_back(self, conn) -> None:
        with self._lock:
            self._conns.add(conn)
        with contextlib.suppress(OSError):
            self._wake_w.send_bytes(b"w")

    def _loop(self) -> None:
        from multiprocessing.connection import wait

        while not self._closed:
            with self._lock:
                conns = list(self._conns)
            ready = wait(conns + [self._wake_r], timeout=1.0)
            jobs: list = []
            deadline = time.monotonic() + self.window_s
            while True:
                t0 = time.perf_counter()
                for c in ready:
                    if c is self._wake_r:
                        with contextlib.suppress(OSError, EOFError):
                            while self._wake_r.poll():
                                self._wake_r.recv_bytes()
                        continue
                    self._take(c, jobs)
                self.take_s += time.perf_counter() - t0
                wait_s = deadline - time.monotonic()
                if not jobs or wait_s <= 0:
                    break
                with self._lock:  # --batch-window-ms: more requests for this batch
                    conns = list(self._conns)
                ready = wait(conns, timeout=wait_s)
            if jobs:
                t0 = time.perf_counter()
                self.calls += len(jobs)
                try:
                    self.batcher.run(jobs)
                except BaseException as e:  # noqa: BLE001 - never leave a worker waiting, nor the loop dead
                    for j in jobs:
                        if not j.future.done():
                            j.future.set_exception(MvdbError(f"search: {type(e).__name__}: {e}"))
                self.run_s += time.perf_counter() - t0

    def _take(self, conn, jobs: list) -> None:
        """Read one call from ``conn``: a search joins ``jobs`` (answered when it is done), any
        other call goes to the pool, which owns the connection until it has answered."""
        try:
            method, args, kwargs = conn.recv()
        except (EOFError, OSError):  # the worker went away
            with self._lock:
                self._conns.discard(conn)
            conn.close()
            return
        except Exception as e:  # noqa: BLE001 - an undecodable call: answered, not fatal
            self._send(conn, False, MvdbError(f"a call the server could not read: {type(e).__name__}: {e}"))
            return
        if method == "search":
            sparse = kwargs.pop("sparse", None)
            (queries,) = args
            job = self.batcher.job(queries, sparse, kwargs)
            job.future.add_done_callback(lambda f, c=conn: self._answer(c, f))
            jobs.append(job)
            return
        with self._lock:
            self._conns.discard(conn)
        pool = self._writes if method in WRITES else self._pool
        pool.submit(self._other, conn, method, args, kwargs)

    def _answer(self, conn, future) -> None:
        e = future.exception()
        self._send(conn, e is None, future.result() if e is None else e)

    def _other(self, conn, method: str, args: tuple, kwargs: dict) -> None:
        try:
            ok, value = True, self._call(method, args, kwargs)
        except BaseException as e:  # noqa: BLE001 - handed back to the worker
            ok, value = False, e
        if self._send(conn, ok, value):
            self._give_back(conn)
        else:  # the worker went away
            conn.close()

    @staticmethod
    def _send(conn, ok: bool, value) -> bool:
        try:
            conn.send((ok, value))
        except (EOFError, OSError):
            return False
        except Exception as e:  # noqa: BLE001 - an answer that does not pickle
            with contextlib.suppress(EOFError, OSError):
                conn.send((False, MvdbError(f"{type(e).__name__}: {e}")))
        return True

    def _call(self, method: str, args: tuple, kwargs: dict):
        if method in texts.CALLS:
            return texts.CALLS[method](self.db, *args, **kwargs)
        if method == READY_CALL:
            return self.readiness.state()
        if method not in CALLS:
            raise MvdbError(f"unknown call {method!r}")
        if method == "stats":
            return dict(self.db.stats(), server=self.counters)
        return getattr(self.db, method)(*args, **kwargs)

    @property
    def counters(self) -> dict:
        """The batcher's counters and the loop's: seconds reading calls (``take_s``) and running
        batches (``run_s``: searches and sending answers), search calls read (``calls``)."""
        return dict(self.batcher.counters, take_s=self.take_s, run_s=self.run_s, calls=self.calls)

    def close(self) -> None:
        """Stop the loop (after the batch it is on) and the pool (after the calls it runs)."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._wake_w.send_bytes(b"w")
        self._loop_thread.join(timeout=120)
        self._pool.shutdown(wait=True)
        self._writes.shutdown(wait=True)
        with contextlib.suppress(OSError):
            self._listener.close()
        with contextlib.suppress(OSError):
            os.unlink(self.address)
        with contextlib.suppress(OSError):
            os.rmdir(self.dir)


class RemoteDatabase:
    """A worker's view of the engine's database: the same methods, each one call to the engine
    (one connection per thread). ``encoder_name``: the name of the engine's text model (None: it
    has none)."""

    def __init__(self, address: str, authkey: bytes, read_only: bool, path: str, encoder_name: str | None = None):
        self._address, self._authkey = address, authkey
        self._local = threading.local()
        self.store = SimpleNamespace(read_only=read_only, path=path)
        self.encoder_name = encoder_name

    def _conn(self):
        c = getattr(self._local, "conn", None)
        if c is None:
            c = self._local.conn = Client(self._address, family="AF_UNIX", authkey=self._authkey)
        return c

    def _call(self, method: str, *args, **kwargs):
        try:
            c = self._conn()
            c.send((method, args, kwargs))
            ok, value = c.recv()
        except (EOFError, OSError) as e:
            self._local.conn = None
            raise ServerError(f"the server's database process is gone ({type(e).__name__}: {e}); "
                              f"nothing was acknowledged") from None
        if ok:
            return value
        raise value

    def __len__(self) -> int:
        return self._call("__len__")

    @property
    def readiness(self) -> SimpleNamespace:
        """The engine's readiness (``state() -> dict``, as mvdb.serve.readiness.Readiness)."""
        return SimpleNamespace(state=lambda: self._call(READY_CALL))

    def forward(self, name: str, *args, **kwargs):
        """A text call (mvdb.serve.texts), run in the engine with its database and model."""
        return self._call(name, *args, **kwargs)

    def __getattr__(self, name: str):
        if name in CALLS:
            return lambda *a, **k: self._call(name, *a, **k)
        raise AttributeError(name)


def _die_with_parent() -> None:
    """End with the database's process: a worker without it cannot answer anything, so a
    SIGKILL at once (a graceful SIGTERM would hold the port while uvicorn waits on requests
    that can no longer finish). The server's own shutdown stops its workers gracefully first."""
    with contextlib.suppress(Exception):  # Linux only; elsewhere the parent's shutdown stops them
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the parent is already gone
        os._exit(1)


def _worker(sock, address: str, authkey: bytes, read_only: bool, path: str, app_options: dict,
            log_level: str, gil_switch_us: float, encoder_name: str | None) -> None:
    import sys

    import uvicorn

    from mvdb.serve.app import create_app, uvicorn_config

    _die_with_parent()
    if gil_switch_us:
        sys.setswitchinterval(gil_switch_us / 1e6)
    db = RemoteDatabase(address, authkey, read_only, path, encoder_name)
    app = create_app(db, read_only=read_only, **app_options)
    uvicorn.Server(uvicorn_config(app, 30.0, log_level)).run(sockets=[sock])


class Workers:
    """The worker processes of one server (started by :func:`mvdb.serve.server.serve`)."""

    def __init__(self, n: int, sock, engine: Dispatcher, read_only: bool, path: str, app_options: dict,
                 log_level: str, gil_switch_us: float):
        ctx = mp.get_context("spawn")  # the main process holds CUDA and threads: never fork it
        self.procs = [ctx.Process(target=_worker, name=f"mvdb-serve-worker-{i}", daemon=True,
                                  args=(sock, engine.address, engine.authkey, read_only, str(path), app_options,
                                        log_level, gil_switch_us, getattr(engine.db.encoder, "name", None)))
                      for i in range(n)]
        for p in self.procs:
            p.start()

    def wait_ready(self, url: str, timeout: float = 300.0) -> None:
        """Until a request through the shared socket is answered (workers import and start)."""
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not all(p.is_alive() for p in self.procs):
                raise ServerError("a server worker process exited while starting (see its log)")
            with contextlib.suppress(OSError), urllib.request.urlopen(url + "/openapi.json", timeout=5) as r:
                if r.status == 200:
                    return
            time.sleep(0.1)
        raise ServerError(f"the server workers did not answer within {timeout:.0f} s")

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    def stop(self, graceful_s: float) -> None:
        """SIGTERM each (uvicorn lets requests in flight finish), then wait; kill what is left."""
        for p in self.procs:
            if p.is_alive():
                with contextlib.suppress(OSError):
                    os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + graceful_s + 5
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(5)
