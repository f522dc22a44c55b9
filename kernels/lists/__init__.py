"""Candidate scoring over IVF centroid lists of documents (the token index's first stage).

Every query token has probed ``P`` lists (best first) with gains ``g[t, 0] >= ... >= g[t, P-1]``.
A document row's approximate score for a query is the sum over the query's tokens of the gain
of the first (best) probed list of that token holding the row. ``credit_lists`` computes it for
a chunk of queries into a dense [queries, rows] float32 table:

- Triton (CUDA): one program per query walks its tokens and their lists in order. Each (query,
  row) has one int64 word: a marker (the last token that credited the row) in the high half and
  the float32 score in the low half, so a row found again in a worse list of the same token is
  skipped, and an entry costs one random read and one write (separate int16 marker and float32
  score tables cost two of each: 1.5-1.9x slower at 1M documents on the H100,
  benchmarks/search_profile.py). A barrier after each block of list entries makes the block's
  writes visible to the next one. Rows within one list are distinct, so a block has no conflicts.
  Memory: 8 bytes per (query, row), no [tokens, rows] scratch.
- torch (CPU, and the reference): a [tokens, rows] scatter-amax scratch, summed per query.

Layout: ``fused.py`` the Triton kernel, ``naive.py`` the torch version, ``ops.py`` :func:`credit_lists`.
"""

from mvdb.kernels.lists.ops import credit_lists

__all__ = ["credit_lists"]
