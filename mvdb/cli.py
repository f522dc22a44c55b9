"""The ``mvdb`` command line: a thin click group over the Python API."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

import click
import numpy as np

from mvdb import __version__
from mvdb.errors import InvalidInputError, MvdbError

QUIET = click.option("--quiet", "-q", is_flag=True, help="No progress bars or summaries.")
DEVICE = click.option("--device", default="auto", show_default=True, help="cpu, cuda, or auto (cuda when present).")
JSON_OUT = click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of text.")
_DEBUG_KEY = "mvdb.debug"


def _set_debug(ctx: click.Context, _param, value: bool) -> None:
    if value:
        ctx.meta[_DEBUG_KEY] = True  # meta is shared by the group's and the command's contexts


DEBUG = click.option("--debug", is_flag=True, expose_value=False, is_eager=True, callback=_set_debug,
                     help="On an error, raise it with its traceback instead of printing one 'Error:' line.")


class _Group(click.Group):
    """Every error of a command becomes one ``Error: <message>`` line on stderr and exit status 1:
    mvdb's own errors (MvdbError) and OSError by their message, anything else by its type and
    message. ``--debug`` raises it instead, with its traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise  # usage errors, --help, Ctrl-C: click reports them
        except Exception as e:
            if ctx.meta.get(_DEBUG_KEY):
                raise
            _fail(e)


def _message(e: BaseException) -> str:
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    if isinstance(e, (MvdbError, OSError)):
        return text or type(e).__name__
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _fail(e: BaseException) -> None:
    click.echo(f"Error: {_message(e)}", err=True)
    sys.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mvdb")
@DEBUG
def main() -> None:
    """mvdb: multi-vector (late-interaction) retrieval with fused MaxSim kernels."""


@main.command()
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
    from mvdb.ingest import open_source, sources_of

    from mvdb.engine.args import device_arg

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
        for p in _shard_paths(db):
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

    paths = _shard_paths(db, create=shards)
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
        paths = _shard_paths(db)
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


def _shard_paths(db: str, create: int = 0) -> list[str]:
    """The store directories of DB: its shards when it is sharded (``create`` > 0 makes a new
    sharded layout), else DB itself."""
    from mvdb.shards.layout import resolve

    return resolve(db, create, option="--shards")


@main.command()
@click.argument("db")
@click.argument("queries")
@click.option("-k", default=10, show_default=True, help="Hits per query.")
@click.option("--where", default=None, help='Metadata filter as JSON, e.g. \'{"lang": "en"}\'.')
@click.option("--nprobe", type=int, default=None, help="IVF lists probed per query token (default: the database's).")
@click.option("--n-candidates", type=int, default=None, help="Documents reranked exactly per query.")
@click.option("--exact", is_flag=True, help="Score every (matching) document: exhaustive MaxSim, slow.")
@click.option("--json", "as_json", is_flag=True, help="One JSON list of [id, score] per query.")
@DEVICE
@DEBUG
def search(db: str, queries: str, k: int, where: str | None, nprobe: int | None, n_candidates: int | None, exact: bool,
           as_json: bool, device: str) -> None:
    """Search DB with query embeddings from a .npy file ([Lq, dim] or [Nq, Lq, dim]).

    Example: mvdb search my.mvdb query.npy -k 5 --where '{"lang": "en"}'
    """
    import mvdb
    from mvdb.ingest import load_npy

    _require_database(db, "search")
    q = load_npy(queries, "the queries")
    if q.ndim not in (2, 3):
        raise InvalidInputError(f"{queries}: expected queries as [Lq, dim] or [Nq, Lq, dim], got shape {q.shape}")
    filt = None
    if where is not None:
        try:
            filt = json.loads(where)
        except ValueError as e:
            raise InvalidInputError(f"--where: expected a JSON object, got {where!r} ({e})") from None
    with mvdb.open(db, read_only=True, device=device) as d:
        hits = d.search(q, k=k, where=filt, nprobe=nprobe, n_candidates=n_candidates, exact=exact)
    batch = hits if q.ndim == 3 else [hits]
    for i, row in enumerate(batch):
        if as_json:
            click.echo(json.dumps([[h.id, h.score] for h in row]))
        else:
            click.echo(f"query {i}: " + ", ".join(f"{h.id} ({h.score:.4f})" for h in row))


