"""The command line, run through click's runner: exit codes and exact messages."""

import json

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from mvdb.cli import main
from mvdb.storage import Store

DIM = 16


def _packed(n, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, 9, n)
    return rng.standard_normal((int(lengths.sum()), DIM)).astype(np.float32), lengths


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_ingest_every_format_and_rerun_is_idempotent(tmp_path):
    tokens, lengths = _packed(6)
    np.savez(tmp_path / "a.npz", tokens=tokens, lengths=lengths)
    np.save(tmp_path / "b.npy", tokens)
    np.save(tmp_path / "b.lengths.npy", lengths)
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f["tokens"], f["offsets"] = tokens, np.concatenate(([0], np.cumsum(lengths)))
        f["ids"] = np.array([b"h0", b"h1", b"h2", b"h3", b"h4", b"h5"])
    (tmp_path / "dir").mkdir()
    for i in range(3):
        np.save(tmp_path / "dir" / f"doc{i}.npy", tokens[:3])
    db = tmp_path / "x.mvdb"
    r = run("ingest", db, tmp_path / "a.npz", tmp_path / "b.npy", tmp_path / "c.h5", tmp_path / "dir", "-q")
    assert r.exit_code == 0, r.output
    with Store(db, read_only=True) as st:
        assert len(st) == 21
        a, b = str(tmp_path / "a.npz"), str(tmp_path / "b.npy")
        assert {f"{a}#0", f"{b}#5", "h3", "doc2"} <= set(st.ids())
        p = st.gather([f"{a}#1"])
        assert np.array_equal(p.tokens, tokens[lengths[0] : lengths[0] + lengths[1]].astype(np.float16))
    r = run("ingest", db, tmp_path / "a.npz")
    assert r.exit_code == 0
    assert "ingested 0 documents (0 tokens)" in r.output and "skipped 6 already stored; 21 in" in r.output


def test_same_file_name_in_two_folders_does_not_collide(tmp_path):
    for sub, seed in (("x", 1), ("y", 2)):
        (tmp_path / sub).mkdir()
        tokens, lengths = _packed(2, seed)
        np.savez(tmp_path / sub / "docs.npz", tokens=tokens, lengths=lengths)
    r = run("ingest", tmp_path / "db", tmp_path / "x" / "docs.npz", tmp_path / "y" / "docs.npz")
    assert "ingested 4 documents" in r.output and "skipped 0 already stored" in r.output


def test_search_an_int8_database(tmp_path):
    tokens, lengths = _packed(5, 3)
    np.savez(tmp_path / "a.npz", tokens=tokens, lengths=lengths, ids=np.arange(5))
    assert run("ingest", tmp_path / "db", tmp_path / "a.npz", "--dtype", "int8", "-q").exit_code == 0
    np.save(tmp_path / "q.npy", tokens[: lengths[0]])
    r = run("search", tmp_path / "db", tmp_path / "q.npy", "-k", 1, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)[0][0] == 0


def test_ingest_bad_source_fails_cleanly(tmp_path):
    db = tmp_path / "x.mvdb"
    np.savez(tmp_path / "bad.npz", tokens=np.ones((5, DIM)), lengths=np.array([2, 2]))
    r = CliRunner().invoke(main, ["ingest", str(db), str(tmp_path / "bad.npz")])
    assert r.exit_code == 1
    assert r.output.startswith("Error: ") and "bad.npz: lengths sum to 4, but there are 5 tokens" in r.output
    r = CliRunner().invoke(main, ["ingest", str(db), str(tmp_path / "nope.npz")])
    assert r.exit_code == 1 and "nope.npz: no such file or directory" in r.output
    np.savez(tmp_path / "nan.npz", tokens=np.full((2, DIM), np.nan), lengths=np.array([2]))
    r = CliRunner().invoke(main, ["ingest", str(db), str(tmp_path / "nan.npz")])
    assert r.exit_code == 1 and "Error: document 0: contains NaN or Inf (token 0)" in r.output


