"""Damage is never a silent wrong answer: each case below damages a copy of one small database
(float16 or int8, str ids, metadata, sparse vectors, an IVF index, a deletion) one way, then checks
how it is detected (``DETECTED``): a CorruptionError (or FormatError) naming the file on open, on
the first read of the damaged part, or when a writer starts; or, for derived index files, a rebuild
with right answers. In every case ``mvdb verify`` lists the problem, and nothing is deleted.

    python -m pytest -q tests/test_damage.py        # the cases: --collect-only -q lists them
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

import mvdb
from damage_tools import edit_manifest, flip, rewrite
from test_database import _exhaustive
from mvdb import CorruptionError, FormatError

DIM = 8
QUERY = np.ones((2, DIM), np.float32)


def _build(path: Path, dtype: str) -> None:
    rng = np.random.default_rng(0)
    # 16 lists: enough for the lists' choice of documents to decide a search (see _found_by_their_tokens)
    with mvdb.open(path, dim=DIM, dtype=dtype, device="cpu", index="ivf", nlist=16, progress=False) as db:
        for b in range(3):
            n = range(b * 10, (b + 1) * 10)
            db.add([rng.standard_normal((int(rng.integers(3, 9)), DIM)).astype(np.float32) for _ in n],
                   ids=[f"d{i}" for i in n], metadata=[{"i": i, "tag": f"t{i % 3}"} for i in n],
                   sparse=[{i: 1.0, 1000 + i: 0.5} for i in n])
        db.delete(["d3"])


@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    root = tmp_path_factory.mktemp("damage")
    out = {}
    for dtype in ("float16", "int8"):
        _build(root / dtype, dtype)
        out[dtype] = root / dtype
    return out


def _segments(path: Path) -> list[Path]:
    return sorted((path / "segments").glob("seg-*.h5"))


def _manifest(path: Path) -> dict:
    return json.loads((path / "MANIFEST.json").read_text())


def _bytes_at(seg: Path, needle: bytes, fn) -> None:
    data = bytearray(seg.read_bytes())
    at = data.find(needle)
    assert at >= 0, needle
    fn(data, at)
    seg.write_bytes(bytes(data))


def _seg1(path):
    return _segments(path)[1]


def _index_entry(path: Path) -> dict:
    return _manifest(path)["index_files"][0]


# name -> (dtype, damage(path), when it is detected, pattern of the error and of verify's listing)
#   open:   mvdb.open raises; read: the first read of the damaged part raises (search, metadata,
#   filter, sparse channel); write: a writer refuses to start (readers see the manifest's state);
#   rebuilt: derived data, rebuilt on open, answers right
CASES = {}


def case(name, when, pattern, dtype="float16", listed=None):
    """Register a damage; ``listed``: what verify's listing says, when it words it otherwise."""
    def deco(fn):
        CASES[name] = (dtype, fn, when, pattern, listed or pattern)
        return fn
    return deco


for _ds in ("tokens", "offsets", "id_bytes", "id_offsets", "sparse_offsets", "checksums"):
    case(f"flipped_{_ds}", "open", r"seg-.*(checksum|offsets|not a readable|cannot be opened|unreadable)")(
        lambda p, ds=_ds: flip(_seg1(p), ds))
for _ds in ("tokens", "scales"):
    case(f"int8_flipped_{_ds}", "open", r"checksum mismatch", dtype="int8")(lambda p, ds=_ds: flip(_seg1(p), ds))
for _ds in ("sparse_terms", "sparse_weights"):
    case(f"flipped_{_ds}", "read", rf"dataset {_ds} checksum mismatch")(lambda p, ds=_ds: flip(_seg1(p), ds))

case("metadata_value_edited", "read", r"metadata checksum mismatch")(
    lambda p: _bytes_at(_seg1(p), b'"tag":"t1"', lambda d, at: d.__setitem__(at + 8, ord("9"))))
case("metadata_not_json", "read", r"metadata checksum mismatch")(
    lambda p: _bytes_at(_seg1(p), b'{"i":10', lambda d, at: d.__setitem__(at + 1, ord("}"))))
