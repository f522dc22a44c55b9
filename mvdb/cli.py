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
@DEVICE
@QUIET
@DEBUG
def ingest(db: str, sources: tuple[str, ...], dtype: str | None, batch: int, build_index: bool, shards: int,
           device: str, quiet: bool) -> None:
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

    Example: mvdb ingest my.mvdb docs.npz more_docs/
    """
    from mvdb.ingest import open_source, sources_of

    if batch < 1:
        raise InvalidInputError(f"--batch: expected 1 or more documents, got {batch}")
    with contextlib.ExitStack() as opened:
        srcs = []
        for path in sources_of(sources):
            srcs.append(open_source(path))
            opened.callback(srcs[-1].close)
        dims = {s.dim for s in srcs}
        if len(dims) > 1:
            raise InvalidInputError("sources: different embedding dims: " + ", ".join(f"{s.path} has {s.dim}" for s in srcs))
        dim = dims.pop()
        new = not os.path.lexists(db)
        try:
            _ingest(db, srcs, dim, dtype, batch, shards, quiet)
        except BaseException:
            if new:
                _remove_if_empty(db)
            raise
    if build_index:
        import mvdb

        for p in _shard_paths(db):
            t0 = time.perf_counter()
            with mvdb.open(p, device=device) as d:
                stats = d.stats()
            if not quiet:
                nlist = f", nlist {stats['nlist']}" if stats["nlist"] else ""
                click.echo(f"token index{'' if p == db else ' of ' + os.path.basename(p)}: {stats['index']}{nlist} "
                           f"on {stats['device']}, ready in {time.perf_counter() - t0:.1f} s")


def _ingest(db: str, srcs: list, dim: int, dtype: str | None, batch: int, shards: int, quiet: bool) -> None:
    """Add the documents of the checked sources ``srcs`` to DB (created if missing)."""
    from mvdb.ingest import add_new
    from mvdb.storage import Store

    paths = _shard_paths(db, create=shards)
    with contextlib.ExitStack() as stack:
        stores = [stack.enter_context(Store(p, dtype=dtype)) for p in paths]
        for p, st in zip(paths, stores):
            if st.dim is not None and st.dim != dim:
                raise InvalidInputError(f"{p}: stores dim {st.dim}, but the sources have dim {dim}")
        st = _Placement(stores) if len(stores) > 1 or shards else stores[0]
        added = skipped = tokens_added = 0
        t0 = time.perf_counter()
        for src in srcs:
            rate = {"text": ""}
            with click.progressbar(length=src.n, label=src.path, show_pos=True, file=sys.stderr,
                                   item_show_func=lambda _, r=rate: r["text"], hidden=quiet) as bar:
                for ids, toks, lens in src.batches(batch):
                    # legacy: ids of the path-derived scheme, before content keys
                    got, skip, got_tokens = add_new(st, ids, toks, lens, also_known=src.legacy_ids(ids))
                    added += got
                    skipped += skip
                    tokens_added += got_tokens
                    dt = max(time.perf_counter() - t0, 1e-9)
                    rate["text"] = f"{added / dt:,.0f} docs/s, {tokens_added / dt:,.0f} tokens/s"
                    bar.update(len(ids))
        if not quiet:
            dt = time.perf_counter() - t0
            click.echo(f"ingested {added} documents ({tokens_added:,} tokens) in {dt:.1f} s; "
                       f"skipped {skipped} already stored; {len(st)} in {db}")


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


class _Placement:
    """The Store calls ``ingest`` makes, over several shard stores, by mvdb.shards.placement (as
    ShardedDatabase.add and mvdb.distributed): ids are looked up in every shard, and each document
    goes to the shard holding the fewest tokens."""

    def __init__(self, stores):
        self.stores = stores

    def __len__(self) -> int:
        return sum(len(st) for st in self.stores)

    def contains(self, ids) -> np.ndarray:
        from mvdb.shards.placement import contains_any

        return contains_any(self.stores, list(ids))

    def add_packed(self, tokens, lengths, ids) -> None:
        from mvdb.shards.placement import place, split_packed

        for si, part, toks, lens in split_packed(tokens, lengths, place(lengths, self.stores)):
            self.stores[si].add_packed(toks, lens, ids=[ids[i] for i in part])


@main.command()
@click.argument("db")
@click.argument("queries")
@click.option("-k", default=10, show_default=True, help="Hits per query.")
@click.option("--json", "as_json", is_flag=True, help="One JSON list of [id, score] per query.")
@DEBUG
def search(db: str, queries: str, k: int, as_json: bool) -> None:
    """Search DB with query embeddings from a .npy file ([Lq, dim] or [Nq, Lq, dim]).

    Example: mvdb search my.mvdb query.npy -k 5
    """
    import mvdb
    from mvdb.ingest import load_npy

    q = load_npy(queries, "the queries")
    if q.ndim not in (2, 3):
        raise InvalidInputError(f"{queries}: expected queries as [Lq, dim] or [Nq, Lq, dim], got shape {q.shape}")
    with mvdb.open(db, read_only=True) as d:
        hits = d.search(q, k=k)
    batch = hits if q.ndim == 3 else [hits]
    for i, row in enumerate(batch):
        if as_json:
            click.echo(json.dumps([[h.id, h.score] for h in row]))
        else:
            click.echo(f"query {i}: " + ", ".join(f"{h.id} ({h.score:.4f})" for h in row))


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
@DEBUG
def verify(db: str) -> None:
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
        click.echo(f"{len(paths)} shards: ", nl=False)
    click.echo(str(report))
    sys.exit(0 if report.ok else 1)


@main.command()
@click.argument("db")
@DEVICE
@QUIET
@DEBUG
def compact(db: str, device: str, quiet: bool) -> None:
    """Rewrite segments without deleted documents and merge small ones (ids are kept); the token
    index follows.

    Example: mvdb compact my.mvdb
    """
    import mvdb

    _require_database(db, "compact")
    with mvdb.open(db, device=device) as d:
        n = d.compact()
        if not quiet:
            click.echo(f"rewrote {n} segments; {len(d)} documents in {d.stats()['segments']} segments")


@main.command()
@click.argument("db")
@click.option("--force", is_flag=True, help="Rebuild the manifest even when it is intact.")
@DEBUG
def recover(db: str, force: bool) -> None:
    """Rebuild a lost or damaged MANIFEST.json from the segments whose checksums hold (the newest
    copy of an id wins; deletions made after a segment was written are lost; the index is rebuilt
    on the next open). Prints what was left out; exit 1 when anything was.

    Example: mvdb recover my.mvdb
    """
    from mvdb.storage import recover as recover_path

    report = recover_path(db, force=force)
    click.echo(str(report))
    sys.exit(0 if report.ok else 1)


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
@click.option("--search-threads", default=1, show_default=True,
              help="Threads taking batches of searches off the queue (each one db.search at a time).")
@click.option("--gil-switch-us", default=100.0, show_default=True,
              help="Python's thread switch interval in the server's processes (0: Python's 5,000 us).")
@DEVICE
@DEBUG
def serve(db: str, host: str, port: int, read_only: bool, api_key_file: str | None, create: bool, max_body_mb: float,
          batch_queries: int, batch_window_ms: float, workers: int | None, search_threads: int, gil_switch_us: float,
          device: str) -> None:
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
    if search_threads < 1:
        raise InvalidInputError(f"--search-threads: expected 1 or more, got {search_threads}")
    if gil_switch_us < 0:
        raise InvalidInputError(f"--gil-switch-us: expected 0 or more, got {gil_switch_us}")
    run(db, host=host, port=port, read_only=read_only, api_key=key, device=device, max_body_mb=max_body_mb,
        batch_queries=batch_queries, batch_window_ms=batch_window_ms, workers=workers,
        search_threads=search_threads, gil_switch_us=gil_switch_us, on_ready=main_ready)


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
