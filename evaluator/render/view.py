"""`view.html`: one self-contained page to browse a run's queries, or several runs side by side.

`page()` is handed the runs' saved values and returns the HTML text: the data as one inline JSON (API ids and
repeated top lists stored once in tables, records pointing into them), the viewer's plain JS and CSS from
`view_assets/` inline, the figures as base64 PNG. No network reference: it opens from disk. Per-query numbers
come from `analysis.metrics.record_obs` (the report's own definitions); the comparison's paired test is
`analysis.stats.wilcoxon_paired`. `source()` gathers one output folder's values through `OutputDir`.

Raw LLM replies are not in `queries.jsonl`; they live in the LLM response cache, keyed by the whole request.
The viewer does not read that cache: rebuilding each request's key needs the registry and the prompts, and a
shared cache may hold other runs or have been cleared. The page says where they are instead.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import re
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path, PurePath
from typing import Any

import numpy as np
import orjson

from evaluator.analysis.metrics import RANK_METRICS, Obs, record_obs
from evaluator.analysis.stats import exact, stars, wilcoxon_paired
from evaluator.render.fmt import DASH, fnum, format_p, mean_pm
from evaluator.results.cost import usd
from evaluator.results.schema import (
    GOLDS,
    SUMMARY_FILE,
    Meta,
    OutputDir,
    OutputError,
    Record,
    atomic_write,
    plain,
    qid_key,
)

VIEW_FILE = "view.html"
# A page with more records than this keeps them in side files of at most about this many records each (whole
# queries: a query's records across runs and models stay together), loaded one at a time by the page; below
# it, the page holds everything inline as before. A record is ~1.8 KB of page data (178 MB for 100k records,
# issue 31), so a part is ~9 MB: a browser parses it in well under a second, and view.html itself holds only
# the overview and the list of parts, whatever the number of queries.
PART_RECORDS = 5_000
# Metrics of the comparison's paired test: (arch, metric, gold or None), all at the run's main k.
COMPARED = (("ptr", "recall", "api_list"), ("ptr", "recall", "relevant"), ("rtp", "recall", "api_list"),
            ("rtp", "recall", "relevant"), ("ptr", "precision", "api_list"), ("rtp", "precision", "api_list"),
            ("ptr", "pass", None), ("rtp", "pass", None))
# Outcome codes of one record at the main k (per gold): which architecture recalled more.
PTR_WINS, RTP_WINS, TIE, BOTH_MISS, NO_PAIR = "ptr", "rtp", "tie", "miss", "na"
RAW_REPLIES = ("Raw replies are not stored in queries.jsonl: they live in the LLM response cache ({cache}), "
               "keyed by the whole request. The viewer does not read that cache; the parse rule of each field "
               "(parse_audit) is shown instead.")


@dataclass
class Source:
    """One output folder's saved values."""

    name: str
    meta: Meta
    records: list[Record]
    summary: Mapping[str, Any] | None = None  # summary.json as `migrate.summary` returns it (the page reads it as JSON)
    figures: dict[str, bytes] = field(default_factory=dict)  # file name -> PNG bytes


def source(od: OutputDir, name: str | None = None, *, meta: Meta | None = None,
           records: list[Record] | None = None, summary: Mapping[str, Any] | None = None,
           figures: Sequence[str] | None = None) -> Source:
    """One output folder's values (the ones already read or just drawn may be passed in; `figures`: the
    names a render drew, so a stale PNG left in the folder is not shown)."""
    od.require()
    saved = meta is None or records is None
    meta = meta if meta is not None else od.read_meta()
    records = records if records is not None else od.read_records()
    if saved:
        od.check_agree(meta, records)  # another run's meta.json is not shown over these records
    summary = summary if summary is not None else od.read_json(SUMMARY_FILE)
    return Source(name or od.path.name or str(od.path), meta, records, summary, od.read_figures(figures))


