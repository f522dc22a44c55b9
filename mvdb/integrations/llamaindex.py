"""mvdb for LlamaIndex: a vector store that encodes node text itself, and its retriever.

    from mvdb.integrations.llamaindex import MvdbVectorStore
    store = MvdbVectorStore(mvdb.open("docs.mvdb"), encoder=model)
    store.add([TextNode(text="a text", metadata={"lang": "en"}, id_="a"), ...])   # or Documents
    retriever = store.as_retriever(similarity_top_k=4, filters=MetadataFilters(filters=[
        MetadataFilter(key="lang", value="en")]))
    nodes = retriever.retrieve("a question")            # [NodeWithScore], MaxSim scores
    store.delete_nodes(["a"]); store.delete(ref_doc_id)

Late interaction keeps one vector per token, which LlamaIndex's single-vector ``BaseEmbedding``
cannot carry, so :class:`MvdbVectorStore` is a ``BasePydanticVectorStore`` with
``stores_text=True`` and ``is_embedding_query=False``: ``add`` encodes each node's text (its
content without metadata) with the multi-vector encoder (an :class:`mvdb.Encoder`, a Sentence
Transformers or PyLate model, or a callable ``f(texts, is_query)``) and ``query`` encodes
``query_str``. Nothing here reads LlamaIndex's ``Settings.embed_model`` or ``Settings.llm``: use
:class:`MvdbRetriever` (``store.as_retriever()``) rather than ``VectorStoreIndex``, which embeds
nodes with a single-vector model.

Nodes are stored with ``add_texts(store_text=True)``: the text under ``"text"``, the node's
metadata flat beside it (what filters see) and the node itself (relationships, ``ref_doc_id``,
templates) as LlamaIndex's vector stores keep it (``node_to_metadata_dict``), so they come back
as they went in. Documents added to the database without LlamaIndex come back as ``TextNode`` s
with the stored text and metadata. Ids are the nodes' ids, kept as they are (over a database whose
ids are ints, their decimal strings); an id already stored is refused (``mvdb.DuplicateIdError``)
and nothing is stored.

Filters (``MetadataFilters``) map to mvdb's ``where``: ``==`` (ExactMatch), ``!=``, ``>``,
``>=``, ``<``, ``<=``, ``in``, ``nin``, ``is_empty`` (missing, null, ``""`` or ``[]``), nested
``MetadataFilters`` with ``and`` / ``or`` / ``not`` (none of them holds). ``any``, ``all``,
``contains``, ``text_match`` and ``text_match_insensitive`` are refused with an
``mvdb.InvalidInputError``.
"""

from __future__ import annotations

from typing import Any

try:
    from llama_index.core.bridge.pydantic import PrivateAttr
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import BaseNode, Document, MetadataMode, NodeWithScore, QueryBundle, TextNode
    from llama_index.core.vector_stores.types import (
        BasePydanticVectorStore,
        FilterCondition,
        FilterOperator,
        MetadataFilter,
        MetadataFilters,
        VectorStoreQuery,
        VectorStoreQueryMode,
        VectorStoreQueryResult,
    )
    from llama_index.core.vector_stores.utils import metadata_dict_to_node, node_to_metadata_dict
except ImportError as e:  # pragma: no cover - the message says what to install
    raise ImportError(f'mvdb.integrations.llamaindex needs llama-index-core: pip install "mvdb[llamaindex]" '
                      f'({e})') from None

from mvdb.errors import InvalidInputError, InvalidTypeError
from mvdb.integrations._text_store import TextStore
from mvdb.text import check_record

__all__ = ["MvdbRetriever", "MvdbVectorStore", "llama_where"]

_OPS = {FilterOperator.EQ: "$eq", FilterOperator.NE: "$ne", FilterOperator.GT: "$gt", FilterOperator.GTE: "$gte",
        FilterOperator.LT: "$lt", FilterOperator.LTE: "$lte", FilterOperator.IN: "$in", FilterOperator.NIN: "$nin"}
_SUPPORTED = ", ".join([*(o.value for o in _OPS), FilterOperator.IS_EMPTY.value])


def llama_where(filters, at: str = "filters") -> dict | None:
    """LlamaIndex ``MetadataFilters`` -> mvdb ``where`` (None for no filter); see the module docstring."""
    if filters is None:
        return None
    if not isinstance(filters, MetadataFilters):
        raise InvalidTypeError(f"{at}: expected llama_index MetadataFilters, got {type(filters).__name__}")
    if not filters.filters:
        if at == "filters":
            return None
        raise InvalidInputError(f"{at}: expected at least one filter in a nested MetadataFilters, got none")
    parts = [_one(f, f"{at}.filters[{i}]") for i, f in enumerate(filters.filters)]
    cond = filters.condition or FilterCondition.AND
    if cond == FilterCondition.AND:
        return parts[0] if len(parts) == 1 else {"$and": parts}
    if cond == FilterCondition.OR:
        return {"$or": parts}
    if cond == FilterCondition.NOT:
        return {"$not": {"$or": parts}}
    raise InvalidInputError(f"{at}.condition: expected and, or or not, got {cond!r}")  # pragma: no cover


