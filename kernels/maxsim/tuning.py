"""Launch policy of the MaxSim kernel: autotune candidates and their prune filter, the fixed
configs used without autotuning, the split of long queries across programs, and programmatic
dependent launch (PDL)."""

from __future__ import annotations

import functools
import threading

import torch
import triton
from mvdb.kernels import settings, winners
from mvdb.kernels.maxsim.kernel import CSR_CROSS, _maxsim_fwd_kernel
from mvdb.kernels.maxsim.runtime import interpreting

# Every query of up to 32 tokens shares one bucket (the configs' query tiles are at least 32 rows,
# so a smaller bucket would compile and tune the same configs again); a bucket is a compiled
# variant and an autotune entry of its own, so real queries (4-64 tokens) meet two.
LQ_BUCKETS = (32, 64, 128, 256, 512, 1024)


def lq_bucket(max_lq: int) -> int:
    """Autotune bucket of the longest query (queries past 512 tokens share the 'long' bucket)."""
    for b in LQ_BUCKETS:
        if max_lq <= b:
            return b
    return LQ_BUCKETS[-1]


@functools.lru_cache(maxsize=None)
def shared_memory_limit(index: int) -> int:
    """Bytes of shared memory one program may take on CUDA device ``index``."""
    return int(triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"])


def shared_bytes(block_q: int, block_d: int, stages: int, block_dim: int, q_bytes: int, d_bytes: int) -> int:
    """Shared memory a config takes: the query block, and a document tile per pipeline stage."""
    return block_q * block_dim * q_bytes + max(1, stages) * block_d * block_dim * d_bytes


def fits(block_q: int, block_d: int, stages: int, meta: dict, q, d) -> bool:
    """Whether a config's shared memory fits the device of the launch with constexprs ``meta``,
    query tokens ``q`` and document tokens ``d`` as the kernel gets them (unknown: yes)."""
    if q is None or d is None or not q.is_cuda:
        return True
    q_bytes = 1 if meta.get("INT8") and not meta.get("QUANT") else q.element_size()
    need = shared_bytes(block_q, block_d, stages, meta["BLOCK_DIM"], q_bytes, d.element_size())
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    return need <= shared_memory_limit(index)


def _fits(c, nargs, kwargs) -> bool:
    return fits(c.kwargs["BLOCK_Q"], c.kwargs["BLOCK_D"], c.num_stages, kwargs, (nargs or {}).get("Q"),
                (nargs or {}).get("D"))


def _configs():
    """Candidate launch configs; the prune filter keeps the ones that fit the query bucket.
    RUNMAX=1 keeps an elementwise running max over the document's tiles and reduces across the
    tile's columns once per document (fewer cross-lane reductions, one more [BLOCK_Q, BLOCK_D]
    block of registers); RUNMAX=0 reduces every tile."""
    out = []
    for bq in (32, 64, 128, 256):
        for bd in (32, 64, 128):
            for warps in (1, 2, 4, 8) if bq == 32 else (2, 4, 8):  # one warp: 32-token tiles only
                for stages in (1, 2, 3, 4) if warps == 1 else (2, 3, 4):  # no pipelining: one warp only
                    for runmax in (0, 1):
                        out.append(triton.Config({"BLOCK_Q": bq, "BLOCK_D": bd, "RUNMAX": runmax}, num_warps=warps,
                                                 num_stages=stages))
    return out


def _prune(configs, nargs, **kwargs):
    lq = kwargs["LQ_BUCKET"]
    full = settings.autotune() == "full"
    keep = []
    fitting = [c for c in configs if _fits(c, nargs, kwargs)] or configs[:1]
    for c in fitting:
        bq, bd = c.kwargs["BLOCK_Q"], c.kwargs["BLOCK_D"]
        if bq > max(32, lq):
            continue
        if not full:
            # The short list of configs that win somewhere: short queries are latency-bound
            # gathers, best with small tiles and 2-4 warps; long queries are compute-bound, best
            # with large query tiles and 3 stages. Queries of up to 32 tokens keep BLOCK_D 32 with
            # 2 warps only: it is near the best in every short case, while BLOCK_D 64 with 4 warps,
            # which the autotuner can pick on a noisy first call, is much slower on int8 candidates.
            # INT8 documents with the queries quantized by their own launch (not QUANT) add one
            # warp with 3 stages. Not with QUANT: one warp quantizing each program's query block
            # is slow. With the rows shared (QCACHE) one program per query quantizes and the others
            # load int8 rows as they do after the launch: the same list as without QUANT.
            # Queries quantized apart also add one warp with one stage (no software pipeline: less
            # shared memory per program, more programs per SM), which wins on some int8 layouts
            # and loses on others: the autotuner picks per layout and query bucket.
            one_warp = kwargs.get("INT8") and c.num_warps == 1 and (
                c.num_stages == 3 and (not kwargs.get("QUANT") or kwargs.get("QCACHE"))
                or c.num_stages == 1 and not kwargs.get("QUANT"))
            if lq <= 32 and not (bq == 32 and bd == 32 and (c.num_warps == 2 and c.num_stages in (2, 3) or one_warp)):
                continue
            if 32 < lq <= 64 and not (bq == max(32, lq) and bd in (32, 64) and c.num_warps in (2, 4)
                                 and c.num_stages in (2, 3)):
                continue
            if lq > 64 and not (bq >= 128 and bd in (64, 128) and c.num_warps in (4, 8) and c.num_stages == 3):
                continue
        keep.append(c)
    if not keep:
        # wide dims: every config of the short list is too large for shared memory; the short
        # list's shapes with the largest query tiles that fit (a handful, not every config)
        near = [c for c in fitting if c.kwargs["BLOCK_Q"] <= max(32, lq) and c.kwargs["BLOCK_D"] <= 64
                and c.num_warps in (2, 4) and c.num_stages in (2, 3)]
        top = max((c.kwargs["BLOCK_Q"] for c in near), default=None)
        keep = [c for c in near if c.kwargs["BLOCK_Q"] == top] or fitting[:1]
    return keep


_KEY = ["LQ_BUCKET", "DIM", "Q_VARLEN", "D_LAYOUT", "HAS_QMASK", "HAS_DMASK", "INT8", "PAGED", "QUANT", "QCACHE",
        "QCHUNK"]


def _claim_afresh(kwargs, reset_only=False):
    """Autotuning hook: the launch's query flags zeroed before each timed run (under the buffer's
    lock, on the launch's stream), so that every run of a shared-quantization config claims,
    quantizes and waits as a real launch does, instead of finding the first run's rows."""
    flags = kwargs.get("QFLAG")
    if flags is not None:
        flags.zero_()


_tuned = triton.autotune(configs=_configs(), key=_KEY, prune_configs_by={"early_config_prune": _prune},
                         pre_hook=_claim_afresh)(_maxsim_fwd_kernel)


def default_config(lq_bucket_: int, fits=None) -> dict:
    """Launch config used without autotuning (interpreter, MVDB_AUTOTUNE=0): the usual autotune
    winner for short and for long queries. ``fits(config) -> bool``: whether a config fits the
    device's shared memory; wide dims get fewer stages, then smaller tiles, until one does."""
    if interpreting():
        return {"BLOCK_Q": 16, "BLOCK_D": 16, "num_warps": 4, "RUNMAX": 1}
    if lq_bucket_ <= 64:
        c = {"BLOCK_Q": max(32, lq_bucket_), "BLOCK_D": 32, "num_warps": 2, "num_stages": 3, "RUNMAX": 1}
    else:
        # every query bucket above 64 tokens: BLOCK_D 64 fits two programs per SM, faster than
        # BLOCK_D 128 on long bf16 queries and as fast in int8
        c = {"BLOCK_Q": 128, "BLOCK_D": 64, "num_warps": 4, "num_stages": 3, "RUNMAX": 0}
    while fits is not None and not fits(c):
        if c["num_stages"] > 1:
            c["num_stages"] -= 1
        elif c["BLOCK_D"] > 16:
            c["BLOCK_D"] //= 2
        elif c["BLOCK_Q"] > 16:
            c["BLOCK_Q"] //= 2
        else:
            break
    return c


# Long queries against long documents are split across programs, QCHUNK_ROWS query rows each:
# from QCHUNK_MIN_LQ query tokens (the launch's longest query, or its estimate: the last chunk runs
# to the query's end, so an underestimate costs speed, not correctness; an overestimate is capped at
# the query tokens of the launch, and a grid past 2**31 - 1 programs is not split) and QCHUNK_MIN_LD document
# tokens on average (the padded length, or tokens / documents of a CSR store; paged stores, whose
# shapes do not tell, are not split). One program per pair loops over its query blocks and streams
# the whole document once per block; at ColPali's size (1,024 x 1,024 tokens, 1,000 documents)
# those passes are a document apart on every SM, tens of MB, and come back from HBM. Chunk programs
# of one document run side by side instead and share its tiles through L2. The chunks' sums land in
# an [n_chunks, Nq, K] buffer, added up in chunk order after the launch. Short documents are not
# split: one program's passes over such a document stay in L2, and the split only adds programs.
QCHUNK_ROWS = 256
QCHUNK_MIN_LQ = 512
QCHUNK_MIN_LD = 512


def query_chunks(max_lq: int, mean_ld: float) -> int:
    """Programs per (query, document) pair: 1, or one per QCHUNK_ROWS rows of long queries."""
    if QCHUNK_ROWS <= 0 or max_lq < max(QCHUNK_MIN_LQ, QCHUNK_ROWS + 1) or mean_ld < QCHUNK_MIN_LD:
        return 1
    return -(-max_lq // QCHUNK_ROWS)


def _mean_doc_len(layout: int, d: torch.Tensor, offsets, d_len: int, starts) -> float:
    """The documents' mean length from the shapes alone (0 where they do not tell: paged stores)."""
    if layout < int(CSR_CROSS.value):  # PADDED_CROSS, PADDED_PER_QUERY
        return d_len
    if starts is None and offsets is not None:
        return d.shape[0] / max(1, offsets.numel() - 1)
    return 0


# Programmatic dependent launch (Hopper and later), opt-in (MVDB_PDL=1): where the queries are
# quantized by a launch of their own, the MaxSim launch is its dependent and may start while it
# runs (its programs wait for the rows before reading them), which hides the gap between the two
# launches; never while a CUDA graph is captured nor on GPUs before sm_90. Not the default: it
# saves a little GPU time per call but costs host time, so calls whose pace the host sets get
# slower.
PDL = settings.pdl()
_PDL_DEVICES: dict[int, bool] = {}


def pdl_ok(device: torch.device) -> bool:
    if not PDL or interpreting() or device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    ok = _PDL_DEVICES.get(index)
    if ok is None:
        ok = _PDL_DEVICES[index] = torch.cuda.get_device_capability(index)[0] >= 9
    return ok


def autotuning() -> bool:
    return not interpreting() and settings.autotune() != "0"


_BEST: dict[tuple, dict] = {}  # autotune winners, launched directly (skips the autotuner's per-call work)
_TUNE_LOCK = threading.Lock()  # one autotuning run at a time (the autotuner keeps per-call state)
KERNEL = "maxsim_fwd"  # the kernel's name in the stored winners (mvdb.kernels.winners)


@functools.lru_cache(maxsize=None)
def _environment(device: torch.device) -> dict:
    return winners.environment(device, source=_maxsim_fwd_kernel.cache_key[:16])


def winner_key(q_dtype: torch.dtype, d_dtype: torch.dtype, meta: dict) -> str:
    """The stored winners' key of a launch: its autotune key values and dtypes."""
    return winners.key_of({"q": q_dtype, "d": d_dtype, **{k: meta[k] for k in _KEY}})


def stored_winner(device: torch.device, q_dtype: torch.dtype, d_dtype: torch.dtype, meta: dict) -> dict | None:
    """A winner an earlier process or the shipped table holds for this launch, else None."""
    return winners.get(KERNEL, winner_key(q_dtype, d_dtype, meta), _environment(device))


def store_winner(device: torch.device, q_dtype: torch.dtype, d_dtype: torch.dtype, meta: dict, config: dict) -> None:
    winners.put(KERNEL, winner_key(q_dtype, d_dtype, meta), _environment(device), config)
