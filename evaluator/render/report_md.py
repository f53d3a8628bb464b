"""`report.md` composed from values: the run's meta, the main study's result, and the scaling and
routing sections as already-rendered text. Reads and writes no file."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from evaluator.analysis.main_study import MainResult
from evaluator.analysis.metric_defs import Metric
from evaluator.data import CORPUS_TEXT_RULE, EMBED_TEXT_RULE
from evaluator.render import tables
from evaluator.render.cost_section import cost_section_md
from evaluator.render.fmt import models_or_none, table, text
from evaluator.results.schema import CallStats, Meta, Runtime, WarningCount, plain, repeats_note

DECISIONS = [
    "Gold sets: every retrieval table is given for `api_list` (paper-comparable default) and then for "
    "`relevant`.",
    "Precision@k divides by the nominal k even when fewer than k APIs were retrieved (PtR with no stub).",
    "RtP retrieval is deterministic: computed once per query (rows with model = null, one value, no std); "
    "`checks.rtp_inconsistent_queries` in summary.json counts queries whose saved RtP lists differ "
    "between records.",
    "Across runs: mean and sample standard deviation (ddof = 1); with one run the std is empty.",
    "Pass rate: the plan selects at least one of the APIs offered to it (a name it made up is no selection; "
    "older records without `selected_offered` count any selection). A planner reply that could not be parsed counts as "
    "no selection (a planner outcome); a call that failed for good after retries (`llm_error`) is an "
    "infrastructure outcome and is excluded from the planner metrics (counted under Errors). A discovery "
    "call that failed for good excludes that query from PtR retrieval, stub and planner metrics; so does, for any "
    "architecture, an own call that failed for good or a failure of the architecture itself on the query (it "
    "raised, broke the plugin contract, timed out or waited in a cycle): such a block gets no planner call and "
    "is left out of every metric and test of that architecture (counted under Errors).",
    "Selection rate = |selected ∩ R| / |R| with R the k APIs shown to the planner (undefined, so excluded, "
    "when R is empty); fidelity = |selected ∩ R| / |selected|, excluded when nothing was selected. Both are "
    "means over queries.",
    "Jaccard of planner-selected sets: two empty selections are the same (empty) intended trajectory and "
    "score 1.0; the share of such queries is shown as 'both refused'.",
    "Complete miss: R ∩ G = ∅ at the main k. On a miss the planner 'used a wrong tool' if it selected "
    "anything and 'refused' if it selected nothing without a parse error.",
    "Match% and stub cosine are pooled over stubs (not averaged per query); a stub's match is its top-1 "
    "API being gold. Stubs that copy the discovery prompt's own example (`search_flights`; flagged "
    "`example_copy` in queries.jsonl) are left out of Match% and the cosines. Unique% = distinct stub names / all stub names per subset and run (names "
    "lower-cased and stripped), then averaged over runs.",
    "Budget-equivalent k (Table 5): the k of the ablation nearest to PtR's mean effective search width at "
    "the main k (ties to the smaller k).",
    "Win/loss counts and the Wilcoxon test use per-query values averaged over runs (RtP retrieval is one "
    "value), computed as exact fractions so that equal averages tie; Wilcoxon `zero_method='wilcox'` drops tied queries, exact null distribution for up to 50 "
    "untied differences, tie-corrected normal approximation otherwise; p is '–' when no query differs.",
    "t-tests: one-sample (PtR per-run means vs the RtP value) for precision/recall, Student's two-sample "
    "for pass rate; with one run or zero run-to-run variance the p-value is undefined and shown as '–'.",
    "Significance: * p < .05, ** p < .01, *** p < .001, n.s. otherwise (as in the paper).",
    "PtR: every stub is searched to the largest k of the ablation, so the re-ranked union's first k "
    "entries are exactly TopK_t max_s sim(s, d_t) at every k. A query whose discovery reply yields no "
    "stub retrieves nothing and gets no planner call (counted in Gen%), unless `fallback_to_query` is on.",
    "Prompts are this project's own (evaluator/study/prompts.py; the paper's verbatim prompts are not in the "
    "available text); their versions are part of the response-cache key. The planner sees the main-k "
    "retrieved APIs as `tool/api: description`; its selections are mapped back to registry ids by exact, "
    "normalised, then close (difflib >= 0.85) name matching; a name that matches nothing offered is "
    "looked up in the registry, else kept as written (it counts against fidelity).",
]


def warnings_md(w: Mapping[str, WarningCount]) -> str:
    """Counted data problems: kind -> 'n (e.g. ...)'."""
    if not w:
        return "No data warnings.\n"
    return "\n".join(f"- {k}: {v.count}" + (f" (e.g. {text('; '.join(v.examples[:3]))})" if v.examples else "")
                     for k, v in sorted(w.items())) + "\n"


def runtime_md(runtime: Runtime) -> str:
    """The embedding runtime, what it embedded, and the peak resident memory (meta.json `runtime`)."""
    peak = runtime.peak_rss_mib
    if peak is None:
        return ""
    lines = ["## Runtime\n"]
    if runtime.embed_runtime:
        lines.append(f"- Embedding runtime: `{runtime.embed_runtime}`")
    if runtime.search:
        lines.append(f"- Search: `{runtime.search}`")
    if emb := runtime.embed:
        lines.append(f"- Texts embedded: {int(emb.get('embedded', 0)):,}; from the embedding cache: "
                     f"{int(emb.get('cache_hits', 0)):,}")
    lines.append(f"- Peak resident memory of the largest process: {peak.largest_process:,.0f} MiB (this "
                 f"process {peak.this_process:,.0f} MiB; its largest finished child, e.g. the model export, "
                 f"{peak.largest_child:,.0f} MiB), up to writing this report")
    if runtime.peak_gpu_mib is not None:
        lines.append(f"- Peak GPU memory of the embedder and the search: {runtime.peak_gpu_mib:,.0f} MiB")
    return "\n".join(lines) + "\n"


def llm_stats_md(st: Mapping[str, CallStats]) -> str:
    """One row per model, one column per counter (the percentiles and per-kind counts stay in meta.json)."""
    if not st:
        return ""
    rows = {m: plain(v) for m, v in sorted(st.items())}
    cols = sorted(k for k, x in next(iter(rows.values())).items() if not isinstance(x, dict | list))
    body = [[m] + [_cell(v[col]) for col in cols] for m, v in rows.items()]
    # calls that failed for good, by kind (http_400, context_exceeded, ...): what a rerun retries
    failed = [f"- `{m}`: " + ", ".join(f"{n} {kind}" for kind, n in sorted(v.failed.items()))
              for m, v in sorted(st.items()) if v.failed]
    tail = ("\nCalls that failed for good, by kind:\n\n" + "\n".join(failed) + "\n") if failed else ""
    return "## LLM accounting\n\n" + table(["model"] + cols, body) + "\n" + tail


def _cell(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.3g}"
    return "–" if x is None else str(x)


RETRIEVER_RULES = {
    "dense": "embeddings, exact inner product; score = cosine",
    "bm25": "Okapi BM25 (bm25s, lucene, k1 1.5, b 0.75) over the embedded text; identifiers split at `_` and "
            "camelCase, lower-cased, bm25s's English stop words, no stemmer; score = BM25; the embedder "
            "searches nothing",
    "hybrid": "reciprocal-rank fusion, Σ 1/(60 + rank), of the dense and the BM25 top-100 of each text; "
              "score = RRF (at most 2/61)",
}
# What a bundled model is, where it is not the paper's (the report says so beside the name).
EMBEDDER_NOTES = {"sentence-transformers/all-mpnet-base-v2": " (all-mpnet-base-v2, 768-d; not the paper's "
                  "`thenlper/gte-base`)"}


def run_decisions(meta: Meta, result: MainResult) -> list[str]:
    """The decisions that depend on this run, stated from it (never fixed numbers)."""
    reg = meta.registry
    size = f"{reg.size:,}" if isinstance(reg.size, int) else "?"
    corpus = reg.format == "beir"  # a BEIR folder's corpus: documents, embedded by CORPUS_TEXT_RULE
    how = (("every corpus document" if corpus else
            "every API; an API without a description is embedded as `{tool_name}/{api_name}: `") if reg.choice == "full"
           else ("only documents with a title or text" if corpus else "only APIs with a description")
           if reg.choice == "described" else reg.choice)
    qps = result.summary.checks.queries_per_subset
    subsets = ", ".join(f"{s} ({n})" for s, n in qps.items()) or "none"
    temps = sorted({str(m.profile.sampling.temperature) for m in meta.models if m.profile is not None})
    out = [
        f"Registry: {size} APIs{f' ({reg.format})' if reg.format else ''}, choice `{reg.choice}` ({how}). "
        "The paper used 46,984 ToolBench APIs.",
        f"Embedded text: {CORPUS_TEXT_RULE if corpus else EMBED_TEXT_RULE}",
        f"Queries: {sum(qps.values())} in {len(qps)} subset(s): {subsets}. The paper used 200/200/100 "
        "queries for G1/G2/G3.",
        f"Embedder: `{meta.embedder}`, {meta.backend} {meta.precision} (the paper: gte-base, 768-d); vectors are "
        "L2-normalised; search is exact inner product (faiss.IndexFlatIP on a CPU, the same top-k in torch on a GPU), "
        "re-scored in float64 so results do not depend on how queries were batched or where they were searched; "
        "exact ties go to the higher registry row, as FAISS orders them.",
    ]
    if corpus or result.graded:
        out.append(f"Gold: the BEIR folder's `qrels/{meta.settings.data.split}.tsv`. A document judged with a score "
                   "> 0 is relevant (both gold sets) with its score as its grade: "
                   + (f"{result.graded} queries have grades other than 1, and NDCG gains the grade (Table 1c)"
                      if result.graded else "every grade is 1 (binary relevance)")
                   + "; recall, precision, MRR, COMP and pass count every grade alike. A score of 0 is judged "
                   "non-relevant; queries the split does not judge are left out, as BEIR's loader does (counted under "
                   "Data warnings).")
    if (retriever := meta.settings.retrieval.retriever) != "dense":
        out.append(f"Retriever `{retriever}`: {RETRIEVER_RULES[retriever]}. PtR merges its stubs' lists by the "
                   "best score any stub gives an API, with the retriever's own score (BM25 scores of different "
                   "stubs are not normalised: a stub with more matching words weighs more; RRF scores are "
                   "rank-based, on one scale). Routing's τ is a threshold on RtP's top-1 score of this retriever "
                   f"({'BM25' if retriever == 'bm25' else 'RRF'}), not a cosine.")
    if meta.models:
        out.append(f"Sampling: temperature {', '.join(temps) or 'as in each profile'}; the run index is sent as "
                   "`seed` and is part of the cache key, so N runs are N samples (providers that ignore the "
                   "seed still vary, as the paper observed).")
    return out


def _model_desc(m: str, labels: tables.Labels) -> str:
    bits = [labels.model_ids[m]] if m in labels.model_ids else []
    bits += ["simulated"] if m in labels.simulated else []
    return f"`{m}`" + (f" ({', '.join(bits)})" if bits else "")


def labels_of(meta: Meta, models: Sequence[str]) -> tables.Labels:
    # the bundled simulator is simulated whatever meta says (an output folder with a bare meta.json)
    simulated = set(meta.simulated_models) | {m for m in models if m == "sim"}
    size = meta.registry.size
    return tables.Labels(simulated=simulated & set(models) if models else simulated, embedder=meta.embedder,
                    registry_size=f"{size:,}" if isinstance(size, int) else "?",
                    registry_choice=meta.registry.choice, runs=str(meta.runs),
                    model_ids={m.name: m.model for m in meta.models if m.model and m.model != m.name},
                    retriever=meta.settings.retrieval.retriever)


def compose(meta: Meta, result: MainResult, *, sections: Sequence[str] = (), figures: Sequence[str] = (),
            skipped: Sequence[str] = ()) -> str:
    """`sections`: extra Markdown sections (scaling, routing) in order; `figures`: file names under
    figures/; `skipped`: one line per table or analysis that could not be made, with why."""
    summary = result.summary
    models = sorted({m.name for m in meta.models} | set(summary.models))
    labels = labels_of(meta, models)
    c = tables.Ctx(result, labels)
    out: list[str] = ["# Tool discovery: Retrieve-then-Plan vs Plan-then-Retrieve\n"]
    for m in models:
        if m in labels.simulated:
            out.append(f"> **SIMULATED LLM — model `{m}`:** the LLM was simulated by a heuristic, so its numbers "
                       "measure the pipeline, not a language model.\n")
    out += [f"> **Note:** {repeats_note(m.name, meta.runs)}\n" for m in meta.models
            if m.profile is not None and m.profile.repeats_runs]
    qps = summary.checks.queries_per_subset
    out.append("\n".join([
        f"- Models: {', '.join(_model_desc(m, labels) for m in models) or 'none (retrieval only)'}",
        f"- Embedder: `{labels.embedder}`{EMBEDDER_NOTES.get(labels.embedder, '')}",
        f"- Retriever: `{labels.retriever}` ({RETRIEVER_RULES[labels.retriever]})",
        f"- Registry: {labels.registry_size} APIs, choice `{labels.registry_choice}`",
        "- Gold: `api_list` (every API of the tools sampled for the query; paper-comparable, shown first) and "
        "`relevant` (APIs the reference solution needs)" if len(result.golds) > 1 else
        f"- Gold: one set per query, `{result.golds[0] if result.golds else 'none'}` (see the skipped tables)",
        f"- Runs: {labels.runs}; main k = {result.k}; ablation ks = {', '.join(map(str, result.ks))}",
        f"- Subsets: {', '.join(f'{s} (n={n})' for s, n in qps.items())}",
        f"- Records: {summary.checks.records}; evaluator version {meta.version}",
    ]) + "\n")
    if summary.checks.rtp_inconsistent_queries:
        out.append(f"> **Warning:** {summary.checks.rtp_inconsistent_queries} records carry an RtP retrieved "
                   "list that differs from another record of the same query; RtP rows use the first.\n")

    out.append("## Retrieval: k-ablation\n")
    for model in models_or_none(models):
        for gold in result.golds:
            out.append(tables.metric_at_k(c, model, gold))
            if model is None:
                out.append(tables.metric_at_k(c, model, gold, Metric.PRECISION))
            out.append(tables.rank_metrics_at_k(c, model, gold))
    for m in models:
        if not (tables.has(summary, m, "ptr") or tables.has(summary, m, "rtp")):
            continue
        out.append(f"## Model `{m}`" + (" (simulated LLM)" if m in labels.simulated else "") + "\n")
        if m in result.contrasts:
            out.append(tables.worked_contrasts(c, result.contrasts[m]))
        for gold in result.golds:
            out.append(tables.main_results(c, m, gold))
        for gold in result.golds:
            out.append(tables.compact_results(c, m, gold))
        if result.comparison is not None and len(result.comparison.archs) >= 3:
            for gold in result.golds:
                out.append(tables.architectures_compared(c, m, gold))
            for gold in result.golds:
                out.append(tables.pairwise_tests(c, result.comparison, m, gold))
            for gold in result.golds:
                out.append(tables.friedman_tests(c, result.comparison, m, gold))
        if tables.has(summary, m, "ptr"):
            for gold in result.golds:
                out.append(tables.stub_generation(c, m, gold))
            for gold in result.golds:
                out.append(tables.search_width(c, m, gold))
        out.append(tables.trajectories(c, m))
        if tables.has(summary, m, "both"):
            out.append(tables.selection_divergence(c, m))
        out.append(tables.inference_cost(c, m))
        if m in result.trajectories:
            out.append(tables.example_trajectory(c, result.trajectories[m], m))
        out.append(tables.errors_table(c, m))
    if not models:
        out.append(tables.errors_table(c, None))

    if figures:
        out.append("## Figures\n\n" + "\n".join(f"![{f.rsplit('.', 1)[0]}](figures/{f})" for f in figures) + "\n")
    out.append("## Data warnings\n\n" + warnings_md(meta.warnings))
    if st := llm_stats_md(meta.llm_stats):
        out.append(st)
    if cost := cost_section_md(meta.cost, meta.batch):
        out.append(cost)
    if rt := runtime_md(meta.runtime):
        out.append(rt)
    all_skipped = [*result.skipped, *skipped]
    out.append("## Skipped tables and analyses\n\n" + ("\n".join(f"- {s}" for s in all_skipped) if all_skipped
                                                         else "None: every table and analysis was made.") + "\n")
    out.append("## Decisions\n\n" + "\n".join(f"- {d}" for d in [*run_decisions(meta, result), *DECISIONS]) + "\n")
    out.append("## summary.json\n\n`rows`: one row per (model, subset, arch, metric, k, gold) with `mean`, `std` "
               "(sample, null with one value) and `values` (per-run means; RtP retrieval: model null, one value; "
               "`wins`/`ties`: one count on run-averaged recall; `recall_win_rtp`/`recall_win_ptr`/`recall_tie`: per-run "
               "fractions of queries). `tests`: one entry per test (`ttest_1samp`, `ttest_ind`, `wilcoxon`) "
               "with statistic, p-value (null when undefined), stars and n. `checks`: record counts and "
               "consistency checks. `meta`: only what the numbers depend on (paths, timings and accounting "
               "are in meta.json)."
               + (" `comparisons` (three architectures or more): `pairs`, every pair's paired Wilcoxon test with "
                  "its Holm-adjusted p (`p_holm`), and `friedman`, one test across all architectures, per model, "
                  "subset, metric and gold at the main k." if result.comparison is not None
                  and len(result.comparison.archs) >= 3 else "") + "\n")
    out.extend(s.rstrip() + "\n" for s in sections)
    return "\n".join(out)
