"""``mvdb info``, ``mvdb verify``, ``mvdb compact``, ``mvdb recover`` and ``mvdb warmup``: what a
database holds, its checks, its upkeep, its repair and its kernels made ready."""

from __future__ import annotations

import json
import os
import sys

import click

from mvdb.cli.arguments import require_database, shard_paths
from mvdb.cli.group import DEBUG, DEVICE, JSON_OUT, QUIET


@click.command()
@click.argument("db")
@click.option("--json", "as_json", is_flag=True)
@DEBUG
def info(db: str, as_json: bool) -> None:
    """Show what DB holds.

    Example: mvdb info my.mvdb
    """
    from mvdb.pooling import describe
    from mvdb.storage import Store

    per = []
    for p in shard_paths(db):
        with Store(p, read_only=True) as st:
            m = st.manifest
            per.append({"path": p, "documents": len(st), "dim": m["dim"], "dtype": m["dtype"],
                        "id_type": m["id_type"], "segments": len(m["segments"]),
                        "tokens": sum(s["n_tokens"] for s in m["segments"]),
                        "deleted": sum(len(s["deleted"]) for s in m["segments"]), "generation": m["generation"],
                        "bytes": sum(s["file_size"] for s in m["segments"]), "index": _index_info(m),
                        "pooling": (m.get("config") or {}).get("pooling")})
    if len(per) == 1 and per[0]["path"] == db:
        out = per[0]
    else:
        out = {"path": db, "shards": len(per), "documents": sum(p["documents"] for p in per),
               "tokens": sum(p["tokens"] for p in per), "bytes": sum(p["bytes"] for p in per),
               "pooling": next((p["pooling"] for p in per if p["pooling"]), None), "per_shard": per}
    # the records in words; the database's: the first shard's that has one, as stats() reads it
    for d in {id(d): d for d in (out, *per)}.values():
        d["pooling"] = describe(d["pooling"], none="none (documents stored as given)")
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


@click.command()
@click.argument("db")
@JSON_OUT
@DEBUG
def verify(db: str, as_json: bool) -> None:
    """Check every checksum, offset and the manifest of DB; changes nothing. Exit 1 on problems.

    Example: mvdb verify my.mvdb
    """
    from mvdb.storage import verify as verify_path

    require_database(db, "verify")
    paths = shard_paths(db)
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


@click.command()
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

    require_database(db, "compact")
    with mvdb.open(db, device=device, progress=not (quiet or as_json)) as d:
        n = d.compact()
        out = {"rewritten": n, "documents": len(d), "segments": d.stats()["segments"]}
    if as_json:
        click.echo(json.dumps(out))
    elif not quiet:
        click.echo(f"rewrote {n} segments; {out['documents']} documents in {out['segments']} segments")


@click.command()
@click.argument("db")
@click.option("--max-query-tokens", type=click.IntRange(1, 65536), default=None,
              help="The longest query to warm for (default: the recorded encoder's limit, at least 64).")
@JSON_OUT
@DEVICE
@QUIET
@DEBUG
def warmup(db: str, max_query_tokens: int | None, as_json: bool, device: str, quiet: bool) -> None:
    """Compile and tune every kernel variant the searches of DB launch, so that the first query
    of every later process runs at the warm speed (the tuning is stored on disk, the compiled
    kernels in Triton's cache); read-only. Run it once after installing or upgrading.

    Example: mvdb warmup my.mvdb
    """
    import mvdb

    require_database(db, "warm up")
    with mvdb.open(db, device=device, read_only=True, progress=not (quiet or as_json)) as d:
        out = d.warmup(max_query_tokens)
    if as_json:
        click.echo(json.dumps(out))
    elif not quiet:
        click.echo(f"warmed {out['searches']} searches in {out['seconds']:.1f} s")


@click.command()
@click.argument("db")
@click.option("--force", is_flag=True, help="Rebuild the manifest even when it is intact.")
@JSON_OUT
@DEBUG
def recover(db: str, force: bool, as_json: bool) -> None:
    """Rebuild a lost, damaged or outdated MANIFEST.json from the segments whose checksums hold (the
    newest copy of an id wins; the deletions and settings kept are those of the latest commit, from
    the manifest or its commit record; the index is rebuilt on the next open). Prints what was left out; exit 1 when anything was.


    Example: mvdb recover my.mvdb
    """
    from mvdb.storage import recover as recover_path

    report = recover_path(db, force=force)
    _exit_with_report(report, as_json)