def write(od: OutputDir, meta: Meta, records: list[Record], figures: Sequence[str] | None,
          part_records: int = PART_RECORDS) -> None:
    """`OUT/view.html` of one output folder (the hook at the end of `report` and of a run), with its parts."""
    write_paged(od.path / VIEW_FILE, [source(od, meta=meta, records=records, figures=figures)],
                part_records=part_records)


def write_page(folders: Sequence[OutputDir], out: Path | None = None,
               part_records: int = PART_RECORDS) -> tuple[Path, str]:
    """The `view` command: one folder's `view.html`, or a comparison page at `out`. Returns its path and text."""
    names = [od.path.name or str(od.path) for od in folders]
    # two folders of the same name (a/out, b/out) are told apart by the path as given
    names = [str(od.path) if names.count(n) > 1 else n for od, n in zip(folders, names, strict=True)]
    html = folders[0].path / VIEW_FILE if out is None else out
    return html, write_paged(html, [source(od, n) for od, n in zip(folders, names, strict=True)],
                             part_records=part_records)


class _PageHandler(BaseHTTPRequestHandler):
    page: bytes = b""
    parts: Path | None = None  # the page's parts folder (a paged page loads them)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        # Only the page and its own parts: serving its folder would expose every other file in it.
        path = self.path.split("?")[0]
        body, kind = self.page, "text/html; charset=utf-8"
        if path not in ("/", "/" + VIEW_FILE):
            parts = self.parts
            part = parts / path.rsplit("/", 1)[-1] if parts is not None else None
            if (parts is not None and part is not None and part.is_file()
                    and re.fullmatch(rf"/{re.escape(parts.name)}/part-\d{{4}}\.js", path) is not None):
                body, kind = part.read_bytes(), "text/javascript; charset=utf-8"
            else:
                body, kind = b"not found", "text/plain"
        self.send_response(200 if kind != "text/plain" else 404)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # the command prints the address once; no line per request


def server(html: str, port: int = 0, page_path: Path | None = None) -> ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1 for one page and its parts (`view --serve`); the caller runs `serve_forever`."""
    parts = page_path.parent / parts_folder(page_path.name) if page_path is not None else None
    handler = type("Handler", (_PageHandler,), {"page": html.encode("utf-8"), "parts": parts})
    return ThreadingHTTPServer(("127.0.0.1", port), handler)


# ---------------------------------------------------------------- shaping


class _Interner:
    """A table of values stored once; records hold indices into it."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.index: dict[Any, int] = {}

    def __call__(self, value: Any) -> int:
        i = self.index.get(value)
        if i is None:
            i = self.index[value] = len(self.items)
            self.items.append(value)
        return i


def _r4(xs: Sequence[float]) -> tuple[float, ...]:
    # four decimals tell scores apart on screen; six would add a third to the page's size
    return tuple(np.round(np.asarray(xs, dtype=float), 4).tolist())


def _plan(plan: Any, api: _Interner) -> dict[str, Any] | None:
    if plan is None:
        return None
    return {"steps": list(plan.steps), "sel": [api(x) for x in plan.selected if x is not None],
            "off": None if plan.selected_offered is None else [api(x) for x in plan.selected_offered],
            "refused": plan.refused, "pe": plan.parse_error, "le": plan.llm_error, "lek": plan.llm_error_kind,
            "fr": plan.finish_reason, "audit": None if plan.parse_audit is None else plain(plan.parse_audit)}


def _tokens(block: Any) -> dict[str, list[int]]:
    return {call: [t.prompt, t.completion] for call, t in sorted(block.tokens.items())}


def _outcome(rtp: float | None, ptr: float | None) -> str:
    if rtp is None or ptr is None:
        return NO_PAIR
    if ptr > rtp:
        return PTR_WINS
    if rtp > ptr:
        return RTP_WINS
    return BOTH_MISS if rtp == 0 else TIE


