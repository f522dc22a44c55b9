"""Findings of the third reliability audit (issue #58), one test each: a manifest put back from
before a delete or a setting (the commit record keeps them), query values that would overflow
the scores, int8 and inline documents likewise, sources that are not regular files
(a FIFO hung `mvdb ingest`), and a server that answers only to its own names (DNS rebinding)."""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest
from click.testing import CliRunner

import mvdb
from mvdb import InvalidInputError
from mvdb.cli import main

DIM = 8


def _docs(n, seed=0):
    rng = np.random.default_rng(seed)
    out = [rng.standard_normal((int(rng.integers(3, 9)), DIM)).astype(np.float32) for _ in range(n)]
    return [d / np.linalg.norm(d, axis=1, keepdims=True) for d in out]


# ---- deletions and settings that a manifest put back cannot undo


def _files(path):
    return {os.path.relpath(os.path.join(r, n), path): open(os.path.join(r, n), "rb").read()
            for r, _, names in os.walk(path) for n in names}


def test_a_manifest_from_before_a_delete_is_refused_and_recover_keeps_the_delete(tmp_path):
    path = tmp_path / "db.mvdb"
    ids = [f"d{i}" for i in range(10)]
    with mvdb.open(path, device="cpu", progress=False) as d:
        d.add(_docs(10), ids=ids)
    backup = (path / "MANIFEST.json").read_bytes()  # a backup, a file-sync, a snapshot rollback
    with mvdb.open(path, device="cpu", progress=False) as d:
        d.delete(["d1", "d2", "d3"])
    (path / "MANIFEST.json").write_bytes(backup)  # put back
    before = _files(path)

    report = mvdb.verify(path)
    assert not report.ok and any("older than the latest commit" in p for p in report.problems), report
    with pytest.raises(mvdb.CorruptionError, match=r"commit record.*committed after it.*mvdb recover"):
        mvdb.open(path, device="cpu", progress=False)
    with pytest.warns(UserWarning, match=r"older than the data.*writers refuse.*mvdb recover"):
        mvdb.open(path, device="cpu", read_only=True, progress=False).close()
    out = CliRunner().invoke(main, ["verify", str(path)])
    assert out.exit_code != 0 and "older than the latest commit" in out.output
    assert _files(path) == before, "refusing changed nothing"

    assert mvdb.recover(path).ok
    with mvdb.open(path, device="cpu", progress=False) as d:
        assert sorted(d.store.ids()) == sorted(set(ids) - {"d1", "d2", "d3"})
        assert {h.id for h in d.search(_docs(10)[2], k=10)}.isdisjoint({"d1", "d2", "d3"})
    backup = (path / "MANIFEST.json").read_bytes()  # the same again after the recovery
    with mvdb.open(path, device="cpu", progress=False) as d:
        d.delete(["d4"])
    (path / "MANIFEST.json").write_bytes(backup)
    assert mvdb.recover(path).ok
    with mvdb.open(path, device="cpu", progress=False) as d:
        assert sorted(d.store.ids()) == sorted(set(ids) - {"d1", "d2", "d3", "d4"})


def test_a_manifest_from_before_a_setting_is_refused_and_recover_keeps_it(tmp_path):
    path = tmp_path / "db.mvdb"
    with mvdb.open(path, device="cpu", index="flat", progress=False) as d:
        d.add(_docs(10))
    backup = (path / "MANIFEST.json").read_bytes()
    with pytest.warns(UserWarning, match="index='ivf'"):
        mvdb.open(path, device="cpu", index="ivf", nlist=2, progress=False).close()  # recorded: a commit
    (path / "MANIFEST.json").write_bytes(backup)
    with pytest.raises(mvdb.CorruptionError, match="mvdb recover"):
        mvdb.open(path, device="cpu", progress=False)
    assert mvdb.recover(path).ok
    assert json.loads((path / "MANIFEST.json").read_bytes())["config"]["index"] == {"kind": "ivf", "nlist": 2}


def test_a_lost_manifest_costs_no_committed_delete(tmp_path):
    path = tmp_path / "db.mvdb"
    with mvdb.open(path, device="cpu", progress=False) as d:
        d.add(_docs(6), ids=list(range(6)))
        d.delete([4])
        d.add(_docs(2, seed=1), ids=[6, 7])
    (path / "MANIFEST.json").unlink()
    assert mvdb.recover(path).ok
    with mvdb.open(path, device="cpu", progress=False) as d:
        assert sorted(d.store.ids()) == [0, 1, 2, 3, 5, 6, 7]