def _one(f, at: str) -> dict:
    if isinstance(f, MetadataFilters):
        return llama_where(f, at)
    if not isinstance(f, MetadataFilter):
        raise InvalidTypeError(f"{at}: expected a MetadataFilter or MetadataFilters, got {type(f).__name__}")
    op, key, value = f.operator, f.key, f.value
    if op in _OPS:
        if op in (FilterOperator.IN, FilterOperator.NIN) and not isinstance(value, list):
            raise InvalidInputError(f"{at}: operator {op.value!r} expects a list value, got {value!r:.60}")
        return {key: {_OPS[op]: value}}
    if op == FilterOperator.IS_EMPTY:
        return {"$or": [{key: {"$exists": False}}, {key: {"$eq": None}}, {key: {"$eq": ""}}, {key: {"$eq": []}}]}
    raise InvalidInputError(f"{at}: mvdb cannot express the operator {op.value!r} on {key!r}; expected one of "
                            f"{_SUPPORTED}")


def _node(doc_id: str, text: str, meta: dict) -> BaseNode:
    """A stored document as the node it was (or a TextNode of its text and metadata)."""
    if "_node_content" not in meta:
        return TextNode(id_=doc_id, text=text, metadata=meta)
    if meta.get("_node_type") == Document.class_name():
        node = Document.from_json(meta["_node_content"])
        node.set_content(text)
        return node
    return metadata_dict_to_node(meta, text=text)


