"""``mvdb get``, ``mvdb delete`` and ``mvdb export``: documents by id, or every document to files
``mvdb ingest`` reads back."""

from __future__ import annotations

import contextlib
import json
import os
import sys

import click
import numpy as np

from mvdb.cli.arguments import ids_arg, require_database, shard_paths
from mvdb.cli.group import DEBUG, DEVICE, JSON_OUT, QUIET
from mvdb.errors import InvalidInputError
from mvdb.ingest.sources import POOLING_SIDE_FILE


@click.command()
@click.argument("db")
@click.argument("ids", nargs=-1, required=True)
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Write the documents to OUT.npy (+ .lengths.npy, .ids.npy, .metadata.jsonl, .pooling.json), "
                   "re-ingestable.")
@click.option("--force", is_flag=True, help="Overwrite OUT and its side files where they exist.")
@JSON_OUT
@DEBUG
def get(db: str, ids: tuple[str, ...], out: str | None, force: bool, as_json: bool) -> None:
    """Show (or write out) documents of DB by id: token count and metadata.

    Example: mvdb get my.mvdb 17 42 --out two.npy
    """
    import mvdb

    require_database(db, "get")
    if out is not None:
        _check_out(out, force)
    with mvdb.open(db, read_only=True, device="cpu") as d:
        keys = ids_arg(d, ids)
        docs, meta, pooled = d.get(keys), d.metadata(keys), d.stats().get("pooling")
    if out is not None:
        _write_packed(out, keys, docs, meta, pooled)
    rows = [{"id": i, "tokens": int(x.shape[0]), "metadata": m} for i, x, m in zip(keys, docs, meta)]
    if as_json:
        click.echo(json.dumps({"documents": rows, "out": out}))
    else:
        for r in rows:
            click.echo(f"{r['id']}: {r['tokens']} tokens, metadata {json.dumps(r['metadata'])}")
        if out is not None:
            click.echo(f"wrote {len(rows)} documents to {out}")


@click.command()
@click.argument("db")
@click.argument("ids", nargs=-1, required=True)
@JSON_OUT
@DEVICE
@DEBUG
def delete(db: str, ids: tuple[str, ...], as_json: bool, device: str) -> None:
    """Delete documents of DB by id (all or none: an unknown id deletes nothing).

    Example: mvdb delete my.mvdb 17 42
    """
    import mvdb

    require_database(db, "delete")
    with mvdb.open(db, device=device, progress=False) as d:
        keys = ids_arg(d, ids)
        d.delete(keys)
        left = len(d)
    if as_json:
        click.echo(json.dumps({"deleted": len(keys), "documents": left}))
    else:
        click.echo(f"deleted {len(keys)} documents; {left} left in {db}")


@click.command()
@click.argument("db")
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--batch", default=10_000, show_default=True, help="Documents read at a time.")
@click.option("--force", is_flag=True, help="Overwrite OUT and its side files where they exist.")
@JSON_OUT
@QUIET
@DEBUG
def export(db: str, out: str, batch: int, force: bool, as_json: bool, quiet: bool) -> None:
    """Write every live document of DB to OUT.npy with OUT.lengths.npy, OUT.ids.npy, (when any
    document has metadata) OUT.metadata.jsonl and (when DB pools its documents) OUT.pooling.json:
    the packed format `mvdb ingest` reads back (`mvdb ingest NEW OUT.npy --metadata
    OUT.metadata.jsonl`; pooled documents are stored as they are, and NEW records their pooling).
    fp16 stores export fp16; int8 stores export their dequantized tokens as float32. Reads the
    files only (no GPU, no index).

    Example: mvdb export my.mvdb backup.npy
    """
    from mvdb.storage import Store

    require_database(db, "export")
    _check_out(out, force)
    if batch < 1:
        raise InvalidInputError(f"--batch: expected 1 or more documents, got {batch}")
    with contextlib.ExitStack() as stack:
        stores = [stack.enter_context(Store(p, read_only=True)) for p in shard_paths(db)]
        per = [(st, st.ids()) for st in stores]
        n = sum(len(ids) for _, ids in per)
        dims = {st.dim for st in stores if st.dim} or {0}
        dim = dims.pop()
        int8 = any(st.manifest["dtype"] == "int8" for st in stores)
        pooled = _export_pooling(db, stores, quiet or as_json)
        total = sum(st.snapshot().live_tokens for st in stores)
        lengths, all_ids, meta, t = np.zeros(n, np.int64), [], [], 0
        tokens = np.lib.format.open_memmap(out, mode="w+", dtype=np.float32 if int8 else np.float16,
                                           shape=(total, dim))
        with click.progressbar(length=n, label=f"exporting {db}", show_pos=True, file=sys.stderr,
                               hidden=quiet or as_json) as bar:
            for st, ids in per:
                for a in range(0, len(ids), batch):
                    part = ids[a : a + batch]
                    p = st.gather(part)
                    x = p.tokens.astype(np.float32) * p.scales[:, None] if p.scales is not None else p.tokens
                    tokens[t : t + x.shape[0]] = x
                    lengths[len(all_ids) : len(all_ids) + len(part)] = np.diff(p.offsets)
                    t += x.shape[0]
                    all_ids += list(part)
                    meta += st.metadata(part)
                    bar.update(len(part))
        tokens.flush()
        del tokens
    with_meta = _write_side_files(out, all_ids, lengths, meta, pooled)
    summary = {"documents": n, "tokens": t, "out": out, "metadata": out[:-4] + ".metadata.jsonl" if with_meta else None,
               "pooling": pooled}
    if as_json:
        click.echo(json.dumps(summary))
    elif not quiet:
        click.echo(f"exported {n} documents ({t:,} tokens) to {out}" + (" with metadata" if with_meta else ""))


