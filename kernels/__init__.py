"""Fused MaxSim and Sparton (SPLADE head) kernels (Triton) with pure-torch references; usable
without a database.

    from mvdb.kernels import maxsim, maxsim_varlen, maxsim_candidates, quantize_int8, sparton

One folder per kernel family (maxsim/ inference, maxsim/train/ training, lists/, codes/, sparton/),
each with naive.py (the pure-torch reference), the Triton kernels (fused.py; maxsim/ splits its
forward into kernel.py and the host modules beside it) and ops.py (the public host functions);
quant.py, warmup.py, errors.py and _checks.py are shared.
"""

from mvdb.kernels.maxsim import maxsim, maxsim_candidates, maxsim_varlen
from mvdb.kernels.quant import dequantize_int8, quantize_int8
from mvdb.kernels.sparton import SpartonHead, sparton
from mvdb.kernels.warmup import warmup

__all__ = [
    "dequantize_int8",
    "maxsim",
    "maxsim_candidates",
    "maxsim_varlen",
    "quantize_int8",
    "sparton",
    "SpartonHead",
    "warmup",
]
