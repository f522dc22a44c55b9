"""The HTTP API of ``mvdb serve``: a FastAPI application over one open database.

Every route takes a MessagePack or JSON body (mvdb.serve.codec) and answers in the format the
request asked for (``Accept: application/msgpack``, else JSON). Errors answer with a 4xx/5xx
status and ``{"error": <mvdb exception class>, "message": <the library's text>}``, which the
Python client raises again as the same exception. No route takes a path: the server serves the
one database it was started on.

Reads run concurrently; searches go through the batcher (mvdb.serve.batcher), so the GPU sees
one batch for many concurrent requests; writes run one at a time (the database's writer lock)
and are answered only once committed. With a text model (``mvdb serve --model``), ``/search_text``
encodes the queries where the database is (mvdb.serve.texts) and searches through the batcher;
``/explain`` takes a text, embeddings or a stored document's id as the query. ``/ui`` is a web
page over these routes (mvdb.serve.ui).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from typing import Callable, NamedTuple
from urllib.parse import urlsplit

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from mvdb import errors
from mvdb.encoders import texts_arg
from mvdb.serve import codec, texts
from mvdb.serve.batcher import Batcher
from mvdb.serve.readiness import READY
from mvdb.serve.ui import add_ui

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
MAX_QUERIES = 4096  # queries (texts or embeddings) one request may send, by default (mvdb serve --max-queries)


class BodyTooLarge(errors.InvalidInputError):
    pass


class ForeignOrigin(errors.AuthenticationError):
    """A browser request sent by a page of another origin (another site must not drive the
    database through the user's browser), or a request addressed to a name that is not the
    server's (DNS rebinding: a page of evil.example whose name now points at 127.0.0.1): 403."""


LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")  # the names a server always answers to


def hostname(netloc: str) -> str:
    """The host of a ``Host`` header or an origin's netloc, without port or brackets, lowercase."""
    netloc = netloc.strip().lower()
    if netloc.startswith("["):
        return netloc[1 : netloc.find("]")] if "]" in netloc else netloc
    return netloc.rsplit(":", 1)[0] if netloc.count(":") == 1 else netloc


def allowed_hosts(bind: str, extra=()) -> frozenset:
    """The names a server bound to ``bind`` answers to without an API key: localhost, the
    loopback addresses, the bind address (unless it is every interface's) and ``extra``."""
    names = set(LOCAL_NAMES) | {hostname(h) for h in extra}
    if bind not in ("", "0.0.0.0", "::"):
        names.add(hostname(bind))
    return frozenset(names)


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
    if isinstance(e, ForeignOrigin):
        status = 403
    elif isinstance(e, errors.AuthenticationError):
        status = 401
    elif isinstance(e, BodyTooLarge):
        status = 413
    # the nearest class the client knows (mvdb.errors)
    name = next((c.__name__ for c in type(e).__mro__ if getattr(errors, c.__name__, None) is c), "MvdbError")
    text = _message(e) if isinstance(e, errors.MvdbError) else f"internal error: {type(e).__name__}: {_message(e)}"
    return _respond({"error": name, "message": text}, accept_json, status)


def wants_json(accept: str) -> bool:
    """JSON unless the ``Accept`` header asks for MessagePack before (or without) JSON: a plain
    ``curl`` or ``*/*`` gets text; the Python client asks for MessagePack."""
    accept = accept.lower()
    at = accept.find("msgpack")
    return at < 0 or 0 <= accept.find(codec.JSON) < at


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


class Served:
    """What the routes serve: the database, its batcher and the server's settings."""

    def __init__(self, db, batcher: Batcher, *, read_only: bool, key: bytes | None, limit: int, readiness=None,
                 hosts: frozenset | None = None, max_queries: int = MAX_QUERIES):
        self.db, self.batcher, self.read_only, self.key, self.limit = db, batcher, read_only, key, limit
        self.max_queries = max_queries
        self.hosts = hosts  # the names it answers to without a key (None: any)
        # ``readiness``: what /ready reports, ``state() -> dict`` (mvdb.serve.readiness); a worker
        # process asks the database's process, whose warm-up it is
        self.readiness = readiness if readiness is not None else getattr(db, "readiness", None) or READY
        self.refuses_writes = bool(read_only or getattr(getattr(db, "store", None), "read_only", False))
        self.started = time.time()
        enc = getattr(db, "encoder", None)  # a worker's view of the database names the engine's
        self.model = enc.name if enc is not None else getattr(db, "encoder_name", None)

    def guard(self, request: Request) -> None:
        """The origin of a browser's request, the API key and the declared body size, before
        anything is read."""
        host = request.headers.get("host", "")
        if self.key is None and self.hosts is not None and hostname(host) not in self.hosts:
            raise ForeignOrigin(f"request addressed to {host!r}, not a name of this server ({', '.join(sorted(self.hosts))}"
                                f"; mvdb serve --allowed-host NAME adds one, or serve with --api-key-file)")
        origin = request.headers.get("origin")
        if origin is not None:
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or parts.netloc != host:
                raise ForeignOrigin(f"request from a page of {origin!r}: only this server's own pages (/ui) may call "
                                    "it from a browser")
        if self.key is not None:
            given = request.headers.get("authorization", "")
            token = given[7:] if given.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
            if not hmac.compare_digest(token.encode(), self.key):
                raise errors.AuthenticationError("missing or wrong API key (send 'Authorization: Bearer <key>')")
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > self.limit:
            raise BodyTooLarge(f"request body: {int(size)} bytes, more than the server's limit of {self.limit} "
                               f"(mvdb serve --max-body-mb)")

    async def body_of(self, request: Request, route: str) -> dict:
        chunks, n = [], 0
        async for chunk in request.stream():
            n += len(chunk)
            if n > self.limit:
                raise BodyTooLarge(f"request body: more than the server's limit of {self.limit} bytes "
                                   f"(mvdb serve --max-body-mb)")
            chunks.append(chunk)
        raw = b"".join(chunks)
        if not raw:
            return {}
        ctype = request.headers.get("content-type")
        if len(raw) > BIG_BODY:
            return _dict(await run_in_threadpool(codec.decode, raw, ctype), route)
        return _dict(codec.decode(raw, ctype), route)

    def count(self, queries, route: str):
        """``queries``, after checking that there are at most ``max_queries`` of them (413)."""
        n = codec.n_queries(queries)
        if n > self.max_queries:
            raise BodyTooLarge(f"{route}: {n} queries in one request, more than the server's limit of "
                               f"{self.max_queries} (mvdb serve --max-queries; the Python client splits "
                               f"larger batches itself)")
        return queries

    def writable(self, name: str) -> None:
        if self.read_only:
            raise errors.ReadOnlyError(f"{name}: the server was started with --read-only")


# ---- the routes: each ``async fn(served, args) -> result``, registered by ROUTES below

ARR = {"description": "an embedding array: MessagePack {'$nd', 'shape', 'data'} or a JSON nested list"}
IDS = {"type": "array", "items": {}, "description": "document ids (ints or strings)"}
SEARCH = {"queries": ARR, "k": {"type": "integer"}, "where": {"type": "object"},
          "sparse": {"description": "a sparse vector per query: {term: weight} or [terms, weights]"},
          "n_candidates": {"type": "integer"}, "k_tokens": {"type": "integer"}, "nprobe": {"type": "integer"},
          "n_sparse": {"type": "integer"}, "exact": {"type": "boolean"}}


async def health(s: Served, args):
    """Whether the server is up, with the number of documents, its text model (``model``: its
    name; None without ``--model``) and the most queries one request may send (``max_queries``)."""
    return {"ok": True, "documents": len(s.db), "read_only": s.refuses_writes, "uptime_s": time.time() - s.started,
            "model": s.model, "max_queries": s.max_queries}


class Status(NamedTuple):
    """A route's result with a status other than 200."""

    body: object
    code: int


async def ready(s: Served, args):
    """Readiness, apart from liveness (``/health``): 200 once the database has warmed up (every
    kernel variant its searches launch compiled and tuned), 503 while it warms up; a probe's
    route (mvdb serve --no-warm: ready at once)."""
    state = await run_in_threadpool(s.readiness.state)
    return state if state["ready"] else Status(state, 503)


async def stats(s: Served, args):
    """Counts, residency and index figures (``db.stats()``), plus the server's batching counters."""
    out = await run_in_threadpool(s.db.stats)
    out.setdefault("server", s.batcher.counters)  # with worker processes: the dispatcher's (mvdb.serve.workers)
    return out


async def length(s: Served, args):
    """The number of live documents."""
    return len(s.db)


async def search(s: Served, args):
    """Top-k by exact MaxSim among the candidates: one query ([Lq, dim]) gives a list of
    [id, score]; a batch (a list, or [Nq, Lq, dim]) one list per query."""
    queries = s.count(codec.embeddings(args.get("queries"), "queries"), "search")
    options = {k: args[k] for k in SEARCH_OPTIONS if k in args}
    return _hits(await asyncio.wrap_future(s.batcher.search(queries, args.get("sparse"), options)))


async def search_text(s: Served, args):
    """Encode the query texts with the server's model (``mvdb serve --model``) and search: one str
    gives a list of [id, score], a list of str one list per text. Options as /search's."""
    if s.model is None:
        raise texts.no_model("search_text")
    queries, single = texts_arg(s.count(args.get("queries"), "search_text"), "queries", single=True, queries=True)
    vecs = await run_in_threadpool(texts.run, s.db, "encode_queries", queries)
    options = {k: args[k] for k in SEARCH_OPTIONS if k in args}
    return _hits(await asyncio.wrap_future(s.batcher.search(vecs[0] if single else vecs, args.get("sparse"), options)))


async def explain(s: Served, args):
    """Why ``doc_id`` scores what it does for ``query`` (a text, with ``--model``; or embeddings
    [Lq, dim]) or for the stored document ``query_id``: ``{id, score, matches, text}``, one match
    per query token (query_token, doc_token, similarity, share, and where the text is stored and the
    model gives them: doc_span, doc_text, doc_spans, query_span, query_text); ``text``: the stored texts of
    the document and the query."""
    if "doc_id" not in args or ("query" not in args and "query_id" not in args):
        raise errors.InvalidInputError("explain: expected doc_id (the document to explain) and query (a text, or "
                                       "embeddings [Lq, dim]) or query_id (a stored document's id)")
    query = args.get("query")
    if isinstance(query, str) and s.model is None:
        raise texts.no_model("explain")
    if query is not None and not isinstance(query, str):
        query = codec.embeddings(query, "query")
    return await run_in_threadpool(texts.run, s.db, "explanation", args.get("doc_id"), query, args.get("query_id"))


async def candidates(s: Served, args):
    """The ids the exact stage of search would rerank, per query."""
    queries = s.count(codec.embeddings(args.pop("queries", None), "queries"), "candidates")
    return await run_in_threadpool(lambda: s.db.candidates(queries, **args))


async def rerank(s: Served, args):
    """Exact MaxSim of each query against its own candidate ids."""
    queries = s.count(codec.embeddings(args.get("queries"), "queries"), "rerank")
    return _hits(await run_in_threadpool(lambda: s.db.rerank(queries, args.get("candidate_ids"), args.get("k"))))


async def add(s: Served, args):
    """Store documents; answered once committed, with their ids. With ``encoder`` (an
    ``Encoder.record()``: texts the client encoded), checked against the database's record and
    recorded with the batch where it has none (``add_encoded``)."""
    s.writable("add")
    docs = codec.embeddings(args.get("docs"), "docs")
    encoder = args.get("encoder")
    if encoder is not None:
        if args.get("sparse") is not None:
            raise errors.InvalidInputError("sparse: not taken with encoder (texts add no sparse vectors)")
        out = await run_in_threadpool(lambda: s.db.add_encoded(docs, encoder, ids=args.get("ids"),
                                                               metadata=args.get("metadata")))
    else:
        out = await run_in_threadpool(lambda: s.db.add(docs, ids=args.get("ids"), metadata=args.get("metadata"),
                                                       sparse=args.get("sparse")))
    return [_plain(i) for i in out]


async def delete(s: Served, args):
    """Delete documents by id (all or none: an unknown id deletes nothing)."""
    s.writable("delete")
    await run_in_threadpool(s.db.delete, args.get("ids"))


async def get(s: Served, args):
    """Each document's tokens as a float32 [L, dim] array."""
    return await run_in_threadpool(s.db.get, args.get("ids"))


async def metadata(s: Served, args):
    """Each document's metadata (None where it has none)."""
    return await run_in_threadpool(s.db.metadata, args.get("ids"))


async def contains(s: Served, args):
    """Which of the ids are stored."""
    return [bool(x) for x in await run_in_threadpool(s.db.contains, args.get("ids"))]


async def compact(s: Served, args):
    """Rewrite segments holding deleted documents; the number rewritten."""
    s.writable("compact")
    return await run_in_threadpool(s.db.compact)


async def refresh(s: Served, args):
    """Follow commits another process made; whether something changed."""
    return await run_in_threadpool(s.db.refresh)


async def verify(s: Served, args):
    """Check every file against the manifest and its checksums."""
    r = await run_in_threadpool(s.db.verify)
    return {"problems": list(r.problems), "n_docs": r.n_docs, "n_segments": r.n_segments}


class Route(NamedTuple):
    path: str
    method: str
    summary: str
    body: dict | None  # the body's arguments (OpenAPI properties); None: not checked
    fn: Callable


ROUTES = (
    Route("/health", "GET", "liveness and size", None, health),
    Route("/ready", "GET", "readiness: 200 once warmed up, 503 before", None, ready),
    Route("/stats", "GET", "db.stats()", None, stats),
    Route("/len", "GET", "len(db)", None, length),
    Route("/search", "POST", "db.search(queries, ...)", SEARCH, search),
    Route("/search_text", "POST", "db.search_text(queries, ...) with the server's model",
          {**SEARCH, "queries": {"description": "one text, or a list of texts"}}, search_text),
    Route("/explain", "POST", "db.explain(query, doc_id); query_id: a stored document as the query",
          {"query": {"description": "a text (needs --model) or embeddings [Lq, dim]"},
           "query_id": {"description": "a stored document's id, as the query instead"},
           "doc_id": {"description": "the document to explain"}}, explain),
    Route("/candidates", "POST", "db.candidates(queries, ...)", {k: v for k, v in SEARCH.items() if k != "exact"},
          candidates),
    Route("/rerank", "POST", "db.rerank(queries, candidate_ids, k)",
          {"queries": ARR, "candidate_ids": {"type": "array"}, "k": {"type": "integer"}}, rerank),
    Route("/add", "POST", "db.add(docs, ids, metadata, sparse); with encoder, db.add_encoded",
          {"docs": {"type": "array", "items": ARR}, "ids": IDS, "metadata": {"type": "array"},
           "sparse": {"type": "array"}, "encoder": {"type": "object"}}, add),
    Route("/delete", "POST", "db.delete(ids)", {"ids": IDS}, delete),
    Route("/get", "POST", "db.get(ids)", {"ids": IDS}, get),
    Route("/metadata", "POST", "db.metadata(ids)", {"ids": IDS}, metadata),
    Route("/contains", "POST", "db.contains(ids)", {"ids": IDS}, contains),
    Route("/compact", "POST", "db.compact()", {}, compact),
    Route("/refresh", "POST", "db.refresh()", {}, refresh),
    Route("/verify", "GET", "db.verify()", None, verify),
)


def endpoint(served: Served, r: Route):
    """The request handler of route ``r``: checks the key and size, decodes the body (checking its
    arguments), runs the route, encodes the result; every error becomes an error response."""
    async def handle(request: Request):
        accept_json = wants_json(request.headers.get("accept", ""))
        try:
            served.guard(request)
            args = await served.body_of(request, r.path) if r.method == "POST" else {}
            if r.body is not None:
                _only(args, r.path, r.body)
            out = await r.fn(served, args)
            if isinstance(out, Status):
                return _respond(out.body, accept_json, out.code)
            return _respond(out, accept_json)
        except Exception as e:  # noqa: BLE001 - every error becomes a response
            return error_response(e, accept_json)

    handle.__name__ = r.fn.__name__
    return handle


def create_app(db, *, read_only: bool = False, api_key: str | None = None, max_body_mb: float = 256,
               batch_queries: int = 256, batch_window_ms: float = 0.0, search_threads: int = 1,
               header_timeout_s: float = 10.0, body_timeout_s: float = 60.0, readiness=None,
               hosts: frozenset | None = None, max_queries: int = MAX_QUERIES) -> FastAPI:
    """The application serving ``db`` (an open ``Database`` or ``ShardedDatabase``); the caller
    owns ``db``. ``read_only`` refuses writes (403, ReadOnlyError) even on a writable handle.
    ``header_timeout_s`` / ``body_timeout_s``: the read timeouts of its connections
    (mvdb.serve.protocol), applied by :func:`uvicorn_config`. ``readiness``: what ``/ready``
    reports (a :class:`mvdb.serve.readiness.Readiness`; None: ready). ``hosts``: without an API
    key, the names (``Host`` headers) it answers to, others refused with 403 (:func:`allowed_hosts`;
    None: any, for callers that check them themselves). ``max_queries``: the most queries (texts or
    embeddings) one request may send; more is a 413."""
    batcher = Batcher(db, max_queries=batch_queries, window_s=batch_window_ms / 1e3, threads=search_threads)
    served = Served(db, batcher, read_only=read_only, key=api_key.encode() if api_key else None,
                    limit=int(max_body_mb * (1 << 20)), readiness=readiness, hosts=hosts, max_queries=max_queries)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        await anyio.to_thread.run_sync(batcher.close)  # searches in flight finish first

    app = FastAPI(title="mvdb", lifespan=lifespan, version=getattr(__import__("mvdb"), "__version__", "0"),
                  description="Multi-vector (late-interaction) retrieval over one mvdb database. Bodies are "
                              "MessagePack (arrays as {'$nd': dtype, 'shape', 'data': bytes}) or JSON "
                              "(embeddings as nested lists); see the serving guide.")
    app.state.db, app.state.batcher, app.state.started = db, batcher, served.started
    app.state.read_timeouts = (header_timeout_s, body_timeout_s)
    for r in ROUTES:
        extra = None
        if r.body is not None:
            schema = {"schema": {"type": "object", "properties": r.body}}
            extra = {"requestBody": {"content": {codec.MSGPACK: schema, codec.JSON: schema}}}
        app.add_api_route(r.path, endpoint(served, r), methods=[r.method], summary=r.summary,
                          description=r.fn.__doc__, openapi_extra=extra, response_class=Response)
    add_ui(app)
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