def test_a_failed_delete_leaves_no_commit_record(tmp_path, monkeypatch):
    from mvdb.storage import manifest as manifest_mod

    path = tmp_path / "db.mvdb"
    with mvdb.open(path, device="cpu", progress=False) as d:
        d.add(_docs(4), ids=list(range(4)))
        before = _files(path)

        def full(*a, **k):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(manifest_mod, "atomic_write", full)
        with pytest.raises(OSError, match="No space left"):
            d.delete([1])
        monkeypatch.undo()
        assert _files(path) == before
        d.delete([1])
    assert mvdb.verify(path).ok and sorted(os.listdir(path / "segments"))[0].startswith("commit-")


# ---- scores that cannot overflow


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    with mvdb.open(tmp_path_factory.mktemp("ov") / "db.mvdb", progress=False) as d:
        d.add(_docs(20), ids=[f"d{i}" for i in range(20)])
        yield d


@pytest.mark.parametrize("value", [3e38, 1e20, 65505.0, -1e5], ids=["3e38", "1e20", "just-past", "negative"])
def test_huge_query_values_are_refused_everywhere(db, value):
    q = np.full((3, DIM), value, np.float32)
    msg = r"value -?\S+ is out of range \(query values must lie within \+-65504"
    with pytest.raises(InvalidInputError, match="query 0: " + msg):
        db.search(q, k=3)
    with pytest.raises(InvalidInputError, match="query 1: " + msg):
        db.search([np.ones((2, DIM), np.float32), q], k=3)
    with pytest.raises(InvalidInputError, match="query 0: " + msg):
        db.rerank(q, ["d1"])
    with pytest.raises(InvalidInputError, match="query 0: " + msg):
        db.candidates(q, k=3)
    with pytest.raises(InvalidInputError, match="query: " + msg):
        db.explain(q, "d1")
    with pytest.raises(InvalidInputError, match="query 0: " + msg):
        mvdb.rerank(q, [np.ones((2, DIM), np.float32)])


def test_the_largest_float16_queries_score_finitely(db):
    q = np.full((3, DIM), 65504.0, np.float32)
    hits = db.search(q, k=3)
    assert len(hits) == 3 and all(np.isfinite(h.score) for h in hits)
    assert np.isfinite(db.search(q.astype(np.float16), k=1)[0].score)


def test_int8_documents_past_the_limit_are_refused_and_nothing_is_stored(tmp_path):
    with mvdb.open(tmp_path / "i8.mvdb", dtype="int8", progress=False) as d:
        d.add(_docs(2))
        with pytest.raises(InvalidInputError, match=r"document 1: value 1e\+37 at token 0 is out of range \(an int8 "
                                                    r"store takes values within \+-1\.845e\+19"):
            d.add([np.ones((2, DIM), np.float32), np.full((3, DIM), 1e37, np.float32)])
        assert len(d) == 2
        d.add([np.full((3, DIM), 1e18, np.float32)])  # large, but no score can overflow
        assert np.isfinite(d.search(np.full((2, DIM), 65504.0, np.float32), k=1)[0].score)


def test_inline_documents_past_the_limit_are_refused():
    with pytest.raises(InvalidInputError, match=r"document 1: values beyond \+-1\.845e\+19"):
        mvdb.rerank(np.ones((2, DIM), np.float32), [np.ones((2, DIM)), np.full((2, DIM), 1e30)])
    assert np.isfinite(mvdb.rerank(np.ones((2, DIM), np.float32), [np.full((2, DIM), 1e18)])[0].score)


def test_huge_query_values_over_http_are_a_400_not_a_500(db):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from mvdb.serve.app import create_app

    with TestClient(create_app(db)) as c:
        for route, body in [("/search", {"queries": [[3e38] * DIM], "k": 3}),
                            ("/rerank", {"queries": [[3e38] * DIM], "candidate_ids": ["d1"]}),
                            ("/explain", {"query": [[3e38] * DIM], "doc_id": "d1"})]:
            r = c.post(route, json=body, headers={"accept": "application/json"})
            assert r.status_code == 400, (route, r.text)
            assert r.json()["error"] == "InvalidInputError" and "out of range" in r.json()["message"]


