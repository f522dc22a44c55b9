"""Adapters that run two third-party MaxSim kernels on mvdb's benchmark inputs.

score(q, d) = sum_i max_j <q_i, d_j>. Every adapter returns float32 scores on the input device and
imports its peer lazily, so this module imports without them. Timed functions (naive_*, fm_*,
lik_*) do only what the peer's API needs around its kernel; prepare_* / *_prepare_* functions do
the once-per-corpus work (padding, quantizing, casting offsets) and belong outside the timed region.

Inputs the peers want, or they copy or convert on every call: contiguous fp16 tokens (every
flash-maxsim path but fm_dense casts bf16 / fp32 to fp16, a copy of the whole corpus; lik takes
fp16 / bf16 as is and rounds fp32 tiles to fp16 in the kernel), int32 cu_seqlens / offsets (both
peers cast other dtypes on every call), d a power of two >= 16 (flash_maxsim_packed zero-pads every
token to the next one, a copy of the corpus). fm_candidates, lik_varlen_1q and lik_candidates
address tokens with int32 arithmetic: keep T * d < 2**31.
"""

from __future__ import annotations

import functools
import importlib

import torch

MISSING = {
    "flash-maxsim": [
        "several queries against packed varlen docs in one call (flash_maxsim_packed takes one query)",
        "int8 on packed (unpadded) docs: flash_maxsim_int8x8 wants padded [n, Ld, d] plus doc_lengths",
        "several queries in one int8 call (flash_maxsim_int8x8 takes one query)",
        "candidate lists of several queries in one call (flash_maxsim_rerank_direct takes one query)",
        "fp8",
    ],
    "late-interaction-kernels": [
        "int8 (its only quantized path is fp8: fp8.maxsim_inference_fp8)",
        "fp8 on packed varlen docs or candidate lists (fp8 takes padded [Nd, Ld, d] only)",
    ],
}


def versions() -> dict:
    """Each peer's version, or the error its import raised."""
    out = {}
    for name, module in (("flash-maxsim", "flash_maxsim"), ("late-interaction-kernels", "late_interaction_kernels")):
        try:
            out[name] = importlib.import_module(module).__version__
        except Exception as e:  # noqa: BLE001 - reported, not raised
            out[name] = f"{type(e).__name__}: {e}"
    return out


