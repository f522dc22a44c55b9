"""The segment store: a conformance suite every storage flavour runs, bad input, faults, reads."""

import errno
import json
import os

import numpy as np
import pytest

from mvdb import (
    CorruptionError,
    DatabaseLockedError,
    DuplicateIdError,
    FormatError,
    InvalidInputError,
    InvalidTypeError,
    ReadOnlyError,
    UnknownIdError,
)
from mvdb.storage import Store
from mvdb.storage import segment as segment_mod
from mvdb.storage import snapshot as snapshot_mod
from mvdb.storage import store as store_mod

DIM = 16


def _docs(rng, n, dim=DIM, lo=1, hi=20):
    return [rng.standard_normal((int(rng.integers(lo, hi + 1)), dim)).astype(np.float32) for _ in range(n)]


def _state(path):
    """Everything committed, for 'nothing changed' checks: the manifest bytes and the segment files."""
    with open(os.path.join(path, "MANIFEST.json"), "rb") as f:
        manifest = f.read()
    return manifest, sorted(os.listdir(os.path.join(path, "segments")))


class StoreConformance:
    """Behaviour every storage flavour must show. Subclasses set ``dtype``."""

    dtype = "float16"

    def expected(self, doc):
        """What the store gives back for a float32 document."""
        if self.dtype == "float16":
            return doc.astype(np.float16).astype(np.float32)
        amax = np.abs(doc).max(axis=1, keepdims=True)
        scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
        q = np.clip(np.trunc(doc / scale + 0.5 * np.sign(doc / scale)), -127, 127)
        return (q * scale).astype(np.float32)

    def assert_doc(self, got, doc):
        np.testing.assert_allclose(got, self.expected(doc), rtol=1e-6, atol=1e-6)

    @pytest.fixture
    def st(self, tmp_path):
        s = Store(tmp_path / "db", dim=DIM, dtype=self.dtype)
        yield s
        s.close()

    def test_add_get_roundtrip_with_auto_ids(self, st):
        docs = _docs(np.random.default_rng(1), 7)
        ids = st.add(docs)
        assert ids == list(range(7)) and len(st) == 7
        for i, got in zip(ids, st.get(ids)):
            self.assert_doc(got, docs[i])
        assert st.add(_docs(np.random.default_rng(2), 2)) == [7, 8], "auto ids continue"

    def test_user_int_ids_and_auto_ids_never_collide(self, st):
        st.add(_docs(np.random.default_rng(1), 2), ids=[100, 5])
        assert st.add(_docs(np.random.default_rng(2), 2)) == [101, 102]

    def test_str_ids_and_metadata(self, st):
        docs = _docs(np.random.default_rng(3), 3)
        st.add(docs, ids=["a", "é", "c"], metadata=[{"lang": "en", "n": [1, 2]}, None, {"x": 1.5}])
        assert st.metadata(["c", "a", "é"]) == [{"x": 1.5}, {"lang": "en", "n": [1, 2]}, None]
        self.assert_doc(st.get(["é"])[0], docs[1])
        assert "a" in st and "zz" not in st and 3 not in st

    def test_gather_keeps_request_order_and_repeats(self, st):
        docs = _docs(np.random.default_rng(4), 5)
        st.add(docs, ids=[10, 11, 12, 13, 14])
        p = st.gather([13, 10, 13])
        assert p.ids == [13, 10, 13]
        assert list(np.diff(p.offsets)) == [len(docs[3]), len(docs[0]), len(docs[3])]
        assert p.tokens.dtype == (np.float16 if self.dtype == "float16" else np.int8)
        assert (p.scales is None) == (self.dtype == "float16")

    def test_duplicates_rejected_and_nothing_written(self, st):
        st.add(_docs(np.random.default_rng(5), 2), ids=[1, 2])
        before = _state(st.path)
        with pytest.raises(DuplicateIdError, match=r"already in the database: \[2\]"):
            st.add(_docs(np.random.default_rng(6), 2), ids=[3, 2])
        with pytest.raises(DuplicateIdError, match=r"duplicate ids within the batch: \[7\]"):
            st.add(_docs(np.random.default_rng(6), 2), ids=[7, 7])
        assert _state(st.path) == before and len(st) == 2

    def test_delete_is_immediate_and_ids_are_stable(self, st):
        docs = _docs(np.random.default_rng(7), 6)
        st.add(docs)
        st.delete([1, 4])
        assert len(st) == 4 and st.ids() == [0, 2, 3, 5] and 1 not in st
        with pytest.raises(UnknownIdError, match=r"not in the database: \[1\]"):
            st.get([1])
        before = _state(st.path)
        with pytest.raises(UnknownIdError, match=r"\[99\]"):
            st.delete([2, 99])
        assert _state(st.path) == before and 2 in st, "a failed delete deletes nothing"
        st.add([docs[1]], ids=[1])  # a deleted id can be used again
        self.assert_doc(st.get([1])[0], docs[1])

    def test_compact_keeps_ids_content_metadata_and_order(self, st):
        rng = np.random.default_rng(8)
        docs = _docs(rng, 30)
        for i in range(0, 30, 10):
            st.add(docs[i : i + 10], ids=list(range(i, i + 10)), metadata=[{"i": j} for j in range(i, i + 10)])
        st.delete([3, 15, 29])
        order = st.ids()
        assert st.compact() == 3
        assert len(st.manifest["segments"]) == 1
        assert st.ids() == order
        for i in order:
            self.assert_doc(st.get([i])[0], docs[i])
        assert st.metadata([16]) == [{"i": 16}]
        assert st.verify().ok
        assert sorted(n for n in os.listdir(os.path.join(st.path, "segments")) if n.endswith(".h5")) == [st.manifest["segments"][0]["name"]]

    def test_reopen_persists_everything(self, st, tmp_path):
        docs = _docs(np.random.default_rng(9), 4)
        st.add(docs, ids=["w", "x", "y", "z"], metadata=[{"k": i} for i in range(4)])
        st.delete(["x"])
        st.close()
        with Store(tmp_path / "db") as again:
            assert again.dim == DIM and again.dtype == self.dtype
            assert again.ids() == ["w", "y", "z"] and again.metadata(["z"]) == [{"k": 3}]
            self.assert_doc(again.get(["y"])[0], docs[2])

    def test_iter_batches_and_load_all_cover_live_docs_in_order(self, st):
        docs = _docs(np.random.default_rng(10), 12)
        st.add(docs[:6])
        st.add(docs[6:])
        st.delete([2, 7])
        batches = list(st.iter_batches(max_tokens=25))
        assert [i for b in batches for i in b.ids] == st.ids()
        whole = st.load_all()
        assert whole.ids == st.ids()
        assert whole.offsets[-1] == sum(len(docs[i]) for i in st.ids())
        tokens = whole.tokens.astype(np.float32)
        if whole.scales is not None:
            tokens *= whole.scales[:, None]
        for k, i in enumerate(whole.ids):
            self.assert_doc(tokens[whole.offsets[k] : whole.offsets[k + 1]], docs[i])
        pinned = st.load_all(device="cpu")
        assert pinned.tokens.shape == whole.tokens.shape and pinned.ids == whole.ids

    def test_readers_see_snapshots_and_refresh(self, st, tmp_path):
        st.add(_docs(np.random.default_rng(11), 3))
        reader = Store(tmp_path / "db", read_only=True)
        st.add(_docs(np.random.default_rng(12), 2))
        st.delete([0])
        assert len(reader) == 3, "a reader keeps its snapshot"
        assert reader.refresh() and len(reader) == 4 and 0 not in reader
        st.compact()
        assert reader.refresh() and reader.ids() == [1, 2, 3, 4]
        assert not reader.refresh()
        with pytest.raises(ReadOnlyError, match="opened read-only"):
            reader.add(_docs(np.random.default_rng(13), 1))
        with pytest.raises(ReadOnlyError):
            reader.delete([1])
        reader.close()

    def test_large_batches_split_into_bounded_segments(self, tmp_path):
        with Store(tmp_path / "db", dim=DIM, dtype=self.dtype, segment_tokens=50) as st:
            docs = _docs(np.random.default_rng(14), 20, lo=5, hi=15)
            st.add(docs)
            segs = st.manifest["segments"]
            assert len(segs) > 2 and all(s["n_tokens"] <= 50 for s in segs)
            for i, got in enumerate(st.get(list(range(20)))):
                self.assert_doc(got, docs[i])
            assert st.verify().ok

    def test_verify_finds_corruption_and_changes_nothing(self, st):
        st.add(_docs(np.random.default_rng(15), 5))
        assert st.verify().ok
        seg = os.path.join(st.path, "segments", st.manifest["segments"][0]["name"])
        r = segment_mod.SegmentReader(seg)
        tok_offset = int(r._file["tokens"].id.get_offset())
        r.close()
        with open(seg, "r+b") as f:
            f.seek(tok_offset + 3)
            b = f.read(1)
            f.seek(tok_offset + 3)
            f.write(bytes([b[0] ^ 0xFF]))
        before = _state(st.path)
        report = st.verify()
        assert not report.ok and "dataset tokens checksum mismatch" in str(report)
        assert _state(st.path) == before


