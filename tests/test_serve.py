"""``mvdb serve`` and ``mvdb.connect`` (issue #16), on loopback only. The conformance suite
(tests/test_contract.py) runs every method of the API against a served database too; here: the
client's answers equal the library's on the same handle, concurrent clients under a writer,
batching, bad payloads and keys, read-only, and a server killed with SIGKILL mid-add.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import mvdb

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
urllib3 = pytest.importorskip("urllib3")

from mvdb.serve import Server, connect

_HTTP = urllib3.PoolManager(retries=False)


class _Answer:
    def __init__(self, r):
        self.status_code, self.data = r.status, r.data
        self.text = r.data.decode(errors="replace")

    def json(self):
        import json

        return json.loads(self.data)


def _post(url, *, json=None, content=None, headers=None):
    """A raw POST (not through mvdb.connect): a JSON body, or bytes as they are."""
    return _Answer(_HTTP.request("POST", url, json=json, body=content, headers=headers))


def _get(url, headers=None):
    return _Answer(_HTTP.request("GET", url, headers=headers))

DIM = 8


def _docs(rng, n):
    out = [rng.standard_normal((int(rng.integers(3, 10)), DIM)).astype(np.float32) for _ in range(n)]
    return [d / np.linalg.norm(d, axis=1, keepdims=True) for d in out]


def _maxsim(q, d):
    return float((q @ d.astype(np.float16).astype(np.float32).T).max(axis=1).sum())


@pytest.fixture
def served(tmp_path):
    rng = np.random.default_rng(16)
    docs = _docs(rng, 60)
    db = mvdb.open(tmp_path / "db", device="cpu", index="flat")
    db.add(docs, ids=[f"d{i}" for i in range(60)], metadata=[{"lang": "en" if i % 2 else "fr", "n": i}
                                                              for i in range(60)],
           sparse=[{i: 1.0} for i in range(60)])
    with Server(db) as srv:
        client = connect(srv.url)
        yield db, client, srv, docs
        client.close()
    db.close()


@pytest.mark.heavy
def test_every_method_equals_the_library(served):
    db, c, _, docs = served
    rng = np.random.default_rng(1)
    qs = [docs[i][:3] + 0.1 * rng.standard_normal((3, DIM)).astype(np.float32) for i in (4, 9, 33)]
    assert c.search(qs[0], k=5) == db.search(qs[0], k=5)
    assert c.search(qs, k=4) == db.search(qs, k=4)
    assert c.search(np.stack(qs), k=4) == db.search(np.stack(qs), k=4)  # a [Nq, Lq, dim] batch
    assert c.search(qs[1].astype(np.float16), k=3) == db.search(qs[1].astype(np.float16), k=3)
    import torch

    assert c.search(torch.from_numpy(qs[2]), k=3) == db.search(qs[2], k=3)
    for where in ({"lang": "en"}, {"n": {"$lt": 10}}, {"$or": [{"lang": "fr"}, {"n": 3}]}):
        assert c.search(qs, k=4, where=where) == db.search(qs, k=4, where=where)
    assert c.search(qs[0], k=60, exact=True) == db.search(qs[0], k=60, exact=True)
    kw = {"k": 2, "n_candidates": 2, "k_tokens": 1, "sparse": {40: 2.0}, "n_sparse": 1}
    assert c.search(qs[0], **kw) == db.search(qs[0], **kw)
    assert "d40" in [h.id for h in c.search(qs[0], **kw)]
    assert c.search(qs[:2], k=2, sparse=[{40: 1.0}, None]) == db.search(qs[:2], k=2, sparse=[{40: 1.0}, None])
    assert c.candidates(qs, k=3) == db.candidates(qs, k=3)
    assert c.rerank(qs[0], ["d1", "d2", "d4"]) == db.rerank(qs[0], ["d1", "d2", "d4"])
    assert c.rerank(qs[:2], [["d1", "d2"], ["d5"]], k=1) == db.rerank(qs[:2], [["d1", "d2"], ["d5"]], k=1)
    for a, b in zip(c.get(["d3", "d0"]), db.get(["d3", "d0"])):
        assert a.dtype == np.float32 and np.array_equal(a, b)
    assert c.metadata(["d7", "d2"]) == db.metadata(["d7", "d2"])
    assert c.contains(np.array(["d1", "x"])).tolist() == db.contains(["d1", "x"]).tolist() == [True, False]
    assert "d5" in c and "zz" not in c
    assert len(c) == len(db) == 60 and c.dim == DIM
    s = c.stats()
    assert {k: v for k, v in s.items() if k != "server"} == db.stats()
    assert c.verify().ok and str(c.verify()) == str(db.verify())


def test_json_bodies_give_the_same_answers(served):
    db, _, srv, docs = served
    q = docs[11][:4]
    r = _post(srv.url + "/search", json={"queries": q.tolist(), "k": 3, "where": {"lang": "en"}},
                   headers={"accept": "application/json"})
    assert r.status_code == 200, r.text
    want = db.search(q, k=3, where={"lang": "en"})
    assert r.json() == {"batch": False, "hits": [[h.id, h.score] for h in want]}
    r = _post(srv.url + "/search", json={"queries": [q.tolist(), q[:2].tolist()], "k": 2,
                                              "sparse": [[[5], [1.0]], None]}, headers={"accept": "application/json"})
    assert r.json()["hits"] == [[[h.id, h.score] for h in row] for row in db.search([q, q[:2]], k=2,
                                                                                      sparse=[([5], [1.0]), None])]
    r = _post(srv.url + "/get", json={"ids": ["d11"]}, headers={"accept": "application/json"})
    np.testing.assert_array_equal(np.asarray(r.json()[0], np.float32), db.get(["d11"])[0])


def test_writes_through_the_client_are_the_library_writes(tmp_path):
    rng = np.random.default_rng(3)
    docs = _docs(rng, 20)
    with Server(str(tmp_path / "db"), device="cpu", open_options={"index": "flat"}) as srv, connect(srv.url) as c:
        assert c.add(docs[:10]) == list(range(10))
        assert c.add(docs[10:12], ids=[100, np.int64(101)], metadata=[{"a": 1}, None]) == [100, 101]
        c.delete([3, 100])
        assert len(c) == 10 and c.compact() >= 1 and len(c) == 10
        assert c.metadata([101]) == [None]
    with mvdb.open(tmp_path / "db", device="cpu", read_only=True) as db:  # on disk, committed
        assert len(db) == 10 and 3 not in db and 101 in db
        np.testing.assert_allclose(db.get([5])[0], docs[5], atol=2e-3)


def test_errors_are_the_library_errors_with_4xx(served):
    db, c, srv, docs = served
    before = len(db)
    nan = np.full((2, DIM), np.nan, np.float32)
    cases = [  # (the call, on the client or on the library handle) -> the same error, the same text
        (lambda h: h.search(np.ones((2, DIM + 1), np.float32)), mvdb.InvalidInputError),
        (lambda h: h.search("a query"), mvdb.InvalidTypeError),
        (lambda h: h.search(docs[0], k=0), mvdb.InvalidInputError),
        (lambda h: h.search(docs[0], where={"n": {"$regex": "a"}}), mvdb.InvalidInputError),
        (lambda h: h.get(["nope"]), mvdb.UnknownIdError),
        (lambda h: h.rerank(docs[0], ["d1", "nope"]), mvdb.UnknownIdError),
        (lambda h: h.add([docs[0]], ids=["d1"]), mvdb.DuplicateIdError),
        (lambda h: h.add([nan]), mvdb.InvalidInputError),
        (lambda h: h.add([docs[0]], ids=[1.5]), mvdb.InvalidTypeError),
        (lambda h: h.add([docs[0]], metadata=[{"a": {1, 2}}]), mvdb.InvalidInputError),
        (lambda h: h.add(docs[:2], metadata=[{}]), mvdb.InvalidInputError),
        (lambda h: h.delete(["d1", "nope"]), mvdb.UnknownIdError),
    ]
    for call, error in cases:
        with pytest.raises(error) as lib:
            call(db)
        with pytest.raises(error) as remote:
            call(c)
        assert type(remote.value) is type(lib.value) and str(remote.value) == str(lib.value)
    assert len(db) == before  # nothing stored by any of them
    for body, status, text in [
        (b"\xc1\x00garbage", 400, "expected MessagePack"),
        (b"[1, 2", 400, "expected JSON"),
    ]:
        ctype = "application/json" if body.startswith(b"[") else "application/msgpack"
        r = _post(srv.url + "/search", content=body, headers={"content-type": ctype, "accept": "application/json"})
        assert r.status_code == status and text in r.json()["message"], r.text
    r = _post(srv.url + "/search", json={"queries": docs[0].tolist(), "path": "/etc/passwd"},
                   headers={"accept": "application/json"})
    assert r.status_code == 400 and "unknown argument(s) ['path']" in r.json()["message"]
    r = _post(srv.url + "/get", json={"ids": ["nope"]}, headers={"accept": "application/json"})
    assert r.status_code == 404 and r.json()["error"] == "UnknownIdError"
    r = _post(srv.url + "/add", json={"docs": [docs[0].tolist()], "ids": ["d1"]}, headers={"accept": "application/json"})
    assert r.status_code == 409 and r.json()["error"] == "DuplicateIdError"
    assert len(db) == before


def test_api_key_size_limit_and_read_only(tmp_path):
    rng = np.random.default_rng(4)
    docs = _docs(rng, 10)
    with mvdb.open(tmp_path / "db", device="cpu", index="flat") as db:
        db.add(docs)
        with Server(db, api_key="s3cret", read_only=True, max_body_mb=0.01) as srv:
            assert srv.url.startswith("http://127.0.0.1:")  # loopback unless told otherwise
            for headers in ({}, {"authorization": "Bearer wrong"}, {"x-api-key": "s3cre"}):
                r = _get(srv.url + "/len", headers={**headers, "accept": "application/json"})
                assert r.status_code == 401 and r.json()["error"] == "AuthenticationError", r.text
            with pytest.raises(mvdb.MvdbError, match="API key"):
                connect(srv.url, api_key="wrong")
            with connect(srv.url, api_key="s3cret") as c:
                assert len(c) == 10
                with pytest.raises(mvdb.ReadOnlyError, match="--read-only"):
                    c.add([docs[0]])
                with pytest.raises(mvdb.ReadOnlyError):
                    c.delete([0])
                with pytest.raises(mvdb.InvalidInputError, match="limit"):  # 413: over 10 KB
                    c.add([np.ones((200, DIM), np.float32)] * 4)
                assert len(c) == 10
            r = _get(srv.url + "/len", headers={"x-api-key": "s3cret", "accept": "application/json"})
            assert r.status_code == 200 and r.json() == 10
            assert _get(srv.url + "/openapi.json").status_code == 200  # the schema, no data
        assert len(db) == 10


@pytest.mark.heavy
@pytest.mark.parametrize("workers", [1, 2])
def test_concurrent_clients_while_one_writes_get_consistent_answers(tmp_path, workers):
    """16 client threads search (fixed number of rounds) while one thread adds: every hit is a
    document whose add had begun, scored by its exact MaxSim, best first; and the batcher joined
    concurrent requests into shared batches. In this process (one HTTP process), and as
    ``mvdb serve --workers 2`` (the engine's search loop batching both workers' calls)."""
    rng = np.random.default_rng(5)
    docs = _docs(rng, 160)
    ids = [f"d{i}" for i in range(160)]
    stored = dict(zip(ids, docs))
    queries = [docs[i][:3] for i in range(0, 160, 7)]
    db = mvdb.open(tmp_path / "db", device="cpu", index="flat")
    db.add(docs[:40], ids=ids[:40])
    begun = set(ids[:40])
    errors = []
    if workers == 1:
        srv, proc = Server(db, batch_window_ms=5), None
        url = srv.url
    else:
        db.close()
        proc, url = _start(tmp_path / "db", "--workers", "2", "--batch-window-ms", "5")
    try:
        c = connect(url)

        def writer():
            for a in range(40, 160, 20):
                begun.update(ids[a : a + 20])
                c.add(docs[a : a + 20], ids=ids[a : a + 20])

        def reader(t):
            try:
                for r in range(6):
                    q = queries[(t + r) % len(queries)]
                    hits = c.search(q, k=5)
                    assert len(hits) == 5
                    assert all(h.id in begun for h in hits), [h.id for h in hits]
                    for h in hits:
                        assert abs(h.score - _maxsim(q, stored[h.id])) < 1e-2
                    assert all(a.score >= b.score - 1e-6 for a, b in zip(hits, hits[1:]))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=reader, args=(t,)) for t in range(16)]
        w = threading.Thread(target=writer)
        for t in [w, *threads]:
            t.start()
        for t in [w, *threads]:
            t.join(timeout=300)
        assert not errors, errors[:3]
        server = c.stats()["server"]
        assert server["batched_queries"] >= 96 and server["batches"] < server["batched_queries"], server
        assert len(c) == 160
        lib = db if workers == 1 else mvdb.open(tmp_path / "db", device="cpu", read_only=True)
        for q in queries[:4]:  # and after the writes, the same answers as the library
            assert c.search(q, k=5) == lib.search(q, k=5)
        assert c.search(queries[:3], k=4) == lib.search(queries[:3], k=4)
        if lib is not db:
            lib.close()
        c.close()
    finally:
        if proc is None:
            srv.stop()
            db.close()
        else:
            proc.send_signal(signal.SIGTERM)
            _stopped_cleanly(proc)


def _start(path, *args):
    env = dict(os.environ, MVDB_PROGRESS="0", PYTHONUNBUFFERED="1")
    p = subprocess.Popen([sys.executable, "-m", "mvdb", "serve", str(path), "--port", "0", "--device", "cpu", *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if "listening on" in line:
            return p, line.split("listening on ")[1].split()[0]
        if p.poll() is not None:
            break
    p.kill()
    raise AssertionError(f"the server did not start: {p.stderr.read()[-2000:]}")


def _stopped_cleanly(proc, timeout: float = 60) -> None:
    """The server exits 0 after SIGTERM; otherwise the assertion carries the end of its stderr."""
    rc = proc.wait(timeout=timeout)
    assert rc == 0, f"the server exited {rc}; its stderr ends:\n{proc.stderr.read()[-4000:]}"


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = open(f"/proc/{d}/stat").read()  # noqa: SIM115
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d))
    return out


def _gone(pids, timeout=30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(os.path.exists(f"/proc/{p}") and "Z" not in open(f"/proc/{p}/stat").read().rsplit(")", 1)[1][:3]
                   for p in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.heavy
@pytest.mark.parametrize("workers", [1, 2])
def test_killed_mid_add_restarts_with_every_acknowledged_add(tmp_path, workers):
    """SIGKILL of the server (with worker processes: of the main one, which holds the database)
    while a client adds in a loop: every acknowledged add is there after a restart, only whole
    batches are, and no worker outlives the main process."""
    rng = np.random.default_rng(6)
    docs = _docs(rng, 400)
    proc, url = _start(tmp_path / "db", "--create", "--workers", str(workers))
    kids = _children(proc.pid)
    acked, stop = [], threading.Event()

    def writer():
        c = connect(url, timeout=30)
        for b in range(0, 400, 10):  # bounded: at most 40 adds
            if stop.is_set():
                return
            try:
                got = c.add(docs[b : b + 10], ids=list(range(b, b + 10)))
            except mvdb.MvdbError:
                return  # the server went away mid-add: not acknowledged
            acked.extend(got)

    t = threading.Thread(target=writer)
    t.start()
    while len(acked) < 50 and t.is_alive():
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    stop.set()
    t.join(timeout=60)
    assert len(acked) >= 50
    if workers > 1:
        # a worker cannot answer without the database's process: it ends with it, not seconds later
        assert len(kids) >= workers and _gone(kids, timeout=1.0), "a worker outlived the killed server"
    proc, url = _start(tmp_path / "db", "--workers", str(workers))
    try:
        with connect(url) as c:
            assert c.contains(acked).all(), "an acknowledged add was lost"
            n = len(c)
            assert n >= len(acked) and n % 10 == 0  # whole batches only
            got = c.get(acked[-10:])
            for i, g in zip(acked[-10:], got):
                np.testing.assert_allclose(g, docs[i], atol=2e-3)
            q = docs[acked[3]][:3]
            with mvdb.open(tmp_path / "db", device="cpu", read_only=True) as db:  # and the same answers
                assert c.search(q, k=5) == db.search(q, k=5)
                assert c.search([q, q[:2]], k=3) == db.search([q, q[:2]], k=3)
    finally:
        proc.send_signal(signal.SIGTERM)
        _stopped_cleanly(proc)  # graceful


@pytest.mark.heavy
def test_sigterm_lets_the_write_in_flight_finish(tmp_path):
    """A write in flight when SIGTERM comes (its request half sent) is received, committed and
    acknowledged before the server exits: the client gets its ids and the database holds exactly
    those documents."""
    import socket

    rng = np.random.default_rng(8)
    proc, url = _start(tmp_path / "db", "--create", "--workers", "1")
    c = connect(url)
    c.add(_docs(rng, 5))
    big = _docs(rng, 3000)
    half_sent, shutting_down, result = threading.Event(), threading.Event(), {}
    real_urlopen = c._http.urlopen

    def urlopen_in_two_parts(method, path, body=None, **kwargs):
        def parts():
            yield body[: len(body) // 2]
            half_sent.set()
            shutting_down.wait(60)
            yield body[len(body) // 2 :]

        headers = dict(c._http.headers, **{"content-length": str(len(body))})
        return real_urlopen(method, path, body=parts(), headers=headers, **kwargs)

    def add():
        try:
            result["ids"] = c.add(big)
        except mvdb.MvdbError as e:
            result["error"] = e

    c._http.urlopen = urlopen_in_two_parts
    t = threading.Thread(target=add)
    t.start()
    try:
        assert half_sent.wait(60)
        time.sleep(0.2)  # the server reads the request's head
        proc.send_signal(signal.SIGTERM)
        host, port = url.rsplit("/", 1)[1].rsplit(":", 1)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # shutdown has begun: no new connections
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
            except ConnectionRefusedError:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the server kept accepting connections after SIGTERM")
    finally:
        shutting_down.set()
        t.join(timeout=120)
    _stopped_cleanly(proc, timeout=120)
    assert "error" not in result, f"the write in flight was not acknowledged: {result.get('error')!r}"
    assert len(result["ids"]) == 3000
    with mvdb.open(tmp_path / "db", device="cpu", read_only=True) as db:
        assert len(db) == 3005 and db.contains(result["ids"]).all()
        for i in (0, 1234, 2999):
            np.testing.assert_allclose(db.get([result["ids"][i]])[0], big[i], atol=2e-3)


def test_a_where_with_mixed_key_types_is_refused_and_searches_go_on(served):
    """A filter whose keys do not sort together (an int and a str) cannot join a batch: it is
    searched alone and refused with the library's error, and the server's search thread lives on."""
    db, c, _, docs = served
    bad = {1: "a", "b": 2}
    with pytest.raises(mvdb.MvdbError) as lib:
        db.search(docs[0], k=3, where=bad)
    with pytest.raises(type(lib.value)) as remote:
        c.search(docs[0], k=3, where=bad)
    assert str(remote.value) == str(lib.value)
    assert c.search(docs[0], k=3) == db.search(docs[0], k=3)
