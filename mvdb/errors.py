"""Exception hierarchy: one base class, subclasses that also inherit the matching built-in."""

from __future__ import annotations


class MvdbError(Exception):
    """Base class of every error mvdb raises on purpose."""


class InvalidInputError(MvdbError, ValueError):
    """An argument has the right type but a wrong value (shape, range, content)."""


class InvalidTypeError(MvdbError, TypeError):
    """An argument has the wrong type or dtype."""


class DeviceMismatchError(InvalidInputError):
    """Tensors that must share a device do not."""
