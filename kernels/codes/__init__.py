"""Residual codes: each stored token as its IVF list plus ``bits`` bits per dimension of its
residual (PLAID-style, with per-dimension quantile buckets), and approximate MaxSim over them.

    x ~ centroids[lists[t]] + weights[d, code[t, d]]        for each dimension d

``bits`` is 1, 2 or 4. At dim 128 a token takes 2 + 32 bytes at 2 bits (2 + 16 at 1, 2 + 64 at
4; the list id is 16 bits up to 65536 lists, else 32), against 256 in float16, so a large
candidate pool can be ranked on the device while the exact tokens live in host memory or on disk.
Layout: ``naive.py`` (torch: training, packing, the reference and the CPU path), ``fused.py``
(the Triton kernel), ``ops.py`` (the public functions).
"""

from mvdb.kernels.codes.ops import BITS, approx_maxsim_candidates, decode, encode, train_buckets

__all__ = ["BITS", "approx_maxsim_candidates", "decode", "encode", "train_buckets"]