def test_info_verify_compact_search(tmp_path):
    tokens, lengths = _packed(8, seed=1)
    np.savez(tmp_path / "a.npz", tokens=tokens, lengths=lengths, ids=np.arange(100, 108))
    db = tmp_path / "x.mvdb"
    assert run("ingest", db, tmp_path / "a.npz", "-q").exit_code == 0
    info = json.loads(run("info", db, "--json").output)
    assert info["documents"] == 8 and info["dim"] == DIM and info["id_type"] == "int"
    r = run("verify", db)
    assert r.exit_code == 0 and r.output.strip() == "8 documents in 1 segments: OK"
    with Store(db) as st:
        st.delete([101])
    r = run("compact", db)
    assert r.exit_code == 0 and r.output.strip() == "rewrote 1 segments; 7 documents in 1 segments"
    np.save(tmp_path / "q.npy", tokens[lengths[0] : lengths[0] + lengths[1]][None])
    np.save(tmp_path / "q2.npy", tokens[: lengths[0]])
    r = run("search", db, tmp_path / "q2.npy", "-k", 2, "--json")
    hits = json.loads(r.output)
    assert r.exit_code == 0 and hits[0][0] == 100 and len(hits) == 2
    r = run("search", db, tmp_path / "q.npy", "-k", 1)
    assert r.output.startswith("query 0: ") and "101" not in r.output


def test_verify_reports_corruption_with_exit_1(tmp_path):
    tokens, lengths = _packed(3)
    np.savez(tmp_path / "a.npz", tokens=tokens, lengths=lengths)
    db = tmp_path / "x.mvdb"
    run("ingest", db, tmp_path / "a.npz", "-q")
    seg = next((db / "segments").iterdir())
    with h5py.File(seg, "r") as f:
        off = f["tokens"].id.get_offset()
    data = bytearray(seg.read_bytes())
    data[off] ^= 0xFF
    seg.write_bytes(bytes(data))
    r = CliRunner().invoke(main, ["verify", str(db)])
    assert r.exit_code == 1 and "dataset tokens checksum mismatch" in r.output


def test_every_command_has_an_example_in_its_help():
    for name in ("ingest", "search", "info", "verify", "compact", "demo"):
        r = run(name, "--help")
        assert r.exit_code == 0 and "Example: mvdb " + name in r.output


@pytest.mark.parametrize("cmd", ["info", "verify"])
def test_missing_database(tmp_path, cmd):
    r = CliRunner().invoke(main, [cmd, str(tmp_path / "none")])
    assert r.exit_code == 1 and "read_only=True does not create one" in r.output


def test_ingest_builds_and_persists_the_ivf_index(tmp_path, monkeypatch):
    import mvdb.engine.state

    monkeypatch.setattr(mvdb.engine.state, "FLAT_MAX_TOKENS", 50)  # this small corpus counts as large
    tokens, lengths = _packed(40, seed=3)
    np.savez(tmp_path / "a.npz", tokens=tokens, lengths=lengths)
    db = tmp_path / "x.mvdb"
    r = run("ingest", db, tmp_path / "a.npz", "--device", "cpu")
    assert r.exit_code == 0 and "token index: ivf, nlist 4 on cpu, ready in" in r.output
    info = json.loads(run("info", db, "--json").output)
    assert info["index"].startswith("ivf, nlist 4, trained on 198 tokens") and info["index"].endswith("codes for 1 of 1 segments")
    r = run("ingest", db, tmp_path / "a.npz", "--no-index", "-q")
    assert r.exit_code == 0 and r.output == ""


def test_sharded_ingest_info_verify_search(tmp_path):
    import mvdb

    toks, lens = _packed(40, seed=3)
    np.savez(tmp_path / "a.npz", tokens=toks, lengths=lens)
    db = tmp_path / "sh.mvdb"
    r = run("ingest", db, tmp_path / "a.npz", "--shards", "2", "--device", "cpu", "--quiet")
    assert r.exit_code == 0, r.output
    info = json.loads(run("info", db, "--json").output)
    assert info["shards"] == 2 and info["documents"] == 40
    assert min(p["documents"] for p in info["per_shard"]) > 0  # both shards got documents
    r = run("ingest", db, tmp_path / "a.npz", "--no-index")  # a re-run skips what is stored
    assert "skipped 40 already stored" in r.output
    assert run("verify", db).exit_code == 0
    with mvdb.open(db, devices=["cpu", "cpu"]) as sh:
        assert len(sh) == 40 and sh.search(toks[: lens[0]], k=1)[0].id.endswith("a.npz#0")  # ids from the source
    r = CliRunner().invoke(main, ["ingest", str(db), str(tmp_path / "a.npz"), "--shards", "3"])
    assert r.exit_code != 0 and "has 2 shards, got --shards 3" in r.output
