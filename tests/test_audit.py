"""The findings of the second reliability audit (issue #44), one test each: a restored manifest,
damaged metadata, raw exceptions on damage, refused writes that left traces, bad open arguments,
filters of shared structure, lone surrogates, and the server's limits and read timeouts."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from mvdb.storage import Store

import mvdb
from damage_tools import edit_manifest, rewrite
from mvdb import CorruptionError, EncoderMismatchError, InvalidInputError, InvalidTypeError

DIM = 8


def _docs(rng, n):
    return [rng.standard_normal((int(rng.integers(2, 9)), DIM)).astype(np.float32) for _ in range(n)]


def _open(path, **kw):
    return mvdb.open(path, device="cpu", index="flat", progress=False, **kw)


def _files(path) -> dict:
    """Every file under ``path`` with its bytes (what a refused call must leave as it was)."""
    out = {}
    for root, _, names in os.walk(path):
        for n in names:
            p = os.path.join(root, n)
            out[os.path.relpath(p, path)] = Path(p).read_bytes()
    return out


# ---- 1. a restored older MANIFEST.json never costs data


def test_restored_manifest_is_refused_for_writing_and_recover_keeps_every_document(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "db"
    a, b = _docs(rng, 6), _docs(rng, 5)
    with _open(path) as db:
        db.add(a, ids=[f"a{i}" for i in range(6)], metadata=[{"batch": "a"}] * 6)
        db.delete(["a0"])
    backup = (path / "MANIFEST.json").read_bytes()  # a backup (or a copy taken mid-write)
    with _open(path) as db:
        db.add(b, ids=[f"b{i}" for i in range(5)], metadata=[{"batch": "b"}] * 5)
    (path / "MANIFEST.json").write_bytes(backup)  # put back
    before = _files(path)
    named = {s["name"] for s in json.loads(backup)["segments"]} | {json.loads(backup)["record"]}
    newer = [n for n in os.listdir(path / "segments") if n not in named]
    with pytest.raises(CorruptionError, match=r"committed after it.*older than the data.*mvdb recover") as e:
        _open(path)
    assert all(n in str(e.value) for n in newer)
    assert _files(path) == before, "a refused writer changes nothing"
    report = mvdb.verify(path)
    assert not report.ok and any("newer than MANIFEST.json" in p for p in report.problems), report
    with mvdb.open(path, device="cpu", read_only=True, progress=False) as db:  # readers see the restored state
        assert sorted(db.store.ids()) == [f"a{i}" for i in range(1, 6)]
    report = mvdb.recover(path)
    assert report.ok, report
    with _open(path) as db:  # everything committed is back, the backup's deletion kept
        assert sorted(db.store.ids()) == sorted([f"a{i}" for i in range(1, 6)] + [f"b{i}" for i in range(5)])
        for i, d in enumerate(b):
            np.testing.assert_allclose(db.get([f"b{i}"])[0], d, atol=2e-3)
        assert db.metadata(["b3"]) == [{"batch": "b"}]
        db.add(_docs(rng, 1), ids=["c0"])  # writable again
    assert mvdb.verify(path).ok


def test_manifest_restored_from_before_a_compaction_loses_nothing(tmp_path):
    rng = np.random.default_rng(1)
    path = tmp_path / "db"
    docs = _docs(rng, 12)
    with Store(path, dim=DIM, segment_tokens=40) as st:
        st.add(docs[:6], ids=list(range(6)))
        st.add(docs[6:], ids=list(range(6, 12)))
        st.delete([2, 7])
        backup = (path / "MANIFEST.json").read_bytes()
        assert st.compact() >= 1  # the segments the backup names are rewritten and removed
    (path / "MANIFEST.json").write_bytes(backup)
    with pytest.raises(CorruptionError):
        Store(path)
    assert not mvdb.verify(path).ok
    assert mvdb.recover(path).ok
    with Store(path) as st:
        assert sorted(st.ids()) == [i for i in range(12) if i not in (2, 7)]
        for i in (0, 11):
            np.testing.assert_allclose(st.get([i])[0], docs[i], atol=2e-3)


def test_a_crashed_writes_temp_segment_is_removed_but_a_committed_one_is_finished(tmp_path):
    path = tmp_path / "db"
    rng = np.random.default_rng(2)
    with Store(path, dim=DIM) as st:
        st.add(_docs(rng, 3))
        name = st.manifest["segments"][0]["name"]
    seg = path / "segments"
    os.replace(seg / name, seg / (".tmp-" + name))  # committed, not renamed yet (a crash in between)
    shutil.copy(seg / (".tmp-" + name), seg / ".tmp-seg-00000009-g00000009-deadbeef.h5")  # never committed
    with Store(path, read_only=True) as r:  # readers read the committed one at its temp name
        assert len(r) == 3 and r.verify().ok
    with Store(path) as st:
        assert len(st) == 3
    assert sorted(os.listdir(seg)) == [name]


# ---- 2. damaged metadata never answers


def _metadata_heap(seg: Path, text: bytes) -> int:
    data = seg.read_bytes()
    at = data.find(text)
    assert at >= 0
    return at


@pytest.mark.parametrize("call", ["metadata", "where", "where_ne", "store_metadata"])
def test_an_edited_metadata_byte_is_a_corruption_error(tmp_path, call):
    path = tmp_path / "db"
    rng = np.random.default_rng(3)
    with _open(path) as db:
        db.add(_docs(rng, 3), ids=["x", "y", "z"], metadata=[{"lang": "en"}, {"lang": "fr"}, {"lang": "de"}])
    seg = next((path / "segments").glob("seg-*.h5"))
    at = _metadata_heap(seg, b'{"lang":"en"}')
    raw = bytearray(seg.read_bytes())
    raw[at + 10] = ord("s")  # "en" -> "es": valid JSON, wrong value
    seg.write_bytes(bytes(raw))
    calls = {
        "metadata": lambda db: db.metadata(["x"]),
        "where": lambda db: db.search(np.ones((2, DIM), np.float32), k=3, where={"lang": "es"}),
        "where_ne": lambda db: db.search(np.ones((2, DIM), np.float32), k=3, where={"lang": {"$ne": "en"}}),
        "store_metadata": lambda db: db.store.metadata(["x"]),
    }
    with _open(path) as db, pytest.raises(CorruptionError, match=rf"{seg.name}: dataset metadata checksum mismatch"):
        calls[call](db)
    assert any("metadata checksum mismatch" in p for p in mvdb.verify(path).problems)


def test_metadata_that_is_not_json_is_a_corruption_error_not_a_json_error(tmp_path):
    path = tmp_path / "db"
    with _open(path) as db:
        db.add(_docs(np.random.default_rng(4), 2), ids=["x", "y"], metadata=[{"a": 1}, {"a": 2}])
    seg = next((path / "segments").glob("seg-*.h5"))
    at = _metadata_heap(seg, b'{"a":1}')
    raw = bytearray(seg.read_bytes())
    raw[at + 1] = ord("}")  # '{}a":1}': not JSON
    seg.write_bytes(bytes(raw))
    def agreeing_checksum(f):  # only the parse can tell
        values = [v.decode() for v in f["metadata"][()]]
        f.attrs["crc32_metadata"] = zlib.crc32("\n".join(values).encode())

    rewrite(path, seg, agreeing_checksum)
    with _open(path) as db:
        with pytest.raises(CorruptionError, match=rf"{seg.name}: stored metadata is not JSON"):
            db.search(np.ones((2, DIM), np.float32), where={"a": 1})
        with pytest.raises(CorruptionError, match="not JSON"):
            db.metadata(["x"])


# ---- 3. no raw exception on a damaged manifest


def test_manifest_replaced_by_a_directory(tmp_path):
    path = tmp_path / "db"
    with _open(path) as db:
        db.add(_docs(np.random.default_rng(5), 2))
    (path / "MANIFEST.json").unlink()
    (path / "MANIFEST.json").mkdir()
    with pytest.raises(CorruptionError, match="MANIFEST.json: is not a file"):
        _open(path)
    assert not mvdb.verify(path).ok


@pytest.mark.parametrize("edit", ["dtype", "dim", "id_type", "next_id"])
def test_a_manifest_with_a_valid_checksum_that_disagrees_with_the_segments(tmp_path, edit):
    path = tmp_path / "db"
    with _open(path) as db:
        db.add(_docs(np.random.default_rng(6), 3))
    change = {"dtype": lambda m: m.update(dtype="int8"), "dim": lambda m: m.update(dim=DIM + 1),
              "id_type": lambda m: m.update(id_type="str"), "next_id": lambda m: m.update(next_id=1)}[edit]
    edit_manifest(path, change)
    with pytest.raises(CorruptionError):
        _open(path).search(np.ones((2, DIM), np.float32))
    assert not mvdb.verify(path).ok


# ---- 4. a refused add_texts leaves no encoder record


def test_a_refused_add_texts_records_no_encoder(tmp_path):
    path = tmp_path / "db"

    def nan_model(texts, is_query):
        return [np.full((3, DIM), np.nan, np.float32) for _ in texts]

    def good_model(texts, is_query):
        return [np.random.default_rng(len(t)).standard_normal((3, DIM)).astype(np.float32) for t in texts]

    with _open(path) as db:
        before = _files(path)
        with pytest.raises(InvalidInputError, match="NaN"):
            db.add_texts(["a", "b"], encoder=mvdb.Encoder(nan_model, name="nan-model"))
        assert _files(path) == before and db.stats()["encoder"] is None
        assert db.add_texts(["c"], encoder=mvdb.Encoder(good_model, name="good-model")) == [0]
        assert db.stats()["encoder"]["name"] == "good-model"
        with pytest.raises(EncoderMismatchError):
            db.add_texts(["d"], encoder=mvdb.Encoder(good_model, name="other-model"))


# ---- 5 and 6. a refused open leaves no trace; bad arguments are mvdb errors


@pytest.mark.parametrize("kw,error", [
    ({"dim": 0}, InvalidInputError), ({"dim": -5}, InvalidInputError), ({"dim": "32"}, InvalidTypeError),
    ({"dim": 32.0}, InvalidTypeError), ({"dim": 2**40}, InvalidInputError), ({"dim": True}, InvalidTypeError),
    ({"index": "hnsw"}, InvalidInputError), ({"nlist": 0}, InvalidInputError), ({"dtype": "bf16"}, InvalidInputError),
    ({"residency": "gpu"}, InvalidInputError), ({"read_only": "no"}, InvalidTypeError),
    ({"checksums": 1}, InvalidTypeError), ({"device": "tpu"}, InvalidInputError),
    ({"code_bits": 3}, InvalidInputError), ({"code_bits": True}, InvalidInputError),
], ids=lambda v: repr(v) if not isinstance(v, type) else v.__name__)
def test_a_refused_open_leaves_no_trace(tmp_path, kw, error):
    for path in (tmp_path / "new", tmp_path / "empty"):
        (tmp_path / "empty").mkdir(exist_ok=True)
        with pytest.raises(error):
            mvdb.open(path, progress=False, **kw)
        assert not (tmp_path / "new").exists() and os.listdir(tmp_path / "empty") == []
    with mvdb.open(tmp_path / "new", dim=32, device="cpu", progress=False) as db:  # usable afterwards
        assert db.dim == 32


@pytest.mark.parametrize("path,error", [(None, InvalidTypeError), ("", InvalidInputError),
                                        ("a\0b", InvalidInputError), (123, InvalidTypeError),
                                        (b"bytes", InvalidTypeError)], ids=repr)
def test_bad_paths_are_mvdb_errors(path, error):
    for call in (lambda: mvdb.open(path), lambda: Store(path), lambda: mvdb.verify(path), lambda: mvdb.recover(path)):
        with pytest.raises(error):
            call()


def test_tensors_without_data_are_refused_before_anything_is_written(tmp_path):
    with _open(tmp_path / "db") as db:
        db.add(_docs(np.random.default_rng(7), 1))
        before = _files(tmp_path / "db")
        for bad in (torch.empty(3, DIM, device="meta"), torch.zeros(3, DIM).to_sparse()):
            with pytest.raises(InvalidInputError, match="expected a dense tensor with data"):
                db.add([bad])
            with pytest.raises(InvalidInputError, match="expected a dense tensor with data"):
                db.search(bad)
        assert _files(tmp_path / "db") == before


# ---- 7. filters: a bound on total size, linear evaluation


def test_a_filter_of_shared_structure_is_refused_at_once(tmp_path):
    with _open(tmp_path / "db") as db:
        db.add(_docs(np.random.default_rng(8), 5), metadata=[{"a": i} for i in range(5)])
        w = {"a": 1}
        for _ in range(25):
            w = {"$and": [w, w]}  # a tiny object, 2^25 conditions written out
        t0 = time.perf_counter()
        with pytest.raises(InvalidInputError, match="more than 1,000 conditions"):
            db.search(np.ones((2, DIM), np.float32), where=w)
        with pytest.raises(InvalidInputError, match="more than 1,000 conditions"):
            db.search(np.ones((2, DIM), np.float32), where={"$or": [{"a": i} for i in range(100_000)]})
        assert time.perf_counter() - t0 < 2.0
        hits = db.search(np.ones((2, DIM), np.float32), k=5, where={"a": {"$in": list(range(2, 100_000))}})
        assert sorted(h.id for h in hits) == [2, 3, 4]  # many values: one hashed $in


# ---- 8. metadata text is validated as ids are


def test_metadata_with_lone_surrogates_is_refused(tmp_path):
    with _open(tmp_path / "db") as db:
        for meta in ({"a": "\udc80"}, {"\ud800": 1}, {"a": ["ok", {"b": "x\udfff"}]}):
            with pytest.raises(InvalidInputError, match="lone surrogate"):
                db.add(_docs(np.random.default_rng(9), 1), metadata=[meta])
        assert db.add(_docs(np.random.default_rng(9), 1), metadata=[{"emoji": "\U0001f600"}]) == [0]
        assert db.metadata([0]) == [{"emoji": "\U0001f600"}]
        with pytest.raises(InvalidInputError, match="lone surrogate"):
            db.search(np.ones((2, DIM), np.float32), where={"a": "\udc80"})
        assert len(db) == 1


# ---- 9. the server: structural limits, no per-request types, read timeouts


def _needs_server() -> None:
    """Skip where the serve extra is not installed (only the tests that need it: a module-level
    skip here would skip every test above too)."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    _needs_server()
    from mvdb.serve import Server

    path = tmp_path_factory.mktemp("srv") / "db"
    with _open(path) as db:
        db.add(_docs(np.random.default_rng(10), 4), ids=["a", "b", "c", "d"])
    with Server(str(path), device="cpu", open_options={"index": "flat", "progress": False},
                header_timeout_s=1.0, body_timeout_s=1.0) as srv:
        yield srv


