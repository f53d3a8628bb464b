// The results viewer: overview, query explorer, query page and comparison of evaluator output folders.
// Plain ES module, no dependency; the data is the inline JSON of <script id="data"> (see evaluator/render/view_page.py).
// A large run is paged: the inline data then holds the overview and `parts`, and each part's queries and records
// sit in a script beside the page (view-data/part-NNNN.js), loaded when a view needs it — a <script> tag, since a
// page opened from file:// may load scripts beside it but not fetch() them.
"use strict";

const D = JSON.parse(document.getElementById("data").textContent);
const app = document.getElementById("app");
const GOLDS = D.golds;
const OUTCOME = {ptr: "PtR wins", rtp: "RtP wins", tie: "tie", miss: "both miss", na: "not paired"};
const FLAGS = {truncated: "truncated", parse_error: "parse error", llm_error: "LLM error", refused: "refusal",
               fallback: "fallback", excluded: "PtR excluded", failed: "architecture failed"};

// ------------------------------------------------------------------ helpers

const ESC = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"};
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ESC[c]);
const num = (x, d = 3) => (x === null || x === undefined || Number.isNaN(x) ? "–" : Number(x).toFixed(d));
const api = (i) => (typeof i === "number" ? D.apis[i] : String(i));
const list = (i) => D.lists[i] || [[], []];
const side = (i) => D.sides[i];
const ds = (r) => D.datasets[side(r.side).ds];
const table = (head, rows, attrs = "") =>
  `<table ${attrs}><thead><tr>${head.map((h) => `<th>${esc(h)}</th>`).join("")}</tr></thead>` +
  `<tbody>${rows.map((r) => `<tr>${r.map((c) => `<td>${esc(c)}</td>`).join("")}</tr>`).join("")}</tbody></table>`;
const goldSets = (q) => q.gold.map((g) => new Set(g));
function goldBadges(id, gsets) {
  return gsets.map((g, i) => (g.has(id) ? `<span class="gold g${i}" title="in gold ${GOLDS[i]}">${GOLDS[i]}</span>` : "")).join("");
}
// ------------------------------------------------------------------ parts of a paged page

const PARTS = D.parts || null;
let part = null;  // the part whose queries and records D holds now
const loaded = new Map();  // part -> its data, once its script ran
window.viewPart = (i, data) => { loaded.set(i, data); };

function usePart(i) {
  const data = loaded.get(i);
  for (const key of ["apis", "lists", "queries", "records"]) D[key] = data[key];
  if (D.compare) D.compare.pairs.forEach((p, j) => { p.queries = data.compare_queries[j] || []; });
  part = i;
}

function loadPart(i) {
  if (loaded.has(i)) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const s = document.createElement("script");
    s.src = PARTS[i].file;
    s.onload = () => (loaded.has(i) ? resolve() : reject(new Error(`${PARTS[i].file} did not define its part`)));
    s.onerror = () => reject(new Error(`cannot load ${PARTS[i].file}: keep it beside the page`));
    document.head.appendChild(s);
  });
}

// A link to a query page (or the list) of the part shown now.
const inPart = () => (PARTS ? `p=${part}&` : "");
const qhref = (qi, ri) => `#${inPart()}q=${qi}${ri === undefined || ri === null ? "" : `&r=${ri}`}`;
const partLabel = (p, i) => `part ${i + 1} of ${PARTS.length}: ${p.first[0]} ${p.first[1]} … ${p.last[0]} ${p.last[1]} (${p.records} records)`;

function recsOf(qi) { return D.records.map((r, i) => [r, i]).filter(([r]) => r.q === qi); }

// ------------------------------------------------------------------ navigation

const state = {page: 0, pageSize: 100, search: "", subset: "", side: "", run: "", outcome: "", flag: "", gold: 0, sort: "diff-desc", cmpGold: 0,
               archA: null, archB: null, archGold: 0, archSide: ""};
// Every architecture any run of the page holds, in the runs' order (RtP, PtR, then the others).
const ARCHS = [...new Set(D.datasets.flatMap((d) => d.archs || []))];
const ARCH_NAMES = {rtp: "RtP", ptr: "PtR"};
const archName = (a) => ARCH_NAMES[a] || a;
const blockOf = (r, a) => (a === "rtp" || a === "ptr" ? r[a] : (r.blocks || {})[a]);

