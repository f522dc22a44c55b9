"""MaxSim kernel family: fused Triton forward (fused.py), pure-torch reference (naive.py)."""

from mvdb.kernels.maxsim.ops import maxsim, maxsim_candidates, maxsim_varlen

__all__ = ["maxsim", "maxsim_candidates", "maxsim_varlen"]
