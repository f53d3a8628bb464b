"""`view.html`: one self-contained page to browse a study's queries, or several studies side by side.

`page()` is handed the runs' saved values and the viewer's assets and returns the HTML text: the data as one
inline JSON (API ids and repeated top lists stored once in tables, records pointing into them), the viewer's
plain JS and CSS (`view_assets/`, read by `app.viewer`) inline, the figures as base64 PNG. No network reference:
it opens from disk. Per-query numbers come from `analysis.metrics.record_obs` (the report's own definitions);
the comparison of runs and of architectures from `analysis.compare`. Reading the folder, writing the page and
serving it are `app.viewer`'s and `cli.view_server`'s: this module computes nothing of its own and reads no file.

Raw LLM replies are not in `queries.jsonl`; they live in the LLM response cache, keyed by the whole request.
The viewer does not read that cache: rebuilding each request's key needs the registry and the prompts, and a
shared cache may hold other runs or have been cleared. The page says where they are instead.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import PurePath
from typing import Any

import numpy as np
import orjson

from evaluator.analysis import compare
from evaluator.analysis.metric_defs import RANK_METRICS, RETRIEVAL_METRICS, Metric
from evaluator.analysis.metrics import Obs, record_obs
from evaluator.analysis.stats import Row, Summary, Test
from evaluator.core.errors import OutputError
from evaluator.render.fmt import DASH, fnum, format_p, mean_pm
from evaluator.results.cost import usd
from evaluator.results.schema import (
    GOLDS,
    SUMMARY_FILE,
    ArchBlock,
    Meta,
    PtrBlock,
    Record,
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
    records: Sequence[Record]  # a list, or a stream over queries.jsonl (results.stream.SavedRecords)
    summary: Summary | None = None  # summary.json's rows and tests (None: not written yet)
    study_view: Mapping[str, Any] = field(default_factory=dict)  # summary.json's `meta`: what the numbers depend on
    figures: dict[str, bytes] = field(default_factory=dict)  # file name -> PNG bytes
    # The run's architectures compared (analysis.compare): what the page's A-vs-B panel shows beside the records.
    comparison: compare.Comparison | None = None

    @functools.cached_property
    def facts(self) -> Facts:
        """What the page states of the records, from one pass over them (a stream is not read again for each)."""
        models: set[str | None] = set()
        archs: dict[str, None] = {}
        per_query: Counter[compare.QueryKey] = Counter()
        for r in self.records:
            models.add(r.model)
            archs.update(dict.fromkeys(r.arch_names))
            per_query[compare.query_key(r)] += 1
        return Facts(sorted(models, key=lambda m: m or ""), list(archs), per_query)


@dataclass(frozen=True)
class Facts:
    models: list[str | None]  # sorted, None (retrieval only) first
    archs: list[str]  # in the order the records hold them
    per_query: Counter[compare.QueryKey]  # records per query

    @property
    def records(self) -> int:
        return sum(self.per_query.values())


@dataclass(frozen=True)
class Assets:
    """The viewer's own script and style sheet (`view_assets/`), inlined into every page."""

    js: str
    css: str


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


# The query page shows a block's trace as indented JSON, cut here (a plugin's trace is at most 16 KiB compact).
TRACE_SHOWN_CHARS = 20_000


