"""Running the server: ``mvdb serve DB`` (:func:`serve`, in the foreground, until SIGTERM / Ctrl-C)
and :class:`Server` (in a background thread of this process, for tests and notebooks).

Shutdown is graceful: uvicorn stops accepting connections and lets requests in flight finish
(up to ``graceful_s``); then the search batcher drains and the database is closed, which waits
for a write in progress to commit. A write whose response was not sent was not acknowledged;
one that was acknowledged is committed (and survives a SIGKILL: commits are durable).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from pathlib import Path

import uvicorn

from mvdb.errors import InvalidInputError

GIL_SWITCH_US = 100.0
from mvdb.serve.app import MAX_QUERIES, allowed_hosts, create_app, uvicorn_config
from mvdb.serve.readiness import Readiness


def read_key(path) -> str:
    """The API key in ``path`` (surrounding whitespace dropped); refuses an empty file."""
    try:
        key = Path(path).read_text().strip()
    except OSError as e:
        raise InvalidInputError(f"--api-key-file {path}: cannot read it ({e.strerror})") from None
    if not key:
        raise InvalidInputError(f"--api-key-file {path}: expected a key, the file is empty")
    return key


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise InvalidInputError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.set_inheritable(True)
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


WORKER_SEARCH_THREADS = 8  # calls in flight from each worker to the database process (README "Serving")


def default_workers() -> int:
    """HTTP worker processes when not told: a quarter of the cores, 1 to 8 (1: no separate
    processes, the database and HTTP share one)."""
    return max(1, min(8, (os.cpu_count() or 1) // 4))


def serve(path, *, host: str = "127.0.0.1", port: int = 8000, read_only: bool = False, api_key: str | None = None,
          device: str = "auto", workers: int | None = None, max_body_mb: float = 256, batch_queries: int = 256,
          batch_window_ms: float = 0.0, search_threads: int | None = None, graceful_s: float = 30.0, log_level: str = "warning",
          on_ready=None, gil_switch_us: float = GIL_SWITCH_US, header_timeout_s: float = 10.0,
          body_timeout_s: float = 60.0, model=None, warm: bool = True, on_warm=None, allowed_host=(),
          max_queries: int = MAX_QUERIES) -> None:
    """Open the database at ``path`` and serve it until SIGTERM or Ctrl-C. ``port=0`` picks a free
    port; ``on_ready(url)`` is called once it answers (the CLI prints the URL).

    ``workers``: HTTP worker processes (mvdb.serve.workers; None: :func:`default_workers`); with 1,
    this process does both. ``search_threads``: with one process, the threads taking batches of
    searches off its queue (None: 1); with workers, each worker's threads sending its batches to the
    database process (None: ``WORKER_SEARCH_THREADS``). ``gil_switch_us``: the interpreter's thread switch interval in the
    server's processes (Python's default is 5,000 us; 0 leaves it), so that a thread coming back
    from a GPU call waits less for the one answering HTTP. It changes one process's throughput
    little: the per-request interpreter work, not the switch latency, is what limits one process.
    ``model``: a text model, an :class:`mvdb.Encoder` or what :func:`mvdb.embed.load_encoder` takes
    ("minilm", a model folder or name, or "module:attr"), loaded on ``device`` before anything listens; it encodes the queries of
    ``/search_text`` and ``/explain``, in the process that holds the database.
    ``warm``: warm the database up (``db.warmup()``) while the server starts listening: ``/health``
    answers at once, ``/ready`` 503 until the warm-up is done, then 200 (mvdb.serve.readiness);
    ``on_warm(state)`` is called then (the CLI prints it). False: ready at once.
    ``allowed_host``: names besides localhost, the loopback addresses and ``host`` that requests
    may address the server by (their ``Host`` header) when it has no API key; others get 403.
    ``max_queries``: the most queries (texts or embeddings) one request may send (413 above).
    """
    import mvdb

    encoder = model
    if isinstance(model, str):
        from mvdb.embed import load_encoder
        from mvdb.engine.args import device_arg

        encoder = load_encoder(model, device=str(device_arg(device)))
    workers = default_workers() if workers is None else workers
    if search_threads is None:
        search_threads = 1 if workers <= 1 else WORKER_SEARCH_THREADS
    if gil_switch_us:
        sys.setswitchinterval(gil_switch_us / 1e6)
    sock = _bind(host, port)
    try:
        db = mvdb.open(path, device=device, read_only=read_only, encoder=encoder)
    except BaseException:
        sock.close()
        raise
    options = dict(api_key=api_key, max_body_mb=max_body_mb, batch_queries=batch_queries,
                   batch_window_ms=batch_window_ms, search_threads=search_threads, header_timeout_s=header_timeout_s,
                   body_timeout_s=body_timeout_s, hosts=allowed_hosts(host, allowed_host), max_queries=max_queries)
    readiness = Readiness()
    if warm:
        readiness.start(db, on_done=on_warm)
    else:
        readiness.set()
    try:
        if workers <= 1:
            app = create_app(db, read_only=read_only, readiness=readiness, **options)
            server = uvicorn.Server(uvicorn_config(app, graceful_s, log_level))
            if on_ready is not None:
                _call_when_started(server, lambda: on_ready(_url(sock)))
            # uvicorn catches SIGTERM / SIGINT to shut down gracefully, then raises the signal again
            # under the handler that was there before it started; with a no-op one there, the
            # process goes on to close the database and exits 0 instead of dying by the signal
            with _signals(lambda *_: None):
                server.run(sockets=[sock])
        else:
            stop = threading.Event()
            with _signals(lambda *_: stop.set()):  # the main process waits; the workers serve
                _serve_with_workers(db, sock, workers, path, read_only, options, graceful_s, log_level, gil_switch_us,
                                    on_ready, stop, readiness)
    finally:
        readiness.close()  # the warm-up's search in progress ends before the database closes
        db.close()  # waits for a write in progress
        sock.close()


def _serve_with_workers(db, sock, n: int, path, read_only: bool, options: dict, graceful_s: float, log_level: str,
                        gil_switch_us: float, on_ready, stop: threading.Event, readiness=None) -> None:
    from mvdb.serve.batcher import Batcher
    from mvdb.serve.workers import Dispatcher, Workers

    # the engine's search loop runs the batches itself (threads=0): one thread, whatever --search-threads says
    batcher = Batcher(db, max_queries=options["batch_queries"], threads=0)
    engine = Dispatcher(db, batcher, window_s=options["batch_window_ms"] / 1e3, readiness=readiness)
    # the workers batch their own requests before calling the engine, with --search-threads calls
    # in flight each, so that a worker has its next call ready while the engine answers the last one
    worker_options = dict(options, batch_window_ms=0.0)
    pool = None
    try:
        pool = Workers(n, sock, engine, read_only, path, worker_options, log_level, gil_switch_us)
        url = _url(sock)
        pool.wait_ready(url)
        if on_ready is not None:
            on_ready(url)
        while not stop.wait(0.5):
            if not pool.alive():
                raise RuntimeError("a server worker process died; stopping the server")
    finally:
        if pool is not None:
            pool.stop(graceful_s)  # requests in flight finish (their engine calls with them)
        engine.close()
        batcher.close()


@contextlib.contextmanager
def _signals(handler):
    """SIGTERM and SIGINT go to ``handler`` inside the block (main thread only; elsewhere a no-op),
    the previous handlers come back after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def _call_when_started(server: uvicorn.Server, fn) -> None:
    def wait():
        while not server.started and not server.should_exit:
            threading.Event().wait(0.01)
        if server.started:
            fn()

    threading.Thread(target=wait, daemon=True).start()


