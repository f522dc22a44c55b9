"""``mvdb serve``: a database over HTTP."""

from __future__ import annotations

import click

from mvdb.cli.arguments import load_model, require_database
from mvdb.cli.group import DEBUG, DEVICE
from mvdb.errors import InvalidInputError


@click.command()
@click.argument("db")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0: every interface; only with --api-key-file on a shared network).")
@click.option("--port", default=8000, show_default=True, help="Port (0: a free one, printed).")
@click.option("--read-only", is_flag=True, help="Refuse writes (add, delete, compact) with 403.")
@click.option("--api-key-file", type=click.Path(dir_okay=False), default=None,
              help="File holding the key every request must send (Authorization: Bearer <key>).")
@click.option("--create", is_flag=True, help="Create an empty database at DB if there is none.")
@click.option("--model", default=None, metavar="SPEC",
              help="Text model for /search_text, text queries of /explain and the /ui page: 'minilm', a model "
                   "folder or name, or module:attr; loaded on --device. The model the texts were added with.")
@click.option("--max-body-mb", default=256.0, show_default=True, help="Largest request body accepted (413 above).")
@click.option("--max-queries", default=4096, show_default=True,
              help="Most queries (texts or embeddings) one request may send (413 above; the Python client "
                   "splits larger batches).")
@click.option("--batch-queries", default=256, show_default=True,
              help="Most queries of concurrent requests searched as one batch.")
@click.option("--batch-window-ms", default=0.0, show_default=True,
              help="Wait this long after a search arrives for others to join its batch (0: batches form "
                   "only from requests that queue while the GPU is busy).")
@click.option("--workers", type=int, default=None,
              help="HTTP worker processes in front of the database process (default: a quarter of the cores, "
                   "1 to 8; 1: one process does both).")
@click.option("--search-threads", type=int, default=None,
              help="Threads taking batches of searches off the queue, each one db.search at a time (default 1). "
                   "With --workers 2 or more: each worker's threads sending its batches to the database process, "
                   "which runs one search loop over them all (default 8).")
@click.option("--gil-switch-us", default=100.0, show_default=True,
              help="Python's thread switch interval in the server's processes (0: Python's 5,000 us).")
@click.option("--header-timeout", default=10.0, show_default=True,
              help="Seconds a connection has to send a request's headers (408 and closed after).")
@click.option("--body-timeout", default=60.0, show_default=True,
              help="Seconds a request has to send its whole body once its headers are in (408 and closed after).")
@click.option("--allowed-host", multiple=True, metavar="NAME",
              help="A name clients may address the server by (the Host header) besides localhost, the loopback "
                   "addresses and --host; without --api-key-file, requests to any other name are refused (403), "
                   "which stops DNS rebinding. Repeat for several.")
@click.option("--warm/--no-warm", default=True, show_default=True,
              help="Warm the database up (db.warmup) as the server starts: GET /ready answers 503 until it is "
                   "done, then 200; GET /health answers at once.")
@DEVICE
@DEBUG
def serve(db: str, host: str, port: int, read_only: bool, api_key_file: str | None, create: bool, model: str | None,
          max_body_mb: float, max_queries: int, batch_queries: int, batch_window_ms: float, workers: int | None,
          search_threads: int | None, gil_switch_us: float, header_timeout: float, body_timeout: float,
          allowed_host: tuple, warm: bool, device: str) -> None:
    """Serve DB over HTTP until SIGTERM / Ctrl-C (graceful: requests in flight finish). Clients:
    mvdb.connect("http://HOST:PORT"), any HTTP client (MessagePack or JSON; docs at /docs), or a
    browser at /ui.

    Example: mvdb serve my.mvdb --port 8000 --model minilm
    """
    from mvdb.serve.server import main_ready, main_warm, read_key
    from mvdb.serve.server import serve as run

    if not create:
        require_database(db, "serve (without --create)")
    if port < 0 or port > 65535:
        raise InvalidInputError(f"--port: expected 0 to 65535, got {port}")
    if max_body_mb <= 0 or batch_queries < 1 or max_queries < 1 or batch_window_ms < 0:
        raise InvalidInputError("--max-body-mb, --max-queries and --batch-queries: expected positive values, "
                                f"--batch-window-ms 0 or more; got {max_body_mb}, {max_queries}, {batch_queries}, "
                                f"{batch_window_ms}")
    key = read_key(api_key_file) if api_key_file else None
    if workers is not None and workers < 1:
        raise InvalidInputError(f"--workers: expected 1 or more, got {workers}")
    if search_threads is not None and search_threads < 1:
        raise InvalidInputError(f"--search-threads: expected 1 or more, got {search_threads}")
    if gil_switch_us < 0:
        raise InvalidInputError(f"--gil-switch-us: expected 0 or more, got {gil_switch_us}")
    if not header_timeout > 0 or not body_timeout > 0:
        raise InvalidInputError(f"--header-timeout and --body-timeout: expected seconds above 0, got {header_timeout}, "
                                f"{body_timeout}")
    run(db, host=host, port=port, read_only=read_only, api_key=key, device=device, max_body_mb=max_body_mb,
        max_queries=max_queries,
        batch_queries=batch_queries, batch_window_ms=batch_window_ms, workers=workers,
        search_threads=search_threads, gil_switch_us=gil_switch_us, header_timeout_s=header_timeout,
        body_timeout_s=body_timeout, on_ready=main_ready, warm=warm, on_warm=main_warm, allowed_host=allowed_host,
        model=None if model is None else load_model(model, device))
