"""Differentiable MaxSim: a forward that saves the winning document token per (pair, query
token) as int32, and backwards that gather from it, so neither pass materialises the
query-token x doc-token similarity tensor.

Every layout is described by offsets: query i's tokens are ``q_off[i]:q_off[i+1]`` of a packed
[Tq, d] tensor; document ``doc`` is ``d_off[doc]:d_off[doc+1]`` of a packed [Td, d] tensor; pair
(i, k) scores query i against document k (cross product, every query against every document) or
against document i * K + k (per-query candidates). Padded batches are packed views with
``Lq`` / ``Ld`` tokens each and optional masks over the same token positions.

Backwards (``backward=``):
- ``"unified"``: one program per pair adds g * D[argmax] to dQ and g * Q to dD[argmax] with fp32
  atomics; fast, not bitwise reproducible, gradients accumulated in fp32.
- ``"lowmem"``: every gradient row is owned by one program (dQ rows by query; dD rows, in padded
  batches without a sort: per block of a document's rows, each query's 0/1 pick matrix times its
  tokens for the cross product, one program per document for per-query documents (whose only hits
  are their own pair's winners); otherwise from the winners sorted by the token they picked): no
  atomics, gradients written in the input dtype, bitwise identical run to run.

Layout: ``fused.py`` the Triton kernels, ``ops.py`` the launchers and the autograd Function,
``policy.py`` the launch tuning table and the ``auto`` backward's choice (measured once per shape
bucket on a GPU, a static rule elsewhere), ``naive.py`` torch forms
of the kernels' math (the gradients' reference is autograd through :mod:`mvdb.kernels.maxsim.naive`).
"""

from mvdb.kernels.maxsim.train.ops import backward, forward, padded, varlen
from mvdb.kernels.maxsim.train.policy import (
    AUTO_CHOICES,
    BACKWARDS,
    TUNE,
    choose_backward,
    grouped_queries,
    measured_backward,
)

__all__ = ["AUTO_CHOICES", "BACKWARDS", "TUNE", "backward", "choose_backward", "forward", "grouped_queries",
           "measured_backward", "padded", "varlen"]
