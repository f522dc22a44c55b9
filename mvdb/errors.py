"""mvdb's exceptions (defined in mvdb.kernels.errors, the lowest layer, so that mvdb.kernels and
mvdb.storage depend on nothing above them); re-exported here and from ``mvdb``."""

from mvdb.kernels.errors import (
    AuthenticationError,
    CorruptionError,
    DatabaseLockedError,
    DeviceMismatchError,
    DuplicateIdError,
    FormatError,
    InvalidInputError,
    InvalidTypeError,
    MvdbError,
    ReadOnlyError,
    ServerError,
    StorageError,
    UnknownIdError,
)

__all__ = ["AuthenticationError", "CorruptionError", "DatabaseLockedError", "DeviceMismatchError", "DuplicateIdError", "FormatError",
           "InvalidInputError", "InvalidTypeError", "MvdbError", "ReadOnlyError", "ServerError", "StorageError", "UnknownIdError"]
