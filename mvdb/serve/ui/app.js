// The page at /ui of `mvdb serve`: plain JavaScript over the server's JSON API (no build step).
// Every text from the server goes into the page as text nodes, never as HTML.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const KEY = "mvdb-api-key";
  const state = { model: null, idType: "int", query: null };

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
    node.append(...children);  // strings become text nodes
    return node;
  }

  const fmt = (x, digits = 4) => (typeof x === "number" ? x.toFixed(digits) : String(x));
  const count = (x) => (typeof x === "number" ? x.toLocaleString("en") : String(x ?? "-"));

  // ---- the API: JSON both ways, the key as a bearer token; errors as the server words them
  // Integers past 2^53 (int64 ids) would round in a JS number: read as BigInt from their digits,
  // written back as the same digits.
  const exactInts = (key, value, ctx) => (typeof value === "number" && Number.isInteger(value)
    && !Number.isSafeInteger(value) && ctx && /^-?\d+$/.test(ctx.source) ? BigInt(ctx.source) : value);
  const rawInts = (key, value) => (typeof value === "bigint"
    ? (JSON.rawJSON ? JSON.rawJSON(value.toString()) : Number(value)) : value);

  async function api(path, body) {
    const headers = { accept: "application/json" };
    const key = $("key").value.trim();
    if (key) headers.authorization = "Bearer " + key;
    const init = { method: "GET", headers };
    if (body !== undefined) {
      init.method = "POST";
      headers["content-type"] = "application/json";
      init.body = JSON.stringify(body, rawInts);
    }
    const r = await fetch(path, init);  // relative: the page sits at <server>/ui
    let out = null;
    try { out = JSON.parse(await r.text(), exactInts); } catch (_) { /* not JSON: named below */ }
    if (!r.ok) {
      const e = new Error(out && out.message ? out.message : `HTTP ${r.status}`);
      e.kind = out && out.error;
      e.status = r.status;
      throw e;
    }
    return out;
  }

  function showError(e) {
    const box = $("error");
    let text = (e.kind ? e.kind + ": " : "") + e.message;
    if (e.status === 401) {
      text += "\nEnter the server's API key above.";
      $("key").focus();
    }
    box.textContent = text;
    box.hidden = false;
  }

  const hideError = () => { $("error").hidden = true; };

  // ---- the server and its stats

  async function connect() {
    hideError();
    try {
      const h = await api("health");
      state.model = h.model;
      $("server").textContent = `${count(h.documents)} documents` + (h.read_only ? " · read-only" : "") +
        (h.model ? ` · model ${h.model}` : " · no text model");
      $("mode-text").disabled = !h.model;
      setMode(h.model ? "text" : "id");
      await loadStats();
    } catch (e) {
      $("server").textContent = "not connected";
      showError(e);
    }
  }

  async function loadStats() {
    const s = await api("stats");
    state.idType = s.id_type || "int";
    const rows = [
      ["documents", count(s.documents)], ["tokens", count(s.tokens)], ["dim", s.dim], ["dtype", s.dtype],
      ["ids", s.id_type], ["index", `${s.index} (${s.index_backend})`], ["device", s.device], ["tier", s.tier],
      ["segments", count(s.segments)], ["deleted", count(s.deleted)],
      ["encoder", s.encoder ? s.encoder.name : "none recorded"],
    ];
    const pair = ([k, v]) => [el("dt", {}, k), el("dd", { "data-stat": k }, String(v ?? "-"))];
    $("stats").replaceChildren(...rows.flatMap(pair));
    $("stats-json").textContent = JSON.stringify(s, rawInts, 2);
  }

  function setMode(mode) {
    $("mode-" + mode).checked = true;
    const text = mode === "text";
    $("query").placeholder = text ? "a question or a few words" : "a stored document's id";
    $("note").textContent = text
      ? `Encoded by the server's model (${state.model}).`
      : state.model ? "The document's stored tokens are the query."
        : "This server has no text model (mvdb serve DB --model NAME): use a stored document as the query.";
  }

  const mode = () => ($("mode-text").checked ? "text" : "id");

  function parseId(value) {
    if (state.idType !== "int") return value;
    if (!/^-?\d+$/.test(value)) throw new Error(`this database uses int ids, got ${JSON.stringify(value)}`);
    const n = Number(value);
    return Number.isSafeInteger(n) ? n : BigInt(value);
  }

  // ---- searching

  async function search(event) {
    event.preventDefault();
    hideError();
    const value = $("query").value.trim();
    if (!value) return;
    const k = Math.max(1, parseInt($("k").value, 10) || 10);
    try {
      let answer;
      if (mode() === "text") {
        state.query = { query: value };
        answer = await api("search_text", { queries: value, k });
      } else {
        const id = parseId(value);
        const [tokens] = await api("get", { ids: [id] });
        state.query = { query_id: id };
        answer = await api("search", { queries: tokens, k });
      }
      await showHits(answer.hits);
    } catch (e) {
      showError(e);
    }
  }

  async function showHits(hits) {
    const list = $("hits");
    list.replaceChildren();
    $("detail").hidden = true;
    if (!hits.length) {
      list.append(el("li", { class: "muted" }, "No hits."));
      return;
    }
    const meta = await api("metadata", { ids: hits.map((h) => h[0]) });
    hits.forEach(([id, score], i) => {
      const text = meta[i] && typeof meta[i].text === "string" ? meta[i].text : "";
      const button = el("button", { type: "button" },
        el("span", { class: "hit-head" },
          el("span", { class: "hit-rank" }, `${i + 1}.`),
          el("span", { class: "hit-id" }, String(id)),
          el("span", { class: "hit-score" }, fmt(score))),
        el("span", { class: "hit-snippet" }, text.slice(0, 200)));
      const item = el("li", { class: "hit", "data-id": String(id), "data-score": String(score) }, button);
      button.addEventListener("click", () => openHit(id, item));
      list.append(item);
    });
  }

  // ---- one hit: its text with the matched words shaded, and the per-token table

  async function openHit(id, item) {
    hideError();
    try {
      const e = await api("explain", { ...state.query, doc_id: id });
      for (const li of $("hits").children) li.classList.toggle("open", li === item);
      showExplanation(e);
    } catch (err) {
      showError(err);
    }
  }

  function showExplanation(e) {
    $("detail-id").textContent = String(e.id);
    $("detail-score").textContent = `MaxSim ${fmt(e.score)}`;
    const box = $("doc-text");
    box.replaceChildren();
    const doc = e.text.doc;
    if (typeof doc !== "string") {
      box.append(el("span", { class: "muted" }, "No stored text (add_texts(..., store_text=True) keeps it)."));
    } else {
      // spans count characters (code points) as Python does; a JS string slices UTF-16 units
      const chars = Array.from(doc);
      const text = { slice: (a, b) => chars.slice(a, b).join("") };
      const spans = matchedSpans(e.matches);
      const top = Math.max(1e-9, ...spans.map((s) => s.similarity));
      let at = 0;
      for (const s of spans) {
        if (s.start < at) continue;  // overlapping spans: the first one wins
        box.append(text.slice(at, s.start));
        const mark = el("mark", {
          class: "match", "data-similarity": fmt(s.similarity), "data-share": fmt(s.share),
          title: `similarity ${fmt(s.similarity)}, share ${(100 * s.share).toFixed(1)}%` +
            ` (query: ${s.queries.join(", ")})`,
        }, text.slice(s.start, s.end));
        mark.style.setProperty("--strength", Math.min(1, Math.max(0.12, s.similarity / top)).toFixed(3));
        box.append(mark);
        at = s.end;
      }
      box.append(text.slice(at));
      if (!spans.length) box.append(el("p", { class: "muted" }, "No word spans: the model gives no token offsets."));
    }
    const most = Math.max(1e-9, ...e.matches.map((m) => m.share));
    const word = (text, position) => (text != null ? el("td", {}, text)
      : el("td", { class: "muted", title: "no word: a special token, or no text and spans" }, `token ${position}`));
    const rows = e.matches.map((m) => {
      const bar = el("span", { class: "bar" });
      bar.style.width = `${(60 * Math.max(0, m.share) / most).toFixed(1)}px`;  // 60 px: the largest share
      return el("tr", {},
        el("td", { class: "num" }, String(m.query_token)),
        word(m.query_text, m.query_token),
        word(m.doc_text, m.doc_token),
        el("td", { class: "num" }, fmt(m.similarity)),
        el("td", {}, bar, `${(100 * m.share).toFixed(1)}%`));
    });
    $("tokens").tBodies[0].replaceChildren(...rows);
    $("detail").hidden = false;
  }

  // per matched document word: its strongest similarity, the shares summed, the query tokens
  function matchedSpans(matches) {
    const spans = new Map();
    for (const m of matches) {
      // every word the matched vector stands for: one token's, or a pooled cluster's
      const words = m.doc_spans || (m.doc_span ? [m.doc_span] : []);
      for (const [start, end] of words) {
        const key = `${start}:${end}`;
        const s = spans.get(key) || { start, end, similarity: -Infinity, share: 0, queries: [] };
        s.similarity = Math.max(s.similarity, m.similarity);
        s.share += m.share;
        s.queries.push(m.query_text ?? `#${m.query_token}`);
        spans.set(key, s);
      }
    }
    return [...spans.values()].sort((a, b) => a.start - b.start || b.end - a.end);
  }

  // ---- wiring

  document.addEventListener("DOMContentLoaded", () => {
    $("key").value = sessionStorage.getItem(KEY) || "";
    $("key").addEventListener("change", () => {
      sessionStorage.setItem(KEY, $("key").value.trim());
      connect();
    });
    $("mode-text").addEventListener("change", () => setMode("text"));
    $("mode-id").addEventListener("change", () => setMode("id"));
    $("query-form").addEventListener("submit", search);
    $("refresh").addEventListener("click", () => loadStats().catch(showError));
    connect();
  });
})();
