"""The command line, run through click's runner: exit codes and exact messages."""

import json
import os
import shutil

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from mvdb.storage import Store

from mvdb.cli import main
from mvdb.ingest import open_source

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
        a, b = open_source(tmp_path / "a.npz").key, open_source(tmp_path / "b.npy").key  # content keys
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
    seg = next((db / "segments").glob("seg-*.h5"))
    with h5py.File(seg, "r") as f:
        off = f["tokens"].id.get_offset()
    data = bytearray(seg.read_bytes())
    data[off] ^= 0xFF
    seg.write_bytes(bytes(data))
    r = CliRunner().invoke(main, ["verify", str(db)])
    assert r.exit_code == 1 and "dataset tokens checksum mismatch" in r.output


def test_every_command_has_an_example_in_its_help():
    for name in ("ingest", "search", "explain", "info", "verify", "compact", "demo"):
        r = run(name, "--help")
        assert r.exit_code == 0 and "Example: mvdb " + name in r.output


def test_explain_round_trip(tmp_path):
    tokens, lengths = _packed(5, seed=4)
    np.savez(tmp_path / "a.npz", tokens=tokens, lengths=lengths, ids=np.array(["a", "b", "c", "d", "e"]))
    db = tmp_path / "x.mvdb"
    assert run("ingest", db, tmp_path / "a.npz", "-q").exit_code == 0
    start = int(lengths[0])
    q = tokens[start : start + 2] + 0.01  # near the tokens of document "b"
    np.save(tmp_path / "q.npy", q)
    r = run("explain", db, tmp_path / "q.npy", "b", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    d = tokens[start : start + int(lengths[1])].astype(np.float16).astype(np.float32)
    sim = q @ d.T
    assert out["id"] == "b" and [m["doc_token"] for m in out["matches"]] == sim.argmax(1).tolist()
    assert abs(out["score"] - float(sim.max(1).sum())) <= 1e-3
    assert abs(sum(m["similarity"] for m in out["matches"]) - out["score"]) <= 1e-5
    r = run("explain", db, tmp_path / "q.npy", "b")
    assert r.exit_code == 0 and r.output.startswith("b: MaxSim ") and "query token   1 -> document token" in r.output
    r = CliRunner().invoke(main, ["explain", str(db), str(tmp_path / "q.npy"), "zz"])
    assert r.exit_code == 1 and "zz" in r.output


@pytest.mark.parametrize("cmd", ["info", "verify"])
def test_missing_database(tmp_path, cmd):
    r = CliRunner().invoke(main, [cmd, str(tmp_path / "none")])
    assert r.exit_code == 1 and "does not create one" in r.output


def test_ingest_builds_and_persists_the_ivf_index(tmp_path, monkeypatch):
    import mvdb.engine.state

    monkeypatch.setattr(mvdb.engine.state, "FLAT_MAX_TOKENS", 50)  # this small corpus counts as large
    monkeypatch.setattr(mvdb.engine.state, "CPU_FLAT_MAX_TOKENS", 50)
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
    r = run("verify", db)  # one report over the shards, as ShardedDatabase.verify()
    assert r.exit_code == 0 and r.output.startswith("2 shards: 40 documents in ") and r.output.endswith(": OK\n")
    assert json.loads((db / "shards.json").read_text())["placement"] == "least-loaded"
    with mvdb.open(db, devices=["cpu", "cpu"]) as sh:
        key = open_source(tmp_path / "a.npz").key
        assert len(sh) == 40 and sh.search(toks[: lens[0]], k=1)[0].id == f"{key}#0"  # ids from the source
    r = CliRunner().invoke(main, ["ingest", str(db), str(tmp_path / "a.npz"), "--shards", "3"])
    assert r.exit_code != 0 and "has 2 shards, got --shards 3" in r.output
    layout = json.loads((db / "shards.json").read_text())
    (db / "shards.json").write_text(json.dumps(dict(layout, shards=["shard-000", "../elsewhere"])))
    for cmd in ("verify", "info", "ingest"):  # a shard name leading outside the database: refused
        args = [cmd, db] + ([tmp_path / "a.npz"] if cmd == "ingest" else [])
        _one_error_line(CliRunner().invoke(main, [str(a) for a in args]), "shards.json", "'../elsewhere'")


def _save_packed(path, tokens, lengths, ids=None):
    """X.npy with X.lengths.npy (and X.ids.npy) beside it."""
    base = str(path)[: -len(".npy")]
    np.save(path, tokens)
    np.save(base + ".lengths.npy", lengths)
    if ids is not None:
        np.save(base + ".ids.npy", ids)


def _one_error_line(r, *fragments):
    """Exit 1, nothing on stdout, exactly one 'Error: ' line on stderr (no traceback) holding every fragment."""
    assert r.exit_code == 1, r.output
    assert r.stdout == "" and "Traceback" not in r.output
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


def test_rerun_skips_however_the_source_is_spelled(tmp_path, monkeypatch):
    tokens, lengths = _packed(6, seed=4)
    (tmp_path / "data").mkdir()
    _save_packed(tmp_path / "data" / "packed.npy", tokens, lengths)
    np.savez(tmp_path / "data" / "z.npz", tokens=tokens[::-1].copy(), lengths=lengths[::-1].copy())
    db = tmp_path / "x.mvdb"
    r = run("ingest", db, tmp_path / "data" / "packed.npy", tmp_path / "data" / "z.npz", "--no-index")
    assert "ingested 12 documents" in r.output
    monkeypatch.chdir(tmp_path)
    os.symlink(tmp_path / "data", tmp_path / "alias")
    (tmp_path / "copy").mkdir()
    shutil.copy(tmp_path / "data" / "packed.npy", tmp_path / "copy" / "other.npy")  # a copy, renamed
    shutil.copy(tmp_path / "data" / "packed.lengths.npy", tmp_path / "copy" / "other.lengths.npy")
    shutil.copy(tmp_path / "data" / "z.npz", tmp_path / "copy" / "renamed.npz")
    for spelling in (["data/packed.npy", "./data/z.npz"], ["alias/packed.npy", "alias/../data/z.npz"],
                     ["copy/other.npy", "copy/renamed.npz"], ["x.mvdb/../data/packed.npy"]):
        r = run("ingest", "x.mvdb", *spelling, "--no-index")
        assert r.exit_code == 0 and "ingested 0 documents" in r.output, (spelling, r.output)
    # the same tokens split into other documents are other documents
    _save_packed(tmp_path / "copy" / "resplit.npy", tokens, np.concatenate(([lengths[0] + lengths[1]], lengths[2:])))
    r = run("ingest", "x.mvdb", "copy/resplit.npy", "--no-index")
    assert "ingested 5 documents" in r.output
    # ids the source gives win: an X.ids.npy side file names the documents
    (tmp_path / "named").mkdir()
    _save_packed(tmp_path / "named" / "packed.npy", tokens, lengths, ids=np.array([f"n{i}" for i in range(6)]))
    r = run("ingest", "named.mvdb", "named/packed.npy", "-q")
    with Store(tmp_path / "named.mvdb", read_only=True) as st:
        assert sorted(st.ids()) == [f"n{i}" for i in range(6)]


def test_rerun_skips_documents_stored_under_path_ids(tmp_path):
    """A database ingested before content keys (ids '<path as given>#<row>') is not ingested twice
    when the path is spelled as it was then."""
    tokens, lengths = _packed(4, seed=5)
    np.savez(tmp_path / "a.npz", tokens=tokens, lengths=lengths)
    with Store(tmp_path / "old.mvdb") as st:
        st.add_packed(tokens, lengths, ids=[f"{tmp_path / 'a.npz'}#{i}" for i in range(4)])
    r = run("ingest", tmp_path / "old.mvdb", tmp_path / "a.npz", "--no-index")
    assert "ingested 0 documents" in r.output and "skipped 4 already stored; 4 in" in r.output


def _bad_sources(d):
    """name -> (source to ingest, fragments of its one error line)."""
    tokens, lengths = _packed(3, seed=6)
    np.save(d / "pickled.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    np.save(d / "pickled.lengths.npy", np.array([1, 1]))
    np.save(d / "whole.npy", tokens)
    (d / "truncated.npy").write_bytes((d / "whole.npy").read_bytes()[:-40])
    np.save(d / "truncated.lengths.npy", lengths)
    _save_packed(d / "negative.npy", tokens, np.array([int(lengths.sum()) + 2, -1, -1]))
    _save_packed(d / "fractional.npy", tokens, lengths.astype(np.float64) + 0.5)
    _save_packed(d / "zero.npy", tokens, np.array([int(lengths.sum()), 0]))
    _save_packed(d / "short.npy", tokens, lengths[:2])
    np.save(d / "badlen.npy", tokens)
    (d / "badlen.lengths.npy").write_bytes(b"not a numpy file")
    _save_packed(d / "dupids.npy", tokens, lengths, ids=np.array([7, 8, 7]))
    (d / "docs").mkdir()
    np.save(d / "docs" / "a.npy", tokens[:2])
    np.save(d / "docs" / "b.npy", tokens[:2, :4])
    (d / "broken.npz").write_bytes(b"PK\x03\x04 not really a zip")
    return {
        "pickled": ("pickled.npy", ["pickled.npy", "Python objects"]),
        "truncated": ("truncated.npy", ["truncated.npy", "cannot read the tokens"]),
        "negative": ("negative.npy", ["negative.lengths.npy", "document 1 has length -1"]),
        "fractional": ("fractional.npy", ["fractional.lengths.npy", "expected integer lengths, got dtype float64"]),
        "zero": ("zero.npy", ["zero.lengths.npy", "document 1 has length 0"]),
        "short": ("short.npy", ["short.lengths.npy", f"sum to {int(lengths[:2].sum())}, but there are {int(lengths.sum())}"]),
        "badlen": ("badlen.npy", ["badlen.lengths.npy", "cannot read the lengths"]),
        "dupids": ("dupids.npy", ["dupids.npy", "id 7 appears more than once"]),
        "mixed_dims": ("docs", ["b.npy: dim 4, but", "a.npy has dim 16"]),
        "broken_zip": ("broken.npz", ["broken.npz: cannot read"]),
        "missing": ("nope.npy", ["nope.npy: no such file or directory"]),
    }


@pytest.mark.parametrize("case", [
    "pickled", "truncated", "negative", "fractional", "zero", "short", "badlen", "dupids", "mixed_dims",
    "broken_zip", "missing"])
def test_bad_source_is_one_error_line_and_creates_nothing(tmp_path, case):
    tokens, lengths = _packed(2, seed=7)
    np.savez(tmp_path / "good.npz", tokens=tokens, lengths=lengths)
    src, fragments = _bad_sources(tmp_path)[case]
    db = tmp_path / "x.mvdb"
    for args in ([tmp_path / src], [tmp_path / "good.npz", tmp_path / src]):  # the good one is not ingested either
        _one_error_line(run("ingest", db, *args), *fragments)
        assert not db.exists()


def test_sources_of_other_dims_and_a_bad_document_leave_no_database(tmp_path):
    tokens, lengths = _packed(2, seed=8)
    np.savez(tmp_path / "a.npz", tokens=tokens, lengths=lengths)
    np.savez(tmp_path / "b.npz", tokens=tokens[:, :8], lengths=lengths)
    db = tmp_path / "x.mvdb"
    _one_error_line(run("ingest", db, tmp_path / "a.npz", tmp_path / "b.npz"), "different embedding dims")
    assert not db.exists()
    _one_error_line(run("ingest", db, tmp_path / "a.npz", tmp_path / "b.npz", "--shards", 2), "different embedding dims")
    assert not db.exists()
    bad = tokens.copy()
    bad[0, 0] = np.inf
    np.savez(tmp_path / "inf.npz", tokens=bad, lengths=lengths)
    for shards in (0, 2):  # found only while adding: the new, still empty database is removed again
        _one_error_line(run("ingest", db, tmp_path / "inf.npz", "--shards", shards, "-q"), "contains NaN or Inf")
        assert not db.exists()
    assert run("ingest", db, tmp_path / "a.npz", "-q").exit_code == 0
    _one_error_line(run("ingest", db, tmp_path / "b.npz"), "stores dim 16, but the sources have dim 8")
    _one_error_line(run("ingest", db, tmp_path / "inf.npz", "-q"), "contains NaN or Inf")
    with Store(db, read_only=True) as st:  # an existing database is kept as it was
        assert len(st) == 2


def test_side_files_among_the_sources(tmp_path):
    tokens, lengths = _packed(5, seed=9)
    _save_packed(tmp_path / "p.npy", tokens, lengths, ids=np.array([f"p{i}" for i in range(5)]))
    _save_packed(tmp_path / "q.npy", tokens, lengths)
    db = tmp_path / "x.mvdb"
    shell_glob = sorted(tmp_path.glob("*.npy"))  # p.ids.npy p.lengths.npy p.npy q.lengths.npy q.npy
    r = run("ingest", db, *shell_glob, "-q")
    assert r.exit_code == 0, r.output
    with Store(db, read_only=True) as st:
        assert len(st) == 10 and {"p0", "p4", f"{open_source(tmp_path / 'q.npy').key}#4"} <= set(st.ids())
    shutil.copy(tmp_path / "p.npy", tmp_path / "lone.npy")
    shutil.copy(tmp_path / "p.lengths.npy", tmp_path / "lone.lengths.npy")
    _one_error_line(run("ingest", tmp_path / "y.mvdb", tmp_path / "lone.lengths.npy"),
                    "lone.lengths.npy: a side file of", "lone.npy as the source")
    assert not (tmp_path / "y.mvdb").exists()


@pytest.mark.parametrize("cmd", ["compact", "search", "info", "verify"])
def test_missing_database_is_not_created(tmp_path, cmd):
    np.save(tmp_path / "q.npy", np.ones((2, DIM), np.float32))
    extra = [tmp_path / "q.npy"] if cmd == "search" else []
    db = tmp_path / "nope.mvdb"
    _one_error_line(run(cmd, db, *extra), "nope.mvdb")
    assert not db.exists()
    db.mkdir()  # an empty directory is no database either
    _one_error_line(run(cmd, db, *extra), "nope.mvdb")
    assert os.listdir(db) == []


def test_library_and_unexpected_errors_are_one_line_unless_debug(tmp_path, monkeypatch):
    tokens, lengths = _packed(3)
    np.savez(tmp_path / "a.npz", tokens=tokens, lengths=lengths)
    db = tmp_path / "x.mvdb"
    assert run("ingest", db, tmp_path / "a.npz", "-q").exit_code == 0
    np.save(tmp_path / "q.npy", np.array([object()] * 2, dtype=object), allow_pickle=True)
    _one_error_line(run("search", db, tmp_path / "q.npy"), "q.npy", "Python objects")
    _one_error_line(run("info", tmp_path / "a.npz"), "a.npz: is a file")  # an mvdb FormatError
    with Store(db):  # the writer lock is held: DatabaseLockedError
        _one_error_line(run("ingest", db, tmp_path / "a.npz"), "holds the writer lock")
    assert run("verify", db).exit_code == 0  # the database is still there

    def boom(path):
        raise RuntimeError("boom\nsecond line")

    import mvdb.storage

    monkeypatch.setattr(mvdb.storage, "verify", boom)
    assert _one_error_line(run("verify", db)) == "Error: RuntimeError: boom second line"
    for args in (["--debug", "verify", db], ["verify", "--debug", db]):
        with pytest.raises(RuntimeError, match="boom"):
            run(*args)


def test_content_key_of_a_large_file(tmp_path):
    from mvdb.ingest import EDGE, content_key

    tokens = np.random.default_rng(10).standard_normal((8192, DIM)).astype(np.float32)  # 512 KiB: ends and samples
    lengths = np.full(1024, 8)
    np.save(tmp_path / "a.npy", tokens)
    shutil.copy(tmp_path / "a.npy", tmp_path / "b.npy")
    key = content_key(str(tmp_path / "a.npy"), lengths)
    assert content_key(str(tmp_path / "b.npy"), lengths) == key
    assert content_key(str(tmp_path / "b.npy"), np.full(2048, 4)) != key
    size = (tmp_path / "a.npy").stat().st_size
    for offset in (EDGE - 1, size - EDGE):  # the last byte of the head, the first of the tail
        data = bytearray((tmp_path / "a.npy").read_bytes())
        data[offset] ^= 0xFF
        (tmp_path / "b.npy").write_bytes(bytes(data))
        assert content_key(str(tmp_path / "b.npy"), lengths) != key


def test_verify_lists_damage_and_recover_rebuilds_a_lost_manifest(tmp_path):
    db = tmp_path / "db"
    rng = np.random.default_rng(7)
    with Store(db, dim=8) as st:
        st.add([rng.standard_normal((5, 8)).astype(np.float32) for _ in range(4)], ids=[1, 2, 3, 4])
        st.add([rng.standard_normal((5, 8)).astype(np.float32) for _ in range(3)], ids=[5, 6, 7])
    (db / "MANIFEST.json").unlink()
    r = CliRunner().invoke(main, ["verify", str(db)])
    assert r.exit_code == 1 and "mvdb recover" in r.output
    r = CliRunner().invoke(main, ["compact", str(db)])  # refused: nothing is deleted or created
    assert r.exit_code == 1 and "MANIFEST.json is missing" in r.output
    assert len(os.listdir(db / "segments")) == 2
    r = CliRunner().invoke(main, ["recover", str(db)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["verify", str(db)])
    assert r.exit_code == 0 and "7 documents" in r.output
    seg = sorted((db / "segments").glob("seg-*.h5"))[0]
    with open(seg, "r+b") as f:
        f.truncate(seg.stat().st_size - 100)
    r = CliRunner().invoke(main, ["verify", str(db)])
    assert r.exit_code == 1 and seg.name in r.output and "bytes, the manifest says" in r.output


# ---- search options, get / delete / export, metadata on ingest, --json (issue #18)


def _with_metadata(tmp_path, n=30):
    tokens, lengths = _packed(n, seed=5)
    np.save(tmp_path / "d.npy", tokens)
    np.save(tmp_path / "d.lengths.npy", lengths)
    np.save(tmp_path / "d.ids.npy", np.arange(100, 100 + n))
    (tmp_path / "m.jsonl").write_text("".join(json.dumps({"lang": "en" if i % 2 else "fr", "n": i}) + "\n"
                                              for i in range(n)))
    return tokens, lengths


def test_ingest_metadata_search_where_get_delete_export_round_trip(tmp_path):
    tokens, lengths = _with_metadata(tmp_path)
    db = tmp_path / "db"
    r = run("ingest", db, tmp_path / "d.npy", "--metadata", tmp_path / "m.jsonl", "--json", "--device", "cpu")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output.strip().splitlines()[-1])
    assert summary["added"] == 30 and summary["documents"] == 30 and summary["index"][0]["index"] == "flat"
    off = np.concatenate(([0], np.cumsum(lengths)))
    np.save(tmp_path / "q.npy", tokens[off[7] : off[7] + 3])  # drawn from document 107 ("n": 7, "en")
    r = run("search", db, tmp_path / "q.npy", "-k", "3", "--where", '{"lang": "en"}', "--json", "--device", "cpu")
    assert r.exit_code == 0, r.output
    hits = json.loads(r.output)
    assert hits[0][0] == 107 and all((i - 100) % 2 == 1 for i, _ in hits)  # only "en" documents
    r = run("search", db, tmp_path / "q.npy", "-k", "2", "--where", '{"lang": "fr"}', "--exact", "--json")
    assert r.exit_code == 0 and all((i - 100) % 2 == 0 for i, _ in json.loads(r.output))
    r = run("search", db, tmp_path / "q.npy", "--n-candidates", "5", "--nprobe", "2", "--json", "--device", "cpu")
    assert r.exit_code == 0 and json.loads(r.output)[0][0] == 107
    r = run("get", db, 107, 100, "--json", "--out", tmp_path / "two.npy")
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)["documents"]
    assert [(g["id"], g["tokens"], g["metadata"]) for g in got] == [
        (107, int(lengths[7]), {"lang": "en", "n": 7}), (100, int(lengths[0]), {"lang": "fr", "n": 0})]
    np.testing.assert_allclose(np.load(tmp_path / "two.npy")[: lengths[7]], tokens[off[7] : off[8]], atol=2e-3)
    r = run("delete", db, 101, 102, "--json", "--device", "cpu")
    assert r.exit_code == 0 and json.loads(r.output) == {"deleted": 2, "documents": 28}
    r = run("export", db, tmp_path / "all.npy", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["documents"] == 28
    # the export is the ingest format: a new database from it holds the same documents and metadata
    r = run("ingest", tmp_path / "db2", tmp_path / "all.npy", "--metadata", tmp_path / "all.metadata.jsonl", "-q",
            "--device", "cpu")
    assert r.exit_code == 0, r.output
    r = run("get", tmp_path / "db2", 107, "--json")
    assert json.loads(r.output)["documents"][0]["metadata"] == {"lang": "en", "n": 7}
    r = run("info", tmp_path / "db2", "--json")
    assert json.loads(r.output)["documents"] == 28
    r = run("compact", db, "--json", "--device", "cpu")
    assert r.exit_code == 0 and json.loads(r.output) == {"rewritten": 1, "documents": 28, "segments": 1}
    r = run("verify", db, "--json")
    assert r.exit_code == 0 and json.loads(r.output) == {"ok": True, "documents": 28, "segments": 1, "problems": []}


def test_cli_bad_arguments_are_clear_and_change_nothing(tmp_path):
    _with_metadata(tmp_path)
    db = tmp_path / "db"
    (tmp_path / "short.jsonl").write_text('{"a": 1}\n')
    r = run("ingest", db, tmp_path / "d.npy", "--metadata", tmp_path / "short.jsonl")
    assert r.exit_code == 1 and "expected 30 lines (one per document of the sources), got 1" in r.output
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\n[1, 2]\n')
    r = run("ingest", db, tmp_path / "d.npy", "--metadata", tmp_path / "bad.jsonl")
    assert r.exit_code == 1 and "line 2: expected a JSON object or null, got list" in r.output
    assert not db.exists()  # checked before anything was created
    for cmd in (["get", db, 1], ["delete", db, 1], ["export", db, tmp_path / "x.npy"],
                ["search", db, tmp_path / "d.npy"]):
        r = run(*cmd)
        assert r.exit_code == 1 and "no database here" in r.output, (cmd, r.output)
        assert not db.exists()
    assert run("ingest", db, tmp_path / "d.npy", "-q", "--device", "cpu").exit_code == 0
    r = run("get", db, "abc")
    assert r.exit_code == 1 and "ids: this database uses int ids, got 'abc'" in r.output
    r = run("delete", db, 100, 99999)
    assert r.exit_code == 1 and "99999" in r.output
    assert json.loads(run("info", db, "--json").output)["documents"] == 30  # nothing deleted
    np.save(tmp_path / "q.npy", np.ones((2, DIM), np.float32))
    r = run("search", db, tmp_path / "q.npy", "--where", "{bad")
    assert r.exit_code == 1 and "--where: expected a JSON object" in r.output
    r = run("export", db, tmp_path / "x.txt")
    assert r.exit_code == 1 and "expected a path ending in .npy" in r.output


def test_serve_model_that_does_not_load_or_fit_is_one_error_line(tmp_path):
    """``mvdb serve --model``: a model that does not load, or is not the one the database's texts were
    added with, is one 'Error:' line before anything serves."""
    pytest.importorskip("fastapi")
    import mvdb
    from mvdb.testing.words import encode

    assert "--model SPEC" in run("serve", "--help").output
    db = tmp_path / "t.mvdb"
    with mvdb.open(db, device="cpu", encoder=mvdb.Encoder(encode, name="words-v0")) as d:
        d.add_texts(["gzip compresses files", "df shows free disk space"])
    _one_error_line(run("serve", db, "--port", 0, "--model", "no_such_module_zz:encode"),
                    "model no_such_module_zz:encode: cannot import module 'no_such_module_zz'")
    _one_error_line(run("serve", db, "--port", 0, "--device", "cpu", "--model", "mvdb.testing.words:encode"),
                    "its 2 documents were encoded by 'words-v0'", "'mvdb.testing.words.encode'")