def _record_view(r: Record, obs: Obs, k: int, query: int, side: int, api: _Interner,
                 lists: _Interner) -> dict[str, Any]:
    recall = {a: [obs[(a, "recall", k, g)][0] if (a, "recall", k, g) in obs else None for g in GOLDS]
              for a in ("rtp", "ptr")}
    # NDCG / MRR / COMP at the main k, per architecture and gold (the report's definitions, metrics.rank_metrics)
    rank = {a: {m: [_f(obs[(a, m, k, g)][0]) if (a, m, k, g) in obs else None for g in GOLDS] for m in RANK_METRICS}
            for a in ("rtp", "ptr")}
    out: dict[str, Any] = {"q": query, "side": side, "run": r.run, "recall": recall, "rank": rank,
                           "outcome": [_outcome(recall["rtp"][i], recall["ptr"][i]) for i in range(len(GOLDS))]}
    plans = [b.plan for b in (r.rtp, r.ptr) if b is not None and b.plan is not None]
    flags = []
    if any(b.truncated_replies() for b in (r.rtp, r.ptr) if b is not None):
        flags.append("truncated")
    if any(p.parse_error for p in plans) or (r.ptr is not None and r.ptr.discovery_parse_error):
        flags.append("parse_error")
    if r.failed_calls:
        flags.append("llm_error")
    if any(p.refused for p in plans):
        flags.append("refused")
    if r.ptr is not None and r.ptr.fallback:
        flags.append("fallback")
    if r.ptr is not None and r.ptr.excluded:
        flags.append("excluded")
    out["flags"] = flags
    if r.rtp is not None:
        out["rtp"] = {"top": lists((tuple(api(x) for x in r.rtp.retrieved), _r4(r.rtp.scores))),
                      "plan": _plan(r.rtp.plan, api), "tokens": _tokens(r.rtp)}
    if (p := r.ptr) is not None:
        out["ptr"] = {
            "top": lists((tuple(api(x) for x in p.retrieved), _r4(p.scores))),
            "stubs": [[s.name, s.reasoning, s.rule, s.example_copy] for s in p.stubs],
            "hits": [lists((tuple(api(x) for x in h), _r4(p.stub_scores[i] if i < len(p.stub_scores) else [])))
                     for i, h in enumerate(p.stub_hits)],
            "dpe": p.discovery_parse_error, "dle": p.discovery_llm_error, "dlek": p.discovery_llm_error_kind,
            "dfr": p.discovery_finish_reason, "fallback": p.fallback, "excluded": p.excluded,
            "width": {str(kk): w for kk, w in sorted(p.width.items())},
            "plan": _plan(p.plan, api), "tokens": _tokens(p)}
    return out


def _settings(src: Source) -> list[list[str]]:
    m = src.meta
    models = ", ".join(f"{x.name} ({x.model}{', simulated' if x.simulated else ''})" for x in m.models)
    s = m.settings
    rows = [["Models", models or "none (retrieval only)"],
            ["Embedder", f"{m.embedder} ({m.precision}, runtime {m.backend})"],
            ["Retriever", s.retrieval.retriever],
            ["Embedding runtime", m.runtime.embed_runtime or DASH],
            ["Registry", f"{m.registry.size if m.registry.size is not None else '?'} APIs, choice {m.registry.choice}"
             + (f", {m.registry.format}" if m.registry.format else "") + (f" ({m.registry.source})"
                                                                          if m.registry.source else "")],
            ["Gold sets", ", ".join(GOLDS)],
            ["Subsets", ", ".join(f"{k} (n={v})" for k, v in sorted(m.subsets.items()))],
            ["Runs", str(m.runs)], ["k (planner)", str(m.k)], ["k-ablation", ", ".join(map(str, m.ks))],
            ["Architectures", ", ".join(s.run.archs)],
            ["Records", f"{len(src.records):,}"], ["Evaluator version", m.version],
            ["Created", m.runtime.created or DASH], ["Data", m.data_dir or DASH]]
    return rows


