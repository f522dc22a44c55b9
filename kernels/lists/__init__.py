"""Candidate scoring over IVF centroid lists of documents (the token index's first stage).

Every query token has probed ``P`` lists (best first) with gains ``g[t, 0] >= ... >= g[t, P-1]``.
A document row's approximate score for a query is the sum over the query's tokens of the gain
of the first (best) probed list of that token holding the row. ``credit_lists`` computes it for
a chunk of queries into a dense [queries, rows] float32 table:

- Triton (CUDA): one program per query token walks the token's probed lists best first. Its own
  n_rows-bit bitmap (zeroed per launch) marks the rows this token already credited, so a row found
  again in a worse list is skipped; a fresh row gets the gain through an integer atomic add.
  Gains are fixed point (one scale per batch, no query's score can pass 2**31), so the sum is
  exact and the same whatever order the tokens land in. Rows are ascending within a list, so
  rows sharing a bitmap word are neighbours in a block: a segmented OR scan gathers their bits and
  one plain store per word sets them (atomics on the bitmap cost 1.6x at 1M rows). Memory: 4
  bytes per (query, row) plus up to 256 MB of bitmaps per launch.
  It replaces one program per query walking its tokens in order with int64 marker+score words
  (slower), and does not use one program per (token, list) with plain atomics (faster, but it
  credits a row once per probed list holding it, which loses recall at small candidate budgets).
- torch (CPU, and the reference): a [tokens, rows] scatter-amax scratch, summed per query.

Layout: ``fused.py`` the Triton kernel, ``naive.py`` the torch version, ``ops.py`` :func:`credit_lists`
(float scores), :func:`credit_lists_fixed`, :func:`fixed_gains` and :func:`token_queries` (the fixed-point table the
IVF candidate stage ranks directly).
"""

from mvdb.kernels.lists.ops import credit_lists, credit_lists_fixed, fixed_gains, list_bounds, token_queries

__all__ = ["credit_lists", "credit_lists_fixed", "fixed_gains", "list_bounds", "token_queries"]