def _export_pooling(db: str, stores: list, quiet: bool) -> dict | None:
    """The pooling an export records (OUT.pooling.json): the stores' one record, where every store
    holding documents has it. Shards that disagree (one written on its own) get none: the new
    database then stores every document as it is and pools nothing (said on stderr)."""
    from mvdb.pooling import POOLING_KEY, disagreement

    held = disagreement(stores)
    if held is None:
        return next((st.config[POOLING_KEY] for st in stores if st.config.get(POOLING_KEY)), None)
    if not quiet:
        click.echo(f"mvdb export: {db}: its shards disagree on token pooling ({held}); the export records no "
                   f"pooling, so a database ingested from it stores every document as it is", err=True)
    return None


def _check_out(out: str, force: bool) -> None:
    """OUT (X.npy) is a path ending in .npy, and neither it nor a side file exists unless ``force``."""
    if not out.endswith(".npy"):
        raise InvalidInputError(f"{out}: expected a path ending in .npy (the side files go beside it)")
    there = [p for p in (out, *(out[:-4] + s for s in (".lengths.npy", ".ids.npy", ".metadata.jsonl", POOLING_SIDE_FILE)))
             if os.path.lexists(p)]
    if there and not force:
        raise InvalidInputError(f"{there[0]}: already exists; --force overwrites it"
                                + (f" (and {len(there) - 1} more side file(s))" if len(there) > 1 else ""))


def _write_packed(out: str, ids: list, docs: list, meta: list, pooled: dict | None = None) -> None:
    np.save(out, np.concatenate(docs) if docs else np.zeros((0, 0), np.float32))
    _write_side_files(out, ids, np.array([len(x) for x in docs], dtype=np.int64), meta, pooled)


def _write_side_files(out: str, ids: list, lengths: np.ndarray, meta: list, pooled: dict | None = None) -> bool:
    """X.lengths.npy, X.ids.npy, (when any document has metadata) X.metadata.jsonl and (when the
    documents are pooled) X.pooling.json beside X.npy; whether the metadata file was written. An
    earlier export's side files that these documents do not have are removed (--force)."""
    base = out[:-4]
    np.save(base + ".lengths.npy", lengths)
    np.save(base + ".ids.npy", np.array(ids) if ids and isinstance(ids[0], str) else np.asarray(ids, dtype=np.int64))
    if pooled is not None:
        with open(base + POOLING_SIDE_FILE, "w", encoding="utf-8") as f:
            json.dump(pooled, f)
    elif os.path.lexists(base + POOLING_SIDE_FILE):
        os.unlink(base + POOLING_SIDE_FILE)
    if not any(m is not None for m in meta):
        if os.path.lexists(base + ".metadata.jsonl"):  # an earlier export's (--force): not these documents'
            os.unlink(base + ".metadata.jsonl")
        return False
    with open(base + ".metadata.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(m) + "\n" for m in meta)
    return True