def trace_text(trace: Mapping[str, Any] | None) -> str | None:
    """A block's trace (rewrite's query, fusion's inputs, route's score and τ, a plugin's JSON) as the query page
    shows it: indented JSON, keys sorted, cut at TRACE_SHOWN_CHARS with a note of how much was left out."""
    if trace is None:
        return None
    text = json.dumps(trace, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    if len(text) <= TRACE_SHOWN_CHARS:
        return text
    return text[:TRACE_SHOWN_CHARS] + f"\n... ({len(text) - TRACE_SHOWN_CHARS:,} more characters in queries.jsonl)"


def _block_view(b: ArchBlock, api: _Interner, lists: _Interner) -> dict[str, Any]:
    """Any architecture's block: its ranked list, planner and tokens; stubs and their hits where it keeps them;
    its trace, its own calls that failed for good, its failure and a router's side, where it has them."""
    out: dict[str, Any] = {"top": lists((tuple(api(x) for x in b.retrieved), _r4(b.scores))),
                           "plan": _plan(b.plan, api), "tokens": _tokens(b), "excluded": b.excluded}
    if b.trace is not None:
        out["trace"] = trace_text(b.trace)
    if b.errors:
        out["errors"] = dict(sorted(b.errors.items()))
    if b.failure is not None:
        out["failure"] = [b.failure.kind, b.failure.error]
    if b.side is not None:
        out["side"] = b.side
    if isinstance(b, PtrBlock):
        out |= {"stubs": [[s.name, s.reasoning, s.rule, s.example_copy] for s in b.stubs],
                "hits": [lists((tuple(api(x) for x in h), _r4(b.stub_scores[i] if i < len(b.stub_scores) else [])))
                         for i, h in enumerate(b.stub_hits)],
                "dpe": b.discovery_parse_error, "dle": b.discovery_llm_error, "dlek": b.discovery_llm_error_kind,
                "dfr": b.discovery_finish_reason, "fallback": b.fallback, "excluded": b.excluded,
                "width": {str(kk): w for kk, w in sorted(b.width.items())}}
    return out


def _record_view(r: Record, obs: Obs, k: int, query: int, side: int, api: _Interner,
                 lists: _Interner) -> dict[str, Any]:
    names = r.arch_names
    every = list(dict.fromkeys(["rtp", "ptr", *names]))  # RtP and PtR keys always (null when not run)
    recall = {a: [obs[(a, Metric.RECALL, k, g)][0] if (a, Metric.RECALL, k, g) in obs else None for g in GOLDS]
              for a in every}
    # NDCG / MRR / COMP at the main k, per architecture and gold (the report's definitions, metrics.rank_metrics);
    # the page's data names each metric by its saved name (a plain str: orjson takes no other key)
    rank = {a: {m.value: [_f(obs[(a, m, k, g)][0]) if (a, m, k, g) in obs else None for g in GOLDS]
                for m in RANK_METRICS} for a in every}
    passed = {a: obs[(a, Metric.PASS, k, None)][0] if (a, Metric.PASS, k, None) in obs else None for a in names}
    out: dict[str, Any] = {"q": query, "side": side, "run": r.run, "archs": names, Metric.RECALL.value: recall,
                           "rank": rank, Metric.PASS.value: passed,
                           "outcome": [_outcome(recall["rtp"][i], recall["ptr"][i]) for i in range(len(GOLDS))]}
    blocks = [b for a in names if (b := r.arch(a)) is not None]
    plans = [b.plan for b in blocks if b.plan is not None]
    flags = []
    if any(b.truncated_replies() for b in blocks):
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
    if r.failed_blocks:
        flags.append("failed")
    out["flags"] = flags
    for a in names:
        if (b := r.arch(a)) is not None:
            if a in ("rtp", "ptr"):
                out[a] = _block_view(b, api, lists)
            else:
                out.setdefault("blocks", {})[a] = _block_view(b, api, lists)
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
            ["Records", f"{src.facts.records:,}"], ["Evaluator version", m.version],
            ["Created", m.runtime.created or DASH], ["Data", m.data_dir or DASH]]
    return rows


def _ms(row: Row | None) -> str:
    return DASH if row is None else mean_pm(row.mean, row.std)


def _p(t: Test | None) -> str:
    if t is None or t.pvalue is None:
        return DASH
    return f"{format_p(t.pvalue)} {t.stars or ''}".strip()