function nav() {
  const tabs = [["overview", "Overview"], ["queries", "Queries"]];
  if (ARCHS.length >= 2) tabs.push(["archs", "Architectures"]);
  if (D.compare) tabs.push(["compare", "Comparison"]);
  const P = new URLSearchParams(location.hash.replace(/^#/, ""));
  const cur = P.has("q") ? "q" : P.has("queries") ? "queries" : P.has("archs") ? "archs" : P.has("compare") ? "compare" : "overview";
  return `<nav>${tabs.map(([h, t]) => `<a href="#${h}" class="${cur === h || (h === "queries" && cur === "q") ? "on" : ""}">${t}</a>`).join("")}` +
    `<span class="title">${esc(document.title)}</span></nav>`;
}

function route() {
  const h = location.hash.replace(/^#/, "");
  const params = new URLSearchParams(h);
  const view = params.has("q") ? "q" : params.has("queries") ? "queries" : params.has("archs") && ARCHS.length >= 2 ? "archs"
    : params.has("compare") && D.compare ? "compare" : "overview";
  if (PARTS && view !== "overview") {
    const want = Math.min(Math.max(Number(params.get("p") ?? part ?? 0) || 0, 0), PARTS.length - 1);
    if (want !== part) {
      app.innerHTML = nav() + `<main><p id="loading">Loading ${esc(partLabel(PARTS[want], want))}…</p></main>`;
      loadPart(want).then(() => { usePart(want); route(); },
        (e) => { app.innerHTML = nav() + `<main><p class="restrict">${esc(e.message)}</p></main>`; });
      return;
    }
  }
  let body;
  if (view === "q") body = queryPage(Number(params.get("q")), params.has("r") ? Number(params.get("r")) : null);
  else if (view === "queries") body = explorer();
  else if (view === "compare") body = compare();
  else if (view === "archs") body = archCompare();
  else body = overview();
  app.innerHTML = nav() + `<main>${body}</main>`;
  if (view === "queries") bindExplorer();
  if (view === "archs") bindArchCompare();
  if (view === "compare") bindCompare();
  window.scrollTo(0, 0);
  document.body.dataset.part = part === null ? "" : String(part);
}

// ------------------------------------------------------------------ overview

function overview() {
  return D.datasets.map((d) => {
    const warn = d.warnings.length ? `<ul class="warnings">${d.warnings.map((w) => `<li>${esc(w)}</li>`).join("")}</ul>` : "<p>No warnings.</p>";
    const tables = d.tables.length ? d.tables.map((t) => `<h3>${esc(t.title)}</h3>${table(t.head, t.rows, 'class="num"')}` +
      (t.note ? `<p class="note">${esc(t.note)}</p>` : "")).join("") : "<p>No tables: summary.json is missing.</p>";
    const figs = d.figures.map((f) => `<figure><img alt="${esc(f.name)}" src="data:image/png;base64,${f.png}"><figcaption>${esc(f.name)}</figcaption></figure>`).join("");
    const acc = d.accounting;
    return `<section class="dataset"><h2>${esc(d.name)}</h2>` +
      `<h3>Settings</h3>${table(["setting", "value"], d.settings, 'class="kv"')}` +
      `<h3>Warnings</h3>${warn}<h3>Main tables</h3>${tables}` +
      `<h3>Accounting</h3>${acc.calls.rows.length ? table(acc.calls.head, acc.calls.rows, 'class="num"') : "<p>No LLM calls.</p>"}` +
      (acc.cost.rows.length ? table(acc.cost.head, acc.cost.rows, 'class="num"') : "") +
      `<h3>Figures</h3><div class="figs">${figs || "<p>No figures.</p>"}</div></section>`;
  }).join("");
}

// ------------------------------------------------------------------ explorer

function diffOf(r, g) {
  const a = r.recall.rtp[g], b = r.recall.ptr[g];
  return a === null || b === null ? null : b - a;
}

function matches(r) {
  const q = D.queries[r.q];
  if (state.subset && q.subset !== state.subset) return false;
  if (state.side !== "" && r.side !== Number(state.side)) return false;
  if (state.run !== "" && r.run !== Number(state.run)) return false;
  if (state.outcome && r.outcome[state.gold] !== state.outcome) return false;
  if (state.flag && !r.flags.includes(state.flag)) return false;
  if (state.search) {
    const s = state.search.toLowerCase();
    const stubs = r.ptr ? r.ptr.stubs.map((x) => x[0]).join(" ") : "";
    if (!(q.text.toLowerCase().includes(s) || String(q.id).toLowerCase() === s || stubs.toLowerCase().includes(s))) return false;
  }
  return true;
}

function filtered() {
  const g = state.gold;
  const rows = D.records.map((r, i) => [r, i]).filter(([r]) => matches(r));
  const key = ([r]) => diffOf(r, g);
  if (state.sort === "diff-desc" || state.sort === "diff-asc") {
    const sign = state.sort === "diff-desc" ? -1 : 1;
    rows.sort((a, b) => {
      const x = key(a), y = key(b);
      if (x === null || y === null) return (x === null) - (y === null);
      return sign * (x - y) || a[1] - b[1];
    });
  }
  return rows;
}

function options(values, current, all) {
  return `<option value="">${all}</option>` +
    values.map(([v, t]) => `<option value="${esc(v)}"${String(current) === String(v) ? " selected" : ""}>${esc(t)}</option>`).join("");
}

function explorer() {
  const subsets = [...new Set(D.queries.map((q) => q.subset))].sort().map((s) => [s, s]);
  const runs = [...new Set(D.records.map((r) => r.run))].sort((a, b) => a - b).map((r) => [r, `run ${r}`]);
  const sides = D.sides.map((s, i) => [i, s.label || "retrieval only"]);
  const parts = PARTS ? `<p class="note">This run has ${D.total_records} records of ${D.total_queries} queries, in ` +
    `${PARTS.length} parts of whole queries; search, filters and sorting apply within the part shown.</p>` +
    `<label>part <select id="f-part">${PARTS.map((p, i) => `<option value="${i}"${i === part ? " selected" : ""}>${esc(partLabel(p, i))}</option>`).join("")}</select></label>` : "";
  return `<h2>Queries</h2>${parts}<div class="filters">` +
    `<input id="f-search" type="search" placeholder="search query text, id or stub" value="${esc(state.search)}">` +
    `<select id="f-subset">${options(subsets, state.subset, "every subset")}</select>` +
    `<select id="f-side">${options(sides, state.side, "every model")}</select>` +
    `<select id="f-run">${options(runs, state.run, "every run")}</select>` +
    `<select id="f-outcome">${options(Object.entries(OUTCOME), state.outcome, "every outcome")}</select>` +
    `<select id="f-flag">${options(Object.entries(FLAGS), state.flag, "any flags")}</select>` +
    `<label>gold <select id="f-gold">${GOLDS.map((g, i) => `<option value="${i}"${state.gold === i ? " selected" : ""}>${g}</option>`).join("")}</select></label>` +
    `<label>sort <select id="f-sort">${[["diff-desc", "recall difference PtR−RtP, largest first"], ["diff-asc", "recall difference, smallest first"], ["query", "subset and query id"]]
      .map(([v, t]) => `<option value="${v}"${state.sort === v ? " selected" : ""}>${t}</option>`).join("")}</select></label>` +
    `</div><p id="count"></p><div class="pager"><button id="p-prev">◀ previous</button><span id="p-info"></span>` +
    `<button id="p-next">next ▶</button><label>rows per page <select id="p-size">${PAGE_SIZES.map((n) =>
      `<option value="${n}"${String(state.pageSize) === String(n) ? " selected" : ""}>${n}</option>`).join("")}</select></label></div>` +
    `<table class="rows explorer"><thead><tr><th>subset</th><th>id</th><th>query</th><th>model</th><th>run</th>` +
    `<th>RtP R@k</th><th>PtR R@k</th><th>Δ</th><th>outcome</th><th>flags</th></tr></thead><tbody id="rows"></tbody></table>`;
}

// The list shows one page of rows: a filter over thousands of records then only swaps a page in the DOM
// (laying out, or dropping, thousands of table rows is what takes a browser long). "all" shows every row.
const PAGE_SIZES = [50, 100, 200, 500, "all"];

function rowHtml([r, i]) {
  const g = state.gold;
  const q = D.queries[r.q];
  const d = diffOf(r, g);
  return `<tr data-href="${qhref(r.q, i)}" class="o-${r.outcome[g]}"><td>${esc(q.subset)}</td><td>${esc(q.id)}</td>` +
    `<td class="qtext">${esc(q.text.length > 140 ? q.text.slice(0, 140) + "…" : q.text)}</td><td>${esc(side(r.side).label)}</td>` +
    `<td>${r.run}</td><td>${num(r.recall.rtp[g])}</td><td>${num(r.recall.ptr[g])}</td><td>${d === null ? "–" : (d > 0 ? "+" : "") + d.toFixed(3)}</td>` +
    `<td>${OUTCOME[r.outcome[g]]}</td><td>${r.flags.map((f) => `<span class="flag">${FLAGS[f] || f}</span>`).join("")}</td></tr>`;
}

function renderRows() {
  const rows = filtered();
  const nq = new Set(rows.map(([r]) => r.q)).size;
  document.getElementById("count").textContent =
    `${rows.length} of ${D.records.length} records match (${nq} of ${D.queries.length} queries${PARTS ? ` of part ${part + 1}` : ""}); recall at each run's k, gold ${GOLDS[state.gold]}`;
  const size = state.pageSize === "all" ? Math.max(rows.length, 1) : Number(state.pageSize);
  const pages = Math.max(1, Math.ceil(rows.length / size));
  state.page = Math.min(state.page, pages - 1);
  const from = state.page * size;
  document.getElementById("rows").innerHTML = rows.slice(from, from + size).map(rowHtml).join("");
  document.getElementById("p-info").textContent =
    rows.length ? `rows ${from + 1}–${Math.min(from + size, rows.length)} of ${rows.length}` : "no row";
  document.getElementById("p-prev").disabled = state.page === 0;
  document.getElementById("p-next").disabled = state.page >= pages - 1;
}

function bindExplorer() {
  const ids = {"f-subset": "subset", "f-side": "side", "f-run": "run", "f-outcome": "outcome", "f-flag": "flag", "f-sort": "sort"};
  for (const [id, key] of Object.entries(ids)) {
    document.getElementById(id).addEventListener("change", (e) => { state[key] = e.target.value; state.page = 0; renderRows(); });
  }
  if (PARTS) document.getElementById("f-part").addEventListener("change", (e) => { state.page = 0; location.hash = `queries&p=${e.target.value}`; });
  document.getElementById("f-gold").addEventListener("change", (e) => { state.gold = Number(e.target.value); renderRows(); });
  document.getElementById("p-size").addEventListener("change", (e) => { state.pageSize = e.target.value; state.page = 0; renderRows(); });
  document.getElementById("p-prev").addEventListener("click", () => { state.page -= 1; renderRows(); });
  document.getElementById("p-next").addEventListener("click", () => { state.page += 1; renderRows(); });
  let timer = null;
  document.getElementById("f-search").addEventListener("input", (e) => {
    clearTimeout(timer);
    timer = setTimeout(() => { state.search = e.target.value.trim(); state.page = 0; renderRows(); }, 120);
  });
  document.querySelector("table.explorer").addEventListener("click", (e) => {
    const tr = e.target.closest("tr[data-href]");
    if (tr) location.hash = tr.dataset.href;
  });
  renderRows();
}

// ------------------------------------------------------------------ query page

function topList(entry, gsets, k, extra) {
  const [ids, scores] = list(entry);
  if (!ids.length) return "<p>Nothing retrieved.</p>";
  return `<table class="top"><thead><tr><th>#</th><th>API</th><th>score</th><th>gold</th>${extra ? "<th>found by stub</th>" : ""}</tr></thead><tbody>` +
    ids.map((id, i) => `<tr class="${i === k - 1 ? "cut" : ""}${i >= k ? " beyond" : ""}"><td>${i + 1}</td><td class="api">${esc(api(id))}</td>` +
      `<td>${num(scores[i])}</td><td>${goldBadges(id, gsets)}</td>${extra ? `<td>${extra(id, scores[i])}</td>` : ""}</tr>`).join("") + "</tbody></table>";
}

function planBlock(plan, gsets, offeredTop) {
  if (!plan) return "<p>No planner call (retrieval only, or the architecture was not run).</p>";
  const offered = new Set(plan.off ?? offeredTop);
  const status = [];
  if (plan.le) status.push(`LLM error (${plan.lek || "error"}): ${plan.le}`);
  if (plan.pe) status.push(`parse error: ${plan.pe}`);
  if (plan.refused) status.push("refusal: the planner chose no API");
  status.push(`finish reason: ${plan.fr ?? "–"}`);
  const sel = plan.sel.length ? `<ul class="sel">${plan.sel.map((s) => {
    const tag = offered.has(s) ? `<span class="tag ok">offered</span>` : `<span class="tag bad">not offered (made up)</span>`;
    return `<li><span class="api">${esc(api(s))}</span> ${tag}${goldBadges(s, gsets)}</li>`;
  }).join("")}</ul>` : "<p>Nothing selected.</p>";
  return `<p class="status">${status.map(esc).join(" · ")}</p><h5>Steps</h5>` +
    (plan.steps.length ? `<ol>${plan.steps.map((s) => `<li>${esc(s)}</li>`).join("")}</ol>` : "<p>No steps.</p>") +
    `<h5>Selected APIs</h5>${sel}${auditBlock(plan.audit)}`;
}

function auditBlock(audit) {
  if (!audit) return "";
  const rows = Object.entries(audit).filter(([k]) => k !== "names").map(([k, v]) => [k, typeof v === "string" ? v : JSON.stringify(v)]);
  const names = (audit.names || []).map((n) => Array.isArray(n) ? n.map((x) => (x === null ? "–" : String(x))) : [JSON.stringify(n)]);
  return `<h5>Parse rule</h5>${table(["field", "rule"], rows, 'class="kv"')}` +
    (names.length ? table(["name in reply", "resolved to", "rule", "offered"], names, 'class="kv"') : "");
}

function tokensLine(tokens) {
  const parts = Object.entries(tokens || {}).map(([call, [p, c]]) => `${call}: ${p} in / ${c} out`);
  return `<p class="tokens">Tokens — ${parts.length ? esc(parts.join("; ")) : "none recorded"}</p>`;
}

function stubOf(ptr) {
  // For each API of the union: the stubs whose own top list holds it, with its rank there and the stub's score.
  const found = new Map();
  ptr.hits.forEach((h, s) => {
    const [ids, scores] = list(h);
    ids.forEach((id, rank) => {
      if (!found.has(id)) found.set(id, []);
      found.get(id).push([s, rank, scores[rank]]);
    });
  });
  return (id, score) => (found.get(id) || []).map(([s, rank, sc]) => {
    const best = sc !== undefined && score !== undefined && Math.abs(sc - score) < 1e-4;
    return `<span class="by${best ? " best" : ""}" title="${best ? "its max-sim score comes from this stub" : ""}">#${s + 1} ${esc(ptr.stubs[s]?.[0] ?? "")} (rank ${rank + 1})</span>`;
  }).join(" ") || "–";
}

// What a block says beyond its list: the architecture's failure on this query, its own calls that failed for good,
// a router's side, and its trace (a plugin's JSON, rewrite's query, fusion's inputs, route's score and τ).
function blockNotes(b) {
  const out = [];
  if (b.failure) out.push(`<p class="status bad">${esc(`failed (${b.failure[0]}): ${b.failure[1]}`)} — not scored, no planner call</p>`);
  if (b.errors) out.push(`<p class="status bad">${esc("own calls that failed for good: " + Object.entries(b.errors).map(([c, k]) => `${c} (${k})`).join(", "))} — not scored, no planner call</p>`);
  if (b.side) out.push(`<p class="status">${esc(`routed to ${archName(b.side)}: its list, planner and tokens`)}</p>`);
  if (b.trace) out.push(`<details class="trace" open><summary>Trace</summary><pre class="trace">${esc(b.trace)}</pre></details>`);
  return out.join("");
}

function ptrBlock(p, gsets, k) {
  if (p.failure) return blockNotes(p);
  const status = [`discovery finish reason: ${p.dfr ?? "–"}`];
  if (p.dle) status.push(`discovery LLM error (${p.dlek || "error"}): ${p.dle} — PtR is excluded for this query`);
  if (p.dpe) status.push(`discovery parse error: ${p.dpe}`);
  if (p.fallback) status.push("no stub: the raw query was searched instead (fallback)");
  const stubs = p.stubs.length ? p.stubs.map(([name, reasoning, rule, copy], i) =>
    `<div class="stub"><h5>Stub #${i + 1}: <span class="api">${esc(name)}</span>${copy ? ' <span class="tag bad">copy of the prompt example</span>' : ""}</h5>` +
    `<p>${esc(reasoning)}</p><p class="note">parse rule: ${esc(rule || "–")}</p>` +
    (p.hits[i] !== undefined ? `<details${i < 3 ? " open" : ""}><summary>its own top hits</summary>${topList(p.hits[i], gsets, k)}</details>` : "") + "</div>").join("")
    : "<p>No stubs.</p>";
  const width = Object.entries(p.width || {}).map(([kk, w]) => `k=${kk}: ${w}`).join(", ");
  return blockNotes(p) + `<p class="status">${status.map(esc).join(" · ")}</p><h4>Stubs</h4><div class="stubs">${stubs}</div>` +
    `<h4>Re-ranked union (max-sim over stubs)</h4><p class="note">Search width |union of per-stub top-k|: ${esc(width || "–")}</p>` +
    topList(p.top, gsets, k, stubOf(p)) + `<h4>Planner</h4>${planBlock(p.plan, gsets, list(p.top)[0].slice(0, k))}${tokensLine(p.tokens)}`;
}

function runsTable(qi) {
  const rows = recsOf(qi);
  const prev = new Map();
  const body = rows.map(([r, i]) => {
    const stubs = r.ptr ? r.ptr.stubs.map((s) => s[0]).join(", ") : "–";
    const psel = r.ptr?.plan ? r.ptr.plan.sel.map(api).join(", ") || "(none)" : "–";
    const rsel = r.rtp?.plan ? r.rtp.plan.sel.map(api).join(", ") || "(none)" : "–";
    const cells = [num(r.recall.rtp[0]), num(r.recall.ptr[0]), num(r.recall.ptr[1]), OUTCOME[r.outcome[0]], stubs, psel, rsel];
    const before = prev.get(r.side);
    prev.set(r.side, cells);
    return `<tr data-href="${qhref(qi, i)}"><td>${esc(side(r.side).label)}</td><td>${r.run}</td>` +
      cells.map((c, j) => `<td class="${before && before[j] !== c ? "changed" : ""}">${esc(c)}</td>`).join("") + "</tr>";
  }).join("");
  return `<table class="runs"><thead><tr><th>model</th><th>run</th><th>RtP R@k (${GOLDS[0]})</th><th>PtR R@k (${GOLDS[0]})</th>` +
    `<th>PtR R@k (${GOLDS[1]})</th><th>outcome</th><th>stubs</th><th>PtR selected</th><th>RtP selected</th></tr></thead><tbody>${body}</tbody></table>` +
    `<p class="note">Highlighted: changed since the previous run of the same model.</p>`;
}

function queryPage(qi, ri) {
  const q = D.queries[qi];
  if (!q) return "<p>No such query.</p>";
  const recs = recsOf(qi);
  const [r, idx] = recs.find(([, i]) => i === ri) || recs[0];
  const gsets = goldSets(q);
  const d = ds(r);
  const k = d.k;
  const grade = (i, j) => (q.grades ? ` <span class="tag">grade ${q.grades[i][j]}</span>` : "");
  const gold = GOLDS.map((g, i) => `<div><h4>Gold ${g}</h4><ul>${q.gold[i].map((id, j) => `<li class="api">${esc(api(id))}${grade(i, j)}</li>`).join("") || "<li>none</li>"}</ul></div>`).join("");
  const picker = recs.map(([x, i]) => `<a class="pick${i === idx ? " on" : ""}" href="${qhref(qi, i)}">${esc(side(x.side).label)} · run ${x.run}</a>`).join("");
  const rtp = r.rtp ? anyBlock(r.rtp, gsets, k) : "<p>Not run.</p>";
  const ptr = r.ptr ? ptrBlock(r.ptr, gsets, k) : "<p>Not run (retrieval only).</p>";
  return `<p><a href="#${PARTS ? `queries&p=${part}` : "queries"}">← all queries</a></p><h2>${esc(q.subset)} · query ${esc(q.id)}</h2>` +
    `<blockquote class="query">${esc(q.text)}</blockquote><div class="golds">${gold}</div>` +
    `<h3>Across runs</h3>${runsTable(qi)}<h3>Record</h3><div class="picker">${picker}</div>` +
    `<p class="status">R@${k}: RtP ${GOLDS.map((g, i) => `${g} ${num(r.recall.rtp[i])}`).join(", ")}; PtR ${GOLDS.map((g, i) => `${g} ${num(r.recall.ptr[i])}`).join(", ")}` +
    extraArchs(r).map((a) => `; ${esc(archName(a))} ${GOLDS.map((g, i) => `${g} ${num((r.recall[a] || [])[i])}`).join(", ")}`).join("") + ` · ` +
    `${r.flags.length ? "flags: " + r.flags.map((f) => FLAGS[f] || f).join(", ") : "no flags"}</p>` +
    `<p class="status">${rankLine(r, k)}</p>` +
    `<div class="archs"><section class="arch" id="rtp"><h3>RtP (retrieve, then plan)</h3>${rtp}</section>` +
    `<section class="arch" id="ptr"><h3>PtR (plan, then retrieve)</h3>${ptr}</section>` +
    extraArchs(r).map((a) => `<section class="arch" id="arch-${esc(a)}" data-arch="${esc(a)}"><h3>${esc(archName(a))}</h3>${anyBlock(blockOf(r, a), gsets, k)}</section>`).join("") +
    `</div>` +
    `<h3>Raw replies, latency, cache</h3><p class="note">${esc(d.raw_replies)} Latency and cache hits are recorded per model, not per call: see the accounting on the overview.</p>`;
}

// ------------------------------------------------------------------ comparison

function compare() {
  const C = D.compare;
  const labels = D.sides.map((s) => s.label || "retrieval only");
  const differ = C.differ.length ? table(["setting", ...labels], C.differ, 'class="kv"') : "<p>No setting differs.</p>";
  const g = state.cmpGold;
  const pairs = C.pairs.map((p, pi) => {
    const A = labels[p.a], B = labels[p.b];
    const restrict = p.only_a || p.only_b
      ? `<p class="restrict">Restricted to the ${p.shared} queries both have: ${p.only_a} only in ${esc(A)}, ${p.only_b} only in ${esc(B)} — left out of this comparison.</p>`
      : `<p class="note">Both have the same ${p.shared} queries.</p>`;
    const ks = p.k[0] === p.k[1] ? `Values at k = ${p.k[0]}.` : `Values at each run's own k: A ${p.k[0]}, B ${p.k[1]}.`;
    const metrics = table(["subset", "arch", "metric", "gold", "n", A, B, "Δ (B−A)", "p (Wilcoxon)"], p.metrics.map((m) =>
      [m.subset, m.arch, m.metric, m.gold ?? "–", m.n, num(m.a), num(m.b), (m.delta > 0 ? "+" : "") + num(m.delta), m.p === null ? "–" : `${m.p < 0.001 ? "<0.001" : m.p.toFixed(3)} ${m.stars}`]), 'class="num"');
    const inThis = PARTS ? `<p class="note">Flipped queries and per-query deltas: those of part ${part + 1} of ${PARTS.length} ` +
      `(choose the part on the Queries tab); the metric deltas cover every query.</p>` : "";
    const flips = p.queries.filter((x) => x.a.outcome[g] !== x.b.outcome[g]);
    const row = (x) => {
      const q = D.queries[x.q];
      const dp = x.a.ptr[g] === null || x.b.ptr[g] === null ? null : x.b.ptr[g] - x.a.ptr[g];
      return `<tr data-href="${qhref(x.q)}"><td>${esc(q.subset)}</td><td>${esc(q.id)}</td><td class="qtext">${esc(q.text.slice(0, 120))}</td>` +
        `<td>${OUTCOME[x.a.outcome[g]]}</td><td>${OUTCOME[x.b.outcome[g]]}</td><td>${num(x.a.ptr[g])}</td><td>${num(x.b.ptr[g])}</td>` +
        `<td>${dp === null ? "–" : (dp > 0 ? "+" : "") + dp.toFixed(3)}</td></tr>`;
    };
    const head = `<thead><tr><th>subset</th><th>id</th><th>query</th><th>outcome ${esc(A)}</th><th>outcome ${esc(B)}</th><th>PtR R@k ${esc(A)}</th><th>PtR R@k ${esc(B)}</th><th>Δ PtR</th></tr></thead>`;
    const sorted = [...p.queries].sort((x, y) => Math.abs((y.b.ptr[g] ?? 0) - (y.a.ptr[g] ?? 0)) - Math.abs((x.b.ptr[g] ?? 0) - (x.a.ptr[g] ?? 0)));
    return `<section class="pair"><h3>${esc(A)} (A) vs ${esc(B)} (B)</h3>${restrict}${inThis}<h4>Flipped queries (${flips.length})</h4><p class="note">The run-averaged outcome at k (gold ${GOLDS[g]}) changed between A and B. ${ks}</p>` +
      (flips.length ? `<table class="rows flipped" id="flipped-${pi}">${head}<tbody>${flips.map(row).join("")}</tbody></table>` : "<p>No query flipped.</p>") +
      `<h4>Metric deltas (run-averaged per query, paired Wilcoxon)</h4>${metrics}` +
      `<h4>Per-query deltas (largest |Δ PtR| first)</h4><table class="rows deltas">${head}<tbody>${sorted.map(row).join("")}</tbody></table></section>`;
  }).join("");
  return `<h2>Comparison</h2><label>gold <select id="c-gold">${GOLDS.map((x, i) => `<option value="${i}"${g === i ? " selected" : ""}>${x}</option>`).join("")}</select></label>` +
    `<h3>Settings that differ</h3>${differ}${pairs}`;
}

function bindCompare() {
  document.getElementById("c-gold").addEventListener("change", (e) => { state.cmpGold = Number(e.target.value); route(); });
  for (const t of document.querySelectorAll("table.rows")) {
    t.addEventListener("click", (e) => {
      const tr = e.target.closest("tr[data-href]");
      if (tr) location.hash = tr.dataset.href;
    });
  }
}

// queryPage's run table rows link to records as well
app.addEventListener("click", (e) => {
  const tr = e.target.closest("table.runs tr[data-href]");
  if (tr) location.hash = tr.dataset.href;
});
window.addEventListener("hashchange", route);
route();
window.viewReadyMs = performance.now();  // read by bench/view.py: script start to first view in the DOM
document.body.dataset.ready = "1";

// NDCG@k, MRR@k and COMP@k of every architecture, first gold set (the report's Table 1c definitions).
function rankLine(r, k) {
  if (!r.rank) return "";
  const part = (a) => ["ndcg", "mrr", "comp"].map((m) => `${m.toUpperCase()}@${k} ${num(r.rank[a][m][0])}`).join(", ");
  return `${GOLDS[0]}: RtP ${part("rtp")}; PtR ${part("ptr")}` +
    (r.archs || []).filter((a) => a !== "rtp" && a !== "ptr" && r.rank[a]).map((a) => `; ${esc(archName(a))} ${part(a)}`).join("");
}

// ------------------------------------------------------------------ architectures: every one of a query, any two compared

// The architectures of a record beyond RtP and PtR (their sections follow RtP's and PtR's on the query page).
function extraArchs(r) { return (r.archs || []).filter((a) => a !== "rtp" && a !== "ptr"); }

// Any architecture's block: a stub-keeping one (PtR's shape) as PtR's, else its ranked list, planner and tokens.
function anyBlock(b, gsets, k) {
  if (!b) return "<p>Not run.</p>";
  if (b.stubs) return ptrBlock(b, gsets, k);
  if (b.failure) return blockNotes(b);
  return blockNotes(b) + `<h4>Top ${list(b.top)[0].length} retrieved (k = ${k} marked)</h4>${topList(b.top, gsets, k)}` +
    `<h4>Planner</h4>${planBlock(b.plan, gsets, list(b.top)[0].slice(0, k))}${tokensLine(b.tokens)}`;
}

// Run-averaged recall at k of architecture a per (side, query) on gold g, from the records shown.
function archMeans(a, g) {
  const acc = new Map();
  for (const r of D.records) {
    const v = (r.recall[a] || [])[g];
    if (v === null || v === undefined) continue;
    const key = `${r.side}|${r.q}`;
    if (!acc.has(key)) acc.set(key, {side: r.side, q: r.q, sum: 0, n: 0});
    const e = acc.get(key);
    e.sum += v; e.n += 1;
  }
  return new Map([...acc].map(([key, e]) => [key, {side: e.side, q: e.q, v: e.sum / e.n}]));
}

function archCompare() {
  const A = state.archA ?? ARCHS[0], B = state.archB ?? ARCHS[1];
  const g = state.archGold;
  const pick = (id, cur) => `<select id="${id}">${ARCHS.map((a) => `<option value="${esc(a)}"${a === cur ? " selected" : ""}>${esc(archName(a))}</option>`).join("")}</select>`;
  const sides = D.sides.map((s, i) => [i, s.label || "retrieval only"]);
  const head = `<h2>Architectures</h2><p class="note">Every architecture of a query is shown side by side on its page; ` +
    `here any two are compared: pick A and B.</p><div class="abpick"><label>A ${pick("x-a", A)}</label><label>B ${pick("x-b", B)}</label>` +
    `<label>gold <select id="x-gold">${GOLDS.map((x, i) => `<option value="${i}"${g === i ? " selected" : ""}>${x}</option>`).join("")}</select></label>` +
    `<label>model <select id="x-side">${options(sides, state.archSide, "every model")}</select></label></div>`;
  if (A === B) return head + "<p>Pick two different architectures.</p>";
  // the paired tests of the analysis (analysis.compare): Wilcoxon per pair, Holm within a subset and metric
  const tests = [];
  D.datasets.forEach((d) => (d.arch_tests || []).forEach((t) => {
    const same = t.a === A && t.b === B, swapped = t.a === B && t.b === A;
    if ((same || swapped) && (t.gold === null || t.gold === GOLDS[g])) {
      tests.push([d.name, t.model ?? "–", t.subset, t.metric, t.gold ?? "–", t.n, t.p === null ? "–" : (t.p < 0.001 ? "<0.001" : t.p.toFixed(3)),
                  t.p_holm === null ? "–" : `${t.p_holm < 0.001 ? "<0.001" : t.p_holm.toFixed(3)} ${t.stars}`]);
    }
  }));
  const fried = [];
  D.datasets.forEach((d) => (d.friedman || []).forEach((f) => {
    if (f.gold === null || f.gold === GOLDS[g]) {
      fried.push([d.name, f.model ?? "–", f.subset, f.metric, f.gold ?? "–", f.archs.map(archName).join(", "), f.n,
                  f.statistic === null ? "–" : f.statistic.toFixed(2), f.p === null ? "–" : `${f.p < 0.001 ? "<0.001" : f.p.toFixed(3)} ${f.stars}`]);
    }
  }));
  const testTable = tests.length ? table(["run", "model", "subset", "metric", "gold", "n", "p (Wilcoxon)", "p (Holm)"], tests, 'class="num" id="x-tests"')
    : "<p>No paired test of these two in summary.json.</p>";
  const friedTable = fried.length ? `<h3>All architectures at once (Friedman)</h3>` +
    table(["run", "model", "subset", "metric", "gold", "architectures", "n", "χ²", "p"], fried, 'class="num" id="x-friedman"') : "";
  const ma = archMeans(A, g), mb = archMeans(B, g);
  const rows = [...ma.keys()].filter((key) => mb.has(key)).map((key) => ({...ma.get(key), a: ma.get(key).v, b: mb.get(key).v}))
    .filter((x) => state.archSide === "" || x.side === Number(state.archSide));
  const outcome = (x) => (x.b > x.a ? "b" : x.a > x.b ? "a" : x.a === 0 ? "miss" : "tie");
  const words = {a: `${archName(A)} wins`, b: `${archName(B)} wins`, tie: "tie", miss: "both miss"};
  const count = {a: 0, b: 0, tie: 0, miss: 0};
  rows.forEach((x) => { count[outcome(x)] += 1; });
  rows.sort((x, y) => Math.abs(y.b - y.a) - Math.abs(x.b - x.a) || x.q - y.q);
  const mean = (k) => (rows.length ? rows.reduce((s, x) => s + x[k], 0) / rows.length : null);
  const inPartNote = PARTS ? `<p class="note">Per-query values: the records of part ${part + 1} of ${PARTS.length}; the tests cover every query.</p>` : "";
  const body = rows.map((x) => {
    const q = D.queries[x.q], d = x.b - x.a, o = outcome(x);
    return `<tr data-href="${qhref(x.q)}" class="o-${o}"><td>${esc(q.subset)}</td><td>${esc(q.id)}</td><td class="qtext">${esc(q.text.slice(0, 120))}</td>` +
      `<td>${esc(side(x.side).label)}</td><td>${num(x.a)}</td><td>${num(x.b)}</td><td>${(d > 0 ? "+" : "") + d.toFixed(3)}</td><td class="outcome">${words[o]}</td></tr>`;
  }).join("");
  return head + `<h3>${esc(archName(A))} (A) vs ${esc(archName(B))} (B): paired tests</h3>` +
    `<p class="note">Paired Wilcoxon on run-averaged per-query values at each run's k; p (Holm): adjusted over every pair of the run's architectures within a subset and metric (analysis.compare).</p>${testTable}${friedTable}` +
    `<h3>Per query: recall at k, gold ${GOLDS[g]} (run-averaged)</h3>${inPartNote}<p id="x-count">${rows.length} queries; mean A ${num(mean("a"))}, mean B ${num(mean("b"))}; ` +
    `${words.a} ${count.a}, ${words.b} ${count.b}, ties ${count.tie}, both miss ${count.miss}</p>` +
    `<table class="rows" id="x-rows"><thead><tr><th>subset</th><th>id</th><th>query</th><th>model</th><th>R@k ${esc(archName(A))}</th><th>R@k ${esc(archName(B))}</th><th>Δ (B−A)</th><th>outcome</th></tr></thead><tbody>${body}</tbody></table>`;
}

function bindArchCompare() {
  const set = (id, key, conv = (v) => v) => document.getElementById(id)?.addEventListener("change", (e) => { state[key] = conv(e.target.value); route(); });
  set("x-a", "archA"); set("x-b", "archB"); set("x-gold", "archGold", Number); set("x-side", "archSide");
  document.getElementById("x-rows")?.addEventListener("click", (e) => {
    const tr = e.target.closest("tr[data-href]");
    if (tr) location.hash = tr.dataset.href;
  });
}
