"""mvdb's exceptions (defined in mvdb.kernels.errors, the lowest layer, so that mvdb.kernels and
mvdb.storage depend on nothing above them); re-exported here and from ``mvdb``."""

from mvdb.kernels.errors import (
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

__all__ = ["CorruptionError", "DatabaseLockedError", "DeviceMismatchError", "DuplicateIdError", "FormatError",
           "InvalidInputError", "InvalidTypeError", "MvdbError", "ReadOnlyError", "StorageError", "UnknownIdError"]
