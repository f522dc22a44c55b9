"""Exception hierarchy of mvdb (this lowest layer owns it; mvdb.errors and mvdb re-export it):
one base class, subclasses that also inherit the matching built-in."""

from __future__ import annotations


class MvdbError(Exception):
    """Base class of every error mvdb raises on purpose."""


class InvalidInputError(MvdbError, ValueError):
    """An argument has the right type but a wrong value (shape, range, content)."""


class InvalidTypeError(MvdbError, TypeError):
    """An argument has the wrong type or dtype."""


class DeviceMismatchError(InvalidInputError):
    """Tensors that must share a device do not."""


class DatabaseLockedError(MvdbError, RuntimeError):
    """Another process holds the database's single-writer lock."""


class ReadOnlyError(MvdbError, PermissionError):
    """A write was attempted on a database opened read-only."""


class FormatError(MvdbError, ValueError):
    """The path is not an mvdb database of a format this version can read."""


class DuplicateIdError(InvalidInputError):
    """An id appears twice in a batch, or is already live in the database."""


class AuthenticationError(MvdbError, PermissionError):
    """A server (``mvdb serve --api-key-file``) refused a request without the right key."""


class ServerError(MvdbError, ConnectionError):
    """A server could not be reached, or answered something that is not mvdb's API."""


class UnknownIdError(MvdbError, KeyError):
    """An id that is not live in the database was asked for."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class CorruptionError(MvdbError, RuntimeError):
    """Stored data failed a checksum or consistency check."""


class StorageError(MvdbError, OSError):
    """A write (or read) failed for an operating-system reason: no space, an I/O error, no
    permission, a vanished directory. ``errno`` and ``filename`` are set; the last commit is intact
    and the handle stays usable."""