class Server:
    """``mvdb serve`` in a background thread of this process, over ``db`` (an open handle, which
    stays the caller's) or a path (opened here, closed by ``stop``).

        with Server("my.mvdb") as srv:
            client = mvdb.connect(srv.url)
    """

    def __init__(self, db, *, host: str = "127.0.0.1", port: int = 0, read_only: bool = False,
                 api_key: str | None = None, device: str = "auto", log_level: str = "warning",
                 open_options: dict | None = None, allowed_host=(), **options):
        import mvdb

        self._owns = isinstance(db, (str, Path))
        self._stopped = False
        self.db = mvdb.open(db, device=device, read_only=read_only, **(open_options or {})) if self._owns else db
        try:
            self._sock = _bind(host, port)
            app = create_app(self.db, read_only=read_only, api_key=api_key, hosts=allowed_hosts(host, allowed_host),
                             **options)
            self._server = uvicorn.Server(uvicorn_config(app, 10.0, log_level))
            self.url = _url(self._sock)
            self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                            name="mvdb-serve", daemon=True)
            self._thread.start()
            while not self._server.started:
                if not self._thread.is_alive():
                    raise RuntimeError("the server thread stopped before it started (see its log)")
                self._thread.join(0.01)
        except BaseException:
            if self._owns:
                self.db.close()
            raise

    def stop(self) -> None:
        """Stop serving (requests in flight finish) and close the database if this server opened it."""
        if self._stopped:
            return
        self._stopped = True
        self._server.should_exit = True
        self._thread.join(timeout=60)
        with contextlib.suppress(OSError):
            self._sock.close()
        if self._owns:
            self.db.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def main_ready(url: str) -> None:
    print(f"mvdb serve: listening on {url} (docs at {url}/docs)", flush=True)
    sys.stdout.flush()


def main_warm(state: dict) -> None:
    if state.get("error"):
        print(f"mvdb serve: ready; the warm-up failed ({state['error']})", flush=True)
    else:
        print(f"mvdb serve: ready (warmed up in {state['warmup']['seconds']:.1f} s)", flush=True)
