"""Seeded synthetic multi-vector corpora with the structure of real ones, generated on the device.

A vocabulary of word vectors with Zipf frequencies; every document has a topic and draws a share
of its tokens from that topic's words, the rest from the whole vocabulary; a token is its word's
vector plus context noise (so the same word differs between documents), unit-normalised like
ColBERT's outputs. A query is a handful of tokens drawn from one source document, plus noise.
Uniform noise would make every ranking a near-tie; this does not.
"""

from __future__ import annotations

import torch


class Corpus:
    """tokens [T, dim] (dtype), offsets [n+1] int64, topic [n], source words kept for queries."""

    def __init__(self, tokens, offsets, topic, words):
        self.tokens, self.offsets, self.topic, self.words = tokens, offsets, topic, words

    @property
    def n_docs(self) -> int:
        return self.offsets.numel() - 1

    @property
    def lengths(self) -> torch.Tensor:
        return self.offsets[1:] - self.offsets[:-1]


def make_corpus(
    n_docs: int,
    min_len: int,
    max_len: int,
    dim: int = 128,
    *,
    vocab: int = 50_000,
    n_topics: int = 2_000,
    topic_share: float = 0.35,
    noise: float = 0.45,
    dtype: torch.dtype = torch.float16,
    device: str | torch.device = "cuda",
    seed: int = 0,
    chunk_tokens: int = 1 << 22,
) -> Corpus:
    """n_docs documents of min_len..max_len tokens (uniform), built in chunks to bound memory."""
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)
    words = torch.nn.functional.normalize(torch.randn(vocab, dim, device=device, generator=g), dim=-1)
    zipf_cdf = (1.0 / torch.arange(1, vocab + 1, device=device, dtype=torch.float64) ** 1.07).cumsum(0)
    zipf_cdf = (zipf_cdf / zipf_cdf[-1]).float()
    topic_words = torch.randint(0, vocab, (n_topics, 64), device=device, generator=g)
    lengths = torch.randint(min_len, max_len + 1, (n_docs,), device=device, generator=g)
    offsets = torch.zeros(n_docs + 1, dtype=torch.int64, device=device)
    offsets[1:] = lengths.cumsum(0)
    topic = torch.randint(0, n_topics, (n_docs,), device=device, generator=g)
    total = int(offsets[-1])
    tokens = torch.empty(total, dim, dtype=dtype, device=device)
    doc_of = torch.repeat_interleave(torch.arange(n_docs, device=device), lengths)
    for t0 in range(0, total, chunk_tokens):
        t1 = min(total, t0 + chunk_tokens)
        n = t1 - t0
        general = torch.searchsorted(zipf_cdf, torch.rand(n, device=device, generator=g)).clamp_max(vocab - 1)
        pick = torch.randint(0, topic_words.shape[1], (n,), device=device, generator=g)
        from_topic = topic_words[topic[doc_of[t0:t1]], pick]
        w = torch.where(torch.rand(n, device=device, generator=g) < topic_share, from_topic, general)
        x = words[w] + noise * torch.nn.functional.normalize(torch.randn(n, dim, device=device, generator=g), dim=-1)
        tokens[t0:t1] = torch.nn.functional.normalize(x, dim=-1).to(dtype)
    return Corpus(tokens, offsets, topic, words)


def make_queries(corpus: Corpus, n_queries: int, lq: int, *, noise: float = 0.3, seed: int = 1):
    """n_queries queries of lq tokens, each sampled from one source document -> (Q [n, lq, dim] fp32, sources)."""
    device = corpus.tokens.device
    g = torch.Generator(device=device).manual_seed(seed)
    src = torch.randint(0, corpus.n_docs, (n_queries,), device=device, generator=g)
    start, length = corpus.offsets[src], corpus.lengths[src]
    pos = (torch.rand(n_queries, lq, device=device, generator=g) * length[:, None]).long()
    q = corpus.tokens[start[:, None] + pos].float()  # [n, lq, dim]
    q = q + noise * torch.nn.functional.normalize(torch.randn(q.shape, device=device, generator=g), dim=-1)
    return torch.nn.functional.normalize(q, dim=-1), src
