"""Checking and repairing a database directory without opening it: :func:`verify` lists every
problem by file and changes nothing; :func:`recover` rebuilds a lost, damaged or outdated manifest
from the segments whose checksums hold."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from mvdb.kernels.errors import CorruptionError, FormatError, InvalidInputError
from mvdb.storage import validate
from mvdb.storage._io import WriterLock, atomic_write
from mvdb.storage.files import (
    SEGMENTS,
    TMP_PREFIX,
    census,
    data_files,
    index_bytes,
    name_counter,
    record_generation,
    record_name,
    segment_path,
)
from mvdb.storage.manifest import MANIFEST, new_manifest, next_manifest, parse_manifest, read_manifest, write_manifest
from mvdb.storage.segment import SegmentReader


@dataclass
class VerifyReport:
    """What verify() found; ``ok`` when nothing."""

    problems: list[str]
    n_docs: int
    n_segments: int

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        head = f"{self.n_docs} documents in {self.n_segments} segments: "
        return head + ("OK" if self.ok else f"{len(self.problems)} problem(s)\n  " + "\n  ".join(self.problems))


def _segment_problems(path: str, seg: dict, manifest: dict) -> tuple[list[str], np.ndarray | None]:
    """Every problem of one segment the manifest names, and its live ids (None if unreadable)."""
    name = seg["name"]
    seg_path = segment_path(path, name)
    try:
        size = os.path.getsize(seg_path)
    except OSError as e:
        return [f"{name}: missing or unreadable ({e.strerror or e})"], None
    if size != seg["file_size"]:
        return [f"{name}: {size} bytes, the manifest says {seg['file_size']} (truncated or overwritten)"], None
    try:
        r = SegmentReader(seg_path)
    except Exception as e:  # noqa: BLE001 - any failure to open is a finding
        return [f"{name}: not a readable segment ({type(e).__name__}: {e})"], None
    problems, keys = [], None
    try:
        problems += r.checksum_problems()
        try:
            r.check(seg["n_docs"], seg["n_tokens"])
        except CorruptionError as e:
            problems.append(f"{name}: {str(e).split(': ', 1)[-1]}")
        wrong = r.mismatch(manifest)
        if wrong:
            problems.append(f"{name}: {wrong}")
        deleted = np.asarray(seg["deleted"], dtype=np.int64)
        live = np.ones(r.n_docs, bool)
        live[deleted[(deleted >= 0) & (deleted < r.n_docs)]] = False
        keys = r.ids[live]
    except Exception as e:  # noqa: BLE001 - a damaged file can fail in any read
        problems.append(f"{name}: unreadable ({type(e).__name__}: {e})")
    finally:
        r.close()
    return problems, keys


def verify(path) -> VerifyReport:
    """Check a database without opening it (so a damaged one can be checked): the manifest,
    every segment's presence, size, structure and checksums (tokens, ids, offsets, metadata,
    sparse vectors), their agreement with the manifest, the index files, that no live id appears
    twice, and segments beside the manifest that it does not name (newer data: an older manifest
    put back). Lists every problem by file; changes nothing."""
    path = validate.db_path(path)
    if not os.path.isdir(path):
        return VerifyReport([f"{path}: no database directory here"], 0, 0)
    try:
        manifest = read_manifest(path)
    except (CorruptionError, FormatError) as e:
        return VerifyReport([f"{MANIFEST}: {e}"], 0, 0)
    except OSError as e:
        data = data_files(path)
        hint = f"; {len(data)} data file(s) present: run `mvdb recover {path}`" if data else ""
        what = "is missing" if isinstance(e, FileNotFoundError) else f"cannot be read ({e.strerror or e})"
        return VerifyReport([f"{MANIFEST} {what}{hint}"], 0, 0)

    problems, all_keys = [], []
    for seg in manifest["segments"]:
        found, keys = _segment_problems(path, seg, manifest)
        problems += found
        if keys is not None:
            all_keys.append(keys)
    for entry in manifest.get("index_files", []):
        try:
            index_bytes(path, entry)
        except CorruptionError:
            problems.append(f"index/{entry['name']}: size or checksum does not match the manifest "
                            f"(derived data: the database rebuilds it)")
        except OSError as e:
            problems.append(f"index/{entry['name']}: {e.strerror or e} (derived data: the database rebuilds it)")
    files = census(path, manifest)
    for name in files.newer_records:
        problems.append(f"{name}: a commit (generation {record_generation(name)}) newer than {MANIFEST} (generation "
                        f"{manifest['generation']}): the manifest is older than the latest commit, and the deletes "
                        f"and settings committed since are undone in it; writers refuse; `mvdb recover {path}` "
                        f"rebuilds it keeping every committed delete")
    for name in files.unnamed:
        if name in files.newer:
            problems.append(f"{name}: a committed segment newer than {MANIFEST} (generation "
                            f"{manifest['generation']}) and not named by it: the manifest is older than the data; "
                            f"writers refuse; `mvdb recover {path}` rebuilds it keeping every committed document")
        elif name in files.unexplained:
            problems.append(f"{name}: a committed segment {MANIFEST} does not name: writers refuse; "
                            f"`mvdb recover {path}` rebuilds the manifest keeping every committed document")
        else:
            problems.append(f"{name}: not named by {MANIFEST} (kept, never deleted; `mvdb recover --force {path}` "
                            f"takes its documents in)")
    n_docs = sum(len(k) for k in all_keys)
    if all_keys:
        kinds = {k.dtype.kind for k in all_keys}
        keys = np.concatenate(all_keys) if len(kinds) == 1 else np.concatenate([k.astype(object).astype(str) for k in all_keys])
        uniq, counts = np.unique(keys, return_counts=True)
        if (counts > 1).any():
            dup = [validate.decode_id(x) for x in uniq[counts > 1][:5]]
            problems.append(f"ids: live ids appear more than once: {dup}")
        if keys.dtype.kind == "i" and len(keys) and int(keys.max()) >= manifest["next_id"]:
            problems.append(f"{MANIFEST}: next_id {manifest['next_id']} is not above the stored id {int(keys.max())} "
                            f"(auto ids would repeat stored ones)")
    return VerifyReport(problems, n_docs, len(manifest["segments"]))


def _intact(seg_dir: str, name: str, left_out: list[str]):
    """(ids, n_docs, n_tokens, layout, supersedes) of a segment whose checksums hold, else None
    (and why, in ``left_out``)."""
    try:
        r = SegmentReader(os.path.join(seg_dir, name))
    except Exception as e:  # noqa: BLE001
        left_out.append(f"{name}: left out, cannot be opened ({type(e).__name__})")
        return None
    try:
        bad = r.checksum_problems()
        if not bad:
            r.check(r.n_docs, r.n_tokens)
        if bad:
            left_out.append(f"{name}: left out, {'; '.join(bad)}")
            return None
        layout = (r.tokens.shape[1], "int8" if r.scales is not None else "float16",
                  "str" if r.ids.dtype.kind == "S" else "int")
        return r.ids.copy(), r.n_docs, r.n_tokens, layout, list(r.supersedes), r.generation or 0
    except CorruptionError as e:
        left_out.append(f"{name}: left out, {e}")
        return None
    finally:
        r.close()


def _newest_record(seg_dir: str, path: str, records: list[str], left_out: list[str]) -> dict | None:
    """The newest of the commit records ``records`` (names under segments/) whose checksum holds
    (None when there is none)."""
    for name in sorted(records, key=record_generation, reverse=True):
        try:
            with open(os.path.join(seg_dir, name), "rb") as f:
                return parse_manifest(f.read(), os.path.join(seg_dir, name), path)
        except (CorruptionError, FormatError, OSError) as e:
            left_out.append(f"{name}: commit record not used ({e})")
    return None


def recover(path, *, force: bool = False) -> VerifyReport:
    """Rebuild a lost, unreadable or outdated manifest from the segments whose checksums hold.

    Every intact segment under segments/ is taken in the order it was written (its counter),
    except those a compaction's output supersedes; when an id is in more than one, the newest copy
    wins. Segments that fail their checksums are left out, reported, and kept as
    ``segments/<name>.left-out``. When the manifest is intact but older than the segments beside it
    (a restored backup: segments it does not name, or named ones a later compaction removed), its
    deletions and settings are kept and the segments there are taken in. The deletions and
    settings come from the newest commit record instead (see files.py) when it is newer than the
    manifest, or the manifest is lost: so a restored or lost manifest costs no committed delete.
    What cannot come back: the index (rebuilt on open). A valid, current
    manifest is left alone unless ``force``; a damaged one is kept as MANIFEST.json.damaged. Takes
    the writer lock. Returns the report of :func:`verify` on the result, with the segments left out
    added to its problems."""
    path = validate.db_path(path)
    seg_dir = os.path.join(path, SEGMENTS)
    if not os.path.isdir(seg_dir):
        raise FileNotFoundError(f"{path}: no {SEGMENTS}/ folder here: nothing to recover")
    lock = WriterLock(path)
    try:
        mpath = os.path.join(path, MANIFEST)
        old = None
        if os.path.lexists(mpath):
            try:
                old = read_manifest(path)
            except (CorruptionError, FormatError):
                os.replace(mpath, mpath + ".damaged")
            else:
                missing = [g["name"] for g in old["segments"]
                           if not os.path.exists(segment_path(path, g["name"]))]
                found = census(path, old)
                if not force and not found.outdated and not missing:
                    raise InvalidInputError(f"{path}: its {MANIFEST} is intact; nothing to recover "
                                            f"(force=True rebuilds it anyway)")
                for name in found.unfinished:  # committed: give them their final names first
                    os.replace(os.path.join(seg_dir, TMP_PREFIX + name), os.path.join(seg_dir, name))
        left_out, kept, bad = [], {}, []
        records = [n for n in os.listdir(seg_dir) if record_generation(n) is not None]
        newest = _newest_record(seg_dir, path, records, left_out)
        if newest is not None and (old is None or newest["generation"] > old["generation"]):
            old = newest  # the manifest is lost or older than the latest commit: its record has the deletes
        names = sorted(n for n in os.listdir(seg_dir) if n.endswith(".h5") and not n.startswith(TMP_PREFIX))
        for name in names:
            got = _intact(seg_dir, name, left_out)
            if got is not None:
                kept[name] = got
            else:
                bad.append(name)
        dropped = set((old or {}).get("retired", ()))
        for got in kept.values():
            dropped |= set(got[4])  # a compaction's output supersedes its inputs
        layout = None
        order = sorted((n for n in kept if n not in dropped), key=name_counter)
        usable = []
        for name in order:
            if layout is not None and kept[name][3] != layout:
                left_out.append(f"{name}: left out, dim/dtype/id kind differ from the other segments")
                bad.append(name)
                continue
            layout = kept[name][3]
            usable.append(name)
        old_deleted = {s["name"]: set(s["deleted"]) for s in (old or {}).get("segments", [])}
        seen, segments = set(), []
        for name in reversed(usable):  # newest first: its copy of an id wins
            ids, n_docs, n_tokens = kept[name][:3]
            keys = ids.tolist()
            deleted = [i for i, k in enumerate(keys) if k in seen or i in old_deleted.get(name, ())]
            seen.update(keys)
            segments.append({"name": name, "n_docs": n_docs, "n_tokens": n_tokens,
                             "file_size": os.path.getsize(os.path.join(seg_dir, name)), "deleted": deleted})
        segments.reverse()
        dim, dtype, id_type = layout or (None, None, None)
        m = new_manifest(dim, dtype or (old or {}).get("dtype", "float16"))
        ints = [k for k in seen if isinstance(k, int)]
        # past every commit seen: the manifest's (or record's), the segments', and any record's name
        generation = max([(old or {}).get("generation", 0)] + [kept[n][5] for n in kept]
                         + [record_generation(n) for n in records])
        m.update(id_type=id_type, segments=segments, generation=generation,
                 next_id=max([(old or {}).get("next_id", 0)] + [k + 1 for k in ints]),
                 segment_counter=max([name_counter(n) for n in names] + [(old or {}).get("segment_counter", 0)]))
        if old and old.get("config"):
            m["config"] = old["config"]
        m["retired"] = sorted(dropped & set(names))  # superseded: the next writer removes them
        for name in bad:  # kept for inspection, under a name no reader or writer takes for a segment
            os.replace(os.path.join(seg_dir, name), os.path.join(seg_dir, name + ".left-out"))
        # the rebuilt manifest's own record: the deletes it keeps stay kept if an older manifest is put back again
        m["record"] = record_name(m["generation"] + 1)
        atomic_write(os.path.join(seg_dir, m["record"]), next_manifest(m)[1])
        write_manifest(path, m)
    finally:
        lock.release()
    report = verify(path)
    report.problems = left_out + report.problems
    return report