@main.command()
@click.argument("db")
@click.argument("query")
@click.argument("doc_id")
@JSON_OUT
@DEBUG
def explain(db: str, query: str, doc_id: str, as_json: bool) -> None:
    """Why document DOC_ID scores what it does for the query in QUERY (.npy, [Lq, dim]): per query
    token, the best-matching document token, their similarity and its share of the MaxSim score.

    Example: mvdb explain my.mvdb query.npy 17
    """
    import mvdb
    from mvdb.ingest import load_npy

    _require_database(db, "explain")
    q = load_npy(query, "the query")
    with mvdb.open(db, read_only=True, device="cpu") as d:
        e = d.explain(q, _ids_arg(d, (doc_id,))[0])
    if as_json:
        matches = [{"query_token": m.query_token, "doc_token": m.doc_token, "similarity": m.similarity, "share": m.share}
                   for m in e.matches]
        click.echo(json.dumps({"id": e.id, "score": e.score, "matches": matches}))
        return
    click.echo(f"{e.id}: MaxSim {e.score:.4f}")
    for m in e.matches:
        click.echo(f"  query token {m.query_token:3d} -> document token {m.doc_token:4d}  similarity "
                   f"{m.similarity:.4f}  share {m.share:6.1%}")


def _ids_arg(d, ids: tuple[str, ...]) -> list:
    """Ids from the command line, as the database stores them (ints or strings)."""
    if (d.stats().get("id_type") or "int") != "int":
        return list(ids)
    out = []
    for x in ids:
        try:
            out.append(int(x))
        except ValueError:
            raise InvalidInputError(f"ids: this database uses int ids, got {x!r}") from None
    return out


@main.command()
@click.argument("db")
@click.argument("ids", nargs=-1, required=True)
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Write the documents to OUT.npy (+ .lengths.npy, .ids.npy, .metadata.jsonl), re-ingestable.")
@JSON_OUT
@DEBUG
def get(db: str, ids: tuple[str, ...], out: str | None, as_json: bool) -> None:
    """Show (or write out) documents of DB by id: token count and metadata.

    Example: mvdb get my.mvdb 17 42 --out two.npy
    """
    import mvdb

    _require_database(db, "get")
    with mvdb.open(db, read_only=True, device="cpu") as d:
        keys = _ids_arg(d, ids)
        docs, meta = d.get(keys), d.metadata(keys)
    if out is not None:
        _write_packed(out, keys, docs, meta)
    rows = [{"id": i, "tokens": int(x.shape[0]), "metadata": m} for i, x, m in zip(keys, docs, meta)]
    if as_json:
        click.echo(json.dumps({"documents": rows, "out": out}))
    else:
        for r in rows:
            click.echo(f"{r['id']}: {r['tokens']} tokens, metadata {json.dumps(r['metadata'])}")
        if out is not None:
            click.echo(f"wrote {len(rows)} documents to {out}")


@main.command()
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

    _require_database(db, "delete")
    with mvdb.open(db, device=device, progress=False) as d:
        keys = _ids_arg(d, ids)
        d.delete(keys)
        left = len(d)
    if as_json:
        click.echo(json.dumps({"deleted": len(keys), "documents": left}))
    else:
        click.echo(f"deleted {len(keys)} documents; {left} left in {db}")