def _tables(src: Source) -> list[dict[str, Any]]:
    """Table 1 (recall at k) and Table 3 (main results, with the report's significance marks) from summary.json."""
    summary = src.summary
    if not summary:
        return []
    meta, k = src.meta, src.meta.k
    subsets = summary.subsets
    models: list[str | None] = [*summary.models] or [None]
    more = [a for a in src.facts.archs if a not in ("rtp", "ptr")]
    out = []
    for model in models:
        for gold in GOLDS:
            # RtP (its retrieval: one deterministic row, model null), PtR, then any other architecture of the study
            archs = [("rtp", None, "RtP")] + ([("ptr", model, "PtR")] + [(a, model, a) for a in more] if model else [])
            head = ["k"] + [f"{s} {name}" for s in subsets for _, _, name in archs]
            body = [[str(kk)] + [_ms(summary.row(m_, s, a, Metric.RECALL, kk, gold)) for s in subsets
                                 for a, m_, _ in archs]
                    for kk in meta.ks]
            out.append({"title": f"Table 1: recall at retrieval budget k — model {model or 'none'}, gold {gold}",
                        "head": head, "rows": body})
            head = ["Subset", "k"] + [f"{m.spec.label} {name}" for m in RANK_METRICS for _, _, name in archs]
            body = [[s, str(kk)] + [_ms(summary.row(m_, s, a, metric, kk, gold)) for metric in RANK_METRICS
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
                for metric in (Metric.PASS, Metric.PRECISION, Metric.RECALL):
                    g = gold if metric.spec.gold else None
                    retrieval = metric in RETRIEVAL_METRICS  # RtP's value deterministic (model null), one-sample t-test
                    ttest = "ttest_1samp" if retrieval else "ttest_ind"
                    rtp = summary.row(None if retrieval else model, s, "rtp", metric, k, g)
                    ptr = summary.row(model, s, "ptr", metric, k, g)
                    wins = ""
                    if metric is Metric.RECALL:
                        w = [summary.row(model, s, a, m_, k, gold) for a, m_ in
                             (("rtp", Metric.WINS), ("ptr", Metric.WINS), ("both", Metric.TIES))]
                        wins = " / ".join(DASH if x is None else f"{x.mean or 0:.0f}" for x in w)
                    body.append([f"{s} (n={n})" if n else s, metric, _ms(rtp), _ms(ptr),
                                 _p(summary.test(model, s, metric, k, g, ttest)),
                                 _p(summary.test(model, s, metric, k, g, "wilcoxon")), wins or DASH])
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
    view = dict(src.study_view)
    view.pop("models", None)
    view.pop("simulated", None)
    prof = next((x for x in src.meta.models if x.name == model), None)
    if prof is not None:
        view["model"] = {"name": prof.name, "model": prof.model, "simulated": prof.simulated,
                         "profile": prof.profile.flat() if prof.profile is not None else {}}  # as meta.json saves it
    return _flat(view)


def _avg_outcome(pq: Mapping[compare.SideKey, Mapping[compare.QueryKey, Fraction]], qi: compare.QueryKey,
                 gold: str) -> str:
    rtp, ptr = pq.get(("rtp", Metric.RECALL, gold), {}).get(qi), pq.get(("ptr", Metric.RECALL, gold), {}).get(qi)
    return _outcome(None if rtp is None else float(rtp), None if ptr is None else float(ptr))


def _compare(sides: list[dict[str, Any]], runs: compare.RunsComparison | None, sources: Sequence[Source],
             qindex: Mapping[compare.QueryKey, int]) -> dict[str, Any] | None:
    """Every other side against the first (`analysis.compare.runs`): settings that differ, shared queries, metric
    deltas with their paired Wilcoxon test, and per-query values of the queries shown here (`qindex`: a query's
    key -> its index on the page or part; flipped = the run-averaged outcome at the main k changed)."""
    if runs is None:
        return None
    settings = [_side_settings(sources[s["ds"]], s["model"]) for s in sides]
    keys = sorted(set().union(*settings))
    differ = [[key] + [settings[i].get(key, DASH) for i in range(len(sides))]
              for key in keys if len({st.get(key) for st in settings}) > 1]
    pairs = []
    for p in runs.pairs:
        per_query = []
        for key in p.shared:
            if (q := qindex.get(key)) is None:
                continue
            row: dict[str, Any] = {"q": q}
            for name, vals in (("a", runs.values[p.a]), ("b", runs.values[p.b])):
                row[name] = {"rtp": [_f(vals.get(("rtp", Metric.RECALL, g), {}).get(key)) for g in GOLDS],
                             "ptr": [_f(vals.get(("ptr", Metric.RECALL, g), {}).get(key)) for g in GOLDS],
                             "outcome": [_avg_outcome(vals, key, g) for g in GOLDS]}
            per_query.append(row)
        pairs.append({"a": p.a, "b": p.b, "k": list(p.k), "shared": len(p.shared), "only_a": p.only_a,
                      "only_b": p.only_b, "metrics": [dataclasses.asdict(m) for m in p.metrics], "queries": per_query})
    return {"differ": differ, "pairs": pairs}


def _f(x: Fraction | float | None) -> float | None:
    return None if x is None else round(float(x), 6)


def sides(sources: Sequence[Source]) -> list[dict[str, Any]]:
    """One side per (output folder, model), in the order the records sort them: every part of a paged page
    indexes the same list."""
    sides: list[dict[str, Any]] = []
    for ds, src in enumerate(sources):
        for model in src.facts.models:
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
        "archs": src.facts.archs, **_arch_tests(src.comparison),
    }


def datasets(sources: Sequence[Source]) -> list[dict[str, Any]]:
    """The page data's `datasets`: each output folder's name, settings, tables, accounting, warnings and figures
    (what changes from one run of a study to the next; the records' data does not)."""
    return [_dataset(s) for s in sources]


def _arch_tests(c: compare.Comparison | None) -> dict[str, Any]:
    """The A-vs-B panel's tests: every pair's Wilcoxon (Holm-adjusted) and Friedman across all, per model,
    subset, metric and gold (`analysis.compare.architectures`)."""
    if c is None:
        return {"arch_tests": [], "friedman": []}
    return {"arch_tests": [{"model": p.model, "subset": p.subset, "metric": p.metric, "gold": p.gold, "a": p.a,
                            "b": p.b, "n": p.n, "p": p.pvalue, "p_holm": p.p_holm, "stars": p.stars}
                           for p in c.pairs],
            "friedman": [{"model": f.model, "subset": f.subset, "metric": f.metric, "gold": f.gold,
                          "archs": f.archs, "n": f.n, "statistic": f.statistic, "p": f.pvalue, "stars": f.stars}
                         for f in c.friedman]}


def _shape_records(sources: Sequence[Source], sides: list[dict[str, Any]],
                   runs: compare.RunsComparison | None) -> dict[str, Any]:
    """Id tables, queries, records (each record's page data) and the comparison of runs over these queries."""
    api, lists = _Interner(), _Interner()
    queries: list[dict[str, Any]] = []
    qindex: dict[compare.QueryKey, int] = {}
    side_index = {(s["ds"], s["model"]): i for i, s in enumerate(sides)}
    records: list[dict[str, Any]] = []
    for ds, src in enumerate(sources):
        k = src.meta.k
        for r in sorted(src.records, key=lambda r: (r.subset, qid_key(r.query_id), r.model or "", r.run)):
            key = compare.query_key(r)
            if (qi := qindex.get(key)) is None:
                qi = qindex[key] = len(queries)
                queries.append({"subset": r.subset, "id": r.query_id, "text": r.query,
                                "gold": [[api(x) for x in r.gold_set(g)] for g in GOLDS]})
                if r.grades:  # graded gold (a BEIR folder's qrels): each gold API's grade, beside its id
                    queries[-1]["grades"] = [[r.grade(x) for x in r.gold_set(g)] for g in GOLDS]
            records.append(_record_view(r, record_obs(r, ks=[k], k=k), k, qi, side_index[(ds, r.model)], api, lists))
    return {"apis": api.items, "lists": lists.items, "queries": queries, "records": records,
            "compare": _compare(sides, runs, sources, qindex)}


def shape(sources: Sequence[Source], runs: compare.RunsComparison | None = None) -> dict[str, Any]:
    """The page's data: id tables, queries, records and the comparison of runs (`runs`, from
    `analysis.compare.runs` over `sides(sources)`; none with one side)."""
    sides_ = sides(sources)
    data = _shape_records(sources, sides_, runs)
    if not data["records"]:
        raise OutputError(f"{sources[0].name if sources else 'view'}: queries.jsonl holds no record; "
                          "rerun the study.")
    return {"golds": list(GOLDS), "sides": sides_, "datasets": [_dataset(s) for s in sources], **data}


def parts_folder(html_name: str) -> str:
    """The folder beside a page that holds its parts: `view.html` -> `view-data/`."""
    return f"{PurePath(html_name).stem}-data"


def part_plan(sources: Sequence[Source], part_records: int) -> dict[compare.QueryKey, int]:
    """Each query's part: whole queries in key order, each part about `part_records` records (every source's
    records of one query in the same part)."""
    per_query: Counter[compare.QueryKey] = Counter()
    for src in sources:
        per_query.update(src.facts.per_query)
    plan: dict[compare.QueryKey, int] = {}
    part = n = 0
    for key in sorted(per_query):
        plan[key] = part
        n += per_query[key]
        if n >= part_records:
            part, n = part + 1, 0
    return plan


Split = Callable[[Sequence[Source], dict[compare.QueryKey, int]], Iterator[list[Source]]]


def split_in_memory(sources: Sequence[Source], plan: dict[compare.QueryKey, int]) -> Iterator[list[Source]]:
    """The parts of `part_plan`, each a copy of every source holding its records of the part's queries."""
    parts = max(plan.values(), default=-1) + 1
    buckets: list[list[list[Record]]] = [[[] for _ in sources] for _ in range(parts)]
    for ds, src in enumerate(sources):
        for r in src.records:
            buckets[plan[compare.query_key(r)]][ds].append(r)
    for bucket in buckets:
        yield [dataclasses.replace(src, records=bucket[i], figures={}) for i, src in enumerate(sources)]


def paged(sources: Sequence[Source], html_name: str, emit: Callable[[str, str], None],
          runs: compare.RunsComparison | None = None, part_records: int = PART_RECORDS,
          split: Split = split_in_memory) -> dict[str, Any]:
    """The page's data; its side files go to `emit(name under the parts folder, text)` one by one, so only one
    part's page data is in memory at a time. Everything inline when the records fit one part, else the
    overview, the comparison's metrics and a list of parts inline and each part's records in `part-NNNN.js`.
    `split`: how the parts' records are gathered (`app.viewer` gathers a stream's on disk)."""
    total = sum(s.facts.records for s in sources)
    if total <= part_records:
        return shape(sources, runs)
    sides_ = sides(sources)
    cmp = _compare(sides_, runs, sources, {})  # the metrics over every query; per-query deltas come with each part
    folder = parts_folder(html_name)
    index = []
    for n, part in enumerate(split(sources, part_plan(sources, part_records))):
        data = _shape_records(part, sides_, runs)
        part_cmp = data.pop("compare")
        data["compare_queries"] = [p["queries"] for p in part_cmp["pairs"]] if part_cmp else []
        name = f"part-{n + 1:04d}.js"
        # a classic script, not fetch(): a page opened from file:// may load scripts beside it, not fetch them
        emit(name, f"window.viewPart({n}, {_script_json(data)});\n")
        first, last = data["queries"][0], data["queries"][-1]
        index.append({"file": f"{folder}/{name}", "records": len(data["records"]), "queries": len(data["queries"]),
                      "first": [first["subset"], first["id"]], "last": [last["subset"], last["id"]]})
    n_queries = len(set().union(*(src.facts.per_query for src in sources)))
    return ({"golds": list(GOLDS), "sides": sides_, "datasets": [_dataset(s) for s in sources], "apis": [],
             "lists": [], "queries": [], "records": [], "compare": cmp, "parts": index,
             "total_records": total, "total_queries": n_queries})


# ---------------------------------------------------------------- the page


def _script_json(data: Any) -> str:
    # Inside <script>, "</script" or "<!--" would change how the page is parsed; every "<" is in a JSON string,
    # where "\u003c" is the same character.
    return orjson.dumps(data).decode("utf-8").replace("<", "\\u003c")


def page(sources: Sequence[Source], assets: Assets, runs: compare.RunsComparison | None = None,
         title: str | None = None) -> str:
    """The whole `view.html` text, everything inline."""
    return html(sources, shape(sources, runs), assets, title)


def pages(sources: Sequence[Source], html_name: str, assets: Assets, runs: compare.RunsComparison | None = None,
          title: str | None = None, part_records: int = PART_RECORDS) -> tuple[str, dict[str, str]]:
    """The page's text and its side files (`paged`), named under `parts_folder(html_name)`, in memory."""
    files: dict[str, str] = {}
    data = paged(sources, html_name, files.__setitem__, runs, part_records)
    return html(sources, data, assets, title), files


def html(sources: Sequence[Source], data: dict[str, Any], assets: Assets, title: str | None = None) -> str:
    """The page around its data (`shape` or `paged`): the viewer's style and script inline."""
    title = title or ("Runs compared: " + ", ".join(s.name for s in sources) if len(sources) > 1
                      else f"Run {sources[0].name}")
    esc = title.replace("&", "&amp;").replace("<", "&lt;")
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            # no icon request: a served page would log a 404 for /favicon.ico in the console
            f"<link rel=\"icon\" href=\"data:,\"><title>{esc}</title>"
            f"<style>{assets.css}</style></head>\n<body><div id=\"app\"></div>\n"
            f"<script type=\"application/json\" id=\"data\">{_script_json(data)}</script>\n"
            f"<script type=\"module\">{assets.js}</script>\n</body></html>\n")
