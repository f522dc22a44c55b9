"""Compatibility module: sharding now lives in :mod:`mvdb.shards` (issue #15).

``ShardedDatabase`` is :class:`mvdb.shards.local.ShardedDatabase`; the layout file helpers are in
:mod:`mvdb.shards.layout` and the placement policy and membership routing in
:mod:`mvdb.shards.placement`. The names below keep existing imports working.
"""

from __future__ import annotations

from mvdb.shards.layout import FORMAT, SHARDS, is_sharded
from mvdb.shards.local import ShardedDatabase
from mvdb.shards.placement import contains_any, place

__all__ = ["FORMAT", "SHARDS", "ShardedDatabase", "contains_any", "is_sharded", "place"]
