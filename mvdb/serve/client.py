"""``mvdb.connect(url)``: a client of ``mvdb serve`` with the methods, results and errors of
``mvdb.open``'s database (hits are :class:`mvdb.Hit`, documents float32 arrays, and a server-side
``UnknownIdError`` is raised here as ``UnknownIdError`` with the library's text).

One client may be shared by many threads (one urllib3 connection pool: a connection per thread
in flight, kept alive). Embeddings travel as
MessagePack binary (fp16 stays fp16 on the wire; torch tensors are sent from the host).
"""

from __future__ import annotations

import numpy as np

from mvdb import errors
from mvdb.contract import DatabaseAPI
from mvdb.encoders import as_encoder
from mvdb.engine.progress import Progress
from mvdb.explain import ExplainMethods, Explanation, TokenMatch
from mvdb.serve import codec
from mvdb.text import TextMethods

_ERRORS = {name: getattr(errors, name) for name in dir(errors)
           if isinstance(getattr(errors, name), type) and issubclass(getattr(errors, name), errors.MvdbError)}




def connect(url: str, *, api_key: str | None = None, timeout: float = 300.0, max_connections: int = 100,
            encoder=None) -> Client:
    """A client of the ``mvdb serve`` at ``url`` (e.g. "http://127.0.0.1:8000"); checks that it
    answers (``/health``) before returning. ``encoder``: a text model (as ``mvdb.open``'s) for
    ``add_texts`` / ``search_text``: texts are encoded here and their vectors sent. Without one,
    ``search_text`` and ``explain`` with a text query use the server's model (``mvdb serve
    --model``), and ``explain`` is computed by the server (with the matched words where it has a
    model and the text is stored)."""
    c = Client(url, api_key=api_key, timeout=timeout, max_connections=max_connections, encoder=encoder)
    try:
        c.health()
    except BaseException:
        c.close()
        raise
    return c


