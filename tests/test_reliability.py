"""Reliability (issue #14): a lost manifest, damaged files, names that lead outside the database,
the directory lock, full disks, derived-data write failures, long ids, and threads."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
from mvdb.storage import Store

import mvdb
from damage_tools import edit_manifest, flip
from mvdb import CorruptionError, DatabaseLockedError

DIM = 8
REPO = Path(__file__).resolve().parents[1]


def _docs(rng, n, lo=2, hi=12):
    return [rng.standard_normal((int(rng.integers(lo, hi)), DIM)).astype(np.float32) for _ in range(n)]


def _segments(path) -> list[Path]:
    return sorted((Path(path) / "segments").glob("seg-*.h5"))


@pytest.fixture
def built(tmp_path):
    """A closed database: 3 segments of 10 documents, str ids, metadata, one deletion."""
    rng = np.random.default_rng(0)
    path = tmp_path / "db"
    docs = _docs(rng, 30)
    with mvdb.open(path, device="cpu", index="flat", progress=False) as db:
        for b in range(3):
            db.add(docs[b * 10 : (b + 1) * 10], ids=[f"d{i}" for i in range(b * 10, (b + 1) * 10)],
                   metadata=[{"i": i} for i in range(b * 10, (b + 1) * 10)])
        db.delete(["d3"])
    return path, docs


# ---- 0. a missing manifest


def test_missing_manifest_is_refused_nothing_deleted_and_recover_brings_everything_back(built):
    path, docs = built
    before = {p.name: p.stat().st_size for p in _segments(path)}
    (path / "MANIFEST.json").unlink()
    for opener in (lambda: mvdb.open(path, device="cpu", progress=False), lambda: Store(path)):
        with pytest.raises(CorruptionError, match=r"MANIFEST.json is missing .* 3 data file.*mvdb recover"):
            opener()
    assert {p.name: p.stat().st_size for p in _segments(path)} == before  # nothing removed
    assert not mvdb.verify(path).ok
    report = mvdb.recover(path)
    assert report.ok, report
    with mvdb.open(path, device="cpu", progress=False) as db:
        # every committed document is back, and the deletion too: its commit record outlived the manifest
        assert len(db) == 29 and "d3" not in db.store.ids()
        keep = [i for i in range(30) if i != 3]
        got = db.get([f"d{i}" for i in keep])
        for g, i in zip(got, keep):
            np.testing.assert_allclose(g, docs[i], atol=2e-3)
        assert db.metadata(["d7"]) == [{"i": 7}]
        db.add(docs[:1], ids=["new"])  # writable again, counters past every recovered segment
    with pytest.raises(mvdb.InvalidInputError, match="intact"):
        mvdb.recover(path)


def test_recover_leaves_out_damaged_segments_and_newest_copy_wins(tmp_path):
    rng = np.random.default_rng(1)
    path = tmp_path / "db"
    docs = _docs(rng, 6)
    with Store(path, dim=DIM) as st:
        st.add(docs[:3], ids=[1, 2, 3])
        st.add(docs[3:6], ids=[4, 5, 6])
    first, second = _segments(path)
    with Store(tmp_path / "older", dim=DIM) as st:  # an older copy of ids 1-3 (other tokens)
        st.add([d + 1 for d in docs[:3]], ids=[1, 2, 3])
    shutil.copy(_segments(tmp_path / "older")[0], path / "segments" / "seg-00000000-00000000.h5")
    (path / "MANIFEST.json").unlink()
    flip(second, "tokens")
    report = mvdb.recover(path)
    assert any("left out" in p and second.name in p for p in report.problems), report
    with Store(path) as st:
        assert sorted(st.ids()) == [1, 2, 3]
        np.testing.assert_allclose(st.get([1])[0], docs[0], atol=2e-3)  # the newer copy
    assert mvdb.verify(path).ok
    assert (path / "segments" / (second.name + ".left-out")).exists(), "the damaged segment is kept aside"


# ---- 3. damage: CorruptionError naming the file, and verify lists it


def _damage(kind: str, path: Path) -> str:
    """Damage the database at path one way; returns a pattern the error must match."""
    seg = _segments(path)[1]
    if kind in ("tokens", "offsets", "id_bytes", "id_offsets"):
        flip(seg, kind)
        return seg.name
    if kind == "truncated":
        with open(seg, "r+b") as f:
            f.truncate(seg.stat().st_size // 2)
        return seg.name
    if kind == "zeroed":
        seg.write_bytes(bytes(seg.stat().st_size))
        return seg.name
    if kind == "missing":
        seg.unlink()
        return seg.name
    if kind == "deleted_row_out_of_range":
        edit_manifest(path, lambda m: m["segments"][0].update(deleted=[10**6]))
        return "deleted rows out of range"
    if kind == "absolute_segment_name":
        edit_manifest(path, lambda m: m["segments"][0].update(name=str(path.parent / "victim.h5")))
        return "not a plain .h5 file name"
    if kind == "dotdot_index_file":
        edit_manifest(path, lambda m: m.update(index_files=[{"name": "../../victim.npy", "nbytes": 1, "crc32": 1}]))
        return "not a plain .npy file name"
    if kind == "same_id_twice":
        # segment 2's ids (d10-d19) replaced by segment 3's (d20-d29, same byte lengths) with matching
        # CRCs: only the uniqueness check can see it
        with h5py.File(_segments(path)[2], "r") as f:
            third = f["id_bytes"][()], f["id_offsets"][()]
        _replace_ids(_segments(path)[1], *third)
        return "stored twice|more than once"
    raise AssertionError(kind)


def _replace_ids(seg: Path, data: np.ndarray, offsets: np.ndarray) -> None:
    """Write other ids into a segment in place with matching checksums (same byte lengths)."""
    from mvdb.storage.segment import crc32

    with h5py.File(seg, "r") as f:
        names = json.loads(f.attrs["checksum_names"])
        at = {n: f[n].id.get_offset() for n in ("id_bytes", "id_offsets", "checksums")}
        sums = f["checksums"][()]
        assert f["id_bytes"].shape == data.shape
    sums[names.index("id_bytes")] = crc32(data)
    sums[names.index("id_offsets")] = crc32(offsets)
    with open(seg, "r+b") as f:
        for name, arr in (("id_bytes", data), ("id_offsets", offsets), ("checksums", sums)):
            f.seek(at[name])
            f.write(np.ascontiguousarray(arr).tobytes())


DAMAGE = ["tokens", "offsets", "id_bytes", "id_offsets", "truncated", "zeroed", "missing",
          "deleted_row_out_of_range", "absolute_segment_name", "dotdot_index_file", "same_id_twice"]


@pytest.mark.parametrize("kind", DAMAGE)
def test_damage_is_a_corruption_error_on_open_and_verify_lists_it(built, kind, tmp_path):
    path, _ = built
    victim = tmp_path / "victim.h5"
    victim.write_bytes(b"not ours")
    (tmp_path / "victim.npy").write_bytes(b"not ours either")
    want = _damage(kind, path)
    files = sorted(p.name for p in (path / "segments").iterdir())
    with pytest.raises(CorruptionError, match=want):
        db = mvdb.open(path, device="cpu", progress=False)
        db.search(np.ones((2, DIM), np.float32), k=3)  # structural damage fails the open already
        db.close()
    report = mvdb.verify(path)
    assert not report.ok and any(__import__("re").search(want, p) for p in report.problems), report
    assert sorted(p.name for p in (path / "segments").iterdir()) == files  # a refused open removes nothing
    assert victim.read_bytes() == b"not ours" and (tmp_path / "victim.npy").exists()


def test_verify_lists_every_problem_of_a_database_that_cannot_open(built):
    path, _ = built
    segs = _segments(path)
    flip(segs[0], "tokens")
    segs[2].unlink()
    report = mvdb.verify(path)
    assert len(report.problems) >= 2
    assert any(segs[0].name in p and "tokens" in p for p in report.problems)
    assert any(segs[2].name in p and "missing" in p for p in report.problems)


def test_load_checksums_can_be_turned_off(built):
    path, _ = built
    flip(_segments(path)[1], "tokens")
    with pytest.raises(CorruptionError, match="tokens checksum mismatch while loading"):
        mvdb.open(path, device="cpu", progress=False)
    with mvdb.open(path, device="cpu", progress=False, checksums=False) as db:  # documented escape hatch
        assert len(db) == 29


# ---- 5. the lock cannot be deleted away; a derived-data write failure leaves the handle consistent


def test_lock_survives_deleting_lock_files(tmp_path):
    path = tmp_path / "db"
    with Store(path, dim=DIM):
        for name in os.listdir(path):
            if name == "LOCK":
                os.unlink(path / name)
        with pytest.raises(DatabaseLockedError):
            Store(path)


@pytest.mark.heavy
def test_index_write_failure_after_the_commit_leaves_the_handle_consistent(tmp_path, monkeypatch):
    """An add whose index files cannot be written (disk full) still indexes its documents in
    memory; the next open assigns them again. Documents old and new are found by their own tokens
    among the 2 of 40 the IVF lists choose (the defaults would rerank all 40: a stale index would go
    unseen)."""
    rng = np.random.default_rng(2)
    docs = _docs(rng, 40, 20, 40)
    path = tmp_path / "db"
    with mvdb.open(path, device="cpu", index="ivf", nlist=32, progress=False) as db:
        db.add(docs[:20])

        def full(*a, **k):
            raise OSError(errno.ENOSPC, "No space left on device", str(path / "index" / "x.npy"))

        monkeypatch.setattr(Store, "write_index_file", full)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            ids = db.add(docs[20:])
        assert any("could not persist the index" in str(x.message) for x in w)
        monkeypatch.undo()
        assert len(db) == 40
        want = (list(range(20)) + ids)[::3]
        assert [r[0].id for r in db.search(docs[::3], k=1, n_candidates=2, nprobe=2)] == want
    with mvdb.open(path, device="cpu", progress=False) as db:  # reopened: the index is rebuilt
        assert [r[0].id for r in db.search(docs[::3], k=1, n_candidates=2, nprobe=2)] == want


# ---- 6. long str ids are stored variable-length


def test_one_long_id_does_not_widen_every_id_on_disk(tmp_path):
    rng = np.random.default_rng(3)
    path = tmp_path / "db"
    with Store(path, dim=DIM) as st:
        st.add(_docs(rng, 2000, 1, 3), ids=["x" * 1000] + [f"d{i}" for i in range(1999)])
        st.delete(["d5"])
        st.compact()
        size = sum(p.stat().st_size for p in _segments(path))
        assert size < 200_000, size  # fixed-width ids would take 2000 x 1000 bytes
        assert st.ids()[0] == "x" * 1000 and "d1998" in st.ids()
    assert mvdb.verify(path).ok


# ---- 2. a full disk: a clear error, the process alive, the last commit intact, writable again


_ENOSPC_SCRIPT = textwrap.dedent('''
    import errno, os, sys, numpy as np, mvdb
    from mvdb.storage import store as store_mod
    path, filler, preflight = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    if not preflight:  # let the write itself run into the full disk
        store_mod._free_bytes = lambda p: None
    rng = np.random.default_rng(0)
    small = [rng.standard_normal((4, 8)).astype(np.float32) for _ in range(10)]
    db = mvdb.open(path, device="cpu", index="flat", progress=False)
    db.add(small)
    with open(filler, "wb") as f:  # fill the filesystem
        try:
            while True:
                f.write(b"\\0" * 65536); f.flush()
        except OSError:
            pass
    big = [rng.standard_normal((4000, 8)).astype(np.float32) for _ in range(20)]
    for what in ("add", "compact"):
        try:
            if what == "add":
                db.add(big)
            else:
                db.delete([0, 1]); db.compact()
            print(what, "no error")
        except mvdb.StorageError as e:
            assert e.errno in (errno.ENOSPC, errno.EFBIG), e
            print(what, "StorageError", e.errno, str(e)[:60])
        except mvdb.MvdbError as e:
            print(what, "other", type(e).__name__, e)
    n_ok = len(db)
    assert db.search(small[5], k=1)[0].id == 5
    assert not [n for n in os.listdir(os.path.join(path, "segments")) if n.startswith(".tmp")], "temp files left"
    os.unlink(filler)
    db.add(big[:2])
    db.close()
    with mvdb.open(path, device="cpu", progress=False) as db2:
        print("final", len(db2), n_ok)
        assert len(db2) == n_ok + 2
    print("OK")
''')


@pytest.mark.heavy
@pytest.mark.parametrize("preflight", [True, False], ids=["preflight", "mid-write"])
def test_disk_full_on_a_small_tmpfs(tmp_path, preflight):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        r = subprocess.run([sys.executable, "-c", _ENOSPC_SCRIPT, str(mnt / "db"), str(mnt / "filler"),
                            "1" if preflight else "0"], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "MVDB_PROGRESS": "0"})
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "add StorageError" in r.stdout and "OK" in r.stdout, r.stdout + r.stderr


# ---- 1. threads: searches from 4 threads while a fifth writes, results consistent with a commit


_THREADS_SCRIPT = textwrap.dedent('''
    import sys, threading, time, numpy as np, torch, mvdb
    path, seconds = sys.argv[1], float(sys.argv[2])
    rng = np.random.default_rng(0)
    dim = 16
    # auto ids are 0, 1, 2, ... in add order, so document i is pool[i]
    pool = [rng.standard_normal((int(rng.integers(4, 12)), dim)).astype(np.float32) for _ in range(6000)]
    if sys.argv[3] == "sharded":
        db = mvdb.open(path, devices=["cpu", "cpu"], index="flat", progress=False)
    else:
        db = mvdb.open(path, device="cpu", index="flat", progress=False)
    db.add(pool[:200])
    started_upto = [200]   # ids below this had their add begun
    deleted_at = {}        # id -> when its delete had committed (returned)
    stop = time.monotonic() + seconds
    errors, n_search, n_ops = [], [0], [0]

    def exact(q, d):
        return float((torch.from_numpy(q) @ torch.from_numpy(d).T).max(1).values.sum())

    def searcher(seed):
        r = np.random.default_rng(seed)
        while time.monotonic() < stop:
            src = int(r.integers(0, 200))              # the first 200 are never deleted
            q = pool[src][: int(r.integers(2, 5))] + 0.01 * r.standard_normal((1, dim)).astype(np.float32)
            t0 = time.monotonic()
            hits = db.search(q, k=5)
            upto = started_upto[0]
            n_search[0] += 1
            for h in hits:
                if h.id >= upto:
                    errors.append(f"id {h.id} returned before its add began")
                elif h.id in deleted_at and deleted_at[h.id] < t0:
                    errors.append(f"id {h.id} returned after its delete committed")
                elif abs(h.score - exact(q, pool[h.id])) > 2e-2 * max(1.0, abs(h.score)):
                    errors.append(f"id {h.id}: score {h.score} != exact {exact(q, pool[h.id])}")
            if exact(q, pool[hits[0].id]) < exact(q, pool[src]) - 1e-2:
                errors.append(f"query from {src}: top hit {hits[0].id} scores below its source")

    def writer():
        r = np.random.default_rng(99)
        nxt = 200
        while time.monotonic() < stop:
            op = r.integers(0, 10)
            if op < 6 and nxt + 20 <= len(pool):
                started_upto[0] = nxt + 20
                assert db.add(pool[nxt : nxt + 20]) == list(range(nxt, nxt + 20))
                nxt += 20
            elif op < 9 and nxt > 200:
                live = [i for i in range(200, nxt) if i not in deleted_at]
                gone = [int(g) for g in r.choice(live, min(5, len(live)), replace=False)] if live else []
                if gone:
                    db.delete(gone)
                    done = time.monotonic()
                    for g in gone:
                        deleted_at[g] = done
            else:
                db.compact()
            n_ops[0] += 1

    def guarded(fn, *args):  # an exception in a thread (the writer's own asserts too) is an error of the run
        def run():
            try:
                fn(*args)
            except BaseException as e:
                errors.append(f"{fn.__name__} raised {type(e).__name__}: {e}")
        return run

    threads = [threading.Thread(target=guarded(searcher, s)) for s in range(4)] + [threading.Thread(target=guarded(writer))]
    for t in threads: t.start()
    for t in threads: t.join()
    final = len(db)
    db.close()
    print("searches", n_search[0], "writes", n_ops[0], "live", final, "errors", len(errors))
    for e in errors[:10]: print(e)
    sys.exit(1 if errors or n_search[0] < 10 or n_ops[0] < 3 else 0)
''')


@pytest.mark.heavy
@pytest.mark.parametrize("kind", ["single", "sharded"])
def test_threads_search_while_one_writes(tmp_path, kind):
    seconds = os.environ.get("MVDB_THREAD_SECONDS", "8")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # what a user's process runs
    r = subprocess.run([sys.executable, "-c", _THREADS_SCRIPT, str(tmp_path / "db"), seconds, kind],
                       capture_output=True, text=True, timeout=600, env={**env, "MVDB_PROGRESS": "0"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
