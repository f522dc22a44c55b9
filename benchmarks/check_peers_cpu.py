"""Check benchmarks/peers.py on tiny CPU shapes under the Triton interpreter against a float64 MaxSim.

score(q, d) = sum_i max_j <q_i, d_j>. Prints each adapter's max error relative to max |score| and exits 1
when an adapter that ran is off by more than its tolerance (or raised). Monkeypatches, here only: the
autotuners keep one config (the interpreter has no benchmarker), and the two peer paths that refuse CPU
tensors (flash_maxsim_rerank_direct asserts Q.is_cuda; lik fp8 wants CUDA sm90+) are told they are on CUDA.
"""

from __future__ import annotations

import contextlib
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("LIK_SUPPRESS_NORM_WARN", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from triton.runtime.autotuner import Autotuner  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402

_prune = Autotuner.prune_configs
Autotuner.prune_configs = lambda self, kwargs: _prune(self, kwargs)[:1]

EXACT, QUANT = 1e-2, 5e-2  # fp16 operands with fp32 accumulation; int8 / fp8 operands


@contextlib.contextmanager
def pretend_cuda():
    """Make Tensor.is_cuda and the lik fp8 arch check say yes, for the peers' CPU refusals."""
    import late_interaction_kernels.fp8 as fp8

    hopper = fp8._hopper_or_newer
    torch.Tensor.is_cuda = property(lambda self: True)
    fp8._hopper_or_newer = lambda: True
    try:
        yield
    finally:
        del torch.Tensor.is_cuda
        fp8._hopper_or_newer = hopper


def ref(q: torch.Tensor, d: torch.Tensor) -> float:
    """sum_i max_j <q_i, d_j> in float64; q [Lq, dim], d [Ld, dim]."""
    return (q.double() @ d.double().T).amax(1).sum().item()


def cases(dtype: torch.dtype, dim: int, g: torch.Generator):
    """(name, tolerance, thunk, float64 expected) for every adapter on one seeded problem."""
    nq, lq, n, nd, ld, k = 3, 5, 6, 4, 24, 4
    unit = lambda *s: F.normalize(torch.randn(*s, dim, generator=g), dim=-1).to(dtype)  # noqa: E731
    Q, D = unit(nq, lq), unit(nd, ld)
    lengths = torch.randint(3, 41, (n,), generator=g)
    offsets = F.pad(lengths.cumsum(0), (1, 0))  # int64 [n+1]
    tokens = unit(int(offsets[-1]))  # [T, dim]
    cu_d, max_len = peers.prepare_packed(offsets)
    cand = torch.randint(0, n, (nq, k), generator=g)
    docs = [tokens[offsets[i] : offsets[i + 1]] for i in range(n)]
    dense = torch.tensor([[ref(q, d) for d in D] for q in Q], dtype=torch.float64)  # [Nq, Nd]
    varlen = torch.tensor([[ref(q, d) for d in docs] for q in Q], dtype=torch.float64)  # [Nq, n]
    padded, mask = peers._pad(tokens, cu_d, max_len)
    yield "naive_padded", EXACT, lambda: peers.naive_padded(Q, padded, mask), varlen
    yield "naive_varlen_1q", EXACT, lambda: peers.naive_varlen_1q(Q[0], tokens, cu_d), varlen[0]
    yield "fm_varlen_1q", EXACT, lambda: peers.fm_varlen_1q(Q[0], tokens, cu_d, max_len), varlen[0]
    yield "fm_dense", EXACT, lambda: peers.fm_dense(Q, D), dense
    yield "fm_int8_dense", QUANT, lambda: peers.fm_int8_dense(Q, *peers.fm_prepare_int8(D)), dense
    prep = lambda: peers.fm_prepare_int8_varlen(tokens, cu_d, max_len)  # noqa: E731
    yield "fm_int8_varlen_1q", QUANT, lambda: peers.fm_int8_varlen_1q(Q[0], *prep()), varlen[0]
    picked = varlen.gather(1, cand)  # [Nq, K]
    yield "fm_candidates*", EXACT, lambda: peers.fm_candidates(Q, tokens, offsets, cand, max_len), picked
    yield "lik_varlen_1q", EXACT, lambda: peers.lik_varlen_1q(Q[0], tokens, cu_d, max_len), varlen[0]
    yield "lik_dense", EXACT, lambda: peers.lik_dense(Q, D), dense
    yield "lik_fp8_dense*", QUANT, lambda: peers.lik_fp8_dense(Q, *peers.lik_prepare_fp8(D)), dense
    yield "lik_candidates", EXACT, lambda: peers.lik_candidates(Q, tokens, cu_d, cand, max_len), picked


def main() -> int:
    print(peers.versions())
    g = torch.Generator().manual_seed(0)
    bad = 0
    for dtype in (torch.float32, torch.float16):
        for dim in (32, 64):
            for name, tol, run, want in cases(dtype, dim, g):
                try:
                    with pretend_cuda() if name.endswith("*") else contextlib.nullcontext():
                        got = run()
                except ImportError as e:
                    print(f"skip {name:20s} {dtype} d={dim}: {e}")
                    continue
                except Exception as e:  # noqa: BLE001 - any other failure counts against the adapter
                    print(f"FAIL {name:20s} {dtype} d={dim}: {type(e).__name__}: {e}")
                    bad += 1
                    continue
                ok = got.dtype == torch.float32 and got.shape == want.shape
                err = ((got.double() - want).abs().max() / want.abs().max()).item() if ok else float("inf")
                ok = ok and err <= tol
                bad += not ok
                print(f"{'ok  ' if ok else 'FAIL'} {name:20s} {dtype} d={dim}: max rel err {err:.2e} (tol {tol:.0e})")
    print("* ran with is_cuda (and, for fp8, the sm90 check) patched to True")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