def prepare_packed(offsets: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Per corpus: offsets [n+1] -> (int32 offsets, longest doc), the form both peers take."""
    return offsets.to(torch.int32).contiguous(), int((offsets[1:] - offsets[:-1]).max())


def _pad(tokens: torch.Tensor, cu_d: torch.Tensor, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed docs -> zero-padded [n, max_len, d] and valid mask [n, max_len]."""
    lengths = cu_d[1:] - cu_d[:-1]  # [n]
    pos = torch.arange(max_len, device=tokens.device)
    mask = pos < lengths[:, None]  # [n, max_len]
    rows = (cu_d[:-1, None] + pos).clamp_max(tokens.shape[0] - 1)  # [n, max_len]
    return tokens[rows] * mask[..., None], mask


def naive_padded(Q: torch.Tensor, D: torch.Tensor, d_mask: torch.Tensor | None = None) -> torch.Tensor:
    """s[q, n] = sum_i max_{valid j} <Q[q, i], D[n, j]>, one einsum in the input dtype -> [Nq, Nd]."""
    S = torch.einsum("qid,njd->qnij", Q, D)  # [Nq, Nd, Lq, Ld]
    if d_mask is not None:
        S.masked_fill_(~d_mask[None, :, None, :], float("-inf"))
    return S.amax(-1).sum(-1).float()


def naive_varlen_1q(q: torch.Tensor, tokens: torch.Tensor, cu_d: torch.Tensor) -> torch.Tensor:
    """q [Lq, d] against packed docs -> [n]; pads with torch ops (timed: a naive user pays it)."""
    max_len = int((cu_d[1:] - cu_d[:-1]).max())
    D, mask = _pad(tokens, cu_d, max_len)
    return naive_padded(q[None], D, mask)[0]


def fm_varlen_1q(q: torch.Tensor, tokens: torch.Tensor, cu_d: torch.Tensor, max_len: int) -> torch.Tensor:
    """flash_maxsim_packed(q, tokens, cu_d, max_len) -> [n]; q [Lq, d], cu_d int32 [n+1].

    The kernel walks each doc's own length (max_len is unused by the peer); Lq > 128 is split
    into 128-token chunks whose scores are summed.
    """
    from flash_maxsim import flash_maxsim_packed

    return flash_maxsim_packed(q, tokens, cu_d, max_len)


def fm_dense(Q: torch.Tensor, D: torch.Tensor) -> torch.Tensor:
    """flash_maxsim_batched(Q, D, shared_docs=True) -> [Nq, Nd]; Q [Nq, Lq, d], D [Nd, Ld, d].

    The peer zero-pads Q to Lq in {32, 64, 128} on each call and chunks Lq > 128 into 128s. It
    computes in the input dtype (fp16, bf16; fp32 runs a tf32 dot), unlike its other entry points.
    """
    from flash_maxsim import flash_maxsim_batched

    return flash_maxsim_batched(Q, D, shared_docs=True)


def fm_prepare_int8(D: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per corpus: quantize_int8_symmetric(D) -> (int8 [Nd, Ld, d], fp16 scales [Nd, Ld, 1])."""
    from flash_maxsim import quantize_int8_symmetric

    return quantize_int8_symmetric(D)


def fm_int8_dense(Q: torch.Tensor, D_int8: torch.Tensor, d_scales: torch.Tensor) -> torch.Tensor:
    """flash_maxsim_int8x8(Q[i], D_int8, d_scales) per query i, stacked -> [Nq, Nd].

    The peer takes one query per call and quantizes it per token (quantize_query_int8) inside.
    """
    from flash_maxsim import flash_maxsim_int8x8

    return torch.stack([flash_maxsim_int8x8(q, D_int8, d_scales) for q in Q])


def fm_prepare_int8_varlen(tokens: torch.Tensor, cu_d: torch.Tensor, max_len: int) -> tuple:
    """Per corpus: pad packed docs to [n, max_len, d] and quantize -> (int8, scales, int32 lengths)."""
    D, _ = _pad(tokens, cu_d, max_len)
    return (*fm_prepare_int8(D), (cu_d[1:] - cu_d[:-1]).to(torch.int32))


def fm_int8_varlen_1q(
    q: torch.Tensor, D_int8: torch.Tensor, d_scales: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """flash_maxsim_int8x8(q, D_int8, d_scales, doc_lengths=lengths) -> [n].

    Docs are stored padded (the peer has no packed int8 layout) and every doc walks the whole
    padded length; tokens past lengths[k] are masked out.
    """
    from flash_maxsim import flash_maxsim_int8x8

    return flash_maxsim_int8x8(q, D_int8, d_scales, doc_lengths=lengths)


def fm_candidates(
    Q: torch.Tensor, tokens: torch.Tensor, offsets: torch.Tensor, cand: torch.Tensor, max_len: int
) -> torch.Tensor:
    """flash_maxsim_rerank_direct(Q[i], tokens, start[i], length[i], max_len) per query i -> [Nq, K].

    start = offsets[cand], length = offsets[cand + 1] - start (int32, gathered in the timed region).
    Q [Nq, Lq, d]; tokens [T, d] fp16; offsets [n+1]; cand [Nq, K] valid doc ids (no -1 padding);
    max_len = longest doc of the corpus: every doc walks it, rounded up to 32, 64, ..., 4096.
    """
    from flash_maxsim import flash_maxsim_rerank_direct

    start = offsets[cand]  # [Nq, K]
    length = (offsets[cand + 1] - start).to(torch.int32)  # [Nq, K]
    start = start.to(torch.int32)
    return torch.stack([flash_maxsim_rerank_direct(q, tokens, s, n, max_len) for q, s, n in zip(Q, start, length)])


@functools.lru_cache(maxsize=64)
def _lik_index(nq: int, lq: int, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cu_seqlens_q [nq+1] of nq queries of lq tokens, and query id of each of nq*k pairs."""
    cu_q = torch.arange(nq + 1, dtype=torch.int32, device=device) * lq
    pair_q = torch.arange(nq, dtype=torch.int32, device=device).repeat_interleave(k)
    return cu_q, pair_q


def lik_varlen_1q(q: torch.Tensor, tokens: torch.Tensor, cu_d: torch.Tensor, max_len: int) -> torch.Tensor:
    """maxsim_varlen(q, tokens, [0, Lq], cu_d, max_seqlen_q=Lq, max_seqlen_d=max_len)[0] -> [n].

    Every doc walks max_len tokens (masked past its own length); the peer also checks max_len
    against cu_d on the device on every call (a pass over cu_d, no sync).
    """
    from late_interaction_kernels import maxsim_varlen

    cu_q, _ = _lik_index(1, q.shape[0], 0, q.device)
    return maxsim_varlen(q, tokens, cu_q, cu_d, max_seqlen_q=q.shape[0], max_seqlen_d=max_len)[0]


def lik_dense(Q: torch.Tensor, D: torch.Tensor) -> torch.Tensor:
    """maxsim(Q, D) -> [Nq, Nd]; Q [Nq, Lq, d], D [Nd, Ld, d], normalize=False.

    The peer pads Q to a power-of-two Lq >= 16 (plus a q_mask) on each call when Lq is not one,
    and chunks Lq > 512. Its first call in a process syncs once (a norm check on Q).
    """
    from late_interaction_kernels import maxsim

    return maxsim(Q, D)


def lik_prepare_fp8(D: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per corpus: fp8.quantize_fp8_per_token(D) -> (float8_e4m3fn [Nd, Ld, d], fp32 scales [Nd, Ld])."""
    from late_interaction_kernels.fp8 import quantize_fp8_per_token

    return quantize_fp8_per_token(D)


def lik_fp8_dense(Q: torch.Tensor, D_fp8: torch.Tensor, d_scales: torch.Tensor) -> torch.Tensor:
    """maxsim_inference_fp8(Q_fp8, D_fp8, scale_Q=q_scales, scale_D=d_scales) -> [Nq, Nd].

    (Q_fp8, q_scales) = fp8.quantize_fp8_per_token(Q), in the timed region. Per-token scales on
    both sides keep the peer from syncing (per-tensor scales cost it a .item()). Needs sm90+ (H100):
    elsewhere the peer dequantizes to bf16 and runs its bf16 kernel, with a one-time warning.
    """
    from late_interaction_kernels.fp8 import maxsim_inference_fp8, quantize_fp8_per_token

    Q_fp8, q_scales = quantize_fp8_per_token(Q)
    return maxsim_inference_fp8(Q_fp8, D_fp8, scale_Q=q_scales, scale_D=d_scales)


def lik_candidates(
    Q: torch.Tensor, tokens: torch.Tensor, offsets: torch.Tensor, cand: torch.Tensor, max_len: int
) -> torch.Tensor:
    """score_pairs.score_pairs_packed over the Nq*K (query, cand) pairs -> [Nq, K].

    Called as score_pairs_packed(Q.reshape(Nq*Lq, d), tokens, cu_q, offsets, pair_q, cand.reshape(-1),
    max_seqlen_q=Lq, max_seqlen_d=max_len), cu_q = [0, Lq, 2Lq, ...], pair_q = [0]*K + [1]*K + ...
    (cached). offsets should be int32 (prepare_packed): the peer casts others on every call and
    checks max_len against all of them on the device. cand: valid doc ids, no -1 padding.
    """
    from late_interaction_kernels.score_pairs import score_pairs_packed

    nq, lq, d = Q.shape
    cu_q, pair_q = _lik_index(nq, lq, cand.shape[1], Q.device)
    out = score_pairs_packed(
        Q.reshape(nq * lq, d), tokens, cu_q, offsets, pair_q, cand.reshape(-1), max_seqlen_q=lq, max_seqlen_d=max_len
    )  # [Nq * K]
    return out.view(cand.shape)
