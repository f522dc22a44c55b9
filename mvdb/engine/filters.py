"""Metadata filters (``where=``): a small query language over each document's metadata dict.

A filter is a non-empty dict; every entry must hold (an implicit and):

- ``{"field": value}``: the field equals ``value``;
- ``{"field": {"$op": operand, ...}}``: per-field operators (all must hold): ``$eq``, ``$ne``,
  ``$gt``, ``$gte``, ``$lt``, ``$lte``, ``$in`` (a list), ``$nin`` (a list), ``$exists`` (a bool);
- ``{"$and": [filters]}``, ``{"$or": [filters]}`` (non-empty lists), ``{"$not": filter}``.

Equality is type-strict (bool, number, str, null, list, dict are different kinds: ``True`` never
equals ``1``; ``1`` equals ``1.0``) and compares lists and dicts whole. ``$gt``/``$gte``/``$lt``/
``$lte`` take a number or a str and match only values of the same kind. A missing field (or a
document without metadata) matches ``$ne``, ``$nin`` and ``$exists: False`` and nothing else.
Unknown ``$`` operators are an error. A filter holds at most ``MAX_FILTER_NODES`` conditions
(field conditions and ``$and``/``$or``/``$not`` entries, counted as written out: a sub-filter used
twice counts twice) and ``MAX_FILTER_VALUES`` operand values, so compiling it and testing one
document take time linear in its size; ``$in`` / ``$nin`` test membership in a hashed set. The
snapshot's metadata is parsed once per state and cached with it.
"""

from __future__ import annotations

import math
import reprlib

import numpy as np
import torch

from mvdb.errors import InvalidInputError, InvalidTypeError
from mvdb.storage import validate
from mvdb.storage.validate import MAX_DEPTH, too_deep

LOGICAL = ("$and", "$or", "$not")
MAX_FILTER_NODES = 1_000  # conditions; for many values of one field, use {"$in": [...]}
MAX_FILTER_VALUES = 1_000_000  # scalars inside operands (a $in list of ids, say)
FIELD_OPS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists")

_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxstring, _repr.maxother = 3, 60, 60
_MISSING = object()


def _show(x) -> str:
    """A bounded repr for messages (safe on huge or deeply nested values)."""
    return _repr.repr(x)


def _kind(v) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "str"
    if v is None:
        return "null"
    if isinstance(v, list):
        return "list"
    if isinstance(v, dict):
        return "dict"
    return "other"


def _equal(a, b) -> bool:
    """Type-strict equality of JSON values (a bool never equals a number; 1 == 1.0)."""
    ka = _kind(a)
    if ka != _kind(b):
        return False
    if ka == "list":
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if ka == "dict":
        return a.keys() == b.keys() and all(_equal(a[f], b[f]) for f in a)
    return a == b


class _Budget:
    """What is left of a filter's size limits while it compiles (see the module docstring)."""

    def __init__(self):
        self.nodes, self.values = MAX_FILTER_NODES, MAX_FILTER_VALUES

    def node(self, where: str) -> None:
        self.nodes -= 1
        if self.nodes < 0:
            raise InvalidInputError(f"{where}: the filter holds more than {MAX_FILTER_NODES:,} conditions (a sub-filter "
                                    f"used n times counts n times); to match many values of one field use "
                                    f"{{'field': {{'$in': [...]}}}}")

    def value(self, where: str, n: int = 1) -> None:
        self.values -= n
        if self.values < 0:
            raise InvalidInputError(f"{where}: the filter holds more than {MAX_FILTER_VALUES:,} operand values")


def _key(v):
    """A hashable form of a JSON value with the equality of ``_equal`` (type-strict; 1 == 1.0)."""
    kind = _kind(v)
    if kind == "list":
        return "list", tuple(_key(x) for x in v)
    if kind == "dict":
        return "dict", frozenset((f, _key(x)) for f, x in v.items())
    return kind, v


def _operand(v, where: str, budget: _Budget | None = None):
    """A filter operand as a plain JSON value (numpy scalars unwrapped, tuples as lists)."""
    if budget is not None:
        budget.value(where)
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, str):
        validate.unicode_text(v, where)
        return v
    if v is None or isinstance(v, (bool, int)):
        return v
    if isinstance(v, float):
        if math.isnan(v):
            raise InvalidInputError(f"{where}: expected a JSON value, got NaN (it never matches)")
        return v
    if isinstance(v, (list, tuple)):
        return [_operand(x, f"{where}[{i}]", budget) for i, x in enumerate(v)]
    if isinstance(v, dict):
        out = {}
        for f, x in v.items():
            if not isinstance(f, str):
                raise InvalidInputError(f"{where}: expected str keys in a dict value, got {type(f).__name__}")
            out[f] = _operand(x, f"{where}[{f!r}]", budget)
        return out
    raise InvalidInputError(f"{where}: expected a JSON value (None, bool, number, str, list or dict), "
                            f"got {type(v).__name__}")


def _compare(op: str, operand, where: str):
    if _kind(operand) not in ("number", "str"):
        raise InvalidInputError(f"{where}: {op} expects a number or a str, got {_show(operand)}")
    kind = _kind(operand)
    test = {"$gt": lambda x: x > operand, "$gte": lambda x: x >= operand,
            "$lt": lambda x: x < operand, "$lte": lambda x: x <= operand}[op]
    return lambda v: v is not _MISSING and _kind(v) == kind and test(v)