class Client(TextMethods, ExplainMethods, DatabaseAPI):
    def __init__(self, url: str, *, api_key: str | None = None, timeout: float = 300.0, max_connections: int = 100,
                 encoder=None):
        import urllib3

        self.encoder = as_encoder(encoder)

        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise errors.InvalidInputError(f"url: expected 'http://host:port' or 'https://...', got {url!r}")
        self.url = url.rstrip("/")
        headers = {"accept": codec.MSGPACK, "content-type": codec.MSGPACK}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self._prefix = urllib3.util.parse_url(self.url).path or ""  # a server behind a path ("http://host/mvdb")
        # urllib3, not httpx: half the client's interpreter time per request (186 against 377 us on
        # the 2-core CPU for a search; README "Serving"), which many client threads share one GIL for
        self._http = urllib3.connection_from_url(self.url, maxsize=max_connections, block=False, headers=headers,
                                                 timeout=urllib3.Timeout(connect=timeout, read=timeout), retries=False)
        self._closed = False
        self._dim = None
        self._max_queries = None  # the server's limit per request, asked once a batch could pass it

    # ---- transport

    def _call(self, path: str, body=None, method: str = "POST", *, write: bool = False):
        """One request. A read whose connection broke before any answer came (a kept-alive
        connection the server had just closed) is sent once more; a write never is (it may have
        been committed: the caller decides)."""
        from urllib3.exceptions import HTTPError, NewConnectionError, ProtocolError

        if self._closed:
            raise errors.InvalidInputError(f"{self.url}: the client is closed")
        content = None if method == "GET" else codec.pack(body if body is not None else {})
        for attempt in (0, 1):
            try:
                r = self._http.urlopen(method, self._prefix + path, body=content, retries=False, redirect=False)
                break
            except (ProtocolError, NewConnectionError) as e:
                if write or attempt:
                    raise errors.ServerError(f"{self.url}{path}: {type(e).__name__}: {e}") from None
            except HTTPError as e:
                raise errors.ServerError(f"{self.url}{path}: {type(e).__name__}: {e}") from None
        if (r.headers.get("content-type") or "").startswith(codec.MSGPACK):
            out = codec.unpack(r.data, limits=False)
        else:
            text = r.data[:200].decode(errors="replace")
            raise errors.ServerError(f"{self.url}{path}: HTTP {r.status}, not an mvdb answer: {text!r}")
        if r.status >= 400:
            if isinstance(out, dict) and "error" in out:
                raise _ERRORS.get(out["error"], errors.MvdbError)(out.get("message", ""))
            raise errors.ServerError(f"{self.url}{path}: HTTP {r.status}: {out!r}")
        return out

    def _batched(self, path: str, body: dict, per_query=("queries", "sparse"), hits: bool = True):
        """``_call`` of a route taking queries; a batch of more queries than the server takes in one
        request (``/health``'s ``max_queries``) is sent in parts, each argument of ``per_query``
        split alike, and the answers joined."""
        n = codec.n_queries(body["queries"])
        if n > _FEW_QUERIES and self._max_queries is None:
            self._max_queries = int(self.health().get("max_queries") or n)
        step = self._max_queries or n
        if n <= step:
            return self._call(path, body)
        outs = []
        for a in range(0, n, step):
            part = dict(body)
            for key in per_query:
                if isinstance(part.get(key), (list, tuple)) or getattr(part.get(key), "ndim", 0) >= 1:
                    part[key] = part[key][a : a + step]
            outs.append(self._call(path, part))
        if hits:
            return {"batch": True, "hits": [row for o in outs for row in o["hits"]]}
        return [row for o in outs for row in o]

    @staticmethod
    def _hits(out):
        from mvdb.engine.search import Hit

        if out["batch"]:
            return [[Hit(i, float(s)) for i, s in row] for row in out["hits"]]
        return [Hit(i, float(s)) for i, s in out["hits"]]

    # ---- the database API

    def health(self) -> dict:
        return self._call("/health", method="GET")

    @property
    def dim(self) -> int | None:
        if self._dim is None:
            self._dim = self.stats()["dim"]
        return self._dim

    def __len__(self) -> int:
        return int(self._call("/len", method="GET"))

    def __contains__(self, doc_id) -> bool:
        return bool(self.contains([doc_id])[0])

    def contains(self, ids) -> np.ndarray:
        single = isinstance(ids, (str, int, np.integer))
        return np.asarray(self._call("/contains", {"ids": [ids] if single else _ids(ids)}), dtype=bool)

    def add(self, docs, ids=None, metadata=None, sparse=None) -> list:
        return self._call("/add", {"docs": docs, "ids": _ids(ids), "metadata": metadata, "sparse": sparse}, write=True)

    def add_encoded(self, docs, encoder_record: dict, ids=None, metadata=None) -> list:
        """``add`` of vectors the encoder ``encoder_record`` made (checked and recorded by the server)."""
        from mvdb.storage.packed import Packed  # on use: a client that never adds texts loads no storage layer

        if isinstance(docs, Packed):
            docs = docs.split()
        return self._call("/add", {"docs": docs, "ids": _ids(ids), "metadata": metadata, "encoder": encoder_record},
                          write=True)

    # ---- text: encoded here, checked and stored there

    def _text_path(self):
        return self.url

    def _text_record(self) -> dict | None:
        return self.stats().get("encoder")

    def _text_float16(self) -> bool:
        return self.stats().get("dtype") == "float16"

    def _text_progress(self) -> Progress:
        return Progress()

    def _check_writable(self) -> None:
        """The server refuses writes it does not take (read-only, a reader's API key)."""

    def search_text(self, queries, k: int = 10, where=None, *, encoder=None, **options):
        """As ``Database.search_text``; without an encoder here (``connect(url, encoder=...)`` or
        ``encoder=``), the server encodes the queries with its model (``/search_text``)."""
        if encoder is not None or self.encoder is not None:
            return super().search_text(queries, k, where, encoder=encoder, **options)
        body = _options(queries=queries, k=k, where=where, **options)
        return self._hits(self._batched("/search_text", body))

    def explain(self, query, doc_id) -> Explanation:
        """As ``Database.explain``: computed here with this client's encoder where it has one,
        else by the server (``/explain``, a text query encoded with the server's model)."""
        if self.encoder is not None:
            return super().explain(query, doc_id)
        out = self._call("/explain", {"query": query, "doc_id": doc_id})
        matches = [TokenMatch(**{k: tuple(v) if k.endswith("_span") and v is not None else v for k, v in m.items()})
                   for m in out["matches"]]
        return Explanation(out["id"], out["score"], matches)

    def delete(self, ids) -> None:
        self._call("/delete", {"ids": _ids(ids)}, write=True)

    def compact(self) -> int:
        return self._call("/compact", {}, write=True)

    def refresh(self) -> bool:
        return self._call("/refresh", {})

    def get(self, ids) -> list[np.ndarray]:
        return [np.asarray(a, dtype=np.float32) for a in self._call("/get", {"ids": _ids(ids)})]

    def metadata(self, ids) -> list:
        return self._call("/metadata", {"ids": _ids(ids)})

    def verify(self):
        from mvdb.storage import VerifyReport

        r = self._call("/verify", method="GET")
        return VerifyReport(r["problems"], r["n_docs"], r["n_segments"])

    def stats(self) -> dict:
        return self._call("/stats", method="GET")

    def search(self, queries, k: int = 10, where=None, *, n_candidates=None, k_tokens=None, nprobe=None, sparse=None,
               n_sparse=None, exact: bool = False):
        body = _options(queries=queries, k=k, where=where, n_candidates=n_candidates, k_tokens=k_tokens,
                        nprobe=nprobe, sparse=sparse, n_sparse=n_sparse, exact=exact)
        return self._hits(self._batched("/search", body))

    def candidates(self, queries, k: int = 10, where=None, *, n_candidates=None, k_tokens=None, nprobe=None,
                   sparse=None, n_sparse=None):
        body = _options(queries=queries, k=k, where=where, n_candidates=n_candidates, k_tokens=k_tokens,
                        nprobe=nprobe, sparse=sparse, n_sparse=n_sparse)
        return self._batched("/candidates", body, hits=False)

    def rerank(self, queries, candidate_ids, k: int | None = None):
        body = {"queries": queries, "candidate_ids": _ids(candidate_ids), "k": k}
        return self._hits(self._batched("/rerank", body, per_query=("queries", "candidate_ids")))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"mvdb.Client({self.url!r}{', closed' if self._closed else ''})"


_FEW_QUERIES = 256  # batches up to this size are sent whole without asking the server's limit


def _options(**kw) -> dict:
    """Arguments as given, without those left at None (the server applies the same defaults)."""
    return {k: v for k, v in kw.items() if v is not None or k == "queries"}


def _ids(ids):
    """Ids as lists (numpy arrays of ids become plain lists); anything else is sent as it is, for
    the server (the library) to name what is wrong."""
    if isinstance(ids, np.ndarray):
        return ids.tolist()
    if isinstance(ids, tuple):
        return list(ids)
    if isinstance(ids, list) and ids and isinstance(ids[0], (list, tuple, np.ndarray)):
        return [_ids(x) for x in ids]  # rerank: one list per query
    return ids