def _raw(url: str, body: bytes, content_type: str, path: str = "/search"):
    import urllib3

    r = urllib3.PoolManager(retries=False).request("POST", url + path, body=body,
                                                   headers={"content-type": content_type, "accept": "application/json"})
    return r.status, json.loads(r.data)


@pytest.mark.parametrize("depth", [65, 900, 50_000])
@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_deeply_nested_bodies_are_400_not_500(server, depth, fmt):
    if fmt == "json":
        body, ctype = b'{"queries": ' + b"[" * depth + b"]" * depth + b"}", "application/json"
    else:
        body, ctype = b"\x81\xa7queries" + b"\x91" * (depth - 1) + b"\x90", "application/msgpack"
    status, answer = _raw(server.url, body, ctype)
    assert status == 400 and answer["error"] == "InvalidInputError", answer
    assert "nested more than 64 levels" in answer["message"]


@pytest.mark.heavy
def test_obj_maps_make_no_type_per_request_and_are_bounded(server):
    import msgpack

    from mvdb.serve import codec

    body = msgpack.packb({"ids": [{"$obj": f"T{i}"} for i in range(200_000)]})
    status, answer = _raw(server.url, body, "application/msgpack", "/get")
    assert status == 400 and "expected an int or str id, got T0" in answer["message"], answer
    assert len(codec._STAND_INS) <= codec.MAX_STAND_INS
    big = msgpack.packb({"ids": [[{"a": 1}] for _ in range(600_000)]})
    status, answer = _raw(server.url, big, "application/msgpack", "/get")
    assert status == 400 and "lists and maps" in answer["message"]