class TestFloat16Store(StoreConformance):
    dtype = "float16"


class TestInt8Store(StoreConformance):
    dtype = "int8"

    def test_int8_shares_the_kernel_quantizer(self, st):
        import torch

        from mvdb.kernels import quantize_int8

        doc = np.random.default_rng(16).standard_normal((9, DIM)).astype(np.float32)
        st.add([doc])
        p = st.gather([0])
        q, s = quantize_int8(torch.from_numpy(doc))
        assert np.array_equal(p.tokens, q.numpy()) and np.array_equal(p.scales, s.numpy())

    def test_float16_input_checks_its_range_without_a_warning(self, st):
        """The int8 range check (2^64) against float16 rows: no overflow warning from casting it."""
        import warnings

        doc = np.random.default_rng(17).standard_normal((7, DIM)).astype(np.float16)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            st.add([doc])
        assert st.gather([0]).tokens.shape == (7, DIM)


# Bad input: a clear error, and nothing written.


@pytest.fixture
def db(tmp_path):
    s = Store(tmp_path / "db", dim=DIM)
    s.add(_docs(np.random.default_rng(0), 2))
    yield s
    s.close()


GOOD = np.ones((3, DIM), np.float32)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"docs": [GOOD, np.ones((3, 8))]}, InvalidInputError, "document 1: expected dim 16, got 8"),
        ({"docs": [GOOD, np.full((2, DIM), np.nan)]}, InvalidInputError, r"document 1: contains NaN or Inf \(token 0\)"),
        ({"docs": [GOOD, np.array([[0.0] * (DIM - 1) + [np.inf]])]}, InvalidInputError, "document 1: contains NaN or Inf"),
        ({"docs": [GOOD, np.zeros((0, DIM))]}, InvalidInputError, r"document 1: empty \(0 tokens\)"),
        ({"docs": [GOOD, np.full((2, DIM), "x")]}, InvalidTypeError, "document 1: expected a numeric"),
        ({"docs": [GOOD, np.ones((2, DIM), bool)]}, InvalidTypeError, "document 1: expected a numeric"),
        ({"docs": [GOOD, [[1.0] * DIM]]}, InvalidTypeError, "document 1: expected a 2-D numpy array or torch tensor, got list"),
        ({"docs": [GOOD, np.ones((2, 3, DIM))]}, InvalidInputError, r"document 1: expected a 2-D \[tokens, dim\] array"),
        ({"docs": np.ones((4, DIM))}, InvalidInputError, r"docs: expected a list of \[L, dim\] arrays or one \[n, L, dim\]"),
        ({"docs": [GOOD * 1e6]}, InvalidInputError, "document 0: value 1e\\+06 at token 0 overflows float16"),
        ({"docs": [GOOD], "ids": [1.5]}, InvalidTypeError, r"ids\[0\]: expected int or str, got float"),
        ({"docs": [GOOD], "ids": [True]}, InvalidTypeError, r"ids\[0\]: expected int or str, got bool"),
        ({"docs": [GOOD], "ids": ["a"]}, InvalidTypeError, "ids: this database uses int ids, got str"),
        ({"docs": [GOOD, GOOD], "ids": [5, "a"]}, InvalidTypeError, "ids: expected all int or all str ids, got a mix"),
        ({"docs": [GOOD], "ids": [1, 2]}, InvalidInputError, r"ids: expected 1 ids \(one per document\), got 2"),
        ({"docs": [GOOD], "metadata": [{"x": object()}]}, InvalidInputError, r"metadata\[0\]: not JSON-serialisable"),
        ({"docs": [GOOD], "metadata": [{"x": float("nan")}]}, InvalidInputError, r"metadata\[0\]: not JSON-serialisable"),
        ({"docs": [GOOD], "metadata": ["text"]}, InvalidTypeError, r"metadata\[0\]: expected a dict or None, got str"),
        ({"docs": [GOOD], "metadata": [{}, {}]}, InvalidInputError, r"metadata: expected 1 entries"),
    ],
    ids=["dim", "nan", "inf", "empty-doc", "str-dtype", "bool-dtype", "nested-list", "3d-doc", "2d-batch",
         "fp16-overflow", "float-id", "bool-id", "str-id-in-int-db", "mixed-ids", "id-count", "meta-object",
         "meta-nan", "meta-not-dict", "meta-count"],
)
def test_bad_input_writes_nothing(db, kwargs, error, message):
    before = _state(db.path)
    with pytest.raises(error, match=message):
        db.add(**kwargs)
    assert _state(db.path) == before and len(db) == 2


