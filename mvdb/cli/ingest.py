"""``mvdb ingest``: documents from embedding files into a database, created if missing."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

import click

from mvdb.cli.arguments import shard_paths
from mvdb.cli.group import DEBUG, DEVICE, JSON_OUT, QUIET
from mvdb.errors import InvalidInputError, MvdbError


@click.command()
@click.argument("db")
@click.argument("sources", nargs=-1, required=True)
@click.option("--dtype", type=click.Choice(["float16", "int8"]), default=None,
              help="Storage dtype of a new database (default float16).")
@click.option("--batch", default=10_000, show_default=True, help="Documents per committed batch.")
@click.option("--index/--no-index", "build_index", default=True, show_default=True,
              help="Train and persist the token index at the end (else the first writable open does).")
@click.option("--shards", default=0, show_default=True,
              help="Create DB sharded into this many shards (mvdb.open(DB, devices=[...]) then puts one per device).")
@click.option("--metadata", "metadata_file", type=click.Path(dir_okay=False), default=None,
              help="JSON lines: one object (or null) per document, in the order of the sources' documents.")
@JSON_OUT
@DEVICE
@QUIET
@DEBUG
def ingest(db: str, sources: tuple[str, ...], dtype: str | None, batch: int, build_index: bool, shards: int,
           metadata_file: str | None, as_json: bool, device: str, quiet: bool) -> None:
    """Add document embeddings from files to DB (created if missing).

    SOURCES: packed X.npy + X.lengths.npy (optional X.ids.npy; side files given among the
    sources, as by *.npy, are read with their X.npy), .npz / .safetensors / .h5 with 'tokens' and
    'lengths' (optional 'ids'), or a directory of per-document .npy files. Every source is checked
    before DB is created or written.

    Documents without ids in their file get ids from the file's content (<content key>#<row>),
    not its path, so re-running an interrupted ingest skips what is stored however the path is
    spelled, even from a copy of the file.

    A sharded DB (created with --shards N, or by mvdb.open(DB, devices=[...])) gets each document
    on the shard holding the fewest tokens.

    --metadata F.jsonl gives each document a metadata object (for search --where), line i for
    the i-th document of the sources in order; documents already stored keep theirs.

    Example: mvdb ingest my.mvdb docs.npz more_docs/ --metadata docs.metadata.jsonl
    """
    from mvdb.engine.args import device_arg
    from mvdb.ingest import open_source, sources_of

    if batch < 1:
        raise InvalidInputError(f"--batch: expected 1 or more documents, got {batch}")
    device_arg(device)  # before anything is written: the index step at the end opens on it
    with contextlib.ExitStack() as opened:

        srcs = []
        for path in sources_of(sources):
            srcs.append(open_source(path))
            opened.callback(srcs[-1].close)
        dims = {s.dim for s in srcs}
        if len(dims) > 1:
            raise InvalidInputError("sources: different embedding dims: " + ", ".join(f"{s.path} has {s.dim}" for s in srcs))
        dim = dims.pop()
        meta = _read_metadata(metadata_file, sum(src.n for src in srcs)) if metadata_file else None
        new = not os.path.lexists(db)
        try:
            summary = _ingest(db, srcs, dim, dtype, batch, shards, quiet or as_json, meta)
        except BaseException:
            if new:
                _remove_if_empty(db)
            raise
    if build_index:
        import mvdb

        summary["index"] = []
        for p in shard_paths(db):
            t0 = time.perf_counter()
            with mvdb.open(p, device=device, progress=not (quiet or as_json)) as d:
                stats = d.stats()
            summary["index"].append({"path": p, "index": stats["index"], "nlist": stats["nlist"],
                                     "seconds": time.perf_counter() - t0})
            if not (quiet or as_json):
                nlist = f", nlist {stats['nlist']}" if stats["nlist"] else ""
                click.echo(f"token index{'' if p == db else ' of ' + os.path.basename(p)}: {stats['index']}{nlist} "
                           f"on {stats['device']}, ready in {time.perf_counter() - t0:.1f} s")
    if as_json:
        click.echo(json.dumps(summary))


def _read_metadata(path: str, n: int) -> list:
    """``--metadata``: n JSON lines, each an object or null."""
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except ValueError as e:
                    raise InvalidInputError(f"{path}, line {i}: not JSON ({e})") from None
                if value is not None and not isinstance(value, dict):
                    raise InvalidInputError(f"{path}, line {i}: expected a JSON object or null, got "
                                            f"{type(value).__name__}")
                out.append(value)
    except OSError as e:
        raise InvalidInputError(f"--metadata {path}: cannot read it ({e.strerror})") from None
    if len(out) != n:
        raise InvalidInputError(f"--metadata {path}: expected {n} lines (one per document of the sources), got {len(out)}")
    return out


def _ingest(db: str, srcs: list, dim: int, dtype: str | None, batch: int, shards: int, quiet: bool,
            metadata: list | None = None) -> dict:
    """Add the documents of the checked sources ``srcs`` to DB (created if missing); a summary."""
    from mvdb.ingest import add_new
    from mvdb.shards.placement import PlacedStores
    from mvdb.storage import Store

    paths = shard_paths(db, create=shards)
    with contextlib.ExitStack() as stack:
        stores = [stack.enter_context(Store(p, dtype=dtype)) for p in paths]
        for p, st in zip(paths, stores):
            if st.dim is not None and st.dim != dim:
                raise InvalidInputError(f"{p}: stores dim {st.dim}, but the sources have dim {dim}")
        st = PlacedStores(stores) if len(stores) > 1 or shards else stores[0]
        added = skipped = tokens_added = at = 0
        t0 = time.perf_counter()
        for src in srcs:
            rate = {"text": ""}
            with click.progressbar(length=src.n, label=src.path, show_pos=True, file=sys.stderr,
                                   item_show_func=lambda _, r=rate: r["text"], hidden=quiet) as bar:
                for ids, toks, lens in src.batches(batch):
                    meta = None if metadata is None else metadata[at : at + len(ids)]
                    at += len(ids)
                    # legacy: ids of the path-derived scheme, before content keys
                    got, skip, got_tokens = add_new(st, ids, toks, lens, also_known=src.legacy_ids(ids), metadata=meta)
                    added += got
                    skipped += skip
                    tokens_added += got_tokens
                    dt = max(time.perf_counter() - t0, 1e-9)
                    rate["text"] = f"{added / dt:,.0f} docs/s, {tokens_added / dt:,.0f} tokens/s"
                    bar.update(len(ids))
        dt = time.perf_counter() - t0
        if not quiet:
            click.echo(f"ingested {added} documents ({tokens_added:,} tokens) in {dt:.1f} s; "
                       f"skipped {skipped} already stored; {len(st)} in {db}")
        return {"db": db, "added": added, "skipped": skipped, "tokens_added": tokens_added, "documents": len(st),
                "seconds": dt}


def _remove_if_empty(db: str) -> None:
    """After a failed ingest that created DB: remove it again if it holds no document (a bad
    document found while adding), so no empty database is left behind. Only the files a new
    database consists of are removed, and only empty directories; best effort."""
    from mvdb.shards.layout import SHARDS, is_sharded
    from mvdb.storage import Store
    from mvdb.storage.manifest import MANIFEST

    try:
        if not os.path.isdir(db):
            return
        paths = shard_paths(db)
        for p in paths:
            if os.path.exists(os.path.join(p, MANIFEST)):
                with Store(p, read_only=True) as st:
                    if len(st) or st.manifest["segments"]:
                        return
        for p in paths:
            for name in (MANIFEST, "LOCK"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(p, name))
            for d in (os.path.join(p, "segments"), os.path.join(p, "index"), p):
                with contextlib.suppress(OSError):
                    os.rmdir(d)
        if is_sharded(db) and not any(os.path.exists(p) for p in paths):
            os.unlink(os.path.join(db, SHARDS))
            os.rmdir(db)
    except (MvdbError, OSError):  # best effort: never hide the error that brought us here
        return

