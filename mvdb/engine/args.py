"""Checks of the arguments the database API shares: devices, ids, search options."""

from __future__ import annotations

import numpy as np
import torch

from mvdb.engine.filters import parse as parse_where
from mvdb.engine.search import check_k
from mvdb.errors import InvalidInputError, InvalidTypeError

RESIDENCY = ("auto", "device", "host")


def device_arg(device) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError):
        raise InvalidInputError(f"device: expected 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from None
    if d.type == "cuda" and not torch.cuda.is_available():
        raise InvalidInputError(f"device: {device!r} asked for, but CUDA is not available here")
    return d


def search_args(where, **options) -> None:
    """Check ``where`` and the candidate-stage options up front, so that they are rejected even
    when the database is empty."""
    if where is not None:
        parse_where(where)
    for name, v in options.items():
        if v is not None:
            check_k(v, name)


def ids_arg(ids):
    """Check an ids argument (one int or str id, or a list / array of them); returns it as the
    store reads it (an iterator becomes a list). InvalidTypeError for anything else."""
    if isinstance(ids, str) or (isinstance(ids, (int, np.integer)) and not isinstance(ids, (bool, np.bool_))):
        return ids
    if isinstance(ids, torch.Tensor):
        if ids.ndim != 1 or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise InvalidTypeError(f"ids: expected a 1-D integer tensor of ids, got {ids.dtype} of shape "
                                   f"{tuple(ids.shape)}")
        return ids
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1 or ids.dtype.kind not in "iuUO":
            raise InvalidTypeError(f"ids: expected a 1-D array of int or str ids, got {ids.dtype} of shape {ids.shape}")
        if ids.dtype.kind in "iu":
            return ids
    elif isinstance(ids, (bytes, dict)) or not hasattr(ids, "__iter__"):
        raise InvalidTypeError(f"ids: expected an int or str id, or a list of them, got {type(ids).__name__}")
    values = ids.tolist() if isinstance(ids, np.ndarray) else list(ids)
    kinds = set()
    for i, v in enumerate(values):
        if isinstance(v, str):
            kinds.add("str")
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                raise InvalidInputError(f"ids[{i}]: expected a str that encodes to UTF-8, got a lone surrogate "
                                        f"at position {e.start}") from None
        elif isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
            kinds.add("int")
        else:
            raise InvalidTypeError(f"ids[{i}]: expected an int or str id, got {type(v).__name__}")
    if len(kinds) > 1:
        raise InvalidTypeError("ids: expected all int or all str ids, got a mix")
    return values
