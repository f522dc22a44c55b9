"""Bulk ingest shared by ``mvdb ingest`` and Ray's ``mvdb.shards.cluster.ingest``: the sources
(:mod:`mvdb.ingest.sources`: formats, checks, content keys) and the writer that skips what is
already stored (:mod:`mvdb.ingest.writer`). The text sources of ``mvdb ingest --model`` are in
:mod:`mvdb.ingest.texts`."""

from mvdb.ingest.sources import (
    EDGE,
    SIDE_FILES,
    Source,
    content_key,
    load_npy,
    open_source,
    read_source,
    side_file_of,
    sources_of,
)
from mvdb.ingest.writer import add_new

__all__ = ["EDGE", "SIDE_FILES", "Source", "add_new", "content_key", "load_npy", "open_source", "read_source",
           "side_file_of", "sources_of"]