def _rows_by(summary: Mapping[str, Any]) -> tuple[dict[tuple, dict], dict[tuple, dict]]:
    rows = {(r.get("model"), r["subset"], r["arch"], r["metric"], r.get("k"), r.get("gold")): r
            for r in summary.get("rows") or []}
    tests = {(t.get("model"), t["subset"], t["metric"], t.get("k"), t.get("gold"), t["test"]): t
             for t in summary.get("tests") or []}
    return rows, tests


def _ms(row: Mapping[str, Any] | None) -> str:
    return DASH if row is None else mean_pm(row.get("mean"), row.get("std"))


def _p(t: Mapping[str, Any] | None) -> str:
    if t is None or t.get("pvalue") is None:
        return DASH
    return f"{format_p(t['pvalue'])} {t.get('stars') or ''}".strip()


def _tables(src: Source) -> list[dict[str, Any]]:
    """Table 1 (recall at k) and Table 3 (main results, with the report's significance marks) from summary.json."""
    if not src.summary:
        return []
    rows, tests = _rows_by(src.summary)
    meta, k = src.meta, src.meta.k
    subsets = sorted({key[1] for key in rows})
    models = sorted({key[0] for key in rows if key[0] is not None}) or [None]
    out = []
    for model in models:
        for gold in GOLDS:
            head = ["k"] + [f"{s} {a}" for s in subsets for a in ("RtP", "PtR")]
            body = [[str(kk)] + [_ms(rows.get((m_, s, a, "recall", kk, gold)))
                                 for s in subsets for a, m_ in (("rtp", None), ("ptr", model))]
                    for kk in meta.ks]
            out.append({"title": f"Table 1: recall at retrieval budget k — model {model or 'none'}, gold {gold}",
                        "head": head, "rows": body})
            archs = (("rtp", None, "RtP"), ("ptr", model, "PtR")) if model else (("rtp", None, "RtP"),)
            head = ["Subset", "k"] + [f"{m.upper()} {name}" for m in RANK_METRICS for _, _, name in archs]
            body = [[s, str(kk)] + [_ms(rows.get((m_, s, a, metric, kk, gold))) for metric in RANK_METRICS
                                    for a, m_, _ in archs]
                    for s in subsets for kk in meta.ks]
            out.append({"title": f"Table 1c: NDCG, MRR, COMP at retrieval budget k — model {model or 'none'}, "
                                 f"gold {gold}", "head": head, "rows": body,
                        "note": "Binary relevance; as in report.md (Table 1c)."})
        if model is None:
            continue
        for gold in GOLDS:
            body = []
            for s in subsets:
                n = meta.subsets.get(s)
                for metric, g, ttest in (("pass", None, "ttest_ind"), ("precision", gold, "ttest_1samp"),
                                         ("recall", gold, "ttest_1samp")):
                    rtp = rows.get((model if metric == "pass" else None, s, "rtp", metric, k, g))
                    ptr = rows.get((model, s, "ptr", metric, k, g))
                    wins = ""
                    if metric == "recall":
                        w = [rows.get((model, s, a, m_, k, gold)) for a, m_ in
                             (("rtp", "wins"), ("ptr", "wins"), ("both", "ties"))]
                        wins = " / ".join(DASH if x is None else f"{x.get('mean', 0):.0f}" for x in w)
                    body.append([f"{s} (n={n})" if n else s, metric, _ms(rtp), _ms(ptr),
                                 _p(tests.get((model, s, metric, k, g, ttest))),
                                 _p(tests.get((model, s, metric, k, g, "wilcoxon"))), wins or DASH])
            out.append({"title": f"Table 3: main results at k = {k} — model {model}, gold {gold}",
                        "head": ["Subset", "Metric", "RtP", "PtR", "p (t-test)", "p (Wilcoxon)",
                                 "wins RtP / PtR / ties"], "rows": body,
                        "note": "Marks: * p<.05, ** p<.01, *** p<.001 (as in report.md)."})
    return out


