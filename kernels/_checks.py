"""Input validation shared by the public kernel functions.

Every message names the argument, what was expected and what came. Checks that need the
tensors' values (monotonic offsets, candidate range) are batched into one device->host copy.
"""

from __future__ import annotations

import torch

from mvdb.kernels.errors import DeviceMismatchError, InvalidInputError, InvalidTypeError

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
TOKEN_DTYPES = FLOAT_DTYPES + (torch.int8,)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tensor(name: str, x, ndims: tuple[int, ...], dtypes: tuple[torch.dtype, ...]) -> torch.Tensor:
    """Check that ``x`` is a tensor with one of ``ndims`` dimensions and one of ``dtypes``."""
    if not isinstance(x, torch.Tensor):
        raise InvalidTypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() not in ndims:
        want = " or ".join(f"{n}-D" for n in ndims)
        raise InvalidInputError(f"{name}: expected a {want} tensor, got shape {tuple(x.shape)}")
    if x.dtype not in dtypes:
        want = "/".join(_dtype_name(d) for d in dtypes)
        raise InvalidTypeError(f"{name}: expected dtype {want}, got {_dtype_name(x.dtype)}")
    return x


def same_device(**tensors: torch.Tensor | None) -> torch.device:
    """All given tensors live on one device; return it."""
    first_name = device = None
    for name, t in tensors.items():
        if t is None:
            continue
        if device is None:
            first_name, device = name, t.device
        elif t.device != device:
            raise DeviceMismatchError(f"{name}: expected a tensor on {device} (like {first_name}), got {t.device}")
    if device is None:
        raise InvalidInputError(f"{', '.join(tensors) or 'tensors'}: expected at least one tensor, got only None")
    return device


def dim_match(name: str, x: torch.Tensor, dim: int, what: str = "query dim") -> None:
    if x.shape[-1] != dim:
        raise InvalidInputError(f"{name}: expected last dim {dim} ({what}), got {x.shape[-1]}")
    if dim == 0:
        raise InvalidInputError(f"{name}: expected a positive embedding dim, got 0")


def shape_match(name: str, x: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(x.shape) != tuple(shape):
        raise InvalidInputError(f"{name}: expected shape {tuple(shape)}, got {tuple(x.shape)}")


def scales(tokens_name: str, tokens: torch.Tensor, scales: torch.Tensor | None, shape) -> None:
    """int8 tokens need fp32 per-token scales of ``shape``; float tokens take none."""
    if tokens.dtype == torch.int8:
        if scales is None:
            raise InvalidInputError(
                f"scales: expected float32 per-token scales of shape {tuple(shape)} for int8 "
                f"{tokens_name}, got None (quantize with mvdb.kernels.quantize_int8)"
            )
        tensor("scales", scales, (len(shape),), (torch.float32,))
        shape_match("scales", scales, shape)
    elif scales is not None:
        raise InvalidInputError(
            f"scales: expected None for {_dtype_name(tokens.dtype)} {tokens_name} "
            f"(scales are only for int8), got a tensor"
        )


def mask(name: str, m: torch.Tensor | None, shape: tuple[int, ...]) -> None:
    if m is None:
        return
    tensor(name, m, (len(shape),), (torch.bool,))
    shape_match(name, m, shape)


def value_checks(
    cu: list[tuple[str, torch.Tensor, int]],
    cand: tuple[torch.Tensor, int] | None = None,
) -> list[int]:
    """Check offsets arrays and candidate ranges with one sync; return each offsets array's max length.

    ``cu`` holds ``(name, offsets, expected_last)``: offsets must start at 0, never decrease and
    end at ``expected_last`` (the token count). ``cand`` is ``(cand, n_docs)``: entries in [-1, n_docs).
    """
    stats = []
    for _, off, _ in cu:
        lens = off[1:] - off[:-1]
        stats += [
            off[0].long(),
            off[-1].long(),
            lens.min().long() if lens.numel() else off.new_zeros((), dtype=torch.long),
            lens.max().long() if lens.numel() else off.new_zeros((), dtype=torch.long),
        ]
    if cand is not None and cand[0].numel():
        stats += [cand[0].min(), cand[0].max()]
    values = torch.stack(stats).tolist() if stats else []
    max_lens = []
    for i, (name, _, last) in enumerate(cu):
        first, end, lo, hi = values[4 * i : 4 * i + 4]
        if first != 0:
            raise InvalidInputError(f"{name}: expected first entry 0, got {first}")
        if lo < 0:
            raise InvalidInputError(f"{name}: expected non-decreasing offsets, got a decrease of {-lo}")
        if end != last:
            raise InvalidInputError(f"{name}: expected last entry {last} (the token count), got {end}")
        max_lens.append(hi)
    if cand is not None and cand[0].numel():
        lo, hi = values[-2:]
        n_docs = cand[1]
        if lo < -1 or hi >= n_docs:
            bad = lo if lo < -1 else hi
            raise InvalidInputError(
                f"cand: expected document indices in [0, {n_docs}) or -1 for padding, got {bad}"
            )
    return max_lens