def _connect(url: str) -> socket.socket:
    host, port = url.rsplit("//", 1)[1].split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def test_a_body_that_never_arrives_is_408_and_the_connection_closed(server):
    s = _connect(server.url)
    s.sendall(b"POST /search HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{")
    t0 = time.perf_counter()
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    assert time.perf_counter() - t0 < 5
    assert data.startswith(b"HTTP/1.1 408") and b'"error": "InvalidInputError"' in data and b"request body" in data


def test_headers_that_never_finish_are_408(server):
    s = _connect(server.url)
    s.sendall(b"POST /search HTTP/1.1\r\nhost: localhost\r\n")
    t0 = time.perf_counter()
    data = s.recv(65536)
    assert time.perf_counter() - t0 < 5 and data.startswith(b"HTTP/1.1 408") and b"request header" in data
    idle = _connect(server.url)  # a connection that sends nothing is closed too
    assert idle.recv(65536).startswith(b"HTTP/1.1 408")


def test_legacy_metadata_with_lone_surrogates_is_served(tmp_path):
    _needs_server()
    """Text stored before mvdb refused lone surrogates still reads back over HTTP (no 500)."""
    from mvdb.serve import Server, connect

    path = tmp_path / "db"
    with _open(path) as db:
        db.add(_docs(np.random.default_rng(11), 1), ids=["x"], metadata=[{"a": "b"}])
    seg = next((path / "segments").glob("seg-*.h5"))
    text = json.dumps({"a": "\udc80"})  # as an older mvdb stored it: JSON's \\u escape of a lone surrogate

    def legacy(f):
        del f["metadata"]
        f.create_dataset("metadata", data=np.array([text], dtype=object), dtype=h5py.string_dtype("utf-8"))
        f.attrs["crc32_metadata"] = zlib.crc32(text.encode())

    rewrite(path, seg, legacy)
    with Server(str(path), device="cpu", open_options={"index": "flat"}) as srv, connect(srv.url) as c:
        assert c.metadata(["x"]) == [{"a": "\udc80"}]
        status, answer = _raw(srv.url, json.dumps({"ids": ["x"]}).encode(), "application/json", "/metadata")
        assert status == 200 and answer == [{"a": "\udc80"}]


@pytest.mark.heavy
def test_cli_verify_and_recover_on_a_restored_manifest(tmp_path):
    path = tmp_path / "db"
    rng = np.random.default_rng(12)
    with _open(path) as db:
        db.add(_docs(rng, 2))
    backup = (path / "MANIFEST.json").read_bytes()
    with _open(path) as db:
        db.add(_docs(rng, 2))
    (path / "MANIFEST.json").write_bytes(backup)
    run = lambda *a: subprocess.run([sys.executable, "-m", "mvdb", *a], capture_output=True, text=True)  # noqa: E731
    r = run("verify", str(path))
    assert r.returncode == 1 and "newer than MANIFEST.json" in r.stdout + r.stderr
    r = run("recover", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    with _open(path) as db:
        assert len(db) == 4
