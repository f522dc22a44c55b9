"""The HTTP API of ``mvdb serve``: a FastAPI application over one open database.

Every route takes a MessagePack or JSON body (mvdb.serve.codec) and answers in the format the
request asked for (``Accept: application/json``, else MessagePack). Errors answer with a 4xx/5xx
status and ``{"error": <mvdb exception class>, "message": <the library's text>}``, which the
Python client raises again as the same exception. No route takes a path: the server serves the
one database it was started on.

Reads run concurrently; searches go through the batcher (mvdb.serve.batcher), so the GPU sees
one batch for many concurrent requests; writes run one at a time (the database's writer lock)
and are answered only once committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from mvdb import errors
from mvdb.serve import codec
from mvdb.serve.batcher import Batcher

STATUS = [  # most specific first
    (errors.DuplicateIdError, 409),
    (errors.UnknownIdError, 404),
    (errors.ReadOnlyError, 403),
    (errors.DatabaseLockedError, 423),
    (errors.CorruptionError, 500),
    (errors.StorageError, 507),
    (errors.InvalidInputError, 400),
    (errors.InvalidTypeError, 400),
    (errors.FormatError, 400),
]
SEARCH_OPTIONS = ("k", "where", "n_candidates", "k_tokens", "nprobe", "n_sparse", "exact")
BIG_BODY = 1 << 20  # bodies larger than this are decoded off the event loop


class BodyTooLarge(errors.InvalidInputError):
    pass


def _message(e: BaseException) -> str:
    if isinstance(e, KeyError) and e.args:  # KeyError's str() quotes its text
        return str(e.args[0])
    return str(e) or type(e).__name__


def error_response(e: BaseException, accept_json: bool) -> Response:
    status = 500
    for cls, code in STATUS:
        if isinstance(e, cls):
            status = code
            break
    if isinstance(e, errors.AuthenticationError):
        status = 401
    elif isinstance(e, BodyTooLarge):
        status = 413
    # the nearest class the client knows (mvdb.errors)
    name = next((c.__name__ for c in type(e).__mro__ if getattr(errors, c.__name__, None) is c), "MvdbError")
    text = _message(e) if isinstance(e, errors.MvdbError) else f"internal error: {type(e).__name__}: {_message(e)}"
    return _respond({"error": name, "message": text}, accept_json, status)


def _respond(obj, accept_json: bool, status: int = 200) -> Response:
    if accept_json:
        return Response(codec.to_json(obj), status_code=status, media_type=codec.JSON)
    return Response(codec.pack(obj), status_code=status, media_type=codec.MSGPACK)


def _hits(hits) -> dict:
    """Hits (a list of Hit for one query, a list of such lists for a batch) as [id, score] pairs."""
    if hits and isinstance(hits[0], list):
        return {"batch": True, "hits": [[[h.id, h.score] for h in row] for row in hits]}
    return {"batch": False, "hits": [[h.id, h.score] for h in hits]}


def _dict(body, route: str) -> dict:
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise errors.InvalidTypeError(f"{route}: expected the request body to be a map of arguments, got "
                                      f"{type(body).__name__}")
    return body


def _only(body: dict, route: str, allowed) -> None:
    extra = sorted(set(body) - set(allowed))
    if extra:
        raise errors.InvalidInputError(f"{route}: unknown argument(s) {extra}; expected some of {sorted(allowed)}")


def create_app(db, *, read_only: bool = False, api_key: str | None = None, max_body_mb: float = 256,
               batch_queries: int = 256, batch_window_ms: float = 0.0, search_threads: int = 1,
               header_timeout_s: float = 10.0, body_timeout_s: float = 60.0) -> FastAPI:
    """The application serving ``db`` (an open ``Database`` or ``ShardedDatabase``); the caller
    owns ``db``. ``read_only`` refuses writes (403, ReadOnlyError) even on a writable handle.
    ``header_timeout_s`` / ``body_timeout_s``: the read timeouts of its connections
    (mvdb.serve.protocol), applied by :func:`uvicorn_config`."""
    limit = int(max_body_mb * (1 << 20))
    key = api_key.encode() if api_key else None
    batcher = Batcher(db, max_queries=batch_queries, window_s=batch_window_ms / 1e3, threads=search_threads)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        await anyio.to_thread.run_sync(batcher.close)  # searches in flight finish first

    refuses_writes = bool(read_only or getattr(getattr(db, "store", None), "read_only", False))
    app = FastAPI(title="mvdb", lifespan=lifespan, version=getattr(__import__("mvdb"), "__version__", "0"),
                  description="Multi-vector (late-interaction) retrieval over one mvdb database. Bodies are "
                              "MessagePack (arrays as {'$nd': dtype, 'shape', 'data': bytes}) or JSON "
                              "(embeddings as nested lists); see the README's 'Serving' section.")
    app.state.db, app.state.batcher, app.state.started = db, batcher, time.time()
    app.state.read_timeouts = (header_timeout_s, body_timeout_s)

    def guard(request: Request) -> None:
        """The API key and the declared body size, before anything is read."""
        if key is not None:
            given = request.headers.get("authorization", "")
            token = given[7:] if given.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
            if not hmac.compare_digest(token.encode(), key):
                raise errors.AuthenticationError("missing or wrong API key (send 'Authorization: Bearer <key>')")
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > limit:
            raise BodyTooLarge(f"request body: {int(size)} bytes, more than the server's limit of {limit} "
                               f"(mvdb serve --max-body-mb)")

    async def body_of(request: Request, route: str) -> dict:
        chunks, n = [], 0
        async for chunk in request.stream():
            n += len(chunk)
            if n > limit:
                raise BodyTooLarge(f"request body: more than the server's limit of {limit} bytes "
                                   f"(mvdb serve --max-body-mb)")
            chunks.append(chunk)
        raw = b"".join(chunks)
        if not raw:
            return {}
        ctype = request.headers.get("content-type")
        if len(raw) > BIG_BODY:
            return _dict(await run_in_threadpool(codec.decode, raw, ctype), route)
        return _dict(codec.decode(raw, ctype), route)

    def route(path: str, method: str = "POST", summary: str = "", body: dict | None = None):
        """Register ``fn(args) -> result`` (a coroutine) under ``path``: decodes the body, encodes
        the result, maps errors to statuses."""
        extra = None
        if body is not None:
            extra = {"requestBody": {"content": {codec.MSGPACK: {"schema": {"type": "object", "properties": body}},
                                                 codec.JSON: {"schema": {"type": "object", "properties": body}}}}}

        def deco(fn):
            async def endpoint(request: Request):
                accept_json = codec.JSON in request.headers.get("accept", "")
                try:
                    guard(request)
                    args = await body_of(request, path) if method == "POST" else {}
                    if body is not None:
                        _only(args, path, body)
                    return _respond(await fn(args), accept_json)
                except Exception as e:  # noqa: BLE001 - every error becomes a response
                    return error_response(e, accept_json)

            endpoint.__name__ = fn.__name__
            app.add_api_route(path, endpoint, methods=[method], summary=summary, description=fn.__doc__,
                              openapi_extra=extra, response_class=Response)
            return fn
        return deco

    def writable(name: str) -> None:
        if read_only:
            raise errors.ReadOnlyError(f"{name}: the server was started with --read-only")

    ARR = {"description": "an embedding array: MessagePack {'$nd', 'shape', 'data'} or a JSON nested list"}
    IDS = {"type": "array", "items": {}, "description": "document ids (ints or strings)"}
    SEARCH = {"queries": ARR, "k": {"type": "integer"}, "where": {"type": "object"},
              "sparse": {"description": "a sparse vector per query: {term: weight} or [terms, weights]"},
              "n_candidates": {"type": "integer"}, "k_tokens": {"type": "integer"}, "nprobe": {"type": "integer"},
              "n_sparse": {"type": "integer"}, "exact": {"type": "boolean"}}

    @route("/health", "GET", "liveness and size")
    async def health(args):
        """Whether the server is up, with the number of documents."""
        return {"ok": True, "documents": len(db), "read_only": refuses_writes,
                "uptime_s": time.time() - app.state.started}

    @route("/stats", "GET", "db.stats()")
    async def stats(args):
        """Counts, residency and index figures (``db.stats()``), plus the server's batching counters."""
        out = await run_in_threadpool(db.stats)
        out.setdefault("server", batcher.counters)  # with worker processes: the engine's (mvdb.serve.workers)
        return out

    @route("/len", "GET", "len(db)")
    async def length(args):
        """The number of live documents."""
        return len(db)

    @route("/search", summary="db.search(queries, ...)", body=SEARCH)
    async def search(args):
        """Top-k by exact MaxSim among the candidates: one query ([Lq, dim]) gives a list of
        [id, score]; a batch (a list, or [Nq, Lq, dim]) one list per query."""
        queries = codec.embeddings(args.get("queries"), "queries")
        options = {k: args[k] for k in SEARCH_OPTIONS if k in args}
        return _hits(await asyncio.wrap_future(batcher.search(queries, args.get("sparse"), options)))

    @route("/candidates", summary="db.candidates(queries, ...)", body={k: v for k, v in SEARCH.items() if k != "exact"})
    async def candidates(args):
        """The ids the exact stage of search would rerank, per query."""
        queries = codec.embeddings(args.pop("queries", None), "queries")
        return await run_in_threadpool(lambda: db.candidates(queries, **args))

    @route("/rerank", summary="db.rerank(queries, candidate_ids, k)",
           body={"queries": ARR, "candidate_ids": {"type": "array"}, "k": {"type": "integer"}})
    async def rerank(args):
        """Exact MaxSim of each query against its own candidate ids."""
        queries = codec.embeddings(args.get("queries"), "queries")
        return _hits(await run_in_threadpool(lambda: db.rerank(queries, args.get("candidate_ids"), args.get("k"))))

    @route("/add", summary="db.add(docs, ids, metadata, sparse)",
           body={"docs": {"type": "array", "items": ARR}, "ids": IDS, "metadata": {"type": "array"},
                 "sparse": {"type": "array"}})
    async def add(args):
        """Store documents; answered once committed, with their ids."""
        writable("add")
        docs = codec.embeddings(args.get("docs"), "docs")
        out = await run_in_threadpool(lambda: db.add(docs, ids=args.get("ids"), metadata=args.get("metadata"),
                                                     sparse=args.get("sparse")))
        return [_plain(i) for i in out]

    @route("/delete", summary="db.delete(ids)", body={"ids": IDS})
    async def delete(args):
        """Delete documents by id (all or none: an unknown id deletes nothing)."""
        writable("delete")
        await run_in_threadpool(db.delete, args.get("ids"))

    @route("/get", summary="db.get(ids)", body={"ids": IDS})
    async def get(args):
        """Each document's tokens as a float32 [L, dim] array."""
        return await run_in_threadpool(db.get, args.get("ids"))

    @route("/metadata", summary="db.metadata(ids)", body={"ids": IDS})
    async def metadata(args):
        """Each document's metadata (None where it has none)."""
        return await run_in_threadpool(db.metadata, args.get("ids"))

    @route("/contains", summary="db.contains(ids)", body={"ids": IDS})
    async def contains(args):
        """Which of the ids are stored."""
        return [bool(x) for x in await run_in_threadpool(db.contains, args.get("ids"))]

    @route("/compact", summary="db.compact()", body={})
    async def compact(args):
        """Rewrite segments holding deleted documents; the number rewritten."""
        writable("compact")
        return await run_in_threadpool(db.compact)

    @route("/refresh", summary="db.refresh()", body={})
    async def refresh(args):
        """Follow commits another process made; whether something changed."""
        return await run_in_threadpool(db.refresh)

    @route("/verify", "GET", "db.verify()")
    async def verify(args):
        """Check every file against the manifest and its checksums."""
        r = await run_in_threadpool(db.verify)
        return {"problems": list(r.problems), "n_docs": r.n_docs, "n_segments": r.n_segments}

    return app


def _plain(x):
    return x.item() if hasattr(x, "item") else x


def uvicorn_config(app, graceful_s: float, log_level: str):
    """How every mvdb server runs ``app`` on uvicorn (the main process and each worker): httptools
    with the app's read timeouts (mvdb.serve.protocol)."""
    import uvicorn

    from mvdb.serve.protocol import timed_protocol

    return uvicorn.Config(app, log_level=log_level, access_log=False, timeout_graceful_shutdown=graceful_s,
                          timeout_keep_alive=60, http=timed_protocol(*app.state.read_timeouts),
                          lifespan="on", server_header=False, date_header=False)