def test_bad_packed_input(db):
    with pytest.raises(InvalidInputError, match=r"lengths: expected a sum of 6 \(the token count\), got 5"):
        db.add_packed(np.ones((6, DIM)), [2, 3])
    with pytest.raises(InvalidInputError, match=r"document 1: empty"):
        db.add_packed(np.ones((6, DIM)), [6, 0])
    assert db.add_packed(np.ones((6, DIM)), np.array([2, 4])) == [2, 3]


def test_path_is_a_file(tmp_path):
    p = tmp_path / "file"
    p.write_text("hello")
    with pytest.raises(FormatError, match="is a file; expected an mvdb database directory"):
        Store(p)


def test_path_belongs_to_something_else(tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "data.csv").write_text("a,b")
    with pytest.raises(FormatError, match="holds other files and no MANIFEST.json; not an mvdb database"):
        Store(tmp_path / "other")
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "MANIFEST.json").write_text(json.dumps({"format": "lance"}))
    with pytest.raises(FormatError, match="expected an mvdb manifest"):
        Store(tmp_path / "fake")
    assert os.listdir(tmp_path / "fake") == ["MANIFEST.json"], "nothing written into a foreign directory"


def test_newer_format_version_refused(tmp_path, db):
    path = os.path.join(db.path, "MANIFEST.json")
    db.close()
    doc = json.load(open(path))
    doc["format_version"] = 99
    body = {k: v for k, v in doc.items() if k != "checksum"}
    from mvdb.storage.manifest import checksum

    doc["checksum"] = checksum(body)
    open(path, "w").write(json.dumps(doc))
    with pytest.raises(FormatError, match="format version 99.*upgrade mvdb"):
        Store(os.path.dirname(path))


