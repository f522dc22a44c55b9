"""Random add / delete / compact / reopen sequences checked against a plain in-memory model."""

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, precondition, rule

from mvdb import DuplicateIdError, UnknownIdError
from mvdb.storage import Store

DIM = 8


class StoreMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="mvdb-stateful-")
        self.store = Store(self.dir + "/db", dim=DIM, segment_tokens=40)
        self.model = {}  # id -> (float16 tokens, metadata)
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
            self.model[i] = (d.astype(np.float16), metadata[k] if metadata else None)
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
TestStoreMachine.settings = settings(
    max_examples=25, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
