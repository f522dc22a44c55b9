"""Metadata filters: ``where={"lang": "en"}`` or ``{"lang": {"$in": ["en", "fr"]}}``; every
condition must hold. The snapshot's metadata is parsed once per state and cached with it."""

from __future__ import annotations

from json import loads as json_loads

import numpy as np
import torch

from mvdb.errors import InvalidInputError, InvalidTypeError


def parse(where) -> list[tuple[str, list]]:
    if not isinstance(where, dict) or not where:
        raise InvalidTypeError(f"where: expected a non-empty dict of field conditions, got {where!r}")
    conds = []
    for field, cond in where.items():
        if isinstance(cond, dict):
            if set(cond) != {"$in"} or not isinstance(cond["$in"], (list, tuple)):
                raise InvalidInputError(f"where[{field!r}]: expected a value or {{'$in': [values]}}, got {cond!r}")
            conds.append((field, list(cond["$in"])))
        else:
            conds.append((field, [cond]))
    return conds


def _metadata(state) -> list:
    meta = state.cache.get("metadata")
    if meta is None:
        n = state.n_rows
        meta = [json_loads(m) for m in state.snap.metadata(np.arange(n))] if n else []
        state.cache["metadata"] = meta
    return meta


def allowed_rows(state, where) -> torch.Tensor:
    """Live rows whose metadata match ``where`` (a bool mask on the device)."""
    conds = parse(where)
    ok = [isinstance(m, dict) and all(f in m and m[f] in vals for f, vals in conds) for m in _metadata(state)]
    return torch.tensor(ok, dtype=torch.bool, device=state.live.device) & state.live
