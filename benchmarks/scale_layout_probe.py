"""Where an int8 document's scales lie (issue #17, case c): does reading them from a separate
array cost the candidate path its HBM rate? A probe, not a code path.

Each candidate program reads its document's int8 rows (8-16 KB at 64-128 tokens) and, tile by
tile, its per-token float32 scales (256-512 B) from a second array: a small random read of its own.
The paged kernel (``starts`` / ``scale_starts``) reads scales from wherever they are placed, so the
same kernel runs four layouts of the same store, in alternating rounds:

- default: ``maxsim_candidates`` on the CSR store as the engine holds it (tokens, scales apart);
- paged, as stored: the paged call with starts = offsets (control for the paged path);
- interleaved: one buffer, each document's rows followed by its scales (padded to 128 bytes), so
  a document's scales sit next to its tokens;
- scales at zero (a bound, not exact): every document reads the first document's scales, which
  stay in L2, so no program reads scales from HBM.

    python benchmarks/scale_layout_probe.py --out DIR          # GPU; JSON scale-layout.json
    bash benchmarks/gpu_session.sh py:scale_layout_probe       # on the lent GPU
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from common import alternating_rounds, gpu_header, write_json  # noqa: E402
from synthetic import candidate_lists  # noqa: E402

from mvdb.kernels import maxsim_candidates, quantize_int8  # noqa: E402


def interleave(tok: torch.Tensor, sc: torch.Tensor, offsets: torch.Tensor):
    """(buffer [R, dim] int8, its float32 view, token starts, scale starts): each document's rows,
    then its scales in ceil(4 n / dim) rows. Starts count rows of the buffer / floats of the view."""
    dim = tok.shape[1]
    per_row = dim // 4  # float32 scales per row
    n = offsets[1:] - offsets[:-1]
    rows = n + (n + per_row - 1) // per_row
    new = torch.zeros_like(offsets)
    new[1:] = torch.cumsum(rows, 0)
    buf = torch.zeros(int(new[-1]), dim, dtype=torch.int8, device=tok.device)
    doc = torch.repeat_interleave(torch.arange(n.numel(), device=tok.device), n)
    local = torch.arange(tok.shape[0], device=tok.device) - offsets[doc]
    buf[new[doc] + local] = tok
    view = buf.view(-1).view(torch.float32)
    sc_start = (new[:-1] + n) * per_row
    view[sc_start[doc] + local] = sc
    return buf, view, new[:-1].contiguous(), sc_start.contiguous()


def measure(n_docs: int, rounds: int, dev):
    """(label, row): the four layouts' scores compared and times in alternating rounds."""
    corpus, _, q, cu_q, cand = candidate_lists(n_docs, 32, 1000, device=dev)
    tok, sc = quantize_int8(corpus.tokens)
    off = corpus.offsets
    del corpus
    torch.cuda.empty_cache()
    buf, view, starts, sc_starts = interleave(tok, sc, off)
    plain = off[:-1].contiguous()
    zero = torch.zeros_like(plain)
    calls = {
        "default": lambda: maxsim_candidates(q, cu_q, tok, off, cand, sc, check=False),
        "paged, as stored": lambda: maxsim_candidates(q, cu_q, tok, off, cand, sc, check=False,
                                                      starts=plain, scale_starts=plain),
        # the scales view must have a row per token row for the checks; the kernel reads past it
        "interleaved": lambda: maxsim_candidates(q, cu_q, buf, off, cand, view[: buf.shape[0]], check=False,
                                                 starts=starts, scale_starts=sc_starts),
        "scales at zero (bound)": lambda: maxsim_candidates(q, cu_q, tok, off, cand, sc, check=False,
                                                            starts=plain, scale_starts=zero),
    }
    ref = calls["default"]().clone()
    label = f"c-{n_docs // 1000}k"
    row = {"docs": n_docs, "tokens": tok.shape[0], "interleaved_rows": buf.shape[0],
           "equal_to_default": {name: bool(torch.equal(fn(), ref)) for name, fn in calls.items()}}
    if not (row["equal_to_default"]["paged, as stored"] and row["equal_to_default"]["interleaved"]):
        raise SystemExit(f"{label}: a layout's scores differ from the default call's: {row['equal_to_default']}")
    row["ms"], row["median_ms"] = alternating_rounds(calls, rounds)
    return label, row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--docs", default="1000000,150000")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    dev = "cuda"
    res = gpu_header(rounds=args.rounds, shapes={})
    for n_docs in (int(x) for x in args.docs.split(",")):
        label, row = measure(n_docs, args.rounds, dev)
        res["shapes"][label] = row
        print(label, {k: round(v, 4) for k, v in row["median_ms"].items()}, flush=True)
        torch.cuda.empty_cache()
    write_json(args.out, "scale-layout.json", res)


if __name__ == "__main__":
    main()
