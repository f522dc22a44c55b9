"""MaxSim kernel family: the fused Triton forward (kernel.py), its host function (launcher.py),
launch configs and autotuning (tuning.py), int8 query quantization (query_quant.py), the relaunch
machinery every family shares (runtime.py), pure-torch reference (naive.py), public functions
(ops.py); differentiable MaxSim for training in train/ (its own fused.py, ops.py, policy.py,
naive.py)."""

from mvdb.kernels.maxsim.ops import maxsim, maxsim_candidates, maxsim_varlen

__all__ = ["maxsim", "maxsim_candidates", "maxsim_varlen"]