def test_open_with_other_dim_or_dtype(db):
    path = db.path
    db.close()
    with pytest.raises(InvalidInputError, match="stores dim 16, got 32"):
        Store(path, dim=32)
    with pytest.raises(InvalidInputError, match="stores float16, got 'int8'"):
        Store(path, dtype="int8")
    with pytest.raises(InvalidInputError, match="dtype: expected one of"):
        Store(path, dtype="float32")


def test_read_only_does_not_create(tmp_path):
    with pytest.raises(FileNotFoundError, match="read_only=True does not create one"):
        Store(tmp_path / "nothing", read_only=True)
    assert not (tmp_path / "nothing").exists()


def test_second_writer_is_refused_readers_are_not(db):
    with pytest.raises(DatabaseLockedError, match=f"{db.path}: another process holds the writer lock"):
        Store(db.path)
    with Store(db.path, read_only=True) as r:
        assert len(r) == 2


def test_second_writer_in_another_process(db):
    import subprocess
    import sys

    code = f"from mvdb.storage import Store\ntry:\n Store({db.path!r})\nexcept Exception as e: print(type(e).__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "DatabaseLockedError", out.stderr


def test_corrupt_manifest_is_reported(db):
    path = db.path
    db.close()
    with open(os.path.join(path, "MANIFEST.json"), "r+b") as f:
        f.seek(20)
        f.write(b"X")
    with pytest.raises((CorruptionError, FormatError)):
        Store(path)


# Fault injection: a failed write raises, the committed state is intact and still writable.


