"""MaxSim kernel family: fused Triton forward and its autotuned launcher (fused.py), pure-torch
reference (naive.py), public functions (ops.py); differentiable MaxSim for training in train/
(its own fused.py, ops.py, policy.py, naive.py)."""

from mvdb.kernels.maxsim.ops import maxsim, maxsim_candidates, maxsim_varlen

__all__ = ["maxsim", "maxsim_candidates", "maxsim_varlen"]
