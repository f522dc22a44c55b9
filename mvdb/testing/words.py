"""A lexical stand-in for a text model that needs no download: each lowercased word of a text
becomes one fixed, seeded random unit vector of 384 dimensions, so a query scores highest the
documents that share its words. The text benchmarks' smoke runs, the CLI's and the integrations'
tests use it (``--model mvdb.testing.words:encode``). Not a real model and not public API."""

from __future__ import annotations

import functools
import re
import zlib

import numpy as np

__all__ = ["Words", "encode"]

DOCUMENT_MAX_TOKENS = 256
QUERY_MAX_TOKENS = 32


class Words:
    """The stand-in with the interface of ``mvdb.embed.MiniLM`` where the benchmarks use it
    (``--encoder words`` in the text suites), plus ``token_ids``."""

    name = "words: one seeded random vector per word (a stand-in, no model)"
    dim = 384
    vocab = 30522  # word ids (crc32 modulo this): as many as MiniLM's WordPiece ids

    def __init__(self, device: str = "cpu"):
        self.device = device

    def token_ids(self, text: str) -> list[int]:
        return [zlib.crc32(w.encode()) % self.vocab for w in re.findall(r"\w+", text.lower())]

    @staticmethod
    @functools.lru_cache(maxsize=1 << 16)
    def _vector(word_id: int) -> np.ndarray:
        v = np.random.default_rng(word_id).standard_normal(Words.dim).astype(np.float32)
        return v / np.linalg.norm(v)

    def _vectors(self, texts: list[str], max_tokens: int) -> list[np.ndarray]:
        return [np.stack([self._vector(i) for i in (self.token_ids(t)[:max_tokens] or [0])]) for t in texts]

    def encode(self, texts: list[str], max_tokens: int, batch_size: int = 32, progress: bool = False,
               is_query: bool = False) -> list[np.ndarray]:
        return self._vectors(texts, max_tokens)

    def encoder(self, document_max_tokens: int = 256, query_max_tokens: int = 32, batch_size: int = 32,
                cache=True):
        """An :class:`mvdb.Encoder` of the stand-in (never cached on disk)."""
        import mvdb

        def model(texts, is_query):
            return self._vectors(texts, query_max_tokens if is_query else document_max_tokens)

        return mvdb.Encoder(model, name="words-stand-in", batch_size=batch_size, dim=self.dim)



def encode(texts: list[str], is_query: bool) -> list[np.ndarray]:
    """The stand-in as a plain ``f(texts, is_query)`` model (what ``mvdb.Encoder`` takes): at most
    256 words per document and 32 per query."""
    return Words()._vectors(list(texts), QUERY_MAX_TOKENS if is_query else DOCUMENT_MAX_TOKENS)