def _fail(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device (injected)")


@pytest.mark.parametrize("where", ["segment-write", "manifest-write", "manifest-rename"])
def test_failed_write_leaves_committed_state_intact(db, monkeypatch, where):
    docs_before = db.get([0, 1])
    before = _state(db.path)
    with monkeypatch.context() as m:
        if where == "segment-write":
            m.setattr(store_mod, "write_segment", _fail)
        elif where == "manifest-write":
            from mvdb.storage import manifest as manifest_mod

            m.setattr(manifest_mod, "atomic_write", _fail)
        else:
            from mvdb.storage import _io

            real = os.replace
            m.setattr(_io.os, "replace", lambda a, b: _fail() if "MANIFEST" in b else real(a, b))
        with pytest.raises(OSError, match="No space left"):
            db.add(_docs(np.random.default_rng(1), 3))
        if where.startswith("manifest"):
            with pytest.raises(OSError, match="No space left"):
                db.delete([0])
    assert _state(db.path) == before, "no new segment or temp file left behind"
    assert [np.array_equal(a, b) for a, b in zip(db.get([0, 1]), docs_before)] == [True, True]
    assert db.add(_docs(np.random.default_rng(2), 1)) == [2], "still writable"
    assert db.verify().ok
    with Store(db.path, read_only=True) as r:
        assert r.ids() == [0, 1, 2]


def test_segment_rename_failing_after_the_commit_loses_nothing(db, monkeypatch):
    """A segment's rename to its final name follows the manifest commit: when it fails, the add is
    committed anyway, readers read the segment at its temp name, and the next writer renames it."""
    real = os.replace
    with monkeypatch.context() as m:
        m.setattr(store_mod.os, "replace", lambda a, b: _fail() if a.endswith(".h5") else real(a, b))
        assert db.add(_docs(np.random.default_rng(1), 3)) == [2, 3, 4]
    seg_dir = os.path.join(db.path, "segments")
    name = db.manifest["segments"][-1]["name"]
    assert os.listdir(seg_dir).count(".tmp-" + name) == 1 and name not in os.listdir(seg_dir)
    with Store(db.path, read_only=True) as r:
        assert r.ids() == [0, 1, 2, 3, 4] and r.verify().ok
        assert len(r.get([4])) == 1
    db.close()
    with Store(db.path) as w:
        assert w.ids() == [0, 1, 2, 3, 4]
    assert name in os.listdir(seg_dir) and ".tmp-" + name not in os.listdir(seg_dir)


def test_failed_compaction_keeps_old_segments(db, monkeypatch):
    db.delete([0])
    before = _state(db.path)
    from mvdb.storage import manifest as manifest_mod

    monkeypatch.setattr(manifest_mod, "atomic_write", _fail)
    with pytest.raises(OSError):
        db.compact()
    monkeypatch.undo()
    assert _state(db.path) == before and db.ids() == [1]
    assert db.compact() == 1 and db.ids() == [1] and db.verify().ok


def test_orphans_removed_by_next_writer_not_by_readers(db):
    """Temp files no manifest names are a crashed write's: the next writer removes them. A final
    segment name the manifest does not know is never an orphan (segments get their final name
    only once committed): it is kept and verify() lists it."""
    seg_dir = os.path.join(db.path, "segments")
    path = db.path
    db.close()
    for name in (".tmp-seg-x.h5", "seg-99999999-deadbeef.h5"):
        open(os.path.join(seg_dir, name), "wb").write(b"partial")
    open(os.path.join(path, "MANIFEST.json.tmp-123"), "wb").write(b"{")
    with Store(path, read_only=True) as r:
        report = r.verify()
        assert [p.split(":")[0] for p in report.problems] == ["seg-99999999-deadbeef.h5"]
    assert ".tmp-seg-x.h5" in os.listdir(seg_dir), "a reader removes nothing"
    with Store(path) as w:
        assert len(w) == 2
        names = [s["name"] for s in w.manifest["segments"]]
    assert sorted(os.listdir(seg_dir)) == sorted(names + ["seg-99999999-deadbeef.h5"])
    assert "MANIFEST.json.tmp-123" not in os.listdir(path)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_load_all_to_gpu_matches_host(tmp_path, dtype, monkeypatch):
    import torch

    from mvdb.storage import _load

    monkeypatch.setattr(_load, "CHUNK_TOKENS", 37)  # many staging round trips
    with Store(tmp_path / "db", dim=DIM, dtype=dtype, segment_tokens=120) as st:
        st.add(_docs(np.random.default_rng(20), 40))
        st.delete([3, 17, 30])
        host = st.load_all()
        gpu = st.load_all(device="cuda")
        assert gpu.tokens.is_cuda and gpu.ids == host.ids
        assert torch.equal(gpu.tokens.cpu(), torch.from_numpy(host.tokens))
        assert torch.equal(gpu.offsets.cpu(), torch.from_numpy(host.offsets))
        if dtype == "int8":
            assert torch.equal(gpu.scales.cpu(), torch.from_numpy(host.scales))


def test_failure_after_the_commit_keeps_the_committed_segments(db, monkeypatch):
    """If opening the new snapshot fails after the manifest rename, the new segment stays."""
    real = snapshot_mod.SegmentReader

    def boom(*args, **kwargs):
        raise OSError(errno.EMFILE, "Too many open files (injected)")

    monkeypatch.setattr(snapshot_mod, "SegmentReader", boom)
    with pytest.raises(OSError, match="Too many open files"):
        db.add(_docs(np.random.default_rng(3), 2))
    monkeypatch.setattr(snapshot_mod, "SegmentReader", real)
    with Store(db.path, read_only=True) as r:
        assert r.verify().ok and len(r) == 4, "the committed add is intact"


def test_parallel_write_failure_waits_for_every_chunk(tmp_path, monkeypatch):
    from mvdb.storage import segment

    calls = []
    real = segment._pwrite_all

    def flaky(fd, data, offset):
        calls.append(offset)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        real(fd, data, offset)

    monkeypatch.setattr(segment, "_WRITE_CHUNK", 64)
    monkeypatch.setattr(segment, "_pwrite_all", flaky)
    closed = []
    real_close = os.close
    monkeypatch.setattr(segment.os, "close", lambda fd: (closed.append(len(calls)), real_close(fd)))
    with Store(tmp_path / "db", dim=DIM) as st:
        with pytest.raises(OSError, match="No space left"):
            st.add(_docs(np.random.default_rng(4), 5))
        n_jobs = len(calls)
        assert closed and closed[-1] == n_jobs, "the descriptor was closed while writes were still running"
        assert len(st) == 0 and st.verify().ok


def test_crash_while_creating_a_database(tmp_path):
    p = tmp_path / "db"
    (p / "segments").mkdir(parents=True)
    (p / "LOCK").write_bytes(b"")
    (p / "MANIFEST.json.tmp-1234").write_bytes(b'{"form')
    with Store(p, dim=DIM) as st:
        assert len(st) == 0
    assert not (p / "MANIFEST.json.tmp-1234").exists()


def test_ids_outside_int64_are_absent(db):
    assert 2**64 not in db and not db.contains([2**64, 0]).tolist()[0]
    with pytest.raises(UnknownIdError, match="outside int64"):
        db.get([2**64])


def test_packed_zero_dim_rejected(tmp_path):
    with Store(tmp_path / "db") as st:
        with pytest.raises(InvalidInputError, match="tokens: expected a positive embedding dim, got 0"):
            st.add_packed(np.zeros((2, 0), np.float32), [1, 1])


def test_own_segments_load_without_a_second_checksum(tmp_path, monkeypatch):
    """The engine following its own add does not re-hash the segment it just wrote (the store
    checksummed those bytes while writing); another handle still checks every segment, and
    finds a damaged one."""
    import mvdb
    from mvdb.storage import _load

    fed = []
    real = _load._Checksum.feed
    monkeypatch.setattr(_load._Checksum, "feed", lambda self, chunk: fed.append(self.reader.path) or real(self, chunk))
    rng = np.random.default_rng(0)
    db = mvdb.open(tmp_path / "db", dim=8, device="cpu", progress=False)
    db.add([rng.standard_normal((5, 8)).astype(np.float32) for _ in range(3)])
    db.add([rng.standard_normal((4, 8)).astype(np.float32) for _ in range(2)])
    assert len(db) == 5 and fed == []
    reader = mvdb.open(tmp_path / "db", read_only=True, device="cpu", progress=False)
    assert len(reader) == 5 and len(set(fed)) == 2  # both segments checked on the other handle
    reader.close()
    seg = sorted(fed)[0]
    db.close()
    import h5py

    with h5py.File(seg, "r") as f:
        at = f["tokens"].id.get_offset()
    with open(seg, "r+b") as f:  # flip a byte inside the tokens of one segment
        f.seek(at + 3)
        b = f.read(1)
        f.seek(at + 3)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(CorruptionError):
        mvdb.open(tmp_path / "db", read_only=True, device="cpu", progress=False).search(
            rng.standard_normal((2, 8)).astype(np.float32))