# ---- sources: regular files only


def _ingest(*args):
    return CliRunner().invoke(main, ["ingest", *map(str, args), "--model", "mvdb.testing.words:encode",
                                     "--device", "cpu", "-q"])


def _with_timeout(fn, seconds=60):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", fn()), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "hung"
    return out["r"]


def test_a_fifo_among_the_text_files_is_refused_with_its_path(tmp_path):
    d = tmp_path / "texts"
    d.mkdir()
    (d / "a.txt").write_text("hello there\n")
    os.mkfifo(d / "b.txt")
    r = _with_timeout(lambda: _ingest(tmp_path / "x.mvdb", d))
    assert r.exit_code == 1 and f"Error: {d / 'b.txt'}: a FIFO, not a regular file" in r.output
    assert not (tmp_path / "x.mvdb").exists()
    r = _with_timeout(lambda: _ingest(tmp_path / "y.mvdb", d / "b.txt"))  # given directly
    assert r.exit_code == 1 and f"{d / 'b.txt'}: a FIFO, not a regular file" in r.output


def test_a_fifo_as_an_embeddings_source_is_refused(tmp_path):
    os.mkfifo(tmp_path / "e.npy")
    np.save(tmp_path / "e.lengths.npy", np.array([2]))  # its side file is a plain file
    r = _with_timeout(lambda: CliRunner().invoke(main, ["ingest", str(tmp_path / "x.mvdb"), str(tmp_path / "e.npy"),
                                                        "-q"]))
    assert r.exit_code == 1 and f"{tmp_path / 'e.npy'}: a FIFO, not a regular file" in r.output


# ---- a server that knows its own names


def _raw(url: str, path: str, headers: dict, body: bytes = b"") -> tuple[int, bytes]:
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    c.putrequest("POST" if body else "GET", path, skip_host=True, skip_accept_encoding=True)
    for k, v in headers.items():
        c.putheader(k, v)
    c.putheader("Content-Length", str(len(body)))
    c.endheaders(body)
    r = c.getresponse()
    return r.status, r.read()


@pytest.fixture
def served(tmp_path):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from mvdb.serve import Server

    with mvdb.open(tmp_path / "s.mvdb", progress=False) as d:
        d.add(_docs(5), ids=[f"g{i}" for i in range(5)])
        with Server(d, allowed_host=("search.internal",)) as srv:
            yield srv, d


def test_dns_rebinding_cannot_reach_a_server_without_a_key(served):
    srv, d = served
    port = srv.url.rsplit(":", 1)[1]
    body = b'{"ids": ["g3"]}'
    json_h = {"Content-Type": "application/json", "Accept": "application/json"}
    status, text = _raw(srv.url, "/delete", {**json_h, "Host": f"evil.example:{port}",
                                             "Origin": f"http://evil.example:{port}"}, body)
    assert status == 403 and b"not a name of this server" in text
    assert "g3" in d
    status, _ = _raw(srv.url, "/delete", {**json_h, "Host": f"127.0.0.1:{port}", "Origin": f"ftp://127.0.0.1:{port}"},
                     body)
    assert status == 403 and "g3" in d  # another scheme on the same host is another origin
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"search.internal:{port}", f"[::1]:{port}"):
        assert _raw(srv.url, "/health", {"Host": host, "Accept": "application/json"})[0] == 200, host
    status, _ = _raw(srv.url, "/delete", {**json_h, "Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"},
                     body)
    assert status == 200 and "g3" not in d


def test_allowed_hosts():
    from mvdb.serve.app import allowed_hosts, hostname

    assert hostname("Example.COM:80") == "example.com" and hostname("[::1]:8000") == "::1" and hostname("::1") == "::1"
    assert allowed_hosts("0.0.0.0") == {"localhost", "127.0.0.1", "::1"}
    assert allowed_hosts("10.1.2.3", ["db.lan"]) == {"localhost", "127.0.0.1", "::1", "10.1.2.3", "db.lan"}


# ---- the smaller findings: answers in JSON, limits per request, empty texts, deep lines, k, export


