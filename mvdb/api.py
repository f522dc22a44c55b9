"""``mvdb.open``: the one entry point that picks the database class for a directory (one store,
or shards over several devices). Kept apart from both classes so neither imports the other."""

from __future__ import annotations

from mvdb.database import Database
from mvdb.errors import InvalidTypeError
from mvdb.engine.args import open_args
from mvdb.shards.layout import is_sharded
from mvdb.shards.local import ShardedDatabase
from mvdb.warm import check_query_tokens

__all__ = ["open"]


def open(path, *, dim=None, dtype=None, device="auto", read_only=False, index=None, nlist=None,  # noqa: A001
         residency="auto", devices=None, progress=None, checksums=True, encoder=None, max_gpu_bytes=None,
         code_bits=None, warm=False, pool_factor=None, pool_protected=None, prerank="auto"):
    """Open (or create) a database directory.

    ``dtype``: "float16" (the default) or "int8" for a new database; for an existing one, None or
    the stored dtype. ``index``: "flat" (exact token search), "ivf" (centroid lists, persisted),
    or "auto" (flat below 1M tokens, on a GPU or a CPU); recorded in the database, so it need not be given again
    (None: the recorded choice, "auto" for a new database; a different one is used and recorded,
    with a warning). ``nlist``: IVF lists when training (default about 2 * sqrt(tokens)), recorded
    likewise. ``residency``: where the exact tokens live (the tier; ``stats()["tier"]`` names it):
    "device"; "host" (pinned host memory, the candidates read over the link by the exact rerank) or "disk" (read from
    the segments per search), both with a compressed copy of every token on the device (its IVF
    list and residual codes, mvdb.engine.codes) that ranks a large pool of candidates; or
    "auto": the device when the tokens fit 80% of its free memory, else host memory when they fit
    80% of what is available there, else disk. ``max_gpu_bytes``: the device memory the exact
    tokens may take at most (to share a GPU with a model): above it, "auto" picks another tier.
    ``code_bits``: bits a dimension of those residual codes, 1, 2 or 4 (None: the default for the
    store's dtype, mvdb.engine.codes.default_bits: 2 for float16, 1 for int8; at dim 128 a token then takes 18, 34 or
    66 bytes of device memory): fewer bits leave more of the device free and rank the pool less
    finely. Not recorded: the codes are derived data, encoded again when opened at another rate
    (each rate's files are kept, so that switching back reads them). ``prerank``: what ranks the
    device tier's candidates before the exact rerank: "lists" (the IVF lists' crediting picks the
    documents reranked exactly), "codes" (the codes tiers' way: residual codes of every token on
    the device too, which rank a wide pool from the lists, the best of it reranked exactly; an IVF
    index), or "auto" ("lists"). The codes tiers always rank by the codes. ``devices``: a list of
    devices to shard the documents over, one shard each (:class:`mvdb.shards.local.ShardedDatabase`;
    a directory created sharded is always opened sharded).
    ``progress``: report long index builds on stderr (default: on, ``MVDB_PROGRESS=0`` turns it off).
    ``checksums``: check each segment's tokens against their CRC-32 as they are loaded into memory
    (CorruptionError on a mismatch; structural checks run on every open regardless). On by default;
    False saves the hashing (see the README's reliability section for its cost).
    ``encoder``: a text model for ``add_texts`` / ``search_text`` (a Sentence Transformers or
    PyLate model, a callable ``f(texts, is_query)``, or an :class:`mvdb.Encoder` with settings);
    an EncoderMismatchError when the database's vectors were made by another (:mod:`mvdb.text`).
    ``warm``: True runs ``db.warmup()`` before returning (every kernel variant its searches
    launch compiled and tuned: the first query runs at the warm speed), or an int, the longest
    query to warm for (``warmup(max_query_tokens=...)``).
    ``pool_factor``: token pooling (:func:`mvdb.pool`) of every document this database stores:
    each document's tokens clustered into ``tokens // pool_factor`` means, its first
    ``pool_protected`` tokens (default 1: a [CLS]) kept as they are; recorded in the database
    (``stats()["pooling"]``) and applied by ``add`` / ``add_texts`` / ``mvdb ingest``; queries are
    never pooled. Given for a database that records another pooling, or holds documents stored
    without any, it is refused (InvalidInputError): one database pools its documents one way.
    """
    if not isinstance(warm, (bool, int)):
        raise InvalidTypeError(f"warm: expected a bool or a positive int, got {type(warm).__name__}")
    if warm is not False and warm is not True:
        check_query_tokens(warm)
    path = open_args(path, dim=dim, dtype=dtype, index=index, nlist=nlist, residency=residency,
                     read_only=read_only, checksums=checksums, progress=progress, max_gpu_bytes=max_gpu_bytes,
                     code_bits=code_bits, prerank=prerank)
    if devices is not None or is_sharded(path):
        db = ShardedDatabase(path, devices=devices, dim=dim, dtype=dtype, device=device, read_only=read_only,
                             index=index, nlist=nlist, residency=residency, progress=progress, checksums=checksums,
                             encoder=encoder, max_gpu_bytes=max_gpu_bytes, code_bits=code_bits,
                             pool_factor=pool_factor, pool_protected=pool_protected, prerank=prerank)
    else:
        db = Database(path, dim=dim, dtype=dtype, device=device, read_only=read_only, index=index, nlist=nlist,
                      residency=residency, progress=progress, checksums=checksums, encoder=encoder,
                      max_gpu_bytes=max_gpu_bytes, code_bits=code_bits, pool_factor=pool_factor,
                      pool_protected=pool_protected, prerank=prerank)
    if warm is not False:
        try:
            db.warmup(None if warm is True else warm)
        except BaseException:
            db.close()
            raise
    return db

