"""Random add / delete / compact / reopen sequences checked against a plain in-memory model."""

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, precondition, rule

import glob
import os

from mvdb import CorruptionError, DuplicateIdError, UnknownIdError
from mvdb.storage import Store, recover, verify

DIM = 8


class StoreMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="mvdb-stateful-")
        self.store = Store(self.dir + "/db", dim=DIM, segment_tokens=40)
        self.model = {}  # id -> (float16 tokens, metadata)
        self.history = {}  # every id ever added -> its latest (tokens, metadata): what a recovery may bring back
        self.backup = None  # (MANIFEST.json bytes, the model then)
        self.next_auto = 0

    ids = Bundle("ids")

    @rule(target=ids, lengths=st.lists(st.integers(1, 12), min_size=1, max_size=6), seed=st.integers(0, 2**16),
          user=st.booleans(), meta=st.booleans())
    def add(self, lengths, seed, user, meta):
        rng = np.random.default_rng(seed)
        docs = [rng.standard_normal((n, DIM)).astype(np.float32) for n in lengths]
        metadata = [{"seed": seed, "k": k} for k in range(len(docs))] if meta else None
        if user:
            ids = [int(x) for x in rng.choice(10_000, size=len(docs), replace=False)]
            if any(i in self.model for i in ids):
                with pytest.raises(DuplicateIdError):
                    self.store.add(docs, ids=ids, metadata=metadata)
                return multiple()
        else:
            ids = None
        got = self.store.add(docs, ids=ids, metadata=metadata)
        if ids is None:
            assert got == list(range(self.next_auto, self.next_auto + len(docs)))
        else:
            assert got == ids
        for k, (i, d) in enumerate(zip(got, docs)):
            self.model[i] = self.history[i] = (d.astype(np.float16), metadata[k] if metadata else None)
        self.next_auto = max([self.next_auto] + [i + 1 for i in got])
        return multiple(*got)

    @rule(doc_ids=st.lists(ids, min_size=1, max_size=4, unique=True))
    def delete(self, doc_ids):
        if all(i in self.model for i in doc_ids):
            self.store.delete(doc_ids)
            for i in doc_ids:
                del self.model[i]
        else:
            before = self.store.ids()
            with pytest.raises(UnknownIdError):
                self.store.delete(doc_ids)
            assert self.store.ids() == before

    @rule()
    def compact(self):
        self.store.compact()

    @rule()
    def reopen(self):
        self.store.close()
        self.store = Store(self.dir + "/db")

    @rule()
    def back_up_the_manifest(self):
        with open(self.dir + "/db/MANIFEST.json", "rb") as f:
            self.backup = (f.read(), dict(self.model))

    @precondition(lambda self: self.backup is not None)
    @rule()
    def put_the_backup_back(self):
        """An older manifest put back never costs a committed document: either nothing was
        committed beside it since (the writer opens on the backup's state) or the writer refuses,
        and recover() brings back the committed state: every document, every deletion."""
        self.store.close()
        with open(self.dir + "/db/MANIFEST.json", "wb") as f:
            f.write(self.backup[0])
        try:
            self.store = Store(self.dir + "/db")
        except CorruptionError:
            assert not verify(self.dir + "/db").ok
            report = recover(self.dir + "/db")
            assert report.ok, report
            self.store = Store(self.dir + "/db")
            assert set(self.store.ids()) == set(self.model)
        else:
            assert set(self.store.ids()) == set(self.backup[1])
            self.model = {i: self.history[i] for i in self.backup[1]}
        self.next_auto = self.store.manifest["next_id"]
        self.backup = None
        self.read_all()

    @precondition(lambda self: any(m is not None for _, m in self.model.values()))
    @rule(data=st.data())
    def damage_metadata_then_mend_it(self, data):
        """A flipped byte of stored metadata is a CorruptionError naming the segment, never an answer."""
        segs = sorted(glob.glob(self.dir + "/db/segments/seg-*.h5"))
        hits = [(s, raw.find(b'"seed":')) for s in segs for raw in [open(s, "rb").read()] if b'"seed":' in raw]
        seg, at = data.draw(st.sampled_from(hits))
        self.store.close()  # HDF5 shares an open file's caches within a process: damage what nobody holds
        with open(seg, "r+b") as f:
            f.seek(at + 1)
            before = f.read(1)
            f.seek(at + 1)
            f.write(b"S")
        try:
            with Store(self.dir + "/db", read_only=True) as fresh:
                snap = fresh.snapshot()
                with pytest.raises(CorruptionError, match=os.path.basename(seg)):
                    snap.metadata(np.arange(snap.n_rows))  # every row, as a filter reads them
            assert any("metadata checksum mismatch" in p for p in verify(self.dir + "/db").problems)
        finally:
            with open(seg, "r+b") as f:
                f.seek(at + 1)
                f.write(before)
            self.store = Store(self.dir + "/db")


    def read_all(self):
        keys = sorted(self.model)
        if keys:
            p = self.store.gather(keys)
            for k, i in enumerate(keys):
                assert np.array_equal(p.tokens[p.offsets[k] : p.offsets[k + 1]], self.model[i][0])
            assert self.store.metadata(keys) == [self.model[i][1] for i in keys]

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def read_back(self, data):

        keys = sorted(self.model)
        pick = data.draw(st.lists(st.sampled_from(keys), min_size=1, max_size=5))
        p = self.store.gather(pick)
        for k, i in enumerate(pick):
            assert np.array_equal(p.tokens[p.offsets[k] : p.offsets[k + 1]], self.model[i][0])
        assert self.store.metadata(pick) == [self.model[i][1] for i in pick]

    @invariant()
    def same_ids(self):
        assert sorted(self.store.ids()) == sorted(self.model)
        assert len(self.store) == len(self.model)

    def teardown(self):
        assert self.store.verify().ok
        self.store.close()
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)


def multiple(*values):
    from hypothesis.stateful import multiple as _multiple

    return _multiple(*values)


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(  # MVDB_STATEFUL_EXAMPLES: make test-long runs more
    max_examples=int(os.environ.get("MVDB_STATEFUL_EXAMPLES", 25)), stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow]
)
