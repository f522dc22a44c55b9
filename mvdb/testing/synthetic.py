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
    device = corpus.offsets.device
    g = torch.Generator(device=device).manual_seed(seed)
    src = torch.randint(0, corpus.n_docs, (n_queries,), device=device, generator=g)
    start, length = corpus.offsets[src], corpus.lengths[src]
    pos = (torch.rand(n_queries, lq, device=device, generator=g) * length[:, None]).long()
    q = corpus.tokens[(start[:, None] + pos).to(corpus.tokens.device)].to(device).float()  # [n, lq, dim]
    q = q + noise * torch.nn.functional.normalize(torch.randn(q.shape, device=device, generator=g), dim=-1)
    return torch.nn.functional.normalize(q, dim=-1), src


def varlen_queries(corpus: Corpus, n_queries: int, lo: int = 4, hi: int = 64, *, noise: float = 0.3,
                   seed: int = 1) -> list[torch.Tensor]:
    """n_queries queries as :func:`make_queries`'s, of lo..hi tokens each (log-uniform, as real
    queries run: many short, some long) -> a list of float32 [Lq_i, dim]."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n_queries, generator=g)
    lengths = torch.exp(torch.log(torch.tensor(lo - 0.5)) + u * (torch.log(torch.tensor(hi + 0.5))
                                                                 - torch.log(torch.tensor(lo - 0.5))))
    lengths = lengths.round().long().clamp(lo, hi).tolist()
    q, _ = make_queries(corpus, n_queries, hi, noise=noise, seed=seed)
    return [q[i, :n] for i, n in enumerate(lengths)]


# Structurally different corpora for checking defaults on data they were not tuned on (issue #13).
GENERATORS = {
    # the README's corpus: uniform lengths 64-128, one topic per document, dim 128
    "topics": dict(dim=128, lengths=("uniform", 64, 128), n_topics=2_000, topic_share=0.35, private_share=0.0,
                   topics_per_doc=1, dup_share=0.0, zipf=1.07, noise=0.45),
    # wide lengths (log-uniform 16-200), per-document private words, 10% near-duplicates
    "dups": dict(dim=128, lengths=("loguniform", 16, 200), n_topics=5_000, topic_share=0.25, private_share=0.25,
                 topics_per_doc=1, dup_share=0.10, zipf=1.07, noise=0.40),
    # dim 96, bimodal lengths (70% 20-60, 30% 150-400), two topics per document, steeper Zipf
    "mixed96": dict(dim=96, lengths=("bimodal", 20, 60, 150, 400, 0.3), n_topics=8_000, topic_share=0.35,
                    private_share=0.1, topics_per_doc=2, dup_share=0.03, zipf=1.2, noise=0.35),
}


def _lengths(spec, n: int, device, g) -> torch.Tensor:
    kind = spec[0]
    if kind == "uniform":
        return torch.randint(spec[1], spec[2] + 1, (n,), device=device, generator=g)
    if kind == "loguniform":
        lo, hi = torch.log(torch.tensor(float(spec[1]))), torch.log(torch.tensor(float(spec[2]) + 1))
        u = torch.rand(n, device=device, generator=g)
        return torch.exp(lo + (hi - lo) * u).long().clamp(spec[1], spec[2])
    if kind == "bimodal":
        _, a0, a1, b0, b1, share = spec
        short = torch.randint(a0, a1 + 1, (n,), device=device, generator=g)
        long = torch.randint(b0, b1 + 1, (n,), device=device, generator=g)
        return torch.where(torch.rand(n, device=device, generator=g) < share, long, short)
    raise ValueError(f"unknown length distribution {kind!r}")


def make_structured(kind: str, n_docs: int, *, dim: int | None = None, dtype: torch.dtype = torch.float16,
                    device: str | torch.device = "cuda", seed: int = 0, vocab: int = 50_000,
                    chunk_tokens: int = 1 << 22, store: str | torch.device | None = None) -> Corpus:
    """A corpus of one of the GENERATORS: documents mix Zipf-distributed general words, words of
    their topic(s), and words of their own; near-duplicates copy an earlier document's tokens
    (cyclically, from a random offset) with a little noise. Generated on ``device``, the tokens
    kept on ``store`` (default: the same; "cpu" for corpora larger than the device), the same
    values either way."""
    p = GENERATORS[kind]
    dim = dim or p["dim"]
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)
    words = torch.nn.functional.normalize(torch.randn(vocab, dim, device=device, generator=g), dim=-1)
    zipf_cdf = (1.0 / torch.arange(1, vocab + 1, device=device, dtype=torch.float64) ** p["zipf"]).cumsum(0)
    zipf_cdf = (zipf_cdf / zipf_cdf[-1]).float()
    n_topics = min(p["n_topics"], max(2, n_docs // 4))
    topic_words = torch.randint(0, vocab, (n_topics, 64), device=device, generator=g)
    lengths = _lengths(p["lengths"], n_docs, device, g)
    offsets = torch.zeros(n_docs + 1, dtype=torch.int64, device=device)
    offsets[1:] = lengths.cumsum(0)
    topics = torch.randint(0, n_topics, (n_docs, p["topics_per_doc"]), device=device, generator=g)
    private = torch.randint(0, vocab, (n_docs, 6), device=device, generator=g)
    total = int(offsets[-1])
    store = torch.device(store) if store is not None else device
    tokens = torch.empty(total, dim, dtype=dtype, device=store)
    doc_of = torch.repeat_interleave(torch.arange(n_docs, device=device), lengths)
    for t0 in range(0, total, chunk_tokens):
        t1 = min(total, t0 + chunk_tokens)
        n, d = t1 - t0, doc_of[t0:t1]
        general = torch.searchsorted(zipf_cdf, torch.rand(n, device=device, generator=g)).clamp_max(vocab - 1)
        which = torch.randint(0, p["topics_per_doc"], (n,), device=device, generator=g)
        from_topic = topic_words[topics[d, which], torch.randint(0, 64, (n,), device=device, generator=g)]
        own = private[d, torch.randint(0, 6, (n,), device=device, generator=g)]
        u = torch.rand(n, device=device, generator=g)
        w = torch.where(u < p["topic_share"], from_topic,
                        torch.where(u < p["topic_share"] + p["private_share"], own, general))
        x = words[w] + p["noise"] * torch.nn.functional.normalize(torch.randn(n, dim, device=device, generator=g), dim=-1)
        tokens[t0:t1] = torch.nn.functional.normalize(x, dim=-1).to(dtype).to(store)
    n_dup = int(p["dup_share"] * n_docs)
    if n_dup:
        dups = torch.randperm(n_docs - 1, device=device, generator=g)[:n_dup] + 1
        for c0 in range(0, n_dup, 1 << 16):
            dd = dups[c0 : c0 + (1 << 16)]
            src = (torch.rand(dd.numel(), device=device, generator=g) * dd).long()  # an earlier document
            n_tok = lengths[dd]
            rows = torch.repeat_interleave(torch.arange(dd.numel(), device=device), n_tok)
            j = torch.arange(int(n_tok.sum()), device=device) - torch.repeat_interleave(n_tok.cumsum(0) - n_tok, n_tok)
            shift = torch.randint(0, 1 << 20, (dd.numel(),), device=device, generator=g)
            from_src = offsets[src][rows] + (j + shift[rows]) % lengths[src][rows]
            x = tokens[from_src.to(store)].to(device).float() + 0.1 * torch.nn.functional.normalize(
                torch.randn(rows.numel(), dim, device=device, generator=g), dim=-1)
            tokens[(offsets[dd][rows] + j).to(store)] = torch.nn.functional.normalize(x, dim=-1).to(dtype).to(store)
    return Corpus(tokens, offsets, topics[:, 0], words)


def candidate_lists(n_docs: int, nq: int, k: int, *, device, lq: int = 32, lengths: tuple[int, int] = (64, 128),
                    seeds: tuple[int, int, int] = (11, 13, 17)):
    """The rerank benchmark's inputs (issue #2 case c): a corpus of n_docs docs of ``lengths`` tokens
    (64-128), nq queries of lq tokens drawn from source docs, and k random candidates per query with
    the source first; ``seeds``: of the corpus, the queries and the candidates. Returns (corpus,
    Q [nq, lq, dim] float, q packed fp16 [nq * lq, dim], cu_q, cand)."""
    corpus = make_corpus(n_docs, *lengths, 128, device=device, seed=seeds[0])
    Q, src = make_queries(corpus, nq, lq, seed=seeds[1])
    g = torch.Generator(device=device).manual_seed(seeds[2])
    cand = torch.randint(0, n_docs, (nq, k), device=device, generator=g)
    cand[:, 0] = src
    q = Q.half().reshape(nq * lq, Q.shape[-1])
    cu_q = torch.arange(nq + 1, dtype=torch.int32, device=device) * lq
    return corpus, Q, q, cu_q, cand


def one_query_inputs(n_docs: int = 10000, *, device):
    """The kernel benchmarks' case (a): one query of 32 tokens (fp16) against n_docs documents of
    64-300 tokens. Returns (corpus, q [32, dim] fp16, cu_q int32, tokens, cu_d int32)."""
    corpus = make_corpus(n_docs, 64, 300, 128, device=device, seed=n_docs)
    Q, _ = make_queries(corpus, 1, 32, seed=7)
    cu_q = torch.tensor([0, 32], dtype=torch.int32, device=device)
    return corpus, Q[0].half(), cu_q, corpus.tokens, corpus.offsets.int()


def colpali_inputs(n: int, L: int, *, device, lq: int | None = None, seed: int = 3, query_seed: int = 5):
    """The kernel benchmarks' case (b), ColPali-shaped: one query of lq (default L) tokens against n
    pages of L tokens, bf16. Returns (Q [1, lq, dim], D [n, L, dim])."""
    corpus = make_corpus(n, L, L, 128, dtype=torch.bfloat16, device=device, seed=seed)
    Q, _ = make_queries(corpus, 1, L if lq is None else lq, seed=query_seed)
    return Q.bfloat16(), corpus.tokens.view(n, L, 128)
