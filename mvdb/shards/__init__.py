"""Shards: one database over several ordinary mvdb databases (issue #15).

- :mod:`mvdb.shards.layout`: the layout file (``shards.json``) naming the shards and the placement.
- :mod:`mvdb.shards.placement`: the one placement policy (least-loaded by tokens) and membership
  routing (which shard holds each id), shared by :class:`ShardedDatabase`, ``mvdb ingest --shards``
  and :mod:`mvdb.shards.cluster`.
- :mod:`mvdb.shards.merge`: the per-shard results merged (top-k hits, verify reports).
- :mod:`mvdb.shards.local`: :class:`ShardedDatabase`, one shard per device of one host.

``ShardedDatabase`` loads on first use, so the layout and placement helpers import neither the
engine nor torch.
"""

from __future__ import annotations

import importlib

_LAZY = {"ShardedDatabase": "mvdb.shards.local"}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mvdb.shards' has no attribute {name!r}")


__all__ = ["ShardedDatabase"]
