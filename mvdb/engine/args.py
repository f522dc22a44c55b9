"""Checks of the arguments the database API shares: devices, ids, search options."""

from __future__ import annotations

import numpy as np
import torch

from mvdb.engine.filters import parse as parse_where
from mvdb.engine.search import check_k
from mvdb.errors import InvalidInputError, InvalidTypeError
from mvdb.kernels.codes import BITS as CODE_BITS
from mvdb.storage import validate

RESIDENCY = ("auto", "device", "host", "disk")
INDEX_KINDS = ("auto", "flat", "ivf")
DTYPES = ("float16", "int8")
PRERANKS = ("auto", "lists", "codes")  # what ranks the device tier's pool (the codes tiers' is always the codes)


def open_args(path, *, dim=None, dtype=None, index=None, nlist=None, residency="auto", read_only=False,
              checksums=True, progress=None, max_gpu_bytes=None, code_bits=None, prerank="auto") -> str:
    """Check the arguments of ``mvdb.open`` that need no device, before anything touches the disk
    (a refused open leaves no trace); returns the path as a str."""
    path = validate.db_path(path)
    validate.dim(dim)
    if dtype is not None and dtype not in DTYPES:
        raise InvalidInputError(f"dtype: expected one of {DTYPES} (or None), got {dtype!r}")
    if index is not None and index not in INDEX_KINDS:
        raise InvalidInputError(f"index: expected 'auto', 'flat' or 'ivf', got {index!r}")
    if nlist is not None and (isinstance(nlist, bool) or not isinstance(nlist, int) or nlist < 1):
        raise InvalidInputError(f"nlist: expected a positive int or None, got {nlist!r}")
    if residency not in RESIDENCY:
        raise InvalidInputError(f"residency: expected 'auto', 'device', 'host' or 'disk', got {residency!r}")
    if max_gpu_bytes is not None:
        validate.positive_int(max_gpu_bytes, "max_gpu_bytes")
    if code_bits is not None and (isinstance(code_bits, bool) or not isinstance(code_bits, (int, np.integer))
                                  or code_bits not in CODE_BITS):
        raise InvalidInputError(f"code_bits: expected one of {CODE_BITS} or None, got {code_bits!r}")
    if prerank not in PRERANKS:
        raise InvalidInputError(f"prerank: expected one of {PRERANKS}, got {prerank!r}")
    for name, v in (("read_only", read_only), ("checksums", checksums)):
        if not isinstance(v, bool):
            raise InvalidTypeError(f"{name}: expected a bool, got {type(v).__name__}")
    if progress is not None and not isinstance(progress, bool):
        raise InvalidTypeError(f"progress: expected a bool or None, got {type(progress).__name__}")
    return path


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
            validate.unicode_text(v, f"ids[{i}]")
        elif isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
            kinds.add("int")
        else:
            raise InvalidTypeError(f"ids[{i}]: expected an int or str id, got {type(v).__name__}")
    if len(kinds) > 1:
        raise InvalidTypeError("ids: expected all int or all str ids, got a mix")
    return values
