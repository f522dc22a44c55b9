"""mvdb: an embedded database for multi-vector (late-interaction) retrieval.

Layers, bottom up: :mod:`mvdb.kernels` (fused MaxSim and friends; owns the exceptions),
:mod:`mvdb.storage` (crash-safe segments), :mod:`mvdb.engine` (resident tokens, token indexes, the
search pipeline), then the database facades (``mvdb.open``) and the server and its client
(:mod:`mvdb.serve`, ``mvdb.connect``). The names below load on first use,
so ``import mvdb.kernels`` or ``import mvdb.storage`` pulls in neither the engine nor FAISS.
"""

from __future__ import annotations

import importlib

from mvdb.errors import (
    AuthenticationError,
    CorruptionError,
    DatabaseLockedError,
    DeviceMismatchError,
    DuplicateIdError,
    EncoderMismatchError,
    FormatError,
    InvalidInputError,
    InvalidTypeError,
    MvdbError,
    ReadOnlyError,
    ServerError,
    StorageError,
    UnknownIdError,
)

__version__ = "0.1.0"

_LAZY = {
    "Database": "mvdb.database",
    "DatabaseAPI": "mvdb.contract",
    "Encoder": "mvdb.encoders",
    "Hit": "mvdb.engine.search",
    "open": "mvdb.api",
    "pool": "mvdb.pooling",
    "connect": "mvdb.serve",
    "Client": "mvdb.serve",
    "rerank": "mvdb.engine.inline",
    "recover": "mvdb.storage",
    "verify": "mvdb.storage",
}
_SUBMODULES = ("api", "cli", "contract", "database", "demo", "embed", "encoders", "engine", "ingest",
               "integrations", "kernels", "pooling", "serve", "shards", "storage", "testing", "text")


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"mvdb.{name}")
    raise AttributeError(f"module 'mvdb' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))


__all__ = [
    "AuthenticationError",
    "Client",
    "CorruptionError",
    "Database",
    "DatabaseAPI",
    "DatabaseLockedError",
    "DeviceMismatchError",
    "DuplicateIdError",
    "Encoder",
    "EncoderMismatchError",
    "FormatError",
    "Hit",
    "InvalidInputError",
    "InvalidTypeError",
    "MvdbError",
    "ReadOnlyError",
    "ServerError",
    "StorageError",
    "UnknownIdError",
    "__version__",
    "connect",
    "open",
    "pool",
    "recover",
    "rerank",
    "verify",
]
