"""``mvdb search`` and ``mvdb explain``: query embeddings against a database."""

from __future__ import annotations

import json

import click

from mvdb.cli.arguments import ids_arg, require_database
from mvdb.cli.group import DEBUG, DEVICE, JSON_OUT
from mvdb.errors import InvalidInputError


@click.command()
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

    require_database(db, "search")
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


@click.command()
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

    require_database(db, "explain")
    q = load_npy(query, "the query")
    with mvdb.open(db, read_only=True, device="cpu") as d:
        e = d.explain(q, ids_arg(d, (doc_id,))[0])
    if as_json:
        matches = [{"query_token": m.query_token, "doc_token": m.doc_token, "similarity": m.similarity, "share": m.share}
                   for m in e.matches]
        click.echo(json.dumps({"id": e.id, "score": e.score, "matches": matches}))
        return
    click.echo(f"{e.id}: MaxSim {e.score:.4f}")
    for m in e.matches:
        click.echo(f"  query token {m.query_token:3d} -> document token {m.doc_token:4d}  similarity "
                   f"{m.similarity:.4f}  share {m.share:6.1%}")

