"""``mvdb serve --model`` (issue #47): ``/search_text`` and ``/explain`` over HTTP give the library's
answers, in one process and with ``--workers 2`` (the database process encodes); a server without
a model names what is missing; bad input is refused and stores nothing. The text model here is
the no-download stand-in (``mvdb.testing.words``); tests/test_ui.py runs MiniLM, whose token
spans name the matched words.
"""

from __future__ import annotations

import json
import signal

import numpy as np
import pytest

import mvdb

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
urllib3 = pytest.importorskip("urllib3")

from mvdb.explain import TokenMatch, explain_stored
from mvdb.serve import Server, connect
from mvdb.testing.words import encode as words

MODEL = "mvdb.testing.words:encode"
TEXTS = {"gzip": "gzip compresses files to save disk space", "df": "df shows the free disk space of file systems",
         "ps": "ps lists the running processes", "kill": "kill sends a signal to a process",
         "du": "du estimates the disk space used by files", "grep": "grep prints lines that match patterns"}
JSON = {"accept": "application/json"}
_HTTP = urllib3.PoolManager(retries=False)


def _post(url, body):
    r = _HTTP.request("POST", url, json=body, headers=JSON)
    return r.status, json.loads(r.data)


def _fill(path) -> None:
    with mvdb.open(path, device="cpu", index="flat", encoder=mvdb.Encoder(words)) as db:
        db.add_texts(list(TEXTS.values()), ids=list(TEXTS), store_text=True)


def _check_explanation(out: dict, want) -> None:
    """An /explain answer (JSON) against the library's Explanation: the same numbers, and the
    similarities sum to the score, the shares to 1."""
    assert out["id"] == want.id and abs(out["score"] - want.score) < 1e-9
    assert all(list(m) == list(TokenMatch._fields) for m in out["matches"])  # every field, by name
    assert [(m["query_token"], m["doc_token"]) for m in out["matches"]] == [m[:2] for m in want.matches]
    assert abs(sum(m["similarity"] for m in out["matches"]) - out["score"]) < 1e-5
    assert abs(sum(m["share"] for m in out["matches"]) - 1.0) < 1e-6


def _round_trip(url, lib) -> None:
    """/search_text and /explain at ``url`` against ``lib`` (the same database, opened with the model)."""
    c = connect(url)  # no encoder here: the server's model encodes
    try:
        assert c.health()["model"] == "mvdb.testing.words.encode"
        for q in ("free disk space", "which process"):
            assert c.search_text(q, k=3) == lib.search_text(q, k=3)
        assert c.search_text(["disk space", "signal"], k=2) == lib.search_text(["disk space", "signal"], k=2)
        assert c.search_text("disk", k=5, where={"text": {"$ne": TEXTS["du"]}}) == \
            lib.search_text("disk", k=5, where={"text": {"$ne": TEXTS["du"]}})
        status, out = _post(url + "/search_text", {"queries": "free disk space", "k": 2})
        assert status == 200 and out == {"batch": False, "hits": [[h.id, h.score] for h in lib.search_text(
            "free disk space", k=2)]}
        assert c.explain("free disk space", "df") == lib.explain("free disk space", "df")
        status, out = _post(url + "/explain", {"query": "free disk space", "doc_id": "df"})
        assert status == 200
        _check_explanation(out, lib.explain("free disk space", "df"))
        assert out["text"] == {"doc": TEXTS["df"], "query": "free disk space"}
        status, out = _post(url + "/explain", {"query_id": "du", "doc_id": "df"})  # a stored document as the query
        assert status == 200
        _check_explanation(out, explain_stored(lib, "du", "df"))
        assert out["text"] == {"doc": TEXTS["df"], "query": TEXTS["du"]}
        q = lib.get(["gzip"])[0]
        status, out = _post(url + "/explain", {"query": q.tolist(), "doc_id": "du"})  # embeddings: no model needed
        assert status == 200
        _check_explanation(out, lib.explain(q, "du"))
    finally:
        c.close()


def test_search_text_and_explain_are_the_librarys(tmp_path):
    _fill(tmp_path / "t.mvdb")
    with mvdb.open(tmp_path / "t.mvdb", device="cpu", encoder=mvdb.Encoder(words)) as db, Server(db) as srv:
        _round_trip(srv.url, db)


@pytest.mark.heavy
def test_with_worker_processes_the_database_process_encodes(tmp_path):
    from test_serve import _start, _stopped_cleanly

    _fill(tmp_path / "t.mvdb")
    proc, url = _start(tmp_path / "t.mvdb", "--model", MODEL, "--workers", "2")
    try:
        with mvdb.open(tmp_path / "t.mvdb", device="cpu", read_only=True, encoder=mvdb.Encoder(words)) as lib:
            _round_trip(url, lib)
    finally:
        proc.send_signal(signal.SIGTERM)
        _stopped_cleanly(proc)