@main.command()
@click.argument("db")
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--batch", default=10_000, show_default=True, help="Documents read at a time.")
@JSON_OUT
@QUIET
@DEBUG
def export(db: str, out: str, batch: int, as_json: bool, quiet: bool) -> None:
    """Write every live document of DB to OUT.npy with OUT.lengths.npy, OUT.ids.npy and (when any
    document has metadata) OUT.metadata.jsonl: the packed format `mvdb ingest` reads back
    (`mvdb ingest NEW OUT.npy --metadata OUT.metadata.jsonl`). fp16 stores export fp16; int8
    stores export their dequantized tokens as float32. Reads the files only (no GPU, no index).

    Example: mvdb export my.mvdb backup.npy
    """
    from mvdb.storage import Store

    _require_database(db, "export")
    if not out.endswith(".npy"):
        raise InvalidInputError(f"{out}: expected a path ending in .npy (the side files go beside it)")
    if batch < 1:
        raise InvalidInputError(f"--batch: expected 1 or more documents, got {batch}")
    with contextlib.ExitStack() as stack:
        stores = [stack.enter_context(Store(p, read_only=True)) for p in _shard_paths(db)]
        per = [(st, st.ids()) for st in stores]
        n = sum(len(ids) for _, ids in per)
        dims = {st.dim for st in stores if st.dim} or {0}
        dim = dims.pop()
        int8 = any(st.manifest["dtype"] == "int8" for st in stores)
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
    with_meta = _write_side_files(out, all_ids, lengths, meta)
    summary = {"documents": n, "tokens": t, "out": out, "metadata": out[:-4] + ".metadata.jsonl" if with_meta else None}
    if as_json:
        click.echo(json.dumps(summary))
    elif not quiet:
        click.echo(f"exported {n} documents ({t:,} tokens) to {out}" + (" with metadata" if with_meta else ""))


def _write_packed(out: str, ids: list, docs: list, meta: list) -> None:
    if not out.endswith(".npy"):
        raise InvalidInputError(f"{out}: expected a path ending in .npy (the side files go beside it)")
    np.save(out, np.concatenate(docs) if docs else np.zeros((0, 0), np.float32))
    _write_side_files(out, ids, np.array([len(x) for x in docs], dtype=np.int64), meta)


