"""mvdb's exceptions (defined in mvdb.kernels.errors, the lowest layer, so that mvdb.kernels and
mvdb.storage depend on nothing above them); re-exported here and from ``mvdb``. The errors of the
layers above them only (the text encoders) are defined here."""

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


class EncoderMismatchError(InvalidInputError):
    """Texts would be encoded by a model (or settings) other than the one that made the database's
    vectors (recorded in its manifest): the two kinds of vectors must not be mixed."""


__all__ = ["AuthenticationError", "CorruptionError", "DatabaseLockedError", "DeviceMismatchError", "DuplicateIdError",
           "EncoderMismatchError", "FormatError",
           "InvalidInputError", "InvalidTypeError", "MvdbError", "ReadOnlyError", "ServerError", "StorageError", "UnknownIdError"]