def test_without_a_model_text_queries_name_what_is_missing(tmp_path):
    _fill(tmp_path / "t.mvdb")
    with mvdb.open(tmp_path / "t.mvdb", device="cpu") as db, Server(db) as srv, connect(srv.url) as c:
        assert c.health()["model"] is None
        for call in (lambda: c.search_text("disk space"), lambda: c.explain("disk space", "df")):
            with pytest.raises(mvdb.InvalidInputError, match=r"this server has none: start it with 'mvdb serve DB "
                                                             r"--model NAME'"):
                call()
        for route, body in (("/search_text", {"queries": "disk"}), ("/explain", {"query": "disk", "doc_id": "df"})):
            status, out = _post(srv.url + route, body)
            assert status == 400 and out["error"] == "InvalidInputError" and "--model" in out["message"], out
        q = db.get(["du"])[0]  # embeddings and stored documents need no model
        assert c.explain(q, "df") == db.explain(q, "df")
        status, out = _post(srv.url + "/explain", {"query_id": "du", "doc_id": "df"})
        assert status == 200 and out["text"] == {"doc": TEXTS["df"], "query": TEXTS["du"]}
        _check_explanation(out, explain_stored(db, "du", "df"))


def test_bad_input_is_refused_and_changes_nothing(tmp_path):
    _fill(tmp_path / "t.mvdb")
    with mvdb.open(tmp_path / "t.mvdb", device="cpu", encoder=mvdb.Encoder(words)) as db, Server(db) as srv:
        before = (len(db), db.stats()["generation"], db.metadata(list(TEXTS)))
        cases = [  # (route, body) -> (status, error class, words of the message)
            ("/search_text", {"queries": []}, 400, "InvalidInputError", "queries: expected at least one text"),
            ("/search_text", {"queries": 7}, 400, "InvalidTypeError", "queries: expected a list of str, got int"),
            ("/search_text", {"queries": ["a", 3]}, 400, "InvalidTypeError", "queries[1]: expected a str, got int"),
            ("/search_text", {"queries": "disk", "k": 0}, 400, "InvalidInputError", "k"),
            ("/search_text", {"queries": "disk", "path": "/etc"}, 400, "InvalidInputError",
             "unknown argument(s) ['path']"),
            ("/explain", {"query": "disk", "doc_id": "nope"}, 404, "UnknownIdError", "nope"),
            ("/explain", {"query_id": "nope", "doc_id": "df"}, 404, "UnknownIdError", "nope"),
            ("/explain", {"query": "disk", "query_id": "du", "doc_id": "df"}, 400, "InvalidInputError", "got both"),
            ("/explain", {"query": "disk"}, 400, "InvalidInputError", "expected doc_id"),
            ("/explain", {"doc_id": "df"}, 400, "InvalidInputError", "query_id"),
            ("/explain", {"query": "disk", "doc_id": ["df", "du"]}, 400, "InvalidTypeError", "doc_id: expected one id"),
            ("/explain", {"query": [[1.0, 2.0]], "doc_id": "df"}, 400, "InvalidInputError", "query: expected shape"),
        ]
        for route, body, status, error, words_ in cases:
            got, out = _post(srv.url + route, body)
            assert (got, out["error"]) == (status, error) and words_ in out["message"], (route, body, out)
        with connect(srv.url) as c:  # the client raises the library's error with its text
            with pytest.raises(mvdb.UnknownIdError) as remote:
                c.explain("disk", "nope")
            with pytest.raises(mvdb.UnknownIdError) as lib:
                db.explain("disk", "nope")
            assert str(remote.value) == str(lib.value)
        assert (len(db), db.stats()["generation"], db.metadata(list(TEXTS))) == before


def test_a_page_of_another_origin_is_refused_and_changes_nothing(tmp_path):
    """A browser request from another site's page (a form or fetch to localhost) is refused with
    403 before its body is read; the server's own page (same origin) and non-browser clients
    (no Origin header) are served."""
    from fastapi.testclient import TestClient

    from mvdb.serve.app import create_app

    with mvdb.open(tmp_path / "o.mvdb", device="cpu") as db:
        db.add([np.ones((3, 8), np.float32)], ids=["keep"])
        with TestClient(create_app(db)) as c:
            r = c.post("/delete", json={"ids": ["keep"]}, headers={"origin": "http://evil.example", "accept": "application/json"})
            assert r.status_code == 403 and "evil.example" in r.json()["message"]
            assert db.contains(["keep"]) == [True]
            r = c.post("/contains", json={"ids": ["keep"]}, headers={"origin": "http://testserver", "accept": "application/json"})
            assert r.status_code == 200
            r = c.get("/health", headers={"accept": "application/json"})
            assert r.status_code == 200
