"""How fast can a kernel only read what MaxSim reads? (issue #17: the 85% of HBM targets.)

The kernel table's floor is bytes / the measured rate of a sequential copy. The candidate path
(case c) reads 32,000 documents of 8-16 KB (int8) at random places of a 1M-document store, and the
one-query path (case a) reads 10k documents of 64-300 tokens, one program each. This probe times a
Triton kernel that reads the documents' bytes as MaxSim does, in the same order and the same tiles
as ``fused._doc_max`` (the candidate's offsets, then the document's rows and, for int8, its
scales), and only folds them with an elementwise max (no dot, no query rows, no query
quantization launch): the best of a sweep of tile sizes, warp counts (1, 2, 4) and pipeline
depths is a rate a gather of those bytes reaches (one kernel's best, not a proof that no kernel
can read faster).

    python benchmarks/gather_floor.py --out DIR        # GPU; JSON gather-floor.json
    bash benchmarks/gpu_session.sh py:gather_floor     # on the lent GPU
    TRITON_INTERPRET=1 python benchmarks/gather_floor.py --device cpu --docs-c 16 --docs-a 8 --queries-c 1 \
        --configs 2 --rounds 1                         # smoke: every step, tiny, in Triton's CPU interpreter

Each case also times mvdb's default call on the same tensors (correctness against the float32
reference first), in the same alternating rounds as the sweep, and torch's ``sum`` over as many
bytes (a sequential read, but not a floor: torch's reduction is not the fastest reader).
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from common import alternating_rounds, gpu_header, median_ms, write_json  # noqa: E402
from mvdb.testing.synthetic import candidate_lists, one_query_inputs  # noqa: E402

from mvdb.kernels import maxsim_candidates, maxsim_varlen, quantize_int8  # noqa: E402
from mvdb.kernels.maxsim import naive  # noqa: E402


@triton.jit
def _read_docs(TOK, SC, OFF, CAND, OUT, DIM: tl.constexpr, BLOCK_D: tl.constexpr, INT8: tl.constexpr,
               HAS_CAND: tl.constexpr):
    # INT8: the rows are int8 documents viewed as int32 (DIM 4x smaller: the same bytes, a quarter of
    # the elements to fold), with float32 scales beside them
    pid = tl.program_id(0).to(tl.int64)
    if HAS_CAND:
        doc = tl.load(CAND + pid)
    else:
        doc = pid
    start = tl.load(OFF + doc).to(tl.int64)
    n = (tl.load(OFF + doc + 1).to(tl.int64) - start).to(tl.int32)
    offs_d = tl.arange(0, BLOCK_D)
    offs_c = tl.arange(0, DIM)
    lim = tl.minimum(offs_d, n - 1)
    acc = tl.full([BLOCK_D, DIM], -2147483648 if INT8 else float("-inf"), TOK.dtype.element_ty)
    sacc = tl.full([BLOCK_D], float("-inf"), tl.float32)
    base = TOK + start * DIM
    for db in range(0, n, BLOCK_D):
        cols = tl.maximum(tl.minimum(db, n - BLOCK_D), 0) + lim
        acc = tl.maximum(acc, tl.load(base + cols[:, None] * DIM + offs_c[None, :]))
        if INT8:
            sacc = tl.maximum(sacc, tl.load(SC + start + cols))
    # two outputs per program, so that the check sees the scales apart from the rows
    tl.store(OUT + 2 * pid, tl.max(tl.max(acc, axis=1), axis=0).to(tl.float32))
    tl.store(OUT + 2 * pid + 1, tl.max(sacc, axis=0))


def reference(tok, sc, off, docs):
    """The read kernel's output for ``docs`` (torch, per document; int8 rows viewed as int32):
    [len(docs), 2], the rows' max and the scales' max (-inf without scales)."""
    res = []
    for j in docs.tolist():
        a, b = int(off[j]), int(off[j + 1])
        s = sc[a:b].max() if sc is not None else torch.tensor(float("-inf"), device=tok.device)
        res.append(torch.stack([tok[a:b].max().float(), s.float()]))
    return torch.stack(res)


CONFIGS = list(itertools.product((16, 32, 64, 128), (1, 2, 4), (1, 2, 3)))  # BLOCK_D, warps, stages
N_CONFIGS = len(CONFIGS)  # --configs: the first this many of them


def sweep(tok, sc, off, cand, n_prog, rounds, extra=None):
    """{config: median ms} of the read kernel, every config checked against torch first (on 200
    programs: each one's rows and scales), timed in alternating rounds with the ``extra`` calls."""
    out = torch.empty(n_prog, 2, dtype=torch.float32, device=tok.device)
    if tok.dtype == torch.int8:
        tok = tok.view(torch.int32)
    docs = cand.reshape(-1) if cand is not None else torch.arange(n_prog, device=tok.device)
    check = torch.arange(0, n_prog, max(1, n_prog // 200), device=tok.device)
    ref = reference(tok, sc, off, docs[check])
    res = {}
    for block_d, warps, stages in CONFIGS[:N_CONFIGS]:
        def fn(block_d=block_d, warps=warps, stages=stages):
            _read_docs[(n_prog,)](tok, sc, off, cand, out, DIM=tok.shape[1], BLOCK_D=block_d,
                                  INT8=sc is not None, HAS_CAND=cand is not None,
                                  num_warps=warps, num_stages=stages)
            return out
        if not torch.equal(fn()[check], ref):
            raise SystemExit(f"read kernel wrong at {block_d}/{warps}/{stages}")
        res[f"BLOCK_D {block_d}, {warps} warps, {stages} stages"] = fn
    # cpu_runs: one timed call a round off CUDA (the interpreter: a smoke run, not a measurement)
    return alternating_rounds({**res, **(extra or {})}, rounds, warmup=5, rep=40, cpu_runs=1)[1]


def seq_read_ms(nbytes, dev):
    """A sequential read of nbytes (a sum over a buffer of that size: reads it once)."""
    x = torch.ones(int(nbytes) // 2, dtype=torch.float16, device=dev)
    return median_ms(lambda: x.sum(dtype=torch.float32), warmup=10, rep=100)


def case(label, res, tok, sc, off, cand, n_prog, rounds, default, ref):
    dev = tok.device
    docs = cand.reshape(-1) if cand is not None else torch.arange(n_prog, device=dev)
    lens = (off[docs + 1] - off[docs]).double()
    per_token = tok.shape[1] * tok.element_size() + (4 if sc is not None else 0)  # a row and its scale
    nbytes = float(lens.sum()) * per_token
    got = default()
    err = float(((got.float().reshape(ref.shape) - ref).abs().max() / ref.abs().max()).item())
    if err > 3e-2:
        raise SystemExit(f"{label}: mvdb's max relative error {err:.3g}")
    floors = sweep(tok, sc, off, cand, n_prog, rounds, extra={"mvdb": default})
    mv = floors.pop("mvdb")
    best = min(floors, key=floors.get)
    seq = seq_read_ms(nbytes, dev)
    if cand is not None:
        # the same kernel over as many documents in storage order (no candidate list: a stream)
        first = off[n_prog] * per_token
        in_order = sweep(tok, sc, off, None, n_prog, rounds)
        fast = min(in_order, key=in_order.get)
        res.setdefault("in_order", {})[label] = {"bytes": float(first), "best": fast, "ms": in_order[fast],
                                                 "tb_s": float(first) / in_order[fast] / 1e9}
        print(label, "in storage order:", res["in_order"][label], flush=True)
    row = {"programs": n_prog, "bytes": nbytes, "mvdb_default_ms": mv, "mvdb_max_rel_err": err,
           "seq_read_ms": seq, "read_kernel_ms": floors, "read_kernel_best": best,
           "read_kernel_best_ms": floors[best], "seq_read_tb_s": nbytes / seq / 1e9,
           "read_kernel_tb_s": nbytes / floors[best] / 1e9, "mvdb_tb_s": nbytes / mv / 1e9,
           "mvdb_pct_of_seq_read": 100 * seq / mv, "mvdb_pct_of_read_kernel": 100 * floors[best] / mv}
    res["cases"][label] = row
    print(label, {k: v for k, v in row.items() if k != "read_kernel_ms"}, flush=True)


def _size(n: int) -> str:
    """1000000 -> "1M", 10000 -> "10k", 40 -> "40" (the cases' labels)."""
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k" if n % 1000 == 0 else str(n)


def main():
    global N_CONFIGS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default="c-1M,a-10k", help="c (candidates), a (one query), or both")
    ap.add_argument("--docs-c", type=int, default=1_000_000, help="case c: documents of the store")
    ap.add_argument("--queries-c", type=int, default=32, help="case c: queries, 1,000 candidates each at most")
    ap.add_argument("--docs-a", type=int, default=10_000, help="case a: documents the query scores")
    ap.add_argument("--configs", type=int, default=len(CONFIGS), help="the first N launch configs of the sweep")
    ap.add_argument("--device", default="cuda", help="cuda (the probe) or cpu (with TRITON_INTERPRET=1: a smoke run)")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    dev = args.device
    cuda = dev.startswith("cuda")
    N_CONFIGS = args.configs
    only = {c.split("-")[0] for c in args.cases.split(",")}
    res = gpu_header(rounds=args.rounds, cases={})
    if "c" in only:
        label = f"c-{_size(args.docs_c)}"
        corpus, _, q, cu_q, cand = candidate_lists(args.docs_c, args.queries_c, min(1000, args.docs_c), device=dev)
        tok16, off = corpus.tokens, corpus.offsets
        del corpus
        tok8, sc = quantize_int8(tok16)
        ref = naive.maxsim_csr(q.float(), cu_q, tok8, off, cand, sc, dtype=torch.float32)
        case(f"{label} int8", res, tok8, sc, off, cand, cand.numel(), args.rounds,
             lambda: maxsim_candidates(q, cu_q, tok8, off, cand, sc, check=False), ref)
        del tok8, sc
        torch.cuda.empty_cache() if cuda else None
        ref = naive.maxsim_csr(q.float(), cu_q, tok16, off, cand, None, dtype=torch.float32)
        case(f"{label} fp16", res, tok16, None, off, cand, cand.numel(), args.rounds,
             lambda: maxsim_candidates(q, cu_q, tok16, off, cand, check=False), ref)
        del tok16, off, cand, ref
        torch.cuda.empty_cache() if cuda else None
    if "a" in only:
        n, label = args.docs_a, f"a-{_size(args.docs_a)}"
        corpus, q, cu_q, tok16, cu_d = one_query_inputs(n, device=dev)
        off = corpus.offsets
        tok8, sc = quantize_int8(tok16)
        every = torch.arange(n, device=dev)[None]  # the reference scores every document as candidates
        ref = naive.maxsim_csr(q.float(), cu_q, tok8, off, every, sc, dtype=torch.float32)
        case(f"{label} int8", res, tok8, sc, off, None, n, args.rounds,
             lambda: maxsim_varlen(q, cu_q, tok8, cu_d, d_scales=sc, check=False), ref)
        ref = naive.maxsim_csr(q.float(), cu_q, tok16, off, every, None, dtype=torch.float32)
        case(f"{label} fp16", res, tok16, None, off, None, n, args.rounds,
             lambda: maxsim_varlen(q, cu_q, tok16, cu_d, check=False), ref)
    write_json(args.out, "gather-floor.json", res)


if __name__ == "__main__":
    main()
