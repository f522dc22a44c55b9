"""``mvdb ingest``: documents from embedding files, or texts a text model encodes
(:mod:`mvdb.ingest.texts` reads them), into a database created if missing."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

import click
import numpy as np

from mvdb.cli.arguments import shard_paths
from mvdb.cli.group import BATCH_SIZE, DEBUG, DEVICE, JSON_OUT, MODEL, QUIET
from mvdb.engine.progress import Progress
from mvdb.errors import InvalidInputError, MvdbError

@click.command()
@click.argument("db")
@click.argument("sources", nargs=-1, required=True)
@MODEL
@click.option("--text-field", default=None, help="JSON lines: the field holding the text [default: text].")
@click.option("--id-field", default=None,
              help="JSON lines: the field holding the id, in every line or in none [default: id].")
@click.option("--store-text/--no-store-text", default=None,
              help="Keep each text in its metadata under 'text' (explain then shows the matched words) "
                   "[default: keep].")
@BATCH_SIZE
@click.option("--dtype", type=click.Choice(["float16", "int8"]), default=None,
              help="Storage dtype of a new database (default float16).")
@click.option("--batch", default=10_000, show_default=True, help="Documents per committed batch.")
@click.option("--index/--no-index", "build_index", default=True, show_default=True,
              help="Train and persist the token index at the end (else the first writable open does).")
@click.option("--shards", default=0, show_default=True,
              help="Create DB sharded into this many shards (mvdb.open(DB, devices=[...]) then puts one per device).")
@click.option("--pool-factor", type=float, default=None,
              help="Token pooling: cluster each document's tokens into tokens/N means (mvdb.pool), recorded in "
                   "DB; a DB that records one pools with it [default: DB's, else none].")
@click.option("--pool-protected", type=int, default=None,
              help="With --pool-factor: leading tokens (a [CLS]) kept as they are [default: 1].")
@click.option("--metadata", "metadata_file", type=click.Path(dir_okay=False), default=None,
              help="JSON lines: one object (or null) per document, in the order of the sources' documents.")
@JSON_OUT
@DEVICE
@QUIET
@DEBUG
def ingest(db: str, sources: tuple[str, ...], model: str | None, text_field: str | None, id_field: str | None,
           store_text: bool | None, batch_size: int | None, dtype: str | None, batch: int, build_index: bool,
           shards: int, pool_factor: float | None, pool_protected: int | None, metadata_file: str | None, as_json: bool,
           device: str, quiet: bool) -> None:
    """Add documents to DB (created if missing): embeddings from files, or texts that --model encodes.

    Embedding SOURCES: packed X.npy + X.lengths.npy (optional X.ids.npy; side files given among
    the sources, as by *.npy, are read with their X.npy), .npz / .safetensors / .h5 with 'tokens'
    and 'lengths' (optional 'ids'), or a directory of per-document .npy files.

    Text SOURCES, with --model: JSON lines (.jsonl, .jsonl.gz: one object per line, the text in
    --text-field, an optional id in --id-field, the other fields its metadata), plain text (.txt:
    one document per non-empty line), or a directory of .txt / .md files (one document per file,
    named by its path in the directory), each text kept in its metadata under 'text'. One call
    takes sources of one kind.

    Every source is checked before DB is created or written. Documents without ids get ids from
    their file's content (<content key>#<row>), not its path, so re-running an interrupted ingest
    skips what is stored however the path is spelled, even from a copy of the file.

    A sharded DB (created with --shards N, or by mvdb.open(DB, devices=[...])) gets each document
    on the shard holding the fewest tokens.

    --metadata F.jsonl gives each document of embedding sources a metadata object (for search
    --where), line i for the i-th document of the sources in order; documents already stored keep
    theirs.

    Example: mvdb ingest my.mvdb docs.npz more_docs/ --metadata docs.metadata.jsonl

    --pool-factor N pools each document's tokens to about 1/N as many (Ward clusters, their
    means; queries are never pooled) and records it in DB: later ingests, adds and add_texts pool
    the same way. A DB that holds unpooled documents, or records another factor, refuses it.

    Example: mvdb ingest texts.mvdb pages.jsonl.gz --model minilm --device cuda
    """
    from mvdb.engine.args import device_arg
    from mvdb.ingest.texts import is_text_source
    from mvdb.pooling import pooling_arg

    pooling = pooling_arg(pool_factor, pool_protected)

    if batch < 1:
        raise InvalidInputError(f"--batch: expected 1 or more documents, got {batch}")
    device_arg(device)  # before anything is written: the index step at the end opens on it
    text = [is_text_source(p) for p in sources]
    quiet = quiet or as_json
    if any(text):
        if not all(text):
            raise InvalidInputError(f"sources: {sources[text.index(False)]} is an embedding source and "
                                    f"{sources[text.index(True)]} a text source: ingest them in separate calls")
        if model is None:
            raise InvalidInputError(f"{sources[0]}: a text source needs --model (minilm, package.module:attr, or "
                                    f"a model folder)")
        if metadata_file is not None:
            raise InvalidInputError("--metadata: for embedding sources; text sources carry theirs (the other "
                                    "fields of a JSON line)")
        summary = _ingest_texts(db, sources, model, text_field=text_field or "text", id_field=id_field or "id",
                                store_text=store_text is not False, batch_size=batch_size, dtype=dtype, batch=batch,
                                shards=shards, device=device, quiet=quiet, pooling=pooling)
    else:
        given = [name for name, v in (("--model", model), ("--text-field", text_field), ("--id-field", id_field),
                                      ("--store-text/--no-store-text", store_text), ("--batch-size", batch_size))
                 if v is not None]
        if given:
            raise InvalidInputError(f"{given[0]}: for text sources (.jsonl, .jsonl.gz, .txt, a directory of .txt / "
                                    f".md files), but {sources[0]} is an embedding source")
        summary = _ingest_embeddings(db, sources, dtype, batch, shards, quiet, metadata_file, pooling, device)
    if build_index:
        import mvdb

        summary["index"] = []
        for p in shard_paths(db):
            t0 = time.perf_counter()
            with mvdb.open(p, device=device, progress=not quiet) as d:
                stats = d.stats()
            summary["index"].append({"path": p, "index": stats["index"], "nlist": stats["nlist"],
                                     "seconds": time.perf_counter() - t0})
            if not quiet:
                nlist = f", nlist {stats['nlist']}" if stats["nlist"] else ""
                click.echo(f"token index{'' if p == db else ' of ' + os.path.basename(p)}: {stats['index']}{nlist} "
                           f"on {stats['device']}, ready in {time.perf_counter() - t0:.1f} s")
    if as_json:
        click.echo(json.dumps(summary))


def _ingest_embeddings(db: str, sources: tuple[str, ...], dtype: str | None, batch: int, shards: int, quiet: bool,
                       metadata_file: str | None, pooling: dict | None = None, device: str = "auto") -> dict:
    """Check every embedding source, then add their documents (DB removed again if this created
    it and a bad document stopped it before any was stored); the summary."""
    from mvdb.ingest import open_source, sources_of

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
        with removed_if_failed(db):
            return _ingest(db, srcs, dim, dtype, batch, shards, quiet, meta, pooling, device)


@contextlib.contextmanager
def removed_if_failed(db: str):
    """DB removed again when the block fails, if the block created it and it holds no document."""
    new = not os.path.lexists(db)
    try:
        yield
    except BaseException:
        if new:
            _remove_if_empty(db)
        raise


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
                except RecursionError:
                    raise InvalidInputError(f"{path}, line {i}: JSON nested too deeply to read (more than Python's recursion limit "
                                            f"of {sys.getrecursionlimit()} levels)") from None
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
            metadata: list | None = None, pooling: dict | None = None, device: str = "auto") -> dict:
    """Add the documents of the checked sources ``srcs`` to DB (created if missing); a summary."""
    from mvdb.engine.args import device_arg
    from mvdb.ingest import add_new
    from mvdb.ingest.writer import Pooled, open_pooling
    from mvdb.shards.placement import PlacedStores
    from mvdb.storage import Store

    paths = shard_paths(db, create=shards)
    with contextlib.ExitStack() as stack:
        stores = [stack.enter_context(Store(p, dtype=dtype)) for p in paths]
        for p, st in zip(paths, stores):
            if st.dim is not None and st.dim != dim:
                raise InvalidInputError(f"{p}: stores dim {st.dim}, but the sources have dim {dim}")
        st = PlacedStores(stores) if len(stores) > 1 or shards else stores[0]
        rec, new = open_pooling(stores, _pooled_sources(srcs, pooling), db)
        if rec is not None:
            st = Pooled(st, rec, device_arg(device), record=new, stores=stores,
                        already=any(src.pooled for src in srcs))
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
                    tokens_added = st.tokens if rec is not None else tokens_added + got_tokens
                    dt = max(time.perf_counter() - t0, 1e-9)
                    rate["text"] = f"{added / dt:,.0f} docs/s, {tokens_added / dt:,.0f} tokens/s"
                    bar.update(len(ids))
        return _summary(db, added, skipped, tokens_added, len(st), time.perf_counter() - t0, quiet)


def _pooled_sources(srcs: list, asked: dict | None) -> dict | None:
    """The pooling an ingest asks for: ``asked`` (``--pool-factor``), or that of sources exported
    pooled (their ``X.pooling.json``), whose documents are stored as they are. Sources pooled
    differently, pooled and unpooled together, or pooled otherwise than ``asked`` are refused."""
    from mvdb.ingest.sources import POOLING_SIDE_FILE
    from mvdb.pooling import describe

    kinds = {json.dumps(src.pooled, sort_keys=True): src for src in srcs}
    if len(kinds) > 1:
        a, b = list(kinds.values())[:2]
        raise InvalidInputError(f"sources: {a.path} holds documents with {describe(a.pooled, 'no pooling')}, {b.path} "
                                f"with {describe(b.pooled, 'no pooling')}; one database pools its documents one way")
    pooled = srcs[0].pooled if srcs else None
    if pooled is None:
        return asked
    if asked is not None and asked != pooled:
        raise InvalidInputError(f"--pool-factor: asks for {describe(asked)}, but {srcs[0].path} holds documents pooled "
                                f"with {describe(pooled)} (its {os.path.basename(srcs[0].path)[:-4]}{POOLING_SIDE_FILE}); "
                                f"leave --pool-factor out, they are stored as they are")
    return pooled


def _summary(db: str, added: int, skipped: int, tokens: int, documents: int, seconds: float, quiet: bool) -> dict:
    """The closing line of an ingest (unless ``quiet``) and its ``--json`` summary."""
    if not quiet:
        click.echo(f"ingested {added} documents ({tokens:,} tokens) in {seconds:.1f} s; "
                   f"skipped {skipped} already stored; {documents} in {db}")
    return {"db": db, "added": added, "skipped": skipped, "tokens_added": tokens, "documents": documents,
            "seconds": seconds}


def _ingest_texts(db: str, sources: tuple[str, ...], spec: str, *, text_field: str, id_field: str, store_text: bool,
                  batch_size: int | None, dtype: str | None, batch: int, shards: int, device: str, quiet: bool,
                  pooling: dict | None = None) -> dict:
    """Check every text source, load the model, then encode and add the documents not stored yet,
    ``batch`` a commit, each commit recording the model (as ``add_texts``); the summary."""
    from mvdb.cli.arguments import load_model, model_checked
    from mvdb.ingest.texts import open_text_sources
    from mvdb.shards.placement import PlacedStores, membership
    from mvdb.storage import Store
    from mvdb.text import check_record, recorded_encoder

    srcs = open_text_sources(sources, text_field=text_field, id_field=id_field, store_text=store_text)
    enc = load_model(spec, device, batch_size)
    with removed_if_failed(db), contextlib.ExitStack() as stack:
        stores = [stack.enter_context(Store(p, dtype=dtype)) for p in shard_paths(db, create=shards)]
        st = PlacedStores(stores)  # one store, or the shards: each document to the least loaded
        with model_checked(spec):
            check_record(enc.record(), recorded_encoder(stores), db, len(st))
        from mvdb.engine.args import device_arg
        from mvdb.ingest.writer import Pooled, open_pooling

        rec, new = open_pooling(stores, pooling, db, enc)
        if rec is not None:
            st = Pooled(st, rec, device_arg(device), record=new, stores=stores)
        held = {s.manifest["id_type"] for s in stores} - {None}
        if held and srcs[0].id_type not in held:
            raise InvalidInputError(f"{db}: holds {held.pop()} ids, but {srcs[0].path} has {srcs[0].id_type} ids")
        float16 = all(s.dtype == "float16" for s in stores)
        meter = _Meter()
        for src in srcs:
            with meter.bar(src, quiet):
                for ids, texts, metas in src.batches(batch):
                    new = np.flatnonzero(~membership(st, ids))
                    meter.skip(len(ids) - len(new))
                    if not len(new):
                        continue
                    before = meter.done
                    tokens, lengths = enc.encode_packed([texts[i] for i in new], progress=_BarProgress(meter.encoded),
                                                        dtype=np.float16 if float16 else np.float32)
                    meter.encoded(len(new) - (meter.done - before))  # what the model did not report (a cache hit)
                    dims = {s.dim for s in stores} - {None}
                    if dims and enc.dim not in dims:
                        raise InvalidInputError(f"{db}: stores dim {dims.pop()}, but --model {spec} makes {enc.dim}-d "
                                                f"vectors")
                    st.add_packed(tokens, lengths, ids=[ids[i] for i in new],
                                  metadata=None if metas is None else [metas[i] for i in new],
                                  encoder_record=enc.record())
                    meter.stored(len(new), int(lengths.sum()) if rec is None else st.tokens - meter.tokens)
        summary = meter.summary(db, len(st), quiet)
    return dict(summary, model=enc.name)


class _Meter:
    """The counts of a text ingest, and the progress bar of each source: documents skipped (stored
    already) or encoded, with the documents encoded per second."""

    def __init__(self):
        self.added = self.skipped = self.tokens = self.done = 0
        self.t0 = time.perf_counter()
        self._bar = None
        self._rate = ""

    @contextlib.contextmanager
    def bar(self, src, quiet: bool):
        with click.progressbar(length=src.n, label=src.path, show_pos=True, file=sys.stderr,
                               item_show_func=lambda _: self._rate, hidden=quiet) as bar:
            self._bar = bar
            yield bar

    def skip(self, n: int) -> None:
        self.skipped += n
        self._bar.update(n)

    def encoded(self, n: int) -> None:
        self.done += n
        dt = max(time.perf_counter() - self.t0, 1e-9)
        self._rate = f"{self.done / dt:,.0f} docs/s encoded"
        self._bar.update(n)

    def stored(self, n: int, tokens: int) -> None:
        self.added += n
        self.tokens += tokens

    def summary(self, db: str, documents: int, quiet: bool) -> dict:
        return _summary(db, self.added, self.skipped, self.tokens, documents, time.perf_counter() - self.t0, quiet)


class _BarProgress(Progress):
    """The encoder's progress (:class:`mvdb.engine.progress.Progress`) moving the command's bar."""

    def __init__(self, advance):
        super().__init__(enabled=False)
        self._advance = advance

    def step(self, what: str, total: int | None = None, unit: str = ""):
        return _BarStep(self._advance)


class _BarStep:
    def __init__(self, advance):
        self.update = advance

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


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