def _field(field: str, cond, where: str, budget: _Budget) -> list:
    """Predicates on one field's value (``_MISSING`` when absent) for a value or a dict of operators."""
    if not isinstance(cond, dict):
        value = _operand(cond, where, budget)
        return [lambda v: v is not _MISSING and _equal(v, value)]
    ops = ", ".join(FIELD_OPS)
    if not cond:
        raise InvalidInputError(f"{where}: expected a value or a dict of operators ({ops}), got an empty dict")
    unknown = [op for op in cond if not (isinstance(op, str) and op in FIELD_OPS)]
    if unknown:
        op = unknown[0]
        what = f"unknown operator {op!r}" if isinstance(op, str) and op.startswith("$") else f"the key {op!r}"
        raise InvalidInputError(
            f"{where}: expected a value or a dict of operators ({ops}), got {what}"
            + ("" if what.startswith("unknown") else "; to match a dict value use {'$eq': {...}}")
        )
    preds = []
    for op, arg in cond.items():
        at = f"{where}[{op!r}]"
        if op in ("$eq", "$ne"):
            value = _operand(arg, at, budget)
            if op == "$eq":
                preds.append(lambda v, value=value: v is not _MISSING and _equal(v, value))
            else:
                preds.append(lambda v, value=value: v is _MISSING or not _equal(v, value))
        elif op in ("$in", "$nin"):
            if not isinstance(arg, (list, tuple, np.ndarray)):
                raise InvalidInputError(f"{at}: expected a list of values, got {type(arg).__name__}")
            keys = frozenset(_key(x) for x in _operand(list(arg), at, budget))
            if op == "$in":
                preds.append(lambda v, keys=keys: v is not _MISSING and _key(v) in keys)
            else:
                preds.append(lambda v, keys=keys: v is _MISSING or _key(v) not in keys)
        elif op == "$exists":
            if not isinstance(arg, (bool, np.bool_)):
                raise InvalidInputError(f"{at}: expected True or False, got {_show(arg)}")
            preds.append(lambda v, want=bool(arg): (v is not _MISSING) == want)
        else:
            preds.append(_compare(op, _operand(arg, at, budget), at))
    return preds


def _filter(where, path: str, depth: int, budget: _Budget):
    """A predicate over one document's metadata (a dict, or None) for a filter dict."""
    if not isinstance(where, dict) or not where:
        expected = "a non-empty dict of field conditions"
        if depth == 1:
            raise InvalidTypeError(f"{path}: expected {expected}, got {_show(where)}")
        raise InvalidInputError(f"{path}: expected {expected}, got {_show(where)}")
    if depth > MAX_DEPTH:
        raise InvalidInputError(f"where: expected at most {MAX_DEPTH} nested levels of $and / $or / $not, got more")
    preds = []
    for key, cond in where.items():
        at = f"{path}[{key!r}]"
        budget.node(at)
        if not isinstance(key, str):
            raise InvalidInputError(f"{at}: expected a str field name or operator, got {type(key).__name__}")
        if key.startswith("$"):
            if key not in LOGICAL:
                raise InvalidInputError(
                    f"{at}: unknown operator {key!r}; expected one of {', '.join(LOGICAL)} (or a field name; per "
                    f"field: {', '.join(FIELD_OPS)})"
                )
            if key == "$not":
                inner = _filter(cond, at, depth + 1, budget)
                preds.append(lambda m, inner=inner: not inner(m))
                continue
            if not isinstance(cond, (list, tuple)) or not cond:
                raise InvalidInputError(f"{at}: expected a non-empty list of filters, got {_show(cond)}")
            inner = [_filter(c, f"{at}[{i}]", depth + 1, budget) for i, c in enumerate(cond)]
            combine = all if key == "$and" else any
            preds.append(lambda m, inner=inner, combine=combine: combine(p(m) for p in inner))
            continue
        if too_deep(cond, MAX_DEPTH + 1):  # a value as deep as stored metadata allows, in {"$op": value}
            raise InvalidInputError(f"{at}: expected a value nested at most {MAX_DEPTH} levels, got more")
        validate.unicode_text(key, at)
        for p in _field(key, cond, at, budget):
            preds.append(lambda m, p=p, key=key: p(m.get(key, _MISSING) if isinstance(m, dict) else _MISSING))
    if len(preds) == 1:
        return preds[0]
    return lambda m: all(p(m) for p in preds)


def parse(where):
    """Check a filter and compile it: a predicate over one document's metadata (dict or None).
    InvalidTypeError when ``where`` is not a dict; InvalidInputError, naming the place, for
    anything wrong inside it."""
    return _filter(where, "where", 1, _Budget())


def _metadata(state) -> list:
    meta = state.cache.get("metadata")
    if meta is None:
        n = state.n_rows
        meta = state.snap.metadata_values(np.arange(n)) if n else []
        state.cache["metadata"] = meta
    return meta


def allowed_rows(state, where) -> torch.Tensor:
    """Live rows whose metadata match ``where`` (a bool mask on the device)."""
    match = parse(where)
    ok = [match(m) for m in _metadata(state)]
    return torch.tensor(ok, dtype=torch.bool, device=state.live.device) & state.live
