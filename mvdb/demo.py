"""`mvdb demo`: man pages embedded with MiniLM, a database built from them and searched.

``run_demo`` puts a sample of Linux man pages shipped in the package into a database as text
(``mvdb.open(path, encoder=...)`` and ``db.add_texts``: per-token MiniLM vectors), answers
natural-language questions with ``db.search_text``, and checks the known-item search against
exhaustive MaxSim. ``run_kernel_demo`` (``mvdb demo --kernels``) exercises the fused kernels alone
on realistic shapes, each checked against an fp64 reference.
"""

from __future__ import annotations

import os
import time
from typing import Callable

import numpy as np
import torch

from mvdb.kernels import maxsim_candidates, maxsim_varlen, quantize_int8
from mvdb.kernels.maxsim import naive


def _corpus(n_docs: int, dim: int, g: torch.Generator, device: torch.device):
    """Documents of 64-300 tokens built around a topic vector; unit-norm tokens like ColBERT's."""
    lengths = torch.randint(64, 301, (n_docs,), generator=g)
    topics = torch.nn.functional.normalize(torch.randn(n_docs, dim, generator=g), dim=-1)
    owner = torch.repeat_interleave(torch.arange(n_docs), lengths)
    tokens = topics[owner] + 0.8 * torch.randn(int(lengths.sum()), dim, generator=g) / dim**0.5 * 4
    tokens = torch.nn.functional.normalize(tokens, dim=-1)
    offsets = torch.zeros(n_docs + 1, dtype=torch.long)
    offsets[1:] = lengths.cumsum(0)
    return tokens.to(device), offsets.to(device)


def _queries(tokens, offsets, n_q: int, lq: int, g: torch.Generator):
    """Each query: lq tokens sampled from a source document, plus noise. Returns (q, cu_q, sources)."""
    n_docs = offsets.numel() - 1
    src = torch.randint(0, n_docs, (n_q,), generator=g)
    off = offsets.cpu()
    rows = []
    for s in src.tolist():
        pick = off[s] + torch.randint(0, int(off[s + 1] - off[s]), (lq,), generator=g)
        rows.append(tokens.cpu()[pick] + 0.3 * torch.randn(lq, tokens.shape[1], generator=g) / tokens.shape[1] ** 0.5)
    q = torch.nn.functional.normalize(torch.cat(rows), dim=-1).to(tokens.device)
    cu_q = torch.arange(0, n_q + 1, dtype=torch.int32, device=tokens.device) * lq
    return q, cu_q, src


def _time(fn: Callable[[], torch.Tensor], device: torch.device, reps: int = 5) -> tuple[torch.Tensor, float]:
    out = fn()  # warm-up: compilation / autotuning stay out of the timing
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return out, sorted(times)[len(times) // 2] * 1e3


def run_kernel_demo(device: str = "auto", n_docs: int = 2000, seed: int = 0, echo: Callable[[str], None] = print) -> dict:
    """Run the demo; returns the figures it printed."""
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device))
    g = torch.Generator().manual_seed(seed)
    dim, lq = 128, 32
    tokens, offsets = _corpus(n_docs, dim, g, dev)
    echo(f"mvdb kernel demo on {dev} ({torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'CPU, torch fallback'})")
    echo(f"corpus: {n_docs} documents, {tokens.shape[0]:,} tokens of dim {dim} (64-300 tokens each)")
    results = {}

    fp16 = tokens.half() if dev.type == "cuda" else tokens
    q, cu_q, src = _queries(tokens, offsets, 1, lq, g)
    cu_d = offsets.int()
    scores, ms = _time(lambda: maxsim_varlen(q, cu_q, fp16, cu_d, max_seqlen_q=lq, check=False), dev)
    ref = naive.maxsim_csr(q.double().cpu(), cu_q.cpu(), fp16.double().cpu(), offsets.cpu())
    err = ((scores.cpu().double() - ref).abs().max() / ref.abs().max()).item()
    top = scores[0].topk(5).indices.tolist()
    echo(f"\n[varlen] 1 query x {lq} tokens vs all {n_docs} docs: {ms:.2f} ms  ({n_docs / ms * 1e3:,.0f} docs/s)")
    echo(f"  top-5 docs {top}, query drawn from doc {int(src[0])}; max rel. error vs fp64 {err:.1e}")
    results["varlen_ms"], results["varlen_rel_err"] = ms, err

    n_q, k = 16, 200
    q, cu_q, src = _queries(tokens, offsets, n_q, lq, g)
    cand = torch.randint(0, n_docs, (n_q, k), generator=g)
    cand[:, 0] = src  # the source document is among the candidates
    cand = cand.to(dev)
    scores, ms = _time(lambda: maxsim_candidates(q, cu_q, fp16, offsets, cand, max_seqlen_q=lq, check=False), dev)
    ref = naive.maxsim_csr(q.double().cpu(), cu_q.cpu(), fp16.double().cpu(), offsets.cpu(), cand.cpu())
    err = ((scores.cpu().double() - ref).abs().max() / ref.abs().max()).item()
    hit = (scores.argmax(1).cpu() == 0).float().mean().item()
    echo(f"\n[rerank] {n_q} queries x {k} candidates gathered from the CSR store: {ms:.2f} ms")
    echo(f"  source document ranked first for {hit:.0%} of queries; max rel. error vs fp64 {err:.1e}")
    results["rerank_ms"], results["rerank_rel_err"] = ms, err

    tok8, sc8 = quantize_int8(tokens)
    s8, ms = _time(lambda: maxsim_candidates(q, cu_q, tok8, offsets, cand, sc8, max_seqlen_q=lq, check=False), dev)
    agree = (s8.argmax(1) == scores.argmax(1)).float().mean().item()
    echo(f"\n[rerank int8] same batch on the INT8 store (per-token scales, {tok8.numel() / 2**20:.0f} MiB "
         f"instead of {tokens.numel() * 2 / 2**20:.0f} MiB): {ms:.2f} ms; top-1 agrees with fp16 for {agree:.0%}")
    results["rerank_int8_ms"], results["int8_top1_agreement"] = ms, agree
    return results


