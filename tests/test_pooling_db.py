"""Token pooling in the database (``mvdb.open(..., pool_factor=)``, ``add``, ``add_texts``,
``mvdb ingest --pool-factor``): recorded, applied to documents only, refused where it conflicts,
and explained back to the words a pooled vector stands for."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import mvdb
from mvdb.cli import main as cli
from mvdb.errors import InvalidInputError, InvalidTypeError


def _docs(n=40, dim=16, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((6, dim))
    out = []
    for _ in range(n):
        L = int(rng.integers(3, 40))
        x = centers[rng.integers(0, 6, L)] + 0.7 * rng.standard_normal((L, dim))
        out.append((x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32))
    return out


def _maxsim(q, d):
    return float((q @ d.T).max(axis=1).sum())


def test_a_pooled_database_stores_the_pooled_tokens_and_searches_them_exactly(tmp_path):
    docs = _docs()
    with mvdb.open(tmp_path / "db", device="cpu", pool_factor=2) as db:
        ids = db.add(docs)
        assert db.stats()["pooling"] == {"pool_factor": 2, "protected": 1}
        want = mvdb.pool(docs, 2)
        got = db.get(ids)
        assert [g.shape for g in got] == [w.shape for w in want]
        assert db.stats()["tokens"] == sum(w.shape[0] for w in want) < sum(d.shape[0] for d in docs)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, atol=2e-3)  # float16 storage
        q = docs[7][:5]  # queries are never pooled
        exact = sorted(((_maxsim(q, g), i) for g, i in zip(got, ids)), reverse=True)[:5]
        hits = db.search(q, k=5, exact=True)
        assert [h.id for h in hits] == [i for _, i in exact]
        np.testing.assert_allclose([h.score for h in hits], [s for s, _ in exact], rtol=1e-3, atol=1e-3)
        assert [h.id for h in db.search(q, k=5)] == [h.id for h in hits]  # the index's candidates cover 40


def test_the_pooling_is_recorded_and_a_conflict_is_refused_leaving_the_data(tmp_path):
    docs = _docs()
    path = tmp_path / "db"
    with mvdb.open(path, device="cpu", pool_factor=3, pool_protected=0) as db:
        db.add(docs[:10])
        before = db.stats()["tokens"]
        with pytest.raises(InvalidInputError, match=r"pool_factor 3, 0 protected .*pool_factor 2, 1 protected"):
            db.add(docs[10:], pool_factor=2)
        with pytest.raises(InvalidInputError, match="pool_factor 3"):
            db.add(docs[10:], pool_factor=1)  # 1: no pooling, which conflicts as well
        assert (len(db), db.stats()["tokens"]) == (10, before)
        db.add(docs[10:12], pool_factor=3, pool_protected=0)  # the recorded one: fine
        db.add(docs[12:14])  # none given: the recorded one applies
        assert db.stats()["tokens"] == before + sum(p.shape[0] for p in mvdb.pool(docs[10:14], 3, protected=0))
    with pytest.raises(InvalidInputError, match="one database pools its documents one way"):
        mvdb.open(path, device="cpu", pool_factor=4)
    with mvdb.open(path, device="cpu", read_only=True) as db:
        assert db.pooling == {"pool_factor": 3, "protected": 0} and len(db) == 14


def test_an_unpooled_database_refuses_pooling_but_an_empty_one_takes_it(tmp_path):
    docs = _docs()
    with mvdb.open(tmp_path / "plain", device="cpu") as db:
        db.add(docs[:5])
        with pytest.raises(InvalidInputError, match="holds 5 documents stored without pooling"):
            db.add(docs[5:], pool_factor=2)
        db.add(docs[5:7], pool_factor=1)  # asks for none: nothing to record
        assert db.pooling is None and len(db) == 7
    with pytest.raises(InvalidInputError, match="holds 7 documents stored without pooling"):
        mvdb.open(tmp_path / "plain", device="cpu", pool_factor=2)
    with mvdb.open(tmp_path / "empty", device="cpu") as db:
        db.add(docs[:4], pool_factor=2)  # the first add records it
        assert db.pooling == {"pool_factor": 2, "protected": 1}
    mvdb.open(tmp_path / "ro", device="cpu").close()
    with pytest.raises(InvalidInputError, match="read_only"):
        mvdb.open(tmp_path / "ro", device="cpu", read_only=True, pool_factor=2)


@pytest.mark.parametrize("kw, err", [({"pool_factor": 0.5}, InvalidInputError), ({"pool_factor": "2"}, InvalidTypeError),
                                     ({"pool_factor": True}, InvalidTypeError),
                                     ({"pool_factor": float("inf")}, InvalidInputError),
                                     ({"pool_factor": 2, "pool_protected": -1}, InvalidInputError),
                                     ({"pool_factor": 2, "pool_protected": 1.5}, InvalidTypeError),
                                     ({"pool_protected": 2}, InvalidInputError)])
def test_bad_pooling_arguments_are_refused_before_anything_is_written(tmp_path, kw, err):
    with pytest.raises(err, match="pool_"):
        mvdb.open(tmp_path / "db", device="cpu", **kw)
    with mvdb.open(tmp_path / "db2", device="cpu") as db:
        with pytest.raises(err, match="pool_"):
            db.add(_docs(3), **kw)
        assert len(db) == 0 and db.pooling is None


def test_a_sharded_database_pools_before_placing_and_records_on_every_shard(tmp_path):
    docs = _docs(30)
    with mvdb.open(tmp_path / "db", devices=["cpu", "cpu"], pool_factor=2) as db:
        ids = db.add(docs)
        assert db.stats()["pooling"] == {"pool_factor": 2, "protected": 1}
        assert all(s.pooling == {"pool_factor": 2, "protected": 1} for s in db.shards)
        want = mvdb.pool(docs, 2)
        assert [g.shape for g in db.get(ids)] == [w.shape for w in want]
        with pytest.raises(InvalidInputError, match="one database pools its documents one way"):
            db.add(docs[:2], pool_factor=3)
    with mvdb.open(tmp_path / "late", devices=["cpu", "cpu"]) as db:
        db.add(docs[:1], pool_factor=2)  # one shard gets the document, both record the pooling
        assert all(s.pooling == {"pool_factor": 2, "protected": 1} for s in db.shards)


def test_ingest_pools_records_and_refuses_another_factor(tmp_path):
    docs = _docs(25)
    lengths = np.array([d.shape[0] for d in docs])
    np.savez(tmp_path / "docs.npz", tokens=np.concatenate(docs), lengths=lengths)
    db = str(tmp_path / "db")
    run = CliRunner().invoke
    r = run(cli, ["ingest", db, str(tmp_path / "docs.npz"), "--pool-factor", "2", "--no-index", "--device", "cpu",
                  "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output.strip().splitlines()[-1])
    pooled = sum(p.shape[0] for p in mvdb.pool(docs, 2))
    assert summary["tokens_added"] == pooled
    with mvdb.open(db, device="cpu") as d:
        assert d.pooling == {"pool_factor": 2, "protected": 1} and d.stats()["tokens"] == pooled
    r = run(cli, ["ingest", db, str(tmp_path / "docs.npz"), "--pool-factor", "3", "--no-index", "--device", "cpu"])
    assert r.exit_code != 0 and "pooled with pool_factor 2" in r.output


def test_an_export_of_a_pooled_database_ingests_as_it_was_stored(tmp_path):
    """mvdb export / get --out write X.pooling.json: a new database stores the documents as they
    are (not pooled twice) and records their pooling; what conflicts with it is refused, the data
    untouched."""
    run = CliRunner().invoke
    src = str(tmp_path / "src")
    with mvdb.open(src, device="cpu", pool_factor=2) as d:
        ids = d.add(_docs(20), metadata=[{"i": i} for i in range(20)])
        stored = d.get(ids)
    r = run(cli, ["export", src, str(tmp_path / "out.npy"), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output.strip().splitlines()[-1])["pooling"] == {"pool_factor": 2, "protected": 1}
    assert json.loads((tmp_path / "out.pooling.json").read_text()) == {"pool_factor": 2, "protected": 1}
    new = str(tmp_path / "new")
    r = run(cli, ["ingest", new, str(tmp_path / "out.npy"), "--metadata", str(tmp_path / "out.metadata.jsonl"),
                  "--no-index", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    with mvdb.open(new, device="cpu") as d:
        assert d.pooling == {"pool_factor": 2, "protected": 1}
        for a, b in zip(d.get(ids), stored):  # stored as exported: not pooled again
            np.testing.assert_array_equal(a, b)
        more = d.add(_docs(3, seed=5))  # later adds pool as recorded
        assert [x.shape[0] for x in d.get(more)] == [p.shape[0] for p in mvdb.pool(_docs(3, seed=5), 2)]
    # mvdb get --out carries it too
    r = run(cli, ["get", src, str(ids[0]), str(ids[1]), "--out", str(tmp_path / "two.npy")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "two.pooling.json").read_text()) == {"pool_factor": 2, "protected": 1}
    # refused: another --pool-factor; a database of unpooled documents; pooled and unpooled sources together
    r = run(cli, ["ingest", str(tmp_path / "x"), str(tmp_path / "out.npy"), "--pool-factor", "3", "--device", "cpu"])
    assert r.exit_code != 0 and "holds documents pooled with pool_factor 2" in r.output
    assert not (tmp_path / "x").exists()
    plain = str(tmp_path / "plain")
    with mvdb.open(plain, device="cpu") as d:
        d.add(_docs(4, seed=9))
    r = run(cli, ["ingest", plain, str(tmp_path / "out.npy"), "--no-index", "--device", "cpu"])
    assert r.exit_code != 0 and "stored without pooling" in r.output
    with mvdb.open(plain, device="cpu") as d:
        assert len(d) == 4 and d.pooling is None
    lengths = [x.shape[0] for x in _docs(4, seed=9)]
    np.savez(tmp_path / "unpooled.npz", tokens=np.concatenate(_docs(4, seed=9)), lengths=lengths)
    r = run(cli, ["ingest", str(tmp_path / "y"), str(tmp_path / "out.npy"), str(tmp_path / "unpooled.npz"),
                  "--device", "cpu"])
    assert r.exit_code != 0 and "one database pools its documents one way" in r.output
    # a side file that is not a pooling record
    (tmp_path / "out.pooling.json").write_text('{"pool_factor": 0}')
    r = run(cli, ["ingest", str(tmp_path / "z"), str(tmp_path / "out.npy"), "--device", "cpu"])
    assert r.exit_code != 0 and "out.pooling.json: not a pooling record" in r.output


class HierarchicalTokenPooling:  # the name of Sentence Transformers 6's module
    pass


class _PoolingModel:
    """A callable model that carries its own token pooling module."""

    _modules = {"0": object(), "1": HierarchicalTokenPooling()}

    def __call__(self, texts, is_query):
        return [np.ones((3, 8), np.float32) for _ in texts]


def test_a_model_that_pools_itself_is_not_pooled_again(tmp_path):
    enc = mvdb.Encoder(_PoolingModel(), name="pools")
    assert enc.pools_tokens == "HierarchicalTokenPooling"
    with pytest.raises(InvalidInputError, match="pooled twice"):
        mvdb.open(tmp_path / "db", device="cpu", encoder=enc, pool_factor=2)
    with mvdb.open(tmp_path / "db", device="cpu") as db:
        assert db.pooling is None  # the refused open recorded nothing
    with pytest.raises(InvalidInputError, match="pooled twice"):
        mvdb.open(tmp_path / "sh", devices=["cpu", "cpu"], encoder=enc, pool_factor=2)
    with mvdb.open(tmp_path / "sh", devices=["cpu", "cpu"]) as db:
        assert db.pooling is None and all(s.pooling is None for s in db.shards)
    with mvdb.open(tmp_path / "db2", device="cpu", encoder=enc) as db:
        with pytest.raises(InvalidInputError, match="pooled twice"):
            db.add_texts(["a b c"], pool_factor=2)
        db.add_texts(["a b c"])  # its own pooling only
        assert db.pooling is None and len(db) == 1


def test_explain_names_every_word_a_pooled_vector_stands_for(tmp_path):
    from test_text import _texts, _tiny_sentence_transformer

    from mvdb.explain import _merged  # touching word pieces ("com" + "##press") as one span

    model = _tiny_sentence_transformer(tmp_path / "tiny", "cpu")
    texts = _texts(20)
    with mvdb.open(tmp_path / "db", device="cpu", encoder=model, pool_factor=2) as db:
        ids = db.add_texts(texts, store_text=True)
        enc = db.encoder
        full = enc.encode(texts[:1], is_query=False)[0]
        stored = db.get(ids[:1])[0]
        assert stored.shape[0] == mvdb.pool([full], 2)[0].shape[0] < full.shape[0]
        spans = enc.token_spans(texts[:1])[0]
        _, groups = mvdb.pool([full], 2, return_groups=True)
        e = db.explain(texts[0].split()[0] + " " + texts[0].split()[-1], ids[0])
        covered = set()
        for m in e.matches:
            want = _merged(sorted(tuple(spans[t]) for t in np.flatnonzero(groups[0] == m.doc_token)
                                           if spans[t] is not None))
            assert (m.doc_spans or []) == want
            if want:
                assert m.doc_span == want[0]
                assert m.doc_text == " ".join(texts[0][a:b] for a, b in want)
                covered |= set(want)
        assert covered  # the query's words matched words of the document
        many = [m for m in e.matches if m.doc_spans and len(m.doc_spans) > 1]
        # every pooled vector's spans, over all vectors: each word of the text once
        all_spans = [tuple(s) for s in spans if s is not None]
        per_vector = [sorted(tuple(spans[t]) for t in np.flatnonzero(groups[0] == r) if spans[t] is not None)
                      for r in range(stored.shape[0])]
        assert sorted(s for g in per_vector for s in g) == sorted(all_spans)
        assert any(len(g) > 1 for g in per_vector) or many == []


def test_shards_that_disagree_on_pooling_are_refused(tmp_path):
    from mvdb.errors import FormatError

    docs = _docs(4)
    with mvdb.open(tmp_path / "db", devices=["cpu", "cpu"]) as db:
        db.add(docs[:1])
        holder = next(s for s in db.shards if len(s))
        other = next(s for s in db.shards if not len(s))
        other_path = other.store.path
    with mvdb.open(other_path, device="cpu", pool_factor=2):  # one shard written on its own
        pass
    with pytest.raises(FormatError, match="disagree on token pooling"):
        mvdb.open(tmp_path / "db", devices=["cpu", "cpu"])
    assert holder is not None
    # the way out the error names: an export records no pooling, and the new database stores the
    # documents as they are
    r = CliRunner().invoke(cli, ["export", str(tmp_path / "db"), str(tmp_path / "out.npy")])
    assert r.exit_code == 0 and "disagree on token pooling" in r.output, r.output
    assert not (tmp_path / "out.pooling.json").exists()
    r = CliRunner().invoke(cli, ["ingest", str(tmp_path / "new"), str(tmp_path / "out.npy"), "--device", "cpu"])
    assert r.exit_code == 0, r.output
    with mvdb.open(tmp_path / "new", device="cpu") as d:
        assert d.pooling is None and len(d) == 1
        np.testing.assert_allclose(d.get(d.store.ids())[0], docs[0], atol=1e-3)


def test_a_sharded_database_reports_its_pooling_from_the_open(tmp_path):
    with mvdb.open(tmp_path / "db", devices=["cpu", "cpu"], pool_factor=3) as db:
        assert db.stats()["pooling"] == {"pool_factor": 3, "protected": 1}


def test_an_ingest_that_stores_nothing_records_no_pooling(tmp_path):
    docs = _docs(5)
    bad = [d.copy() for d in docs]
    bad[2][1, 0] = np.nan
    np.savez(tmp_path / "bad.npz", tokens=np.concatenate(bad), lengths=np.array([len(d) for d in bad]))
    mvdb.open(tmp_path / "db", device="cpu").close()  # an existing, empty database
    r = CliRunner().invoke(cli, ["ingest", str(tmp_path / "db"), str(tmp_path / "bad.npz"), "--pool-factor", "2",
                                 "--no-index", "--device", "cpu"])
    assert r.exit_code != 0 and "document 2" in r.output, r.output  # named as given, before pooling
    with mvdb.open(tmp_path / "db", device="cpu") as db:
        assert len(db) == 0 and db.pooling is None


def test_values_the_store_cannot_hold_are_named_by_the_document_as_given(tmp_path):
    docs = _docs(4)
    big = [d.copy() for d in docs]
    big[1][5, 3] = 1e6  # past float16
    with mvdb.open(tmp_path / "db", device="cpu", pool_factor=2) as db:
        with pytest.raises(InvalidInputError, match=r"document 1: value 1e\+06 at token 5 overflows float16"):
            db.add(big)
        assert len(db) == 0