def _accounting(meta: Meta) -> dict[str, Any]:
    calls = []
    for model, st in sorted(meta.llm_stats.items()):
        lat = st.latency_s
        calls.append([model, st.calls, st.requests, st.cache_hits, st.http_429, st.retries, st.timeouts,
                      ", ".join(f"{n} {k}" for k, n in sorted(st.failed.items())) or "0",
                      st.truncated, f"{st.prompt_tokens:,} / {st.completion_tokens:,}",
                      f"{fnum(lat.p50, 2)} / {fnum(lat.p90, 2)}"])
    cost = []
    for model, c in sorted(meta.cost.items()):
        cost.append([model, _usd(c.online.usd), _usd(c.batch.usd), _usd(c.total_usd), _usd(c.all_online_usd)])
    return {"calls": {"head": ["model", "calls", "requests", "cache hits", "429s", "retries", "timeouts", "failed",
                               "truncated", "tokens in / out", "latency p50 / p90 (s)"], "rows": calls},
            "cost": {"head": ["model", "online USD", "batch USD", "total USD", "same tokens all online"],
                     "rows": cost}}


def _usd(x: Any) -> str:
    return usd(None if x is None else float(x), DASH)


def _warnings(src: Source) -> list[str]:
    m = src.meta
    out = [f"{k}: {plain(v)}" for k, v in sorted(m.warnings.items())]
    out += [f"{k} not run: {v}" for k, v in sorted(m.analysis_notes.items())]
    if m.simulated_models or any(x.name == "sim" for x in m.models):
        names = sorted(set(m.simulated_models) | {x.name for x in m.models if x.name == "sim"})
        out.insert(0, f"SIMULATED LLM ({', '.join(names)}): its numbers measure the pipeline, not a language model.")
    if not src.summary:
        out.append(f"{SUMMARY_FILE} is missing: `python -m evaluator report OUT` writes it (and the tables).")
    return out