QUESTIONS = [
    "compress files into an archive",
    "how much disk space is free on each file system",
    "list the processes that are running",
    "search text files for lines matching a pattern",
    "log in to a remote machine securely",
    "read the logs of system services",
]


def _load_sample(n_docs: int) -> list[dict]:
    import gzip
    import json
    from importlib import resources

    with resources.files("mvdb").joinpath("data/manpages-sample.jsonl.gz").open("rb") as raw:
        rows = [json.loads(line) for line in gzip.open(raw, "rt")]
    return rows[:n_docs]


def run_demo(path: str | None = None, n_docs: int = 300, device: str = "auto",
             echo: Callable[[str], None] = print) -> dict:
    """Man pages in as text (MiniLM through ``add_texts``), questions as text (``search_text``),
    the known-item search checked against exhaustive MaxSim."""
    import shutil
    import tempfile

    import mvdb
    from mvdb.embed import MiniLM

    rows = _load_sample(n_docs)
    echo(f"mvdb demo: {len(rows)} Linux man pages, all-MiniLM-L6-v2 per-token embeddings (384-d)")
    encoder = MiniLM().encoder(document_max_tokens=256, query_max_tokens=32)  # encodings cached on disk

    tmp = None
    if path is None:
        tmp = tempfile.mkdtemp(prefix="mvdb-demo-")
        path = os.path.join(tmp, "manpages.mvdb")
    results = {}
    try:
        t0 = time.perf_counter()
        with mvdb.open(path, device=device, encoder=encoder) as db:
            if len(db) == 0:
                db.add_texts([r["body"] for r in rows], ids=[r["id"] for r in rows],
                             metadata=[{"name": r["name"]} for r in rows])
            t_build = time.perf_counter() - t0
            st = db.stats()
            echo(f"encoded and stored {st['documents']} pages ({st['tokens']:,} tokens) in {path} on {db.device} "
                 f"in {t_build:.1f} s (db.add_texts; the encodings are cached after the first run)\n")
            names = {r["id"]: r["name"] for r in rows}
            for text in QUESTIONS:
                t0 = time.perf_counter()
                hits = db.search_text(text, k=3)
                ms = (time.perf_counter() - t0) * 1e3
                shown = ", ".join(f"{names[h.id]} {h.score:.2f}" for h in hits)
                echo(f"  {text!r:52} -> {shown}  ({ms:.0f} ms)")

            summaries = [r["summary"] for r in rows]
            t0 = time.perf_counter()
            found = db.search_text(summaries, k=10)
            t_batch = time.perf_counter() - t0
            rr = [next((1 / (i + 1) for i, h in enumerate(hits) if h.id == r["id"]), 0.0) for hits, r in zip(found, rows)]
            exhaustive = db.search_text(summaries, k=10, exact=True)  # every page scored, the whole batch at once
            recall = np.mean([len({h.id for h in a} & {h.id for h in b}) / 10 for a, b in zip(found, exhaustive)])
            results = {"mrr10": float(np.mean(rr)), "recall10_vs_exhaustive": float(recall),
                       "batch_qps": len(rows) / t_batch, "build_s": t_build}
            echo(f"\nknown-item search: each page's one-line summary as the query, {len(rows)} queries in one batch")
            echo(f"  MRR@10 {results['mrr10']:.3f}; recall@10 against exhaustive MaxSim {recall:.3f}; "
                 f"{results['batch_qps']:.0f} queries/s (encoding included)")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return results
