"""Text encoders: a model object turned into per-token vectors for ``add_texts`` / ``search_text``.

    enc = mvdb.Encoder(model)                 # a Sentence Transformers model, a PyLate ColBERT, or
    vecs = enc.encode(["a text"])             # any callable f(texts, is_query) -> [L_i, dim] each
    db = mvdb.open("my.mvdb", encoder=model)  # mvdb.open wraps a bare model the same way

Four kinds of model, told apart by their class:

- ``"pylate"``: a ``pylate.models.ColBERT``. ``model.encode(texts, is_query=...)`` adds the
  query or document prefix, pads queries to ``query_length`` with mask tokens (ColBERT query
  augmentation) and normalises each token itself (``normalize="model"``).
- ``"sentence-transformers"``: any other ``SentenceTransformer``.
  ``encode_query`` / ``encode_document`` (their prompts, where the model has any) with
  ``output_value="token_embeddings"``: every token's vector, [CLS] and [SEP] included. These are
  not normalised by the model, so the adapter divides each token by its L2 norm
  (``normalize="l2"``, the default; ``normalize=False`` keeps them as they come).
- ``"multi-vector"``: a Sentence Transformers 6 ``MultiVectorEncoder`` (PyLate and Stanford ColBERT
  checkpoints, colpali-engine models, or one assembled from modules). ``encode_document`` /
  ``encode_query`` make the vectors with the model's own semantics (prompts, query expansion,
  skiplist masks, its ``Normalize`` module: ``normalize="model"``); each side's token limit is
  the Transformer module's ``document_length`` / ``query_length``. A model with its own
  ``HierarchicalTokenPooling`` pools its documents itself (a database's ``pool_factor`` refuses it).
- ``"callable"``: any ``f(texts, is_query)`` called with a list of str and a bool, returning one
  [L_i, dim] array or tensor per text. Its vectors are stored as returned (``normalize="none"``)
  unless ``normalize=True`` asks the adapter to L2-normalise each token.

``encode`` runs a Sentence Transformers or PyLate model through mvdb's batched pipeline
(:mod:`mvdb.text_pipeline`: a chunk of texts tokenized at once, masked, normalised and packed on
the device, few copies to the host), which makes the vectors the model's own ``encode`` makes. A
callable (or ``pipeline=False``) is called ``batch_size`` texts at a time, the texts sorted by
length as Sentence Transformers sorts them, and every output is checked: one per text, 2-D, the
same dim for all. Progress goes to stderr (``mvdb.engine.progress``;
``MVDB_PROGRESS=0`` turns it off). Results are float32 numpy arrays in the order of the texts;
``encode_packed`` gives them as one array and the lengths.

:meth:`Encoder.record` is what a database remembers in its manifest about the model that made its
vectors (see ``mvdb.text``): ``name``, ``kind``, ``dim``, ``document_max_tokens``,
``query_max_tokens``, ``normalize`` and ``adapter_version`` (:data:`ADAPTER_VERSION`, raised
whenever this module would make different vectors for the same model and settings).

``cache=``: a directory (or True for ``$MVDB_CACHE``, else ``~/.cache/mvdb``) where results are
kept, keyed by the texts, ``is_query`` and the record; cached vectors are stored as float16 (what
a database stores by default), so a cached result equals a fresh one rounded to float16.
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from mvdb.engine.progress import Progress
from mvdb.errors import InvalidInputError, InvalidTypeError
from mvdb.kernels import settings

__all__ = ["ADAPTER_VERSION", "IDENTITY", "TEXT_KEY", "Encoder", "as_encoder", "cache_dir", "differences",
           "texts_arg"]

ADAPTER_VERSION = 1
TEXT_KEY = "text"  # the metadata key add_texts(store_text=True) puts each document's text under
KINDS = ("sentence-transformers", "multi-vector", "pylate", "callable")
# the record's fields that decide the stored vectors: two encoders that differ in one of them
# must not fill one database (query_max_tokens shapes only the queries, so it may differ)
IDENTITY = ("name", "kind", "dim", "document_max_tokens", "normalize", "adapter_version")


def cache_dir() -> Path:
    """Where cached encodings go: ``$MVDB_CACHE``, else ``~/.cache/mvdb``."""
    return settings.cache_dir()


ST_KINDS = {"MultiVectorEncoder": "multi-vector", "SentenceTransformer": "sentence-transformers"}


def _kind(model) -> str:
    """The kind of ``model``, from its class (no import of the libraries needed)."""
    for cls in type(model).__mro__:
        mod = cls.__module__ or ""
        if mod.split(".")[0] == "pylate" and cls.__name__ == "ColBERT":
            return "pylate"
    for cls in type(model).__mro__:  # (a MultiVectorEncoder is no SentenceTransformer)
        if (cls.__module__ or "").split(".")[0] == "sentence_transformers" and cls.__name__ in ST_KINDS:
            return ST_KINDS[cls.__name__]
    if callable(model):
        return "callable"
    raise InvalidTypeError("encoder: expected a Sentence Transformers model (a SentenceTransformer or a "
                           "MultiVectorEncoder), a PyLate ColBERT model, an "
                           f"mvdb.Encoder or a callable f(texts, is_query), got {type(model).__name__}")


def _model_name(model, kind: str) -> str:
    """A name for the record: the model card's id, else the name or path it was loaded from;
    for a callable its module and qualified name."""
    if kind == "callable":
        return f"{getattr(model, '__module__', None) or '?'}.{getattr(model, '__qualname__', type(model).__name__)}"
    card = getattr(model, "model_card_data", None)
    for attr in ("model_id", "base_model"):
        if isinstance(getattr(card, attr, None), str) and getattr(card, attr):
            return getattr(card, attr)
    try:
        path = model[0].auto_model.config.name_or_path
    except (AttributeError, IndexError, KeyError, TypeError):
        path = None
    return path or getattr(getattr(model, "tokenizer", None), "name_or_path", None) or type(model).__name__


def differences(mine: dict, recorded: dict) -> list[str]:
    """The identity fields in which the record ``mine`` differs from ``recorded`` (a dim not known
    yet on this side does not count)."""
    return [k for k in IDENTITY if not (k == "dim" and mine.get(k) is None) and recorded.get(k) != mine.get(k)]


def _positive(value, what: str):
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise InvalidInputError(f"{what}: expected a positive int or None, got {value!r}")
    return value


def texts_arg(texts, what: str = "texts", single: bool = False, *, queries: bool = False) -> tuple[list[str], bool]:
    """``texts`` as a non-empty list of str (one str too where ``single``) -> (list, was one str).
    ``queries``: query texts, where an empty or whitespace-only text is refused (it has no words
    to match)."""
    if isinstance(texts, str):
        if single:
            if queries and not texts.strip():
                raise InvalidInputError(f"{what}: an empty or whitespace-only text; a query needs at least one word")
            return [texts], True
        raise InvalidTypeError(f"{what}: expected a list of str, got one str (wrap it in a list: [text])")
    if not isinstance(texts, (list, tuple)):
        raise InvalidTypeError(f"{what}: expected a list of str, got {type(texts).__name__}")
    if not texts:
        raise InvalidInputError(f"{what}: expected at least one text, got an empty {type(texts).__name__}")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise InvalidTypeError(f"{what}[{i}]: expected a str, got {type(t).__name__}")
        if queries and not t.strip():
            raise InvalidInputError(f"{what}[{i}]: an empty or whitespace-only text; a query needs at least one word")
    return list(texts), False


def _array(v, i: int, name: str) -> np.ndarray:
    """One output of the model as float32 [L, dim], or an error naming what came."""
    if hasattr(v, "detach"):  # a torch tensor, on any device
        v = v.detach().float().cpu().numpy()
    try:
        a = np.asarray(v, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise InvalidTypeError(f"encoder {name}: output {i}: expected a 2-D [tokens, dim] array or tensor, "
                               f"got {type(v).__name__} ({e})") from None
    if a.ndim != 2:
        raise InvalidInputError(f"encoder {name}: output {i}: expected a 2-D [tokens, dim] array, got shape "
                                f"{tuple(a.shape)}")
    return a


class Encoder:
    """The adapter: see the module docstring. ``name`` names the model in the record (default:
    the model card's id, else the path it was loaded from, else the callable's qualified name;
    give it for a model loaded from a local folder so the record does not depend on the machine).
    ``document_max_tokens`` / ``query_max_tokens``: tokens kept per text (default: the model's
    own, ``max_seq_length``, or PyLate's ``document_length`` / ``query_length``; None for a
    callable, which decides itself). ``normalize``: see the kinds. ``batch_size``: texts per call
    of the model. ``dim``: what the model makes, when known before the first call (else learned
    from it). ``pipeline``: run a Sentence Transformers or PyLate model through mvdb's batched
    pipeline (:mod:`mvdb.text_pipeline`: the same vectors, many times faster on a GPU); False
    calls the model's own ``encode``."""

    def __init__(self, model, *, name: str | None = None, document_max_tokens: int | None = None,
                 query_max_tokens: int | None = None, normalize: bool | None = None, batch_size: int = 32,
                 dim: int | None = None, cache=None, pipeline: bool = True):
        if isinstance(model, Encoder):
            raise InvalidTypeError("model: already an mvdb.Encoder (pass it as it is)")
        self.model = model
        self.kind = _kind(model)
        if name is not None and (not isinstance(name, str) or not name):
            raise InvalidInputError(f"name: expected a non-empty str, got {name!r}")
        self.name = name or _model_name(model, self.kind)
        if normalize is not None and not isinstance(normalize, bool):
            raise InvalidTypeError(f"normalize: expected a bool or None, got {type(normalize).__name__}")
        self.batch_size = _positive(batch_size, "batch_size")
        if batch_size is None:
            raise InvalidInputError("batch_size: expected a positive int, got None")
        self.dim = _positive(dim, "dim")
        if self.kind == "pylate":
            self.normalize = "none" if normalize is False else "model"
            doc, query = getattr(model, "document_length", None), getattr(model, "query_length", None)
        elif self.kind == "sentence-transformers":
            self.normalize = "none" if normalize is False else "l2"
            doc = query = getattr(model, "max_seq_length", None)
        elif self.kind == "multi-vector":
            if normalize is not None:
                raise InvalidInputError("normalize: a MultiVectorEncoder normalises (or not) by its own modules; "
                                        "leave normalize out")
            self.normalize = "model"
            first = _first_module(model)
            doc = getattr(first, "document_length", None) or getattr(model, "max_seq_length", None)
            query = getattr(first, "query_length", None) or getattr(model, "max_seq_length", None)
        else:
            self.normalize = "l2" if normalize else "none"
            doc = query = None
        self.document_max_tokens = _positive(document_max_tokens, "document_max_tokens") or doc
        self.query_max_tokens = _positive(query_max_tokens, "query_max_tokens") or query
        self.cache = None if cache in (None, False) else (cache_dir() if cache is True else Path(cache))
        if not isinstance(pipeline, bool):
            raise InvalidTypeError(f"pipeline: expected a bool, got {type(pipeline).__name__}")
        self.pipeline = pipeline

    def __repr__(self) -> str:
        return f"mvdb.Encoder({self.name!r}, kind={self.kind!r}, dim={self.dim})"

    @property
    def pools_tokens(self) -> str | None:
        """The class name of the model's own token pooling module (Sentence Transformers'
        ``HierarchicalTokenPooling``, or any module named ``...TokenPooling``), or None: a model
        that pools its document tokens itself is not pooled again by the database."""
        modules = getattr(self.model, "_modules", None)
        if not isinstance(modules, dict):
            return None
        for module in modules.values():
            name = type(module).__name__
            if name.endswith("TokenPooling"):
                return name
        return None

    def record(self) -> dict:
        """What the manifest keeps about this encoder (JSON values)."""
        return {"name": self.name, "kind": self.kind, "dim": self.dim,
                "document_max_tokens": self.document_max_tokens, "query_max_tokens": self.query_max_tokens,
                "normalize": self.normalize, "adapter_version": ADAPTER_VERSION}

    def differences(self, recorded: dict) -> list[str]:
        """The identity fields in which this encoder differs from ``recorded`` (a dim not known
        yet on this side does not count)."""
        return differences(self.record(), recorded)

    # ---- encoding

    def encode(self, texts, *, is_query: bool = False, progress=None) -> list[np.ndarray]:
        """Per-token vectors of ``texts`` (a list of str): float32 [L_i, dim] arrays, in order.
        ``progress``: a :class:`mvdb.engine.progress.Progress`, or a bool (None: on unless
        ``MVDB_PROGRESS=0``)."""
        tokens, lengths = self.encode_packed(texts, is_query=is_query, progress=progress)
        return np.split(tokens.astype(np.float32, copy=False), np.cumsum(lengths)[:-1]) if len(lengths) else []

    def encode_packed(self, texts, *, is_query: bool = False, progress=None,
                      dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
        """``encode`` packed: (tokens [T, dim] of ``dtype`` (float32 or float16), lengths [n]
        int64), the texts' vectors one after the other in order. What ``add_texts`` stores: one
        array, not a list of them."""
        texts, _ = texts_arg(texts)
        if not isinstance(is_query, bool):
            raise InvalidTypeError(f"is_query: expected a bool, got {type(is_query).__name__}")
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float16):
            raise InvalidTypeError(f"dtype: expected float32 or float16, got {dtype}")
        path = self._cache_path(texts, is_query)
        if path is not None and path.exists():
            with np.load(path) as z:
                tokens, lengths = z["tokens"], z["lengths"]
            if self.dim is None:
                self.dim = int(tokens.shape[1])
            if tokens.shape[1] == self.dim and len(lengths) == len(texts):
                return tokens.astype(dtype, copy=False), lengths.astype(np.int64)
        # a cache keeps float16: encode to float16 then, and hand back what later calls will read
        want = np.float16 if path is not None else dtype
        tokens, lengths = self._encode(texts, is_query, progress if isinstance(progress, Progress) else Progress(progress),
                                       want)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp-{os.getpid()}.npz")
            np.savez(tmp, tokens=tokens, lengths=lengths)
            os.replace(tmp, path)
        return tokens.astype(dtype, copy=False), lengths

    def token_spans(self, texts, *, is_query: bool = False) -> list | None:
        """Per text, the character span ``(start, end)`` of each of its vectors in the text (None
        for a special token), for showing which words matched; None where the model does not say
        (a callable, a PyLate model, ``pipeline=False``)."""
        texts, _ = texts_arg(texts)
        pipeline = self._pipeline()
        if pipeline is None:
            return None
        with self._limit(is_query):
            return pipeline.spans(self.model, self.kind, texts, is_query)

    def _pipeline(self):
        """:mod:`mvdb.text_pipeline` where it runs this model (else None: the model's own encode)."""
        if self.kind == "callable" or not self.pipeline:
            return None
        from mvdb import text_pipeline  # torch: only where a model runs

        return text_pipeline if text_pipeline.supported(self.model, self.kind) else None

    def _cache_path(self, texts: list[str], is_query: bool) -> Path | None:
        if self.cache is None:
            return None
        rec = dict(self.record(), dim=None, is_query=is_query)  # the dim follows from the rest
        del rec["document_max_tokens" if is_query else "query_max_tokens"]  # the other side's setting
        key = hashlib.sha1(("\x00".join(texts) + "|" + json.dumps(rec, sort_keys=True)).encode()).hexdigest()[:16]
        return self.cache / f"encoded-{key}.npz"

    def _encode(self, texts: list[str], is_query: bool, progress: Progress, dtype) -> tuple[np.ndarray, np.ndarray]:
        what = "queries" if is_query else "documents"
        with progress.step(f"encoding {len(texts):,} {what} with {self.name}", len(texts), "texts") as step:
            pipeline = self._pipeline()
            if pipeline is not None:
                with self._limit(is_query):
                    tokens, lengths = pipeline.encode(self.model, self.kind, texts, is_query=is_query,
                                                      batch_size=self.batch_size, normalize=self.normalize,
                                                      out_dtype=dtype, progress=step)
                if self.dim is None:
                    self.dim = int(tokens.shape[1])
                if tokens.shape[1] != self.dim:
                    raise InvalidInputError(f"encoder {self.name}: expected dim {self.dim}, got vectors of "
                                            f"{tokens.shape[1]}")
                return tokens, lengths
            out = self._encode_each(texts, is_query, step)
        lengths = np.array([len(v) for v in out], dtype=np.int64)
        return np.concatenate(out).astype(dtype, copy=False), lengths

    def _encode_each(self, texts: list[str], is_query: bool, step) -> list[np.ndarray]:
        """The model's own encode (or the callable), ``batch_size`` texts a call, every output checked."""
        # the order Sentence Transformers and PyLate sort a call's texts in: our batches are theirs
        order = np.argsort([-len(t) for t in texts])
        out: list[np.ndarray | None] = [None] * len(texts)
        for b0 in range(0, len(texts), self.batch_size):
            idx = order[b0 : b0 + self.batch_size]
            batch = [texts[i] for i in idx]
            got = self._call(batch, is_query)
            if not isinstance(got, (list, tuple)) and not (hasattr(got, "ndim") and got.ndim == 3):
                raise InvalidTypeError(f"encoder {self.name}: expected a list of [tokens, dim] arrays (one per "
                                       f"text), got {type(got).__name__}")
            if len(got) != len(batch):
                raise InvalidInputError(f"encoder {self.name}: expected {len(batch)} outputs (one per text), "
                                        f"got {len(got)}")
            for i, v in zip(idx, got):
                a = _array(v, int(i), self.name)
                if self.dim is None:
                    self.dim = a.shape[1]
                if a.shape[1] != self.dim:
                    raise InvalidInputError(f"encoder {self.name}: output {int(i)}: expected dim {self.dim}, "
                                            f"got shape {tuple(a.shape)}")
                if self.normalize == "l2":
                    a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
                out[i] = a
            step.update(len(batch))
        return out

    @contextmanager
    def _limit(self, is_query: bool):
        """The model's token limit set to this side's for the duration (restored after)."""
        m = self.model
        limit = self.query_max_tokens if is_query else self.document_max_tokens
        attr = ("query_length" if is_query else "document_length") if self.kind in ("pylate", "multi-vector") \
            else "max_seq_length"
        if self.kind == "multi-vector":  # its Transformer module holds each side's length
            m = _first_module(m)
        before = getattr(m, attr)
        setattr(m, attr, limit)
        try:
            yield
        finally:
            setattr(m, attr, before)

    def _call(self, batch: list[str], is_query: bool):
        m = self.model
        if self.kind == "callable":
            return m(batch, is_query)
        with self._limit(is_query):
            if self.kind == "pylate":
                return m.encode(batch, is_query=is_query, batch_size=len(batch), show_progress_bar=False,
                                convert_to_numpy=True, normalize_embeddings=self.normalize == "model")
            fn = getattr(m, "encode_query" if is_query else "encode_document", None) or m.encode
            return fn(batch, output_value="token_embeddings", batch_size=len(batch), convert_to_numpy=False,
                      show_progress_bar=False)


def _first_module(model):
    """A Sentence Transformers model's first module (its Transformer), or None."""
    try:
        return model[0]
    except (TypeError, IndexError, KeyError):
        return None


def as_encoder(encoder) -> Encoder | None:
    """None, an :class:`Encoder`, or a model to wrap in one with its defaults."""
    if encoder is None or isinstance(encoder, Encoder):
        return encoder
    return Encoder(encoder)
