"""Render an output directory: `meta.json` + `queries.jsonl` -> `summary.json`, `report.md`, figures.

`render(out_dir)` makes no LLM call and touches no network, so `python -m evaluator report OUT_DIR`
reproduces the outputs from saved data. meta.json keys read (all optional, also looked up under
`settings`): models (names or {name, model, simulated}), runs, k, ks, embedder, registry {size, choice}
(or registry_size / registry_choice), simulated (per-model flags win over a global bool), version,
warnings, llm_stats. summary.json copies meta without volatile keys (`runtime`, `llm_stats`, timings,
`settings.out`), so a cached rerun reproduces it byte for byte.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evaluator import metrics as M
from evaluator import stats as S
from evaluator.records import read_records

# meta keys that change between otherwise identical runs (cache hits, clocks) stay out of summary.json.
VOLATILE_META_KEYS = frozenset(
    {"llm_stats", "runtime", "started", "started_at", "finished", "finished_at", "timestamp", "created", "created_at",
     "elapsed", "elapsed_s", "wall_s", "duration_s", "timings", "out", "out_dir", "argv", "command", "host",
     "hostname", "pid"}
)

DECISIONS = [
    "Gold sets: every retrieval table is given for `api_list` (paper-comparable default) and then for "
    "`relevant`.",
    "Precision@k divides by the nominal k even when fewer than k APIs were retrieved (PtR with no stub).",
    "RtP retrieval is deterministic: computed once per query (rows with model = null, one value, no std); "
    "`checks.rtp_inconsistent_queries` in summary.json counts queries whose saved RtP lists differ "
    "between records.",
    "Across runs: mean and sample standard deviation (ddof = 1); with one run the std is empty.",
    "Pass rate: the plan selects at least one API. A planner reply that could not be parsed counts as "
    "no selection (a planner outcome); a call that failed for good after retries (`llm_error`) is an "
    "infrastructure outcome and is excluded from the planner metrics (counted under Errors). A discovery "
    "call that failed for good excludes that query from PtR retrieval, stub and planner metrics.",
    "Selection rate = |selected ∩ R| / |R| with R the k APIs shown to the planner (undefined, so excluded, "
    "when R is empty); fidelity = |selected ∩ R| / |selected|, excluded when nothing was selected. Both are "
    "means over queries.",
    "Jaccard of planner-selected sets: two empty selections are the same (empty) intended trajectory and "
    "score 1.0; the share of such queries is shown as 'both refused'.",
    "Complete miss: R ∩ G = ∅ at the main k. On a miss the planner 'used a wrong tool' if it selected "
    "anything and 'refused' if it selected nothing without a parse error.",
    "Match% and stub cosine are pooled over stubs (not averaged per query); a stub's match is its top-1 "
    "API being gold. Unique% = distinct stub names / all stub names per subset and run (names "
    "lower-cased and stripped), then averaged over runs.",
    "Budget-equivalent k (Table 5): the k of the ablation nearest to PtR's mean effective search width at "
    "the main k (ties to the smaller k).",
    "Win/loss counts and the Wilcoxon test use per-query values averaged over runs (RtP retrieval is one "
    "value); Wilcoxon `zero_method='wilcox'` drops tied queries, exact null distribution for up to 50 "
    "untied differences, tie-corrected normal approximation otherwise; p is '–' when no query differs.",
    "t-tests: one-sample (PtR per-run means vs the RtP value) for precision/recall, Student's two-sample "
    "for pass rate; with one run or zero run-to-run variance the p-value is undefined and shown as '–'.",
    "Significance: * p < .05, ** p < .01, *** p < .001, n.s. otherwise (as in the paper).",
    "Registry: 47,020 ToolBench APIs (the paper's 46,984 plus 36 renamed gold APIs, so every gold API "
    "exists); with `full`, an API without a description is embedded as `{tool_name}/{api_name}: `. "
    "Queries: G1/G2 are StableToolBench's solvable subsets (163/106 queries), not the paper's 200/200.",
    "Embedder: all-MiniLM-L6-v2 (384-d, bundled) by default, not the paper's gte-base (768-d, needs the "
    "model hub); any sentence-transformers model is a setting. Vectors are L2-normalised; search is exact "
    "inner product (faiss.IndexFlatIP), re-scored in float64 so results do not depend on how queries were "
    "batched; exact ties (APIs whose texts differ only in case embed identically) go to the higher "
    "registry row, as FAISS orders them.",
    "PtR: every stub is searched to the largest k of the ablation, so the re-ranked union's first k "
    "entries are exactly TopK_t max_s sim(s, d_t) at every k. A query whose discovery reply yields no "
    "stub retrieves nothing and gets no planner call (counted in Gen%), unless `fallback_to_query` is on.",
    "Prompts are this project's own (evaluator/prompts.py; the paper's verbatim prompts are not in the "
    "available text); their versions are part of the response-cache key. The planner sees the main-k "
    "retrieved APIs as `tool/api: description`; its selections are mapped back to registry ids by exact, "
    "normalised, then close (difflib >= 0.85) name matching; a name that matches nothing offered is "
    "looked up in the registry, else kept as written (it counts against fidelity).",
    "Sampling: temperature 0; the run index is sent as `seed` and is part of the cache key, so N runs are N "
    "samples (providers that ignore the seed still vary at temperature 0, as the paper observed).",
]


# ---------------------------------------------------------------- input


def _lookup(meta: Mapping[str, Any], *names: str) -> Any:
    settings = meta.get("settings") if isinstance(meta.get("settings"), Mapping) else {}
    for src in (meta, settings):
        for n in names:
            if src.get(n) is not None:
                return src[n]
    return None


@dataclass
class Info:
    """What the report header and figure titles need, resolved from meta.json and the records."""

    models: list[str]
    model_ids: dict[str, str]  # profile name -> provider model id, where meta says
    simulated: set[str]
    embedder: str
    registry_size: str
    registry_choice: str
    runs: str
    k: int
    ks: list[int]
    version: str


def _name(x: Any) -> str:
    if isinstance(x, Mapping):
        return str(x.get("name") or x.get("model") or x)
    return str(x)


def resolve_info(meta: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> Info:
    models_meta = _lookup(meta, "models") or []
    models = sorted({_name(m) for m in models_meta} | {str(r["model"]) for r in records if r.get("model")})
    simulated: set[str] = {_name(m) for m in models_meta if isinstance(m, Mapping) and m.get("simulated")}
    per_model = any(isinstance(m, Mapping) and "simulated" in m for m in models_meta)
    sim = _lookup(meta, "simulated")
    if isinstance(sim, Mapping):
        simulated |= {str(m) for m, v in sim.items() if v}
    elif isinstance(sim, list):
        simulated |= {str(m) for m in sim}
    elif sim is True and not per_model:  # a global flag only speaks for all models when nothing finer exists
        simulated |= set(models)
    model_ids = {_name(m): str(m["model"]) for m in models_meta
                 if isinstance(m, Mapping) and m.get("model") and m.get("model") != _name(m)}
    stats_meta = meta.get("llm_stats") if isinstance(meta.get("llm_stats"), Mapping) else {}
    simulated |= {str(m) for m, v in stats_meta.items() if isinstance(v, Mapping) and v.get("simulated")}
    simulated |= {m for m in models if m == "sim"}  # the bundled simulator is simulated whatever meta says
    registry = _lookup(meta, "registry")
    reg = registry if isinstance(registry, Mapping) else {}
    size = _lookup(meta, "registry_size") or reg.get("size") or reg.get("n") or "?"
    choice = _lookup(meta, "registry_choice") or reg.get("choice") or (registry if isinstance(registry, str) else "?")
    emb = _lookup(meta, "embedder", "embedder_name", "embedding_model")
    runs = _lookup(meta, "runs")
    if runs is None:
        runs = len({r.get("run") for r in records if r.get("model")}) or 1
    k = int(_lookup(meta, "k") or M.DEFAULT_K)
    ks = sorted({int(x) for x in (_lookup(meta, "ks") or M.DEFAULT_KS)} | {k})
    return Info(models=models, model_ids=model_ids, simulated=simulated & set(models) if models else simulated,
                embedder=_name(emb) if emb is not None else "?", registry_size=f"{size:,}" if isinstance(size, int)
                else str(size), registry_choice=str(choice), runs=str(runs), k=k, ks=ks,
                version=str(_lookup(meta, "evaluator_version", "version") or "?"))


# ---------------------------------------------------------------- formatting helpers


def fnum(x: float | None, digits: int = 3) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def fpct(x: float | None, digits: int = 1) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{100 * x:.{digits}f}%"


def fms(row: S.Row | None, digits: int = 3, pct: bool = False) -> str:
    """'mean±std' (or just the mean when there is no std)."""
    if row is None or row.mean is None:
        return "–"
    f = fpct if pct else fnum
    return f(row.mean, digits) + (f"±{f(row.std, digits)}" if row.std is not None else "")


def bold(s: str, on: bool) -> str:
    return f"**{s}**" if on and s != "–" else s


def better(a: S.Row | None, b: S.Row | None) -> tuple[bool, bool]:
    """Which of two rows has the higher mean (for bold); neither on a tie or a missing value."""
    if a is None or b is None or a.mean is None or b.mean is None or a.mean == b.mean:
        return False, False
    return a.mean > b.mean, b.mean > a.mean


def table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def ptest(t: S.Test | None) -> str:
    if t is None:
        return "–"
    p = S.format_p(t.pvalue)
    return p if p == "–" else f"{p}{t.stars}" if t.stars != "n.s." else f"{p} n.s."


# ---------------------------------------------------------------- report


@dataclass
class Ctx:
    s: S.Summary
    info: Info

    def label(self, model: str | None, gold: str | None = None) -> str:
        bits = [f"model `{model}`" + (" (simulated LLM)" if model in self.info.simulated else "")
                if model else "retrieval only (no LLM)"]
        if gold:
            bits.append(f"gold `{gold}`")
        bits += [f"embedder `{self.info.embedder}`", f"registry {self.info.registry_size} APIs "
                 f"({self.info.registry_choice})", f"runs {self.info.runs}", f"k = {self.info.k}"]
        return ", ".join(bits)

    def n(self, subset: str) -> str:
        return f"{subset} (n={self.s.checks.get('queries_per_subset', {}).get(subset, '?')})"

    def count(self, model: str | None, subset: str, arch: str, metric: str) -> str:
        r = self.s.row(model, subset, arch, metric)
        return "–" if r is None else str(int(math.fsum(r.values)))


def _has(s: S.Summary, model: str | None, arch: str) -> bool:
    return any(r.model == model and r.arch == arch for r in s.rows)


def _section(title: str, caption: str, body: str) -> str:
    return f"### {title}\n\n_{caption}_\n\n{body}\n"


def table1(c: Ctx, model: str | None, gold: str, metric: str = "recall") -> str:
    subs = c.s.subsets
    with_ptr = model is not None and _has(c.s, model, "ptr")
    header = ["k"] + [f"{sub} {a}" for sub in subs for a in (("RtP", "PtR") if with_ptr else ("RtP",))]
    body = []
    for k in c.info.ks:
        line = [str(k)]
        for sub in subs:
            r = c.s.row(None, sub, "rtp", metric, k, gold)
            if with_ptr:
                p = c.s.row(model, sub, "ptr", metric, k, gold)
                br, bp = better(r, p)
                line += [bold(fms(r), br), bold(fms(p), bp)]
            else:
                line.append(fms(r))
        body.append(line)
    name = "Recall" if metric == "recall" else "Precision"
    return _section(f"Table 1{'' if metric == 'recall' else 'b'}: {name} at retrieval budget k",
                    f"{c.label(model, gold)}. RtP is deterministic (one value)"
                    + ("; PtR mean±std over runs. Bold: better architecture." if with_ptr else "."),
                    table(header, body))


def table3(c: Ctx, model: str, gold: str) -> str:
    k = c.info.k
    header = ["Subset", "Metric", "RtP mean", "RtP ±std", "PtR mean", "PtR ±std", "p (t-test)", "p (Wilcoxon)",
              "wins RtP / PtR / ties"]
    body = []
    for sub in c.s.subsets:
        for metric, name in (("pass", "Pass rate"), ("precision", "Precision"), ("recall", "Recall")):
            is_pass = metric == "pass"
            r = c.s.row(model if is_pass else None, sub, "rtp", metric, k, None if is_pass else gold)
            p = c.s.row(model, sub, "ptr", metric, k, None if is_pass else gold)
            if r is None and p is None:
                continue
            br, bp = better(r, p)
            tt = c.s.test(model, sub, metric, k, None if is_pass else gold, "ttest_ind" if is_pass else "ttest_1samp")
            wx = c.s.test(model, sub, metric, k, None if is_pass else gold, "wilcoxon")
            wins = "–"
            if metric == "recall":
                wr, wp, ti = (c.s.row(model, sub, a, m, k, gold) for a, m in
                              (("rtp", "wins"), ("ptr", "wins"), ("both", "ties")))
                if wr and wp and ti:
                    wins = f"{wr.mean:.0f} / {wp.mean:.0f} / {ti.mean:.0f}"
            body.append([c.n(sub), name, bold(fnum(r.mean if r else None), br), fnum(r.std if r else None),
                         bold(fnum(p.mean if p else None), bp), fnum(p.std if p else None), ptest(tt), ptest(wx),
                         wins])
    return _section("Table 3: Main results", f"{c.label(model, gold)}. p: one-sample t-test for precision/recall "
                    "(PtR per-run means vs deterministic RtP), two-sample t-test for pass rate; Wilcoxon: paired "
                    "per-query signed-rank on run-averaged values. Wins on run-averaged per-query recall. "
                    "* p<.05, ** p<.01, *** p<.001.", table(header, body))


def table11(c: Ctx, model: str, gold: str) -> str:
    k = c.info.k
    header = ["Subset", "P RtP", "P PtR", "R RtP", "R PtR", "Pass RtP", "Pass PtR"]
    body = []
    for sub in c.s.subsets:
        line = [c.n(sub)]
        for metric in ("precision", "recall", "pass"):
            is_pass = metric == "pass"
            r = c.s.row(model if is_pass else None, sub, "rtp", metric, k, None if is_pass else gold)
            p = c.s.row(model, sub, "ptr", metric, k, None if is_pass else gold)
            t = c.s.test(model, sub, metric, k, None if is_pass else gold, "ttest_ind" if is_pass else "ttest_1samp")
            br, bp = better(r, p)
            sup = f"<sup>{t.stars}</sup>" if t and t.stars else ""
            line += [bold(fms(r), br), bold(fms(p), bp) + sup]
        body.append(line)
    return _section(f"Table 11: {model} (compact)", f"{c.label(model, gold)}. Superscripts on PtR: t-test of "
                    "the PtR–RtP difference (one-sample for P/R, two-sample for pass rate).", table(header, body))


def table4(c: Ctx, model: str, gold: str) -> str:
    header = ["Subset", "Gen.%", "Stubs/q", "Unique%", "Match%", "Cos (correct)", "Cos (incorrect)"]
    body = []
    for sub in c.s.subsets:
        def g(metric: str, gd: str | None = None, sub: str = sub) -> S.Row | None:
            return c.s.row(model, sub, "ptr", metric, None, gd)
        body.append([c.n(sub), fms(g("gen"), 1, True), fms(g("stubs_per_query"), 2), fms(g("stub_unique"), 1, True),
                     fms(g("stub_match", gold), 1, True), fms(g("stub_cos_correct", gold)),
                     fms(g("stub_cos_incorrect", gold))])
    return _section("Table 4: Stub generation", f"{c.label(model, gold)}. Match%: stubs whose top-1 API is gold "
                    "(pooled over stubs); Cos: mean cosine of a stub to its top-1 API.", table(header, body))


def budget_equivalent_k(width: float | None, ks: Sequence[int]) -> int | None:
    if width is None or not ks:
        return None
    return min(ks, key=lambda kk: (abs(kk - width), kk))


def table5(c: Ctx, model: str, gold: str) -> str:
    k = c.info.k
    header = ["Subset", "Stubs/q", f"PtR eff. width (k={k})", "RtP eff. width", "Budget-equiv. k",
              "RtP recall (budget-equiv.)", f"PtR recall (k={k})"] + [f"PtR width k={kk}" for kk in c.info.ks]
    body = []
    for sub in c.s.subsets:
        w = c.s.row(model, sub, "ptr", "width", k)
        beq = budget_equivalent_k(w.mean if w else None, c.info.ks)
        rr = c.s.row(None, sub, "rtp", "recall", beq, gold) if beq else None
        body.append([c.n(sub), fms(c.s.row(model, sub, "ptr", "stubs_per_query"), 2), fms(w, 1), str(k),
                     str(beq) if beq else "–", fms(rr), fms(c.s.row(model, sub, "ptr", "recall", k, gold))]
                    + [fms(c.s.row(model, sub, "ptr", "width", kk), 1) for kk in c.info.ks])
    return _section("Table 5: Effective search width", f"{c.label(model, gold)}. RtP searches exactly k candidates; "
                    "PtR's width is the size of the deduplicated union of per-stub top-k lists before the cut. "
                    "Budget-equivalent RtP recall from Table 1.", table(header, body))


def table6(c: Ctx, model: str) -> str:
    k = c.info.k
    spec: list[tuple[str, str, str, str | None, Callable[[S.Row | None], str]]] = [
        ("Selection rate", "ptr", "selection_rate", None, lambda r: fms(r, 1, True)),
        ("Selection rate", "rtp", "selection_rate", None, lambda r: fms(r, 1, True)),
        ("Jaccard (selected)", "both", "jaccard_selected", None, lambda r: fms(r, 2)),
        ("Both refused", "both", "both_refused", None, lambda r: fms(r, 1, True)),
        ("Plan steps", "ptr", "plan_steps", None, lambda r: fms(r, 2)),
        ("Plan steps", "rtp", "plan_steps", None, lambda r: fms(r, 2)),
        ("APIs named", "ptr", "apis_named", None, lambda r: fms(r, 2)),
        ("APIs named", "rtp", "apis_named", None, lambda r: fms(r, 2)),
        ("Fidelity", "ptr", "fidelity", None, lambda r: fms(r, 1, True)),
        ("Fidelity", "rtp", "fidelity", None, lambda r: fms(r, 1, True)),
    ]
    for gold in M.GOLDS:
        spec += [
            (f"Complete miss [{gold}]", arch, "miss", gold, lambda r: fms(r, 1, True)) for arch in ("ptr", "rtp")
        ] + [
            (f"On miss: wrong tool [{gold}]", arch, "miss_wrong_tool", gold, lambda r: fms(r, 1, True))
            for arch in ("ptr", "rtp")
        ] + [
            (f"On miss: refused [{gold}]", arch, "miss_refused", gold, lambda r: fms(r, 1, True)) for arch in ("ptr", "rtp")
        ]
    header = ["Metric", "Arch."] + c.s.subsets
    body = []
    for name, arch, metric, gold, f in spec:
        # RtP's complete-miss rate is pure retrieval: deterministic, stored under model = null.
        m = None if arch == "rtp" and metric in M.RETRIEVAL_METRICS else model
        body.append([name, {"ptr": "PtR", "rtp": "RtP", "both": "both"}[arch]]
                    + [f(c.s.row(m, sub, arch, metric, k, gold)) for sub in c.s.subsets])
    return _section("Table 6: Trajectories", f"{c.label(model)}. Selection rate = |selected∩R|/|R|; fidelity = "
                    "|selected∩R|/|selected| (queries with a selection); Jaccard of planner-selected sets "
                    "(both empty = 1.0).", table(header, body))


def table7(c: Ctx, model: str) -> str:
    k = c.info.k
    header = ["Subset", "n", "Identical", "Divergent"] + [f"Divergent k={kk}" for kk in c.info.ks]
    body = []
    for sub in c.s.subsets:
        d = c.s.row(model, sub, "both", "divergent", k)
        n = c.s.checks.get("queries_per_subset", {}).get(sub, "?")
        body.append([sub, str(n), fpct(1 - d.mean if d and d.mean is not None else None), fms(d, 1, True)]
                    + [fms(c.s.row(model, sub, "both", "divergent", kk), 1, True) for kk in c.info.ks])
    return _section("Table 7: Tool selection divergence", f"{c.label(model)}. Fraction of queries whose RtP and "
                    "PtR top-k sets differ (mean±std over runs).", table(header, body))


def table8(c: Ctx, model: str) -> str:
    k = c.info.k
    header = ["Subset", "RtP tokens/q", "PtR tokens/q", "Overhead"] + [f"ΔR [{g}]" for g in M.GOLDS] + [
        "PtR discovery prompt / completion", "PtR planner prompt / completion", "RtP planner prompt / completion"]
    body = []
    for sub in c.s.subsets:
        rt = c.s.row(model, sub, "rtp", "tokens_total", k)
        pt = c.s.row(model, sub, "ptr", "tokens_total", k)
        over = (pt.mean - rt.mean) / rt.mean if rt and pt and rt.mean and pt.mean is not None else None
        deltas = []
        for gold in M.GOLDS:
            rr = c.s.row(None, sub, "rtp", "recall", k, gold)
            pr = c.s.row(model, sub, "ptr", "recall", k, gold)
            deltas.append(f"{pr.mean - rr.mean:+.3f}" if rr and pr and rr.mean is not None and pr.mean is not None
                          else "–")

        def pc(arch: str, call: str, sub: str = sub) -> str:
            a = c.s.row(model, sub, arch, f"tokens_{call}_prompt", k)
            b = c.s.row(model, sub, arch, f"tokens_{call}_completion", k)
            return f"{fnum(a.mean if a else None, 0)} / {fnum(b.mean if b else None, 0)}"
        body.append([sub, fnum(rt.mean if rt else None, 0), fnum(pt.mean if pt else None, 0),
                     "–" if over is None else f"{100 * over:+.0f}%"] + deltas
                    + [pc("ptr", "discovery"), pc("ptr", "planner"), pc("rtp", "planner")])
    return _section("Table 8: Inference cost", f"{c.label(model)}. Mean prompt + completion tokens per query over "
                    "all calls of the architecture (RtP: planner; PtR: discovery + planner), cached replies "
                    f"included; ΔR = PtR − RtP recall@{k}.", table(header, body))


def errors_table(c: Ctx, model: str | None) -> str:
    header = ["Subset", "Arch.", "records", "planner parse errors", "planner LLM errors", "discovery parse errors",
              "discovery LLM errors", "fallbacks (raw query)"]
    body = []
    for sub in c.s.subsets:
        for arch in ("rtp", "ptr"):
            if c.s.row(model, sub, arch, "n_queries") is None:
                continue
            cells = [c.count(model, sub, arch, m) for m in
                     ("n_queries", "planner_parse_error", "planner_llm_error")]
            if arch == "ptr":
                cells += [c.count(model, sub, arch, m) for m in
                          ("discovery_parse_error", "discovery_llm_error", "fallback")]
            else:
                cells += ["–", "–", "–"]
            body.append([sub, arch.replace("rtp", "RtP").replace("ptr", "PtR")] + cells)
    return _section("Errors", f"{c.label(model)}. Counts summed over runs.", table(header, body))


def warnings_md(meta: Mapping[str, Any]) -> str:
    w = meta.get("warnings")
    if not w:
        return "No data warnings.\n"
    if isinstance(w, Mapping):
        items = [(str(k), _warning_cell(v)) for k, v in sorted(w.items())]
    else:
        counts: Counter[str] = Counter()
        for x in w:
            if isinstance(x, Mapping):  # {"kind"/"message": ..., "count"/"n": ...} or any other object
                label = x.get("kind") or x.get("message") or x.get("what")
                n = x.get("count", x.get("n", 1))
                counts[str(label) if label else json.dumps(x, sort_keys=True)] += int(n) if isinstance(n, int) else 1
            else:
                counts[str(x)] += 1
        items = sorted(counts.items())
    return "\n".join(f"- {k}: {v if not isinstance(v, list | dict) else len(v)}" for k, v in items) + "\n"


def _warning_cell(v: Any) -> Any:
    """`{"count": n, "examples": [...]}` (the data loader's form) -> 'n (e.g. ...)'; other values as given."""
    if isinstance(v, Mapping) and "count" in v:
        ex = [str(e) for e in (v.get("examples") or [])[:3]]
        return f"{v['count']}" + (f" (e.g. {'; '.join(ex)})" if ex else "")
    return v


def llm_stats_md(meta: Mapping[str, Any]) -> str:
    st = meta.get("llm_stats")
    if not isinstance(st, Mapping) or not st:
        return ""
    cols = sorted({k for v in st.values() if isinstance(v, Mapping) for k, x in v.items()
                   if isinstance(x, int | float | str | bool) or x is None})
    body = [[str(m)] + [_cell(v.get(col)) for col in cols] for m, v in sorted(st.items()) if isinstance(v, Mapping)]
    return "## LLM accounting\n\n" + table(["model"] + cols, body) + "\n"


def _cell(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.3g}"
    return "–" if x is None else str(x)


def sections_md(out_dir: Path) -> Iterator[str]:
    sec = out_dir / "sections"
    if sec.is_dir():
        for p in sorted(sec.glob("*.md")):
            yield p.read_text(encoding="utf-8").rstrip() + "\n"


def render_markdown(out_dir: Path, meta: Mapping[str, Any], summary: S.Summary, info: Info,
                    figures: Sequence[Path] = ()) -> str:
    c = Ctx(summary, info)
    out: list[str] = ["# Tool discovery: Retrieve-then-Plan vs Plan-then-Retrieve\n"]
    for m in info.models:
        if m in info.simulated:
            out.append(f"> **SIMULATED LLM — model `{m}`:** the LLM was simulated by a heuristic, so its numbers "
                       "measure the pipeline, not a language model.\n")
    qps = summary.checks.get("queries_per_subset", {})
    out.append("\n".join([
        f"- Models: {', '.join(_model_desc(m, info) for m in info.models) or 'none (retrieval only)'}",
        f"- Embedder: `{info.embedder}`",
        f"- Registry: {info.registry_size} APIs, choice `{info.registry_choice}`",
        "- Gold: `api_list` (every API of the tools sampled for the query; paper-comparable, shown first) and "
        "`relevant` (APIs the reference solution needs)",
        f"- Runs: {info.runs}; main k = {info.k}; ablation ks = {', '.join(map(str, info.ks))}",
        f"- Subsets: {', '.join(f'{s} (n={n})' for s, n in qps.items())}",
        f"- Records: {summary.checks.get('records', 0)}; evaluator version {info.version}",
    ]) + "\n")
    if summary.checks.get("rtp_inconsistent_queries"):
        out.append(f"> **Warning:** {summary.checks['rtp_inconsistent_queries']} records carry an RtP retrieved "
                   "list that differs from another record of the same query; RtP rows use the first.\n")

    out.append("## Retrieval: k-ablation\n")
    for m in info.models or [None]:
        for gold in M.GOLDS:
            out.append(table1(c, m, gold))
            if m is None:
                out.append(table1(c, m, gold, "precision"))
    for m in info.models:
        if not (_has(summary, m, "ptr") or _has(summary, m, "rtp")):
            continue
        out.append(f"## Model `{m}`" + (" (simulated LLM)" if m in info.simulated else "") + "\n")
        for gold in M.GOLDS:
            out.append(table3(c, m, gold))
        for gold in M.GOLDS:
            out.append(table11(c, m, gold))
        if _has(summary, m, "ptr"):
            for gold in M.GOLDS:
                out.append(table4(c, m, gold))
            for gold in M.GOLDS:
                out.append(table5(c, m, gold))
        out.append(table6(c, m))
        if _has(summary, m, "both"):
            out.append(table7(c, m))
        out.append(table8(c, m))
        out.append(errors_table(c, m))
    if not info.models:
        out.append(errors_table(c, None))

    if figures:
        out.append("## Figures\n\n" + "\n".join(f"![{p.stem}](figures/{p.name})" for p in figures) + "\n")
    out.append("## Data warnings\n\n" + warnings_md(meta))
    if st := llm_stats_md(meta):
        out.append(st)
    out.append("## Decisions\n\n" + "\n".join(f"- {d}" for d in DECISIONS) + "\n")
    out.append("## summary.json\n\n`rows`: one row per (model, subset, arch, metric, k, gold) with `mean`, `std` "
               "(sample, null with one value) and `values` (per-run means; RtP retrieval: model null, one value; "
               "`wins`/`ties`: one count on run-averaged recall; `recall_win_rtp`/`recall_win_ptr`/`recall_tie`: per-run "
               "fractions of queries). `tests`: one entry per test (`ttest_1samp`, `ttest_ind`, `wilcoxon`) "
               "with statistic, p-value (null when undefined), stars and n. `checks`: record counts and "
               "consistency checks.\n")
    out.extend(sections_md(out_dir))
    return "\n".join(out)


def _model_desc(m: str, info: Info) -> str:
    bits = [info.model_ids[m]] if m in info.model_ids else []
    bits += ["simulated"] if m in info.simulated else []
    return f"`{m}`" + (f" ({', '.join(bits)})" if bits else "")


def summary_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in meta.items() if k not in VOLATILE_META_KEYS}
    if isinstance(out.get("settings"), Mapping):
        # the default --out is a timestamped folder: it must not make two identical studies differ
        out["settings"] = {k: v for k, v in out["settings"].items() if k not in VOLATILE_META_KEYS}
    return out


def render(out_dir: Path, *, with_figures: bool = True) -> None:
    """Write `summary.json`, `report.md` and `figures/*.png` from `meta.json` + `queries.jsonl`."""
    out_dir = Path(out_dir)
    meta_path = out_dir / "meta.json"
    meta: dict[str, Any] = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.exists() else {}
    records = read_records(out_dir / "queries.jsonl")
    info = resolve_info(meta, records)
    summary = S.summarize(records, info.ks, info.k)
    (out_dir / "summary.json").write_text(S.dumps(S.summary_dict(summary, summary_meta(meta))), encoding="utf-8")
    figs: list[Path] = []
    if with_figures:
        from evaluator import figures  # matplotlib import is the slow part; skip it when not drawing

        figs = figures.render_figures(out_dir / "figures", summary, k=info.k, ks=info.ks, simulated=info.simulated)
    (out_dir / "report.md").write_text(render_markdown(out_dir, meta, summary, info, figs), encoding="utf-8")