class MvdbVectorStore(BasePydanticVectorStore):
    """A LlamaIndex vector store over an mvdb database (``mvdb.open(...)`` or any database-shaped
    class with the text methods); ``encoder``: the multi-vector model of the texts (default: the
    one the database was opened with). See the module docstring."""

    stores_text: bool = True
    is_embedding_query: bool = False
    flat_metadata: bool = False
    _store: TextStore = PrivateAttr()

    def __init__(self, db, encoder=None, **kwargs: Any):
        super().__init__(**kwargs)
        self._store = TextStore(db, encoder, "MvdbVectorStore")

    @classmethod
    def class_name(cls) -> str:
        return "MvdbVectorStore"

    @property
    def client(self):
        """The mvdb database."""
        return self._store.db

    @property
    def encoder(self):
        """The :class:`mvdb.Encoder` that encodes nodes and queries."""
        return self._store.encoder

    def add(self, nodes, **kwargs: Any) -> list[str]:
        """Encode and store ``nodes`` (``TextNode`` s, ``Document`` s) in one commit -> their ids."""
        if kwargs:
            raise InvalidTypeError(f"add: unexpected keywords {sorted(kwargs)}")
        if isinstance(nodes, BaseNode) or not isinstance(nodes, (list, tuple)):
            raise InvalidTypeError(f"nodes: expected a list of nodes, got {type(nodes).__name__}")
        for i, n in enumerate(nodes):
            if not isinstance(n, BaseNode):
                raise InvalidTypeError(f"nodes[{i}]: expected a llama_index node (TextNode, Document), got "
                                       f"{type(n).__name__}")
        if not nodes:
            return []
        texts = [n.get_content(metadata_mode=MetadataMode.NONE) for n in nodes]
        metadata = [node_to_metadata_dict(n, remove_text=True, flat_metadata=self.flat_metadata) for n in nodes]
        keys = self._store.new_keys([n.node_id for n in nodes], len(nodes))
        return self._store.add(texts, metadata, keys)

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Remove every node whose source document is ``ref_doc_id`` (none: nothing happens)."""
        if delete_kwargs:
            raise InvalidTypeError(f"delete: unexpected keywords {sorted(delete_kwargs)}")
        if not isinstance(ref_doc_id, str):
            raise InvalidTypeError(f"ref_doc_id: expected a str, got {type(ref_doc_id).__name__}")
        keys = self._store.keys_where({"ref_doc_id": ref_doc_id})
        if keys:
            self._store.db.delete(keys)

    def _selected(self, node_ids, filters, what: str) -> list:
        """Stored ids among ``node_ids`` (all when None) that match ``filters`` (all when None)."""
        where = llama_where(filters)
        if node_ids is None:
            return self._store.keys_where(where)
        if what == "delete":  # every one must exist: the database's delete says which do not
            keys = list(dict.fromkeys(self._store.keys(node_ids, "node_ids", strict=True)))
        else:
            keys = self._store.present(self._store.keys(node_ids, "node_ids"))
        if where is not None:
            matching = set(self._store.keys_where(where))
            keys = [k for k in keys if k in matching]
        return keys

    def delete_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None,
                     **delete_kwargs: Any) -> None:
        """Remove the nodes ``node_ids`` (all or none: an unknown id raises ``mvdb.UnknownIdError``)
        that match ``filters``, or with ``node_ids=None`` every node that matches ``filters``."""
        if delete_kwargs:
            raise InvalidTypeError(f"delete_nodes: unexpected keywords {sorted(delete_kwargs)}")
        if node_ids is None and filters is None:
            raise InvalidInputError("delete_nodes: expected node_ids= or filters=, got neither (clear() removes "
                                    "every node)")
        keys = self._selected(node_ids, filters, "delete")
        if keys:
            self._store.db.delete(keys)

    def clear(self) -> None:
        """Remove every node."""
        keys = self._store.keys_where(None)
        if keys:
            self._store.db.delete(keys)

    def get_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None) -> list[BaseNode]:
        """The stored nodes among ``node_ids`` (unknown ones left out; None: all) that match ``filters``."""
        keys = self._selected(node_ids, filters, "get")
        return [_node(i, text, meta) for i, text, meta in self._store.records(keys)]

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """The ``similarity_top_k`` best nodes for ``query.query_str`` among those that match
        ``filters``, ``doc_ids`` (their source documents) and ``node_ids``; keywords: mvdb's search
        options (``n_candidates``, ``nprobe``, ``k_tokens``, ``exact``)."""
        if not isinstance(query, VectorStoreQuery):
            raise InvalidTypeError(f"query: expected a VectorStoreQuery, got {type(query).__name__}")
        if query.mode != VectorStoreQueryMode.DEFAULT:
            raise InvalidInputError(f"query.mode: expected {VectorStoreQueryMode.DEFAULT.value!r} (MaxSim over "
                                    f"token vectors), got {getattr(query.mode, 'value', query.mode)!r}")
        if not isinstance(query.query_str, str):
            raise InvalidInputError("query.query_str: expected the query text (this store encodes it with its "
                                    f"multi-vector encoder), got {type(query.query_str).__name__}")
        where = llama_where(query.filters)
        if query.doc_ids is not None:
            docs = {"ref_doc_id": {"$in": list(query.doc_ids)}}
            where = docs if where is None else {"$and": [where, docs]}
        k = query.similarity_top_k
        if query.node_ids is None:
            hits = self._store.search(query.query_str, k, where, kwargs)
        else:
            allowed = self._selected(list(query.node_ids), None, "get")
            if where is not None:
                matching = set(self._store.keys_where(where))
                allowed = [i for i in allowed if i in matching]
            self._store.check_options(kwargs)  # the candidate stage's options: nothing to tune in a rerank
            db = self._store.db
            check_record(self.encoder.record(), db.stats().get("encoder"), "the database", len(db))  # as search_text
            qv = self.encoder.encode([query.query_str], is_query=True, progress=False)[0]
            if db.dim is not None and qv.shape[1] != db.dim:
                raise InvalidInputError(f"encoder {self.encoder.name}: makes {qv.shape[1]}-d vectors; the database "
                                        f"holds {db.dim}-d ones")
            hits = self._store.db.rerank(qv, allowed, k=k) if allowed else []
        records = self._store.records([h.id for h in hits])
        return VectorStoreQueryResult(nodes=[_node(i, text, meta) for i, text, meta in records],
                                      similarities=[float(h.score) for h in hits], ids=[i for i, _, _ in records])

    def as_retriever(self, **kwargs: Any) -> MvdbRetriever:
        """An :class:`MvdbRetriever` over this store (keywords: its own)."""
        return MvdbRetriever(self, **kwargs)


class MvdbRetriever(BaseRetriever):
    """``retrieve(query)`` -> the ``similarity_top_k`` best nodes as ``NodeWithScore`` (MaxSim
    scores, best first) among those that match ``filters`` (``MetadataFilters``), ``doc_ids`` and
    ``node_ids``; ``search_options``: mvdb's (``n_candidates``, ``nprobe``, ``k_tokens``,
    ``exact``)."""

    def __init__(self, vector_store: MvdbVectorStore, similarity_top_k: int = 10,
                 filters: MetadataFilters | None = None, doc_ids: list[str] | None = None,
                 node_ids: list[str] | None = None, search_options: dict | None = None, callback_manager=None,
                 verbose: bool = False):
        if not isinstance(vector_store, MvdbVectorStore):
            raise InvalidTypeError(f"vector_store: expected an mvdb MvdbVectorStore, got {type(vector_store).__name__}")
        if isinstance(similarity_top_k, bool) or not isinstance(similarity_top_k, int) or similarity_top_k < 1:
            raise InvalidInputError(f"similarity_top_k: expected a positive int, got {similarity_top_k!r}")
        llama_where(filters)  # refused here rather than at the first query
        if search_options is not None and not isinstance(search_options, dict):
            raise InvalidTypeError(f"search_options: expected a dict, got {type(search_options).__name__}")
        self._vector_store = vector_store
        self._similarity_top_k = similarity_top_k
        self._filters, self._doc_ids, self._node_ids = filters, doc_ids, node_ids
        self._search_options = dict(search_options or {})
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        query = VectorStoreQuery(query_str=query_bundle.query_str, similarity_top_k=self._similarity_top_k,
                                 filters=self._filters, doc_ids=self._doc_ids, node_ids=self._node_ids)
        result = self._vector_store.query(query, **self._search_options)
        return [NodeWithScore(node=n, score=s) for n, s in zip(result.nodes, result.similarities)]
