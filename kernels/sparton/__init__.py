"""Sparton: the SPLADE head (LM-head logits, ReLU, log1p, masked max over the sequence) fused into
one tiled matmul that never materialises the [B, S, V] logits.

    out[b, v] = max over unmasked s of log1p(relu(hidden[b, s] . weight[v] + bias[v]))

log1p(relu(.)) is non-decreasing, so the max is taken over the raw logits and the activation is
applied once per (b, v). The forward saves the winning position per (b, v) as int32; the
backward sends g * (x > 0) / (1 + x) (x the winning logit) to that position only:
- d_hidden[b, s] = sum over v won by s of gz[b, v] * weight[v]: a one-hot matmul per sequence
  tile, the same FLOPs as the forward;
- d_weight[v] = sum over b of gz[b, v] * hidden[b, s*(b, v)]: a gather (fp32 sums);
- d_bias[v] = sum over b of gz[b, v].
A (b, v) with every position masked, or with no positive logit, outputs 0 and sends no gradient.
Ties go to the first position (torch's amax would split the gradient).

``backend="auto"``: Triton on CUDA (or CPU with TRITON_INTERPRET=1), else a pure-torch fallback
with the same argmax backward that materialises the logits one vocabulary chunk at a time.
:func:`reference` is the naive composition (all logits at once) the tests compare against.

Layout: ``fused.py`` the Triton kernels, ``naive.py`` the torch fallback and :func:`reference`,
``ops.py`` :func:`sparton`, :class:`SpartonHead`, the launchers and the autograd Function.
"""

from mvdb.kernels.sparton.naive import reference
from mvdb.kernels.sparton.ops import BACKENDS, TUNE, SpartonHead, sparton

__all__ = ["BACKENDS", "TUNE", "SpartonHead", "reference", "sparton"]
