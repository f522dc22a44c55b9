"""mvdb: an embedded database for multi-vector (late-interaction) retrieval.

The fused MaxSim kernels live in :mod:`mvdb.kernels`; the database API (``mvdb.open``) is built
on top of them.
"""

from __future__ import annotations

from mvdb.errors import (
    CorruptionError,
    DatabaseLockedError,
    DeviceMismatchError,
    DuplicateIdError,
    FormatError,
    InvalidInputError,
    InvalidTypeError,
    MvdbError,
    ReadOnlyError,
    StorageError,
    UnknownIdError,
)

__version__ = "0.1.0"

from mvdb.database import Database, Hit, open, rerank  # noqa: E402,A004
from mvdb.storage import recover, verify  # noqa: E402

__all__ = [
    "Database",
    "Hit",
    "open",
    "rerank",
    "recover",
    "verify",
    "CorruptionError",
    "DatabaseLockedError",
    "DeviceMismatchError",
    "DuplicateIdError",
    "FormatError",
    "InvalidInputError",
    "InvalidTypeError",
    "MvdbError",
    "ReadOnlyError",
    "StorageError",
    "UnknownIdError",
    "__version__",
]
