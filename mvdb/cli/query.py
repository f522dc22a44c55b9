"""``mvdb search`` and ``mvdb explain``: queries (embeddings, or texts a text model encodes)
against a database."""

from __future__ import annotations

import json
import os
import sys

import click

from mvdb.cli.arguments import ids_arg, load_model, model_checked, recorded_model, require_database
from mvdb.cli.group import BATCH_SIZE, DEBUG, DEVICE, JSON_OUT, MODEL
from mvdb.errors import InvalidInputError


@click.command()
@click.argument("db")
@click.argument("queries", required=False)
@click.option("--text", "texts", multiple=True,
              help="A query as text (repeat for more), encoded by --model; instead of QUERIES.")
@MODEL
@BATCH_SIZE
@click.option("-k", default=10, show_default=True, help="Hits per query.")
@click.option("--where", default=None, help='Metadata filter as JSON, e.g. \'{"lang": "en"}\'.')
@click.option("--nprobe", type=int, default=None, help="IVF lists probed per query token (default: the database's).")
@click.option("--n-candidates", type=int, default=None, help="Documents reranked exactly per query.")
@click.option("--exact", is_flag=True, help="Score every (matching) document: exhaustive MaxSim, slow.")
@click.option("--json", "as_json", is_flag=True, help="One JSON list of [id, score] per query.")
@DEVICE
@DEBUG
def search(db: str, queries: str | None, texts: tuple[str, ...], model: str | None, batch_size: int | None, k: int,
           where: str | None, nprobe: int | None, n_candidates: int | None, exact: bool, as_json: bool,
           device: str) -> None:
    """Search DB with query embeddings from a .npy file ([Lq, dim] or [Nq, Lq, dim]), or with
    text queries that --model encodes: --text "..." (repeatable), or a .txt file as QUERIES (one
    query per non-empty line). The model must be the one that filled DB.

    Example: mvdb search my.mvdb query.npy -k 5 --where '{"lang": "en"}'

    Example: mvdb search texts.mvdb --text "free disk space" --model minilm -k 3
    """
    import mvdb
    from mvdb.ingest import load_npy

    require_database(db, "search")
    text = _text_queries(db, queries, texts, model)
    if text is None:
        if batch_size is not None:
            raise InvalidInputError(f"--batch-size: for text queries (--text, or a .txt file), got {queries}")
        q = load_npy(queries, "the queries")
        if q.ndim not in (2, 3):
            raise InvalidInputError(f"{queries}: expected queries as [Lq, dim] or [Nq, Lq, dim], got shape {q.shape}")
    filt = None
    if where is not None:
        try:
            filt = json.loads(where)
        except ValueError as e:
            raise InvalidInputError(f"--where: expected a JSON object, got {where!r} ({e})") from None
        except RecursionError:
            raise InvalidInputError(f"--where: JSON nested too deeply to read (more than Python's recursion limit "
                                    f"of {sys.getrecursionlimit()} levels)") from None
    options = {"where": filt, "nprobe": nprobe, "n_candidates": n_candidates, "exact": exact}
    if text is not None:
        enc = load_model(model, device, batch_size)
        with model_checked(model), mvdb.open(db, read_only=True, device=device, encoder=enc) as d:
            batch = d.search_text(text, k=k, **options)
    else:
        with mvdb.open(db, read_only=True, device=device) as d:
            hits = d.search(q, k=k, **options)
        batch = hits if q.ndim == 3 else [hits]
    for i, row in enumerate(batch):
        if as_json:
            click.echo(json.dumps([[h.id, h.score] for h in row]))
        else:
            click.echo(f"query {i}: " + ", ".join(f"{h.id} ({h.score:.4f})" for h in row))


def _text_queries(db: str, queries: str | None, texts: tuple[str, ...], model: str | None) -> list[str] | None:
    """The text queries of ``mvdb search`` (None: QUERIES is a .npy of embeddings), checked."""
    if queries is not None and texts:
        raise InvalidInputError(f"QUERIES and --text: give one of them, got {queries} and --text")
    if queries is None and not texts:
        raise InvalidInputError("QUERIES: expected a .npy of query embeddings, a .txt of text queries, or --text")
    if queries is not None and not queries.endswith(".txt"):
        if model is not None:
            raise InvalidInputError(f"--model: for text queries (--text, or a .txt file), but {queries} holds "
                                    f"embeddings")
        return None
    if model is None:
        rec = recorded_model(db)
        made = f"; its documents were encoded by {rec!r}" if rec else ""
        raise InvalidInputError(f"{'--text' if texts else queries}: text queries need --model{made}")
    if texts:
        out = list(texts)
    else:
        try:
            with open(queries, encoding="utf-8") as f:
                out = [line.rstrip("\r\n") for line in f if line.strip()]
        except UnicodeDecodeError as e:
            raise InvalidInputError(f"{queries}: not UTF-8 text ({e.reason})") from None
        except OSError as e:
            raise InvalidInputError(f"{queries}: cannot read it ({e.strerror})") from None
        if not out:
            raise InvalidInputError(f"{queries}: no queries in it (one per non-empty line)")
    for i, t in enumerate(out):
        if not t.strip():
            raise InvalidInputError(f"--text: query {i} is empty")
    return out


@click.command()
@click.argument("db")
@click.argument("query")
@click.argument("doc_id")
@MODEL
@JSON_OUT
@DEVICE
@DEBUG
def explain(db: str, query: str, doc_id: str, model: str | None, as_json: bool, device: str) -> None:
    """Why document DOC_ID scores what it does for the query in QUERY (.npy, [Lq, dim]; with
    --model, the query's text): per query token, the best-matching document token, their
    similarity and its share of the MaxSim score. Where DB stores the texts and the model gives
    each token's place in its text (Sentence Transformers models do), the matched words too.

    Example: mvdb explain my.mvdb query.npy 17

    Example: mvdb explain texts.mvdb "free disk space" df --model minilm
    """
    import mvdb
    from mvdb.ingest import load_npy

    require_database(db, "explain")
    if model is not None:
        if not query.strip():
            raise InvalidInputError("QUERY: empty text")
        enc = load_model(model, device)
        with model_checked(model), mvdb.open(db, read_only=True, device="cpu", encoder=enc) as d:
            e = d.explain(query, ids_arg(d, (doc_id,))[0])
    else:
        if not query.endswith(".npy") and not os.path.exists(query):
            raise InvalidInputError(f"QUERY: expected a .npy of the query's embeddings, got {query!r} (a query as "
                                    f"text needs --model)")
        q = load_npy(query, "the query")
        with mvdb.open(db, read_only=True, device="cpu") as d:
            e = d.explain(q, ids_arg(d, (doc_id,))[0])
    if as_json:
        click.echo(json.dumps({"id": e.id, "score": e.score, "matches": [m.as_dict() for m in e.matches]}))
        return
    click.echo(f"{e.id}: MaxSim {e.score:.4f}")
    words = any(m.query_text is not None or m.doc_text is not None for m in e.matches)
    for m in e.matches:
        q_word = f" {_word(m.query_text)}" if words else ""
        d_word = f" {_word(m.doc_text)}" if words else ""
        click.echo(f"  query token {m.query_token:3d}{q_word} -> document token {m.doc_token:4d}{d_word}  similarity "
                   f"{m.similarity:.4f}  share {m.share:6.1%}")


def _word(text: str | None) -> str:
    """A matched word as shown: quoted, or '-' for a token without one ([CLS], [SEP])."""
    return "-" if text is None else json.dumps(text, ensure_ascii=False)