def _flat(d: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(d, Mapping):
        out: dict[str, str] = {}
        for k, v in d.items():
            out |= _flat(v, f"{prefix}{k}.")
        return out
    return {prefix.rstrip("."): d if isinstance(d, str) else json.dumps(d, sort_keys=True, default=str)}


def _side_settings(src: Source, model: str | None) -> dict[str, str]:
    """What a side's numbers depend on: summary.json's study view of its run and its model's profile."""
    view = dict((src.summary or {}).get("meta") or {})
    view.pop("models", None)
    view.pop("simulated", None)
    prof = next((x for x in src.meta.models if x.name == model), None)
    if prof is not None:
        view["model"] = {"name": prof.name, "model": prof.model, "simulated": prof.simulated,
                         "profile": plain(prof.profile) if prof.profile is not None else {}}
    return _flat(view)


def _query_means(values: Mapping[int, list[float]]) -> dict[int, Fraction]:
    return {q: sum((exact(x) for x in v), Fraction(0)) / len(v) for q, v in values.items() if v}


def _per_query(recs: Sequence[tuple[Obs, int]], k: int) -> dict[tuple, dict[int, Fraction]]:
    """Run-averaged per-query value of each compared metric of one side."""
    vals: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for obs, qi in recs:
        for arch, metric, gold in COMPARED:
            if (o := obs.get((arch, metric, k, gold))) is not None:
                vals[(arch, metric, gold)][qi].append(o[0] / o[1])
    return {key: _query_means(v) for key, v in vals.items()}


def _avg_outcome(pq: Mapping[tuple, Mapping[int, Fraction]], qi: int, gold: str) -> str:
    rtp, ptr = pq.get(("rtp", "recall", gold), {}).get(qi), pq.get(("ptr", "recall", gold), {}).get(qi)
    return _outcome(None if rtp is None else float(rtp), None if ptr is None else float(ptr))


def _compare(sides: list[dict[str, Any]], side_recs: list[list[tuple[Obs, int]]], sources: Sequence[Source],
             queries: list[dict[str, Any]], *, whole: bool = True) -> dict[str, Any] | None:
    """Every other side against the first: settings that differ, shared queries, metric deltas with a paired
    Wilcoxon test, and per-query deltas (flipped = the run-averaged outcome at the main k changed)."""
    if len(sides) < 2:
        return None
    settings = [_side_settings(sources[s["ds"]], s["model"]) for s in sides]
    keys = sorted(set().union(*settings))
    differ = [[key] + [settings[i].get(key, DASH) for i in range(len(sides))]
              for key in keys if len({st.get(key) for st in settings}) > 1]
    ks = [sources[s["ds"]].meta.k for s in sides]
    pq = [_per_query(recs, k) for recs, k in zip(side_recs, ks, strict=True)]
    qsets = [{qi for _, qi in recs} for recs in side_recs]
    pairs = []
    for j in range(1, len(sides)):
        shared = sorted(qsets[0] & qsets[j], key=lambda q: (queries[q]["subset"], qid_key(queries[q]["id"])))
        only_a, only_b = len(qsets[0] - qsets[j]), len(qsets[j] - qsets[0])
        metrics = []
        for subset in [None, *sorted({queries[q]["subset"] for q in shared})]:
            qs = [q for q in shared if subset is None or queries[q]["subset"] == subset]
            for key in COMPARED:
                a, b = pq[0].get(key, {}), pq[j].get(key, {})
                common = [q for q in qs if q in a and q in b]
                if not common:
                    continue
                x, y = [a[q] for q in common], [b[q] for q in common]
                ma, mb = float(sum(x) / len(x)), float(sum(y) / len(y))
                _, p = wilcoxon_paired(x, y)
                p_ = None if math.isnan(p) else p
                metrics.append({"subset": subset or "all", "arch": key[0], "metric": key[1], "gold": key[2],
                                "n": len(common), "a": round(ma, 6), "b": round(mb, 6), "delta": round(mb - ma, 6),
                                "p": p_, "stars": stars(p_)})
        per_query = []
        for q in shared:
            row: dict[str, Any] = {"q": q}
            for name, i in (("a", 0), ("b", j)):
                row[name] = {"rtp": [_f(pq[i].get(("rtp", "recall", g), {}).get(q)) for g in GOLDS],
                             "ptr": [_f(pq[i].get(("ptr", "recall", g), {}).get(q)) for g in GOLDS],
                             "outcome": [_avg_outcome(pq[i], q, g) for g in GOLDS]}
            per_query.append(row)
        pairs.append({"a": 0, "b": j, "k": [ks[0], ks[j]], "shared": len(shared), "only_a": only_a, "only_b": only_b,
                      "metrics": metrics, "queries": per_query})
    if whole and not any(p["shared"] for p in pairs):
        names = " and ".join(s["label"] for s in sides)
        raise OutputError(f"{names} have no query in common (same subset and query id); "
                          "compare runs of the same query files.")
    return {"differ": differ, "pairs": pairs}


def _f(x: Fraction | float | None) -> float | None:
    return None if x is None else round(float(x), 6)


def _sides(sources: Sequence[Source]) -> list[dict[str, Any]]:
    """One side per (output folder, model), in the order the records sort them: every part of a paged page
    indexes the same list."""
    sides: list[dict[str, Any]] = []
    for ds, src in enumerate(sources):
        for model in sorted({r.model for r in src.records}, key=lambda m: m or ""):
            label = src.name if model is None else (f"{src.name} · {model}" if len(sources) > 1 else model)
            sides.append({"ds": ds, "model": model, "label": label})
    return sides


def _dataset(src: Source) -> dict[str, Any]:
    cache = src.meta.settings.run.cache_dir or "the run's --cache-dir"
    return {
        "name": src.name, "k": src.meta.k, "ks": list(src.meta.ks), "runs": src.meta.runs,
        "settings": _settings(src), "tables": _tables(src), "accounting": _accounting(src.meta),
        "warnings": _warnings(src), "raw_replies": RAW_REPLIES.format(cache=f"{cache}/llm"),
        "figures": [{"name": n, "png": base64.b64encode(b).decode("ascii")} for n, b in src.figures.items()],
    }


def _shape_records(sources: Sequence[Source], sides: list[dict[str, Any]], *, views: bool = True,
                   whole: bool = True) -> dict[str, Any]:
    """Id tables, queries, records (`views`: each record's page data too) and the comparison of these records.
    `whole`: they are all the records (a part of a paged page may share no query between two runs)."""
    api, lists = _Interner(), _Interner()
    queries: list[dict[str, Any]] = []
    qindex: dict[tuple, int] = {}
    side_index = {(s["ds"], s["model"]): i for i, s in enumerate(sides)}
    records: list[dict[str, Any]] = []
    side_recs: list[list[tuple[Obs, int]]] = [[] for _ in sides]
    for ds, src in enumerate(sources):
        k = src.meta.k
        for r in sorted(src.records, key=lambda r: (r.subset, qid_key(r.query_id), r.model or "", r.run)):
            key = (r.subset, qid_key(r.query_id))
            if (qi := qindex.get(key)) is None:
                qi = qindex[key] = len(queries)
                if views:
                    queries.append({"subset": r.subset, "id": r.query_id, "text": r.query,
                                    "gold": [[api(x) for x in r.gold_set(g)] for g in GOLDS]})
                else:
                    queries.append({"subset": r.subset, "id": r.query_id})
            si = side_index[(ds, r.model)]
            obs = record_obs(r, ks=[k], k=k)
            if len(sides) > 1:
                side_recs[si].append((obs, qi))
            if views:
                records.append(_record_view(r, obs, k, qi, si, api, lists))
    return {"apis": api.items, "lists": lists.items, "queries": queries, "records": records,
            "compare": _compare(sides, side_recs, sources, queries, whole=whole)}


def shape(sources: Sequence[Source]) -> dict[str, Any]:
    """The page's data: id tables, queries, records and the comparison (pure: handed values, reads nothing)."""
    sides = _sides(sources)
    data = _shape_records(sources, sides)
    if not data["records"]:
        raise OutputError(f"{sources[0].name if sources else 'view'}: queries.jsonl holds no record; "
                          "rerun the study.")
    return {"golds": list(GOLDS), "sides": sides, "datasets": [_dataset(s) for s in sources], **data}



def parts_folder(html_name: str) -> str:
    """The folder beside a page that holds its parts: `view.html` -> `view-data/`."""
    return f"{PurePath(html_name).stem}-data"


def _split(sources: Sequence[Source], part_records: int) -> list[list[Source]]:
    """The records cut into parts of whole queries, each about `part_records` records (every source's records
    of one query in the same part)."""
    by_query: dict[tuple, list[tuple[int, Record]]] = defaultdict(list)
    for ds, src in enumerate(sources):
        for r in src.records:
            by_query[(r.subset, qid_key(r.query_id))].append((ds, r))
    parts: list[list[Source]] = []
    bucket: list[list[Record]] = [[] for _ in sources]
    n = 0
    for key in sorted(by_query):
        for ds, r in by_query[key]:
            bucket[ds].append(r)
        n += len(by_query[key])
        if n >= part_records:
            parts.append([dataclasses.replace(src, records=bucket[i], figures={}) for i, src in enumerate(sources)])
            bucket, n = [[] for _ in sources], 0
    if n:
        parts.append([dataclasses.replace(src, records=bucket[i], figures={}) for i, src in enumerate(sources)])
    return parts


def paged(sources: Sequence[Source], html_name: str, emit: Callable[[str, str], None],
          part_records: int = PART_RECORDS) -> dict[str, Any]:
    """The page's data; its side files go to `emit(name under the parts folder, text)` one by one, so only one
    part's page data is in memory at a time. Everything inline when the records fit one part, else the
    overview, the comparison's metrics and a list of parts inline and each part's records in `part-NNNN.js`."""
    total = sum(len(s.records) for s in sources)
    if total <= part_records:
        return shape(sources)
    sides = _sides(sources)
    whole = _shape_records(sources, sides, views=False)  # the comparison's metrics over every query
    compare = whole["compare"]
    if compare is not None:
        for pair in compare["pairs"]:
            pair["queries"] = []  # per-query deltas come with each part
    folder = parts_folder(html_name)
    index = []
    for n, part in enumerate(_split(sources, part_records)):
        data = _shape_records(part, sides, whole=False)
        part_cmp = data.pop("compare")
        data["compare_queries"] = [p["queries"] for p in part_cmp["pairs"]] if part_cmp else []
        name = f"part-{n + 1:04d}.js"
        # a classic script, not fetch(): a page opened from file:// may load scripts beside it, not fetch them
        emit(name, f"window.viewPart({n}, {_script_json(data)});\n")
        first, last = data["queries"][0], data["queries"][-1]
        index.append({"file": f"{folder}/{name}", "records": len(data["records"]), "queries": len(data["queries"]),
                      "first": [first["subset"], first["id"]], "last": [last["subset"], last["id"]]})
    return ({"golds": list(GOLDS), "sides": sides, "datasets": [_dataset(s) for s in sources], "apis": [],
             "lists": [], "queries": [], "records": [], "compare": compare, "parts": index,
             "total_records": total, "total_queries": len(whole["queries"])})


# ---------------------------------------------------------------- the page


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath("view_assets", name).read_text(encoding="utf-8")


def _script_json(data: Any) -> str:
    # Inside <script>, "</script" or "<!--" would change how the page is parsed; every "<" is in a JSON string,
    # where "\u003c" is the same character.
    return orjson.dumps(data).decode("utf-8").replace("<", "\\u003c")


def page(sources: Sequence[Source], title: str | None = None) -> str:
    """The whole `view.html` text, everything inline."""
    return _html(sources, shape(sources), title)


def pages(sources: Sequence[Source], html_name: str, title: str | None = None,
          part_records: int = PART_RECORDS) -> tuple[str, dict[str, str]]:
    """The page's text and its side files (`paged`), named under `parts_folder(html_name)`, in memory."""
    files: dict[str, str] = {}
    data = paged(sources, html_name, files.__setitem__, part_records)
    return _html(sources, data, title), files


def _html(sources: Sequence[Source], data: dict[str, Any], title: str | None) -> str:
    title = title or ("Runs compared: " + ", ".join(s.name for s in sources) if len(sources) > 1
                      else f"Run {sources[0].name}")
    esc = title.replace("&", "&amp;").replace("<", "&lt;")
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            # no icon request: a served page would log a 404 for /favicon.ico in the console
            f"<link rel=\"icon\" href=\"data:,\"><title>{esc}</title>"
            f"<style>{_asset('view.css')}</style></head>\n<body><div id=\"app\"></div>\n"
            f"<script type=\"application/json\" id=\"data\">{_script_json(data)}</script>\n"
            f"<script type=\"module\">{_asset('view.js')}</script>\n</body></html>\n")


def write_paged(html: Path, sources: Sequence[Source], title: str | None = None,
                part_records: int = PART_RECORDS) -> str:
    """A page and its parts, each file atomic and each part written as soon as it is made; the parts come
    first (the page names them), and parts of an earlier, larger page are removed, so the folder holds exactly
    what the page loads. Returns the page's text."""
    folder = html.parent / parts_folder(html.name)
    written: set[str] = set()

    def emit(name: str, body: str) -> None:
        atomic_write(folder / name, body)
        written.add(name)

    text = _html(sources, paged(sources, html.name, emit, part_records), title)
    if folder.is_dir():
        for old in folder.glob("part-*.js"):
            if old.name not in written:
                old.unlink()
        if not any(folder.iterdir()):
            folder.rmdir()
    atomic_write(html, text)
    return text