case("metadata_not_utf8", "read", r"metadata (checksum mismatch|is not valid UTF-8)")(
    lambda p: _bytes_at(_seg1(p), b'{"i":11', lambda d, at: d.__setitem__(at + 2, 0xFF)))


for _name, _attr, _value, _when, _pattern in [
    ("metadata_checksum_attribute", "crc32_metadata", 12345, "read", r"metadata checksum mismatch"),
    ("checksum_names_attribute", "checksum_names", "not json", "open", r"not a readable segment"),
    ("supersedes_attribute", "mvdb_supersedes", "{", "open", r"not a readable segment"),
]:
    case(_name, _when, _pattern)(lambda p, a=_attr, v=_value: rewrite(p, _seg1(p), lambda f: f.attrs.__setitem__(a, v)))
case("dataset_removed", "open", r"not a readable segment|offsets")(
    lambda p: rewrite(p, _seg1(p), lambda f: f.__delitem__("offsets")))


case("truncated", "open", r"bytes, the manifest says")(
    lambda p: os.truncate(_seg1(p), _seg1(p).stat().st_size // 2))
case("bytes_appended", "open", r"bytes, the manifest says")(
    lambda p: open(_seg1(p), "ab").write(b"\0" * 100))
case("zeroed", "open", r"not a readable segment")(lambda p: _seg1(p).write_bytes(bytes(_seg1(p).stat().st_size)))
case("random_bytes", "open", r"not a readable segment")(
    lambda p: _seg1(p).write_bytes(np.random.default_rng(1).bytes(_seg1(p).stat().st_size)))
case("superblock_zeroed", "open", r"not a readable segment")(
    lambda p: _bytes_at(_seg1(p), b"\x89HDF", lambda d, at: d.__setitem__(slice(at, at + 64), bytes(64))))
case("missing", "open", r"missing")(lambda p: _seg1(p).unlink())


@case("replaced_by_a_directory", "open", r"bytes, the manifest says|cannot be read|missing|not a readable")
def _(p):
    seg = _seg1(p)
    seg.unlink()
    seg.mkdir()


@case("swapped_with_another_segment", "open", r"bytes, the manifest says|holds \d+ documents")
def _(p):
    a, b = _segments(p)[:2]
    tmp = a.with_suffix(".swap")
    os.replace(a, tmp)
    os.replace(b, a)
    os.replace(tmp, b)


@case("same_id_twice", "open", r"stored twice|more than once")
def _(p):
    from mvdb.storage.segment import crc32

    segs = _segments(p)
    with h5py.File(segs[2], "r") as f:
        data, offsets = f["id_bytes"][()], f["id_offsets"][()]
    with h5py.File(segs[1], "r") as f:
        names = json.loads(f.attrs["checksum_names"])
        at = {n: f[n].id.get_offset() for n in ("id_bytes", "id_offsets", "checksums")}
        sums = f["checksums"][()]
    sums[names.index("id_bytes")], sums[names.index("id_offsets")] = crc32(data), crc32(offsets)
    with open(segs[1], "r+b") as f:
        for name, arr in (("id_bytes", data), ("id_offsets", offsets), ("checksums", sums)):
            f.seek(at[name])
            f.write(np.ascontiguousarray(arr).tobytes())


# the manifest: damage its checksum sees
case("manifest_not_json", "open", r"MANIFEST.json: not valid JSON")(
    lambda p: (p / "MANIFEST.json").write_text("{ not json"))
case("manifest_empty", "open", r"MANIFEST.json: not valid JSON")(lambda p: (p / "MANIFEST.json").write_text(""))
case("manifest_truncated", "open", r"MANIFEST.json: not valid JSON")(
    lambda p: (p / "MANIFEST.json").write_text((p / "MANIFEST.json").read_text()[:100]))
case("manifest_byte_edited", "open", r"manifest checksum mismatch")(
    lambda p: (p / "MANIFEST.json").write_text((p / "MANIFEST.json").read_text().replace('"float16"', '"int8"')))
case("manifest_is_a_directory", "open", r"MANIFEST.json: is not a file")(
    lambda p: ((p / "MANIFEST.json").unlink(), (p / "MANIFEST.json").mkdir()))
case("manifest_missing", "open", r"MANIFEST.json is missing")(lambda p: (p / "MANIFEST.json").unlink())
case("manifest_other_format", "open", r"expected an mvdb manifest")(
    lambda p: (p / "MANIFEST.json").write_text(json.dumps({"format": "lance"})))
case("manifest_newer_version", "open", r"newer mvdb")(
    lambda p: edit_manifest(p, lambda m: m.update(format_version=99)))

# the manifest: damage with a valid checksum (a bug, an edit, a tool)
for _name, _fn, _pattern in [
    ("dtype", lambda m: m.update(dtype="int8"), r"stored as float16, the manifest says int8"),
    ("dim", lambda m: m.update(dim=DIM * 2), r"token shape"),
    ("dim_null", lambda m: m.update(dim=None), r"token shape"),
    ("id_type", lambda m: m.update(id_type="int"), r"holds str ids, the manifest says int"),
    ("n_docs", lambda m: m["segments"][1].update(n_docs=11), r"holds 10 documents"),
    ("n_tokens", lambda m: m["segments"][1].update(n_tokens=1), r"tokens, the manifest says"),
    ("file_size", lambda m: m["segments"][1].update(file_size=1), r"bytes, the manifest says 1"),
    ("deleted_out_of_range", lambda m: m["segments"][0].update(deleted=[10**6]), r"deleted rows out of range"),
    ("deleted_repeated", lambda m: m["segments"][0].update(deleted=[1, 1]), r"deleted rows out of range or repeated"),
    ("absolute_segment_name", lambda m: m["segments"][0].update(name="/tmp/victim.h5"), r"not a plain .h5"),
    ("dotdot_segment_name", lambda m: m["segments"][0].update(name="../victim.h5"), r"not a plain .h5"),
    ("segment_listed_twice", lambda m: m["segments"].append(dict(m["segments"][0])), r"listed twice"),
    ("segments_not_a_list", lambda m: m.update(segments={}), r"segments: expected a list"),
    ("generation_a_string", lambda m: m.update(generation="7"), r"generation: expected an int"),
    ("dotdot_index_file", lambda m: m["index_files"].append({"name": "../../victim.npy", "nbytes": 1, "crc32": 1}),
     r"not a plain .npy"),
    ("retired_names_a_live_segment", lambda m: m.update(retired=[m["segments"][0]["name"]]), r"also a live segment"),
    ("config_not_an_object", lambda m: m.update(config=[1]), r"config: expected an object"),
    ("config_index_kind", lambda m: m["config"].update(index={"kind": "hnsw", "nlist": None}), r"config.index"),
    ("config_encoder_not_an_object", lambda m: m["config"].update(encoder="x"), r"config.encoder"),
]:
    case(f"manifest_{_name}", "open", _pattern)(lambda p, fn=_fn: edit_manifest(p, fn))
case("manifest_next_id_below_stored_ids", "open", r"next_id 5 is not above", dtype="int8")(
    lambda p: _int_ids_then(p, lambda m: m.update(next_id=5)))


def _int_ids_then(p: Path, fn) -> None:
    """Rebuild the int8 copy with int ids first (next_id only matters for int ids)."""
    shutil.rmtree(p)
    rng = np.random.default_rng(2)
    with mvdb.open(p, dim=DIM, dtype="int8", device="cpu", index="flat", progress=False) as db:
        db.add([rng.standard_normal((4, DIM)).astype(np.float32) for _ in range(20)])
    edit_manifest(p, fn)


# segments the manifest does not account for: an older manifest put back, or an edited one
@case("manifest_restored_from_a_backup", "write", r"committed after it", listed=r"newer than MANIFEST.json")
def _(p):
    backup = (p / "MANIFEST.json").read_bytes()
    with mvdb.open(p, device="cpu", progress=False) as db:
        db.add([np.ones((3, DIM), np.float32)], ids=["late"])
    (p / "MANIFEST.json").write_bytes(backup)


@case("manifest_restored_from_before_a_compaction", "open", r"committed after it", listed=r"missing")

def _(p):
    backup = (p / "MANIFEST.json").read_bytes()
    with mvdb.open(p, device="cpu", progress=False) as db:
        assert db.compact() >= 1
    (p / "MANIFEST.json").write_bytes(backup)


case("segment_dropped_from_the_manifest", "write", r"does not name them", listed=r"does not name: writers refuse")(
    lambda p: edit_manifest(p, lambda m: (m["segments"].pop(2), m.update(index_files=[]))))

# derived index files: rebuilt from the segments, never a wrong answer
case("index_file_flipped", "rebuilt", r"index/.*size or checksum")(
    lambda p: _bytes_at(p / "index" / _index_entry(p)["name"], b"NUMPY", lambda d, at: d.__setitem__(-3, d[-3] ^ 1)))
case("index_file_truncated", "rebuilt", r"index/.*size or checksum")(
    lambda p: os.truncate(p / "index" / _index_entry(p)["name"], 20))
case("index_file_missing", "rebuilt", r"index/.*No such file")(lambda p: (p / "index" / _index_entry(p)["name"]).unlink())
case("index_file_crc_edited", "rebuilt", r"index/.*size or checksum")(
    lambda p: edit_manifest(p, lambda m: m["index_files"][0].update(crc32=1)))


def _read_all(db) -> None:
    """Every read that touches stored data: tokens (search), metadata, filters, the sparse channel."""
    db.search(QUERY, k=5)
    ids = db.store.ids()
    db.metadata(ids)
    db.search(QUERY, k=5, where={"tag": "t1"})
    db.search(QUERY, k=5, sparse={11: 1.0})
    db.get(ids[:3])


def _found_by_their_tokens(db) -> tuple[int, int]:
    """Every third document queried with its first 3 tokens: (how many get exhaustive MaxSim's best
    as the top hit when the IVF lists choose 3 of the 29 documents reranked, how many queries). The
    defaults would rerank them all, and a wrong index would go unseen."""
    ids = db.store.ids()
    docs = db.get(ids)
    qs = [d[:3] for d in docs[::3]]
    best = [_exhaustive(db, q, 1)[0] for q in qs]
    return sum(r[0].id == b for r, b in zip(db.search(qs, k=1, n_candidates=3, nprobe=2), best)), len(qs)


def _damaged_copy(templates, tmp_path, name) -> tuple[Path, str, str, str]:
    dtype, damage, when, pattern, listed = CASES[name]
    path = tmp_path / "db"
    shutil.copytree(templates[dtype], path)
    damage(path)
    return path, when, pattern, listed


def _listing(path: Path) -> dict:
    out = {}
    for root, dirs, names in os.walk(path):
        for n in names + [d for d in dirs if d.endswith(".h5") or d == "MANIFEST.json"]:
            out[os.path.relpath(os.path.join(root, n), path)] = os.path.isdir(os.path.join(root, n))
    return out


def test_at_least_fifty_cases():
    assert len(CASES) >= 50, len(CASES)


@pytest.mark.parametrize("name", list(CASES))
def test_damage_is_detected_never_answered(templates, tmp_path, name):
    path, when, pattern, listed = _damaged_copy(templates, tmp_path, name)
    victim = tmp_path / "victim.h5"
    victim.write_bytes(b"not ours")
    before = _listing(path)
    report = mvdb.verify(path)  # before anything opens it: verify changes nothing
    assert not report.ok, f"{name}: verify found nothing"
    assert any(re.search(listed, p) for p in report.problems), report
    assert _listing(path) == before
    if when == "rebuilt":
        with mvdb.open(path, device="cpu", progress=False) as db:
            found, n = _found_by_their_tokens(db)
            assert found >= n - 1, (found, n)
            _read_all(db)
        assert mvdb.verify(path).ok, "the open rebuilt the index"
    elif when == "write":
        with pytest.raises(CorruptionError, match=pattern):
            mvdb.open(path, device="cpu", progress=False)
        with mvdb.open(path, device="cpu", read_only=True, progress=False) as db:
            _read_all(db)  # readers see the manifest's (consistent) state
        assert _listing(path) == before, "a refused writer changes nothing"
    else:
        with pytest.raises((CorruptionError, FormatError), match=pattern):
            db = mvdb.open(path, device="cpu", progress=False)
            assert when == "read", f"{name}: expected the open to fail"
            try:
                _read_all(db)
            finally:
                db.close()
        if when == "open":
            assert _listing(path) == before, "a refused open removes nothing"
    assert victim.read_bytes() == b"not ours"