def _write_side_files(out: str, ids: list, lengths: np.ndarray, meta: list) -> bool:
    """X.lengths.npy, X.ids.npy and (when any document has metadata) X.metadata.jsonl beside
    X.npy; whether the metadata file was written."""
    base = out[:-4]
    np.save(base + ".lengths.npy", lengths)
    np.save(base + ".ids.npy", np.array(ids) if ids and isinstance(ids[0], str) else np.asarray(ids, dtype=np.int64))
    if not any(m is not None for m in meta):
        return False
    with open(base + ".metadata.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(m) + "\n" for m in meta)
    return True


@main.command()
@click.argument("db")
@click.option("--json", "as_json", is_flag=True)
@DEBUG
def info(db: str, as_json: bool) -> None:
    """Show what DB holds.

    Example: mvdb info my.mvdb
    """
    from mvdb.storage import Store

    per = []
    for p in _shard_paths(db):
        with Store(p, read_only=True) as st:
            m = st.manifest
            per.append({"path": p, "documents": len(st), "dim": m["dim"], "dtype": m["dtype"],
                        "id_type": m["id_type"], "segments": len(m["segments"]),
                        "tokens": sum(s["n_tokens"] for s in m["segments"]),
                        "deleted": sum(len(s["deleted"]) for s in m["segments"]), "generation": m["generation"],
                        "bytes": sum(s["file_size"] for s in m["segments"]), "index": _index_info(m)})
    if len(per) == 1 and per[0]["path"] == db:
        out = per[0]
    else:
        out = {"path": db, "shards": len(per), "documents": sum(p["documents"] for p in per),
               "tokens": sum(p["tokens"] for p in per), "bytes": sum(p["bytes"] for p in per), "per_shard": per}
    if as_json:
        click.echo(json.dumps(out))
    else:
        for key, value in out.items():
            if key == "per_shard":
                for p in value:
                    click.echo(f"{os.path.basename(p['path'])}: {p['documents']} documents, {p['tokens']:,} tokens, "
                               f"index {p['index']}")
            else:
                click.echo(f"{key}: {value}")


def _index_info(m: dict) -> str:
    cent = next((e for e in m.get("index_files", []) if e.get("kind") == "centroids"), None)
    if cent is None:
        return "none persisted (flat, or not built yet: built when the database opens)"
    segs = {s["name"] for s in m["segments"]}
    coded = {e["segment"] for e in m["index_files"] if e.get("kind") == "codes" and e["segment"] in segs}
    return (f"ivf, nlist {cent['nlist']}, trained on {cent['trained_tokens']:,} tokens, "
            f"codes for {len(coded)} of {len(segs)} segments")


@main.command()
@click.argument("db")
@JSON_OUT
@DEBUG
def verify(db: str, as_json: bool) -> None:
    """Check every checksum, offset and the manifest of DB; changes nothing. Exit 1 on problems.

    Example: mvdb verify my.mvdb
    """
    from mvdb.storage import verify as verify_path

    _require_database(db, "verify")
    paths = _shard_paths(db)
    if paths == [db]:
        report = verify_path(db)  # opens nothing: works on damaged files
    else:  # one report over the shards (as ShardedDatabase.verify), each problem naming its shard
        from mvdb.shards.merge import merge_reports

        report = merge_reports((os.path.basename(p), verify_path(p)) for p in paths)
        if not as_json:
            click.echo(f"{len(paths)} shards: ", nl=False)
    _exit_with_report(report, as_json)


def _exit_with_report(report, as_json: bool) -> None:
    """Print a verify / recover report (text, or one JSON document); exit 1 when it found problems."""
    if as_json:
        click.echo(json.dumps({"ok": report.ok, "documents": report.n_docs, "segments": report.n_segments,
                               "problems": list(report.problems)}))
    else:
        click.echo(str(report))
    sys.exit(0 if report.ok else 1)


@main.command()
@click.argument("db")
@JSON_OUT
@DEVICE
@QUIET
@DEBUG
def compact(db: str, as_json: bool, device: str, quiet: bool) -> None:
    """Rewrite segments without deleted documents and merge small ones (ids are kept); the token
    index follows.

    Example: mvdb compact my.mvdb
    """
    import mvdb

    _require_database(db, "compact")
    with mvdb.open(db, device=device, progress=not (quiet or as_json)) as d:
        n = d.compact()
        out = {"rewritten": n, "documents": len(d), "segments": d.stats()["segments"]}
    if as_json:
        click.echo(json.dumps(out))
    elif not quiet:
        click.echo(f"rewrote {n} segments; {out['documents']} documents in {out['segments']} segments")


@main.command()
@click.argument("db")
@click.option("--force", is_flag=True, help="Rebuild the manifest even when it is intact.")
@JSON_OUT
@DEBUG
def recover(db: str, force: bool, as_json: bool) -> None:
    """Rebuild a lost, damaged or outdated MANIFEST.json from the segments whose checksums hold (the
    newest copy of an id wins; an older manifest put back keeps its deletions and takes the newer
    segments in; deletions recorded only in a lost manifest are lost; the index is rebuilt on the
    next open). Prints what was left out; exit 1 when anything was.


    Example: mvdb recover my.mvdb
    """
    from mvdb.storage import recover as recover_path

    report = recover_path(db, force=force)
    _exit_with_report(report, as_json)


@main.command()
@click.argument("db")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0: every interface; only with --api-key-file on a shared network).")
@click.option("--port", default=8000, show_default=True, help="Port (0: a free one, printed).")
@click.option("--read-only", is_flag=True, help="Refuse writes (add, delete, compact) with 403.")
@click.option("--api-key-file", type=click.Path(dir_okay=False), default=None,
              help="File holding the key every request must send (Authorization: Bearer <key>).")
@click.option("--create", is_flag=True, help="Create an empty database at DB if there is none.")
@click.option("--max-body-mb", default=256.0, show_default=True, help="Largest request body accepted (413 above).")
@click.option("--batch-queries", default=256, show_default=True,
              help="Most queries of concurrent requests searched as one batch.")
@click.option("--batch-window-ms", default=0.0, show_default=True,
              help="Wait this long after a search arrives for others to join its batch (0: batches form "
                   "only from requests that queue while the GPU is busy).")
@click.option("--workers", type=int, default=None,
              help="HTTP worker processes in front of the database process (default: a quarter of the cores, "
                   "1 to 8; 1: one process does both).")
@click.option("--search-threads", type=int, default=None,
              help="Threads taking batches of searches off the queue, each one db.search at a time (default 1). "
                   "With --workers 2 or more: each worker's threads sending its batches to the database process, "
                   "which runs one search loop over them all (default 8).")