@pytest.fixture(scope="module")
def texts_db(tmp_path_factory):
    from mvdb.testing.words import encode as words

    path = tmp_path_factory.mktemp("tx") / "t.mvdb"
    with mvdb.open(path, device="cpu", index="flat", encoder=mvdb.Encoder(words), progress=False) as d:
        d.add_texts(["free disk space", "copy files", "list directory contents", "show the date"],
                    ids=["df", "cp", "ls", "date"])
        yield d


def _app_client(d, **options):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from mvdb.serve.app import create_app

    return TestClient(create_app(d, **options))


def test_answers_are_json_unless_the_client_asks_for_msgpack(db):
    from mvdb.serve import codec

    with _app_client(db) as c:
        for accept in (None, "*/*", "application/json", "text/html,*/*;q=0.8", "application/json, application/msgpack"):
            r = c.get("/health", headers={} if accept is None else {"accept": accept})
            assert r.status_code == 200 and r.headers["content-type"].startswith("application/json"), accept
            assert r.json()["documents"] == 20
        r = c.get("/health", headers={"accept": "application/msgpack"})
        assert r.headers["content-type"].startswith(codec.MSGPACK) and codec.unpack(r.content)["documents"] == 20
        r = c.post("/search", json={"queries": [[1e39] * DIM]})  # errors too
        assert r.status_code == 400 and r.json()["error"] == "InvalidInputError"


def test_k_is_bounded_everywhere(db, tmp_path):
    q = np.ones((2, DIM), np.float32)
    for k in (2**63, 2**64, 10**23):
        with pytest.raises(InvalidInputError, match=r"k: expected a positive int up to 9,223,372,036,854,775,807"):
            db.search(q, k=k)
    assert len(db.search(q, k=2**63 - 1)) == 20  # capped by the number of documents
    with pytest.raises(InvalidInputError, match="k: expected a positive int up to"):
        db.rerank(q, ["d1"], k=2**63)
    with _app_client(db) as c:
        for k in (2**63, -1, 0, 10**30):
            r = c.post("/search", json={"queries": q.tolist(), "k": k})
            assert r.status_code == 400 and "k: expected a positive int" in r.json()["message"], (k, r.text)
    path = tmp_path / "k.mvdb"
    with mvdb.open(path, progress=False) as d:
        d.add(_docs(3))
    np.save(tmp_path / "q.npy", q)
    r = CliRunner().invoke(main, ["search", str(path), str(tmp_path / "q.npy"), "-k", "99999999999999999999999"])
    assert r.exit_code == 1 and "Error: k: expected a positive int up to 9,223,372,036,854,775,807" in r.output, r.output


def test_queries_per_request_are_limited_and_the_client_splits(texts_db):
    with _app_client(texts_db, max_queries=3) as c:
        r = c.post("/search_text", json={"queries": ["disk"] * 4})
        assert r.status_code == 413 and "4 queries in one request, more than the server's limit of 3" in r.text
        assert "--max-queries" in r.json()["message"]
        r = c.post("/search", json={"queries": [np.ones((2, 16)).tolist()] * 5})
        assert r.status_code == 413
        assert c.post("/search_text", json={"queries": ["disk"] * 3}).status_code == 200
        assert c.get("/health").json()["max_queries"] == 3
    from mvdb.serve import Server

    with Server(texts_db, max_queries=100) as srv, mvdb.connect(srv.url) as client:
        texts = ["disk space", "files", "date", "directory"] * 80  # 320: the client sends four requests
        got = client.search_text(texts, k=2)
        want = texts_db.search_text(texts, k=2)
        assert [[h.id for h in row] for row in got] == [[h.id for h in row] for row in want]
        vecs = texts_db.encoder.encode(texts, is_query=True, progress=False)
        assert [h.id for h in client.search(vecs, k=1)[-1]] == [want[-1][0].id]
        assert len(client.rerank(vecs, [["df", "ls"]] * len(vecs))) == 320
        assert len(client.candidates(vecs, k=2)) == 320


@pytest.mark.parametrize("text", ["", "   ", "\n\t"], ids=["empty", "spaces", "whitespace"])
def test_empty_text_queries_are_refused_everywhere_alike(texts_db, text):
    msg = "an empty or whitespace-only text; a query needs at least one word"
    with pytest.raises(InvalidInputError, match="queries: " + msg):
        texts_db.search_text(text)
    with pytest.raises(InvalidInputError, match=r"queries\[1\]: " + msg):
        texts_db.search_text(["disk", text])
    with pytest.raises(InvalidInputError, match="query: " + msg):
        texts_db.explain(text, "df")
    with _app_client(texts_db) as c:
        for route, body in (("/search_text", {"queries": text}), ("/search_text", {"queries": ["a", text]}),
                            ("/explain", {"query": text, "doc_id": "df"})):
            r = c.post(route, json=body)
            assert r.status_code == 400 and msg in r.json()["message"], (route, r.text)


def test_a_json_line_nested_past_the_recursion_limit_is_named_by_file_and_line(tmp_path):
    src = tmp_path / "deep.jsonl"
    src.write_text('{"text": "fine"}\n{"text": "hi", "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    r = _ingest(tmp_path / "x.mvdb", src)
    assert r.exit_code == 1 and f"Error: {src}, line 2: JSON nested too deeply to read" in r.output, r.output
    assert "RecursionError" not in r.output and not (tmp_path / "x.mvdb").exists()
    meta = tmp_path / "m.jsonl"
    meta.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    np.save(tmp_path / "e.npy", np.ones((2, DIM), np.float32))
    np.save(tmp_path / "e.lengths.npy", np.array([2]))
    r = CliRunner().invoke(main, ["ingest", str(tmp_path / "y.mvdb"), str(tmp_path / "e.npy"), "--metadata", str(meta)])
    assert r.exit_code == 1 and f"Error: {meta}, line 1: JSON nested too deeply" in r.output, r.output


def test_export_refuses_to_overwrite_without_force(tmp_path):
    path = tmp_path / "x.mvdb"
    with mvdb.open(path, progress=False) as d:
        d.add(_docs(3), ids=["a", "b", "c"], metadata=[{"n": 1}, None, None])
    out = tmp_path / "out.npy"
    assert CliRunner().invoke(main, ["export", str(path), str(out), "-q"]).exit_code == 0
    before = {p.name: p.read_bytes() for p in tmp_path.glob("out.*")}
    assert len(before) == 4
    for args in (["export", str(path), str(out)], ["get", str(path), "a", "--out", str(out)]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 1 and f"Error: {out}: already exists; --force overwrites it" in r.output, r.output
    (tmp_path / "out.npy").unlink()  # a side file alone is enough to refuse
    r = CliRunner().invoke(main, ["export", str(path), str(out)])
    assert r.exit_code == 1 and "out.lengths.npy: already exists" in r.output
    assert {p.name: p.read_bytes() for p in tmp_path.glob("out.*")} == {k: v for k, v in before.items() if k != "out.npy"}
    with mvdb.open(path, progress=False) as d:
        d.delete(["a"])  # the only document with metadata
    assert CliRunner().invoke(main, ["export", str(path), str(out), "--force", "-q"]).exit_code == 0
    assert np.load(tmp_path / "out.ids.npy").tolist() == ["b", "c"]
    assert not (tmp_path / "out.metadata.jsonl").exists(), "the earlier export's metadata is not these documents'"


def test_read_only_arrays_are_taken_without_a_warning(db):
    import warnings

    q = np.ones((3, DIM), np.float32)
    q.setflags(write=False)  # what Ray's object store hands an actor
    batch = np.stack([q, q])
    batch.setflags(write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        db.search(q, k=2)
        db.search(batch, k=2)
        db.search([q, q], k=2)
        db.rerank(q, ["d1", "d2"])
        db.explain(q, "d1")
        mvdb.rerank(q, [q])


def test_a_worker_dies_with_the_database_process_at_once(tmp_path):
    """A worker whose parent (the database's process) is SIGKILLed ends at once, even while a
    graceful shutdown would still be waiting (here: SIGTERM ignored)."""
    import signal
    import subprocess
    import sys
    import time

    child = ("import signal, time; from mvdb.serve.workers import _die_with_parent; _die_with_parent(); "
             "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)")
    parent = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', {child!r}], "
              "stdout=subprocess.PIPE, text=True); assert p.stdout.readline() == 'up\\n'; "
              "print(p.pid, flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(proc.stdout.readline())
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}") and \
                "Z" not in open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1][:3]:
            time.sleep(0.02)
        alive = os.path.exists(f"/proc/{pid}") and "Z" not in open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1][:3]
        if alive:
            os.kill(pid, signal.SIGKILL)
        assert not alive, "the worker outlived its parent"
    finally:
        proc.kill()