@click.option("--gil-switch-us", default=100.0, show_default=True,
              help="Python's thread switch interval in the server's processes (0: Python's 5,000 us).")
@click.option("--header-timeout", default=10.0, show_default=True,
              help="Seconds a connection has to send a request's headers (408 and closed after).")
@click.option("--body-timeout", default=60.0, show_default=True,
              help="Seconds a request has to send its whole body once its headers are in (408 and closed after).")
@DEVICE
@DEBUG
def serve(db: str, host: str, port: int, read_only: bool, api_key_file: str | None, create: bool, max_body_mb: float,
          batch_queries: int, batch_window_ms: float, workers: int | None, search_threads: int | None, gil_switch_us: float,
          header_timeout: float, body_timeout: float, device: str) -> None:
    """Serve DB over HTTP until SIGTERM / Ctrl-C (graceful: requests in flight finish). Clients:
    mvdb.connect("http://HOST:PORT"), or any HTTP client (MessagePack or JSON; docs at /docs).

    Example: mvdb serve my.mvdb --port 8000
    """
    from mvdb.serve.server import main_ready, read_key
    from mvdb.serve.server import serve as run

    if not create:
        _require_database(db, "serve (without --create)")
    if port < 0 or port > 65535:
        raise InvalidInputError(f"--port: expected 0 to 65535, got {port}")
    if max_body_mb <= 0 or batch_queries < 1 or batch_window_ms < 0:
        raise InvalidInputError("--max-body-mb and --batch-queries: expected positive values, --batch-window-ms "
                                f"0 or more; got {max_body_mb}, {batch_queries}, {batch_window_ms}")
    key = read_key(api_key_file) if api_key_file else None
    if workers is not None and workers < 1:
        raise InvalidInputError(f"--workers: expected 1 or more, got {workers}")
    if search_threads is not None and search_threads < 1:
        raise InvalidInputError(f"--search-threads: expected 1 or more, got {search_threads}")
    if gil_switch_us < 0:
        raise InvalidInputError(f"--gil-switch-us: expected 0 or more, got {gil_switch_us}")
    if not header_timeout > 0 or not body_timeout > 0:
        raise InvalidInputError(f"--header-timeout and --body-timeout: expected seconds above 0, got {header_timeout}, "
                                f"{body_timeout}")
    run(db, host=host, port=port, read_only=read_only, api_key=key, device=device, max_body_mb=max_body_mb,
        batch_queries=batch_queries, batch_window_ms=batch_window_ms, workers=workers,
        search_threads=search_threads, gil_switch_us=gil_switch_us, header_timeout_s=header_timeout,
        body_timeout_s=body_timeout, on_ready=main_ready)


def _require_database(db: str, command: str) -> None:
    """FileNotFoundError unless DB is a database (or a file, which the library then refuses), so a
    writable open does not create an empty one."""
    from mvdb.shards.layout import is_sharded
    from mvdb.storage.manifest import MANIFEST

    if os.path.isfile(db) or is_sharded(db) or os.path.isfile(os.path.join(db, MANIFEST)) \
            or os.path.isdir(os.path.join(db, "segments")):  # a lost manifest: the library says what to do
        return
    where = "no such directory" if not os.path.lexists(db) else f"no {MANIFEST} here"
    raise FileNotFoundError(f"{db}: no database here ({where}; {command} does not create one)")


@main.command()
@DEVICE
@click.option("--docs", default=300, show_default=True, help="Man pages to index (at most 300).")
@click.option("--path", default=None, help="Database directory to build (default: a temporary one).")
@click.option("--kernels", is_flag=True, help="Run the kernel-only demo instead (synthetic shapes).")
@DEBUG
def demo(device: str, docs: int, path: str | None, kernels: bool) -> None:
    """Embed man pages with MiniLM, build a database, search it, and check recall.

    Example: mvdb demo --docs 100
    """
    if kernels:
        from mvdb.demo import run_kernel_demo

        run_kernel_demo(device=device, echo=click.echo)
        return
    from mvdb.demo import run_demo

    run_demo(path=path, n_docs=docs, device=device, echo=click.echo)


if __name__ == "__main__":
    main()
