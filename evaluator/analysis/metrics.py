"""Per-query observations of the metrics from one typed `Record` (each metric defined once, with its formula, in
`metric_defs`; the study's definitions in `../shared/STUDY.md`).

Every metric of a query is an observation `(num, den)`: the per-run aggregate of a metric is
`sum(num) / sum(den)` over the queries of the run. A plain per-query mean has `den = 1`; pooled ratios
(Match%, stub cosine) carry their own denominators; a metric that is undefined for a query (fidelity
when nothing was selected) is simply not observed, so it drops out of the mean. Count metrics (error,
truncation and fallback flags, `n_queries`) are summed instead (`metric_defs.Aggregate`).

Observations are keyed by `MetricKey = (arch, metric, k, gold)`; `k` and `gold` are None where the
metric does not depend on them. `arch` is an architecture's name ("rtp", "ptr", or any other a record holds,
`Record.arch_names`) or "both" (the paper's RtP-vs-PtR cross-architecture metrics).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import TypeVar

from evaluator.analysis.metric_defs import TOKEN_KINDS, Metric, MetricName, tokens_metric
from evaluator.results.schema import GOLDS, ArchBlock, PlanBlock, PtrBlock, Record, Tokens
from evaluator.settings.sections import RetrievalSettings

# The k-ablation and the planner's budget of a caller that names none: the [retrieval] section's defaults.
DEFAULT_KS: tuple[int, ...] = RetrievalSettings().ks
DEFAULT_K = RetrievalSettings().k

MetricKey = tuple[str, MetricName, int | None, str | None]
Obs = dict[MetricKey, tuple[float, float]]


H = TypeVar("H", bound=Hashable)  # an API id, or a registry row (scaling)


def hits(retrieved: Sequence[H], gold: AbstractSet[H]) -> int:
    return len(set(retrieved) & gold)


def recall(retrieved: Sequence[H], gold: AbstractSet[H], n_gold: int | None = None) -> float:
    """|R∩G| / |G|; `n_gold` when G counts APIs the retrieval could never return (scaling)."""
    n = len(gold) if n_gold is None else n_gold
    return hits(retrieved, gold) / n if n else float("nan")


def rank_metrics(ranked: Sequence[str], gold: set[str], k: int,
                 grades: Mapping[str, int] | None = None) -> dict[Metric, float]:
    """NDCG@k, MRR@k and COMP@k of one ranked list (best first, no duplicates) against a gold set, as
    `Metric.NDCG`, `Metric.MRR` and `Metric.COMP` define them (trec_eval's `ndcg_cut`, `recip_rank` on the list
    cut to k). `grades`: graded relevance (e.g. a BEIR qrels score), NDCG's gains; without it every gold item
    gains 1. Every gold item counts as relevant whatever its grade (> 0) for MRR and COMP, as for recall and
    precision. Any architecture's list can be scored: nothing here knows RtP or PtR."""
    top = ranked[:k]
    if grades:
        dcg = math.fsum(grades.get(t, 1) / math.log2(i + 2) for i, t in enumerate(top) if t in gold)
        ideal = sorted((grades.get(g, 1) for g in gold), reverse=True)[:k]
        idcg = math.fsum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    else:
        dcg = math.fsum(1.0 / math.log2(i + 2) for i, t in enumerate(top) if t in gold)
        idcg = math.fsum(1.0 / math.log2(i + 2) for i in range(min(len(gold), k)))
    first = next((i for i, t in enumerate(top) if t in gold), None)
    return {Metric.NDCG: dcg / idcg if idcg else 0.0, Metric.MRR: 0.0 if first is None else 1.0 / (first + 1),
            Metric.COMP: float(bool(gold) and gold <= set(top))}


def retrieval_obs(arch: str, retrieved: Sequence[str], golds: Mapping[str, Sequence[str]], ks: Sequence[int],
                  out: Obs, grades: Mapping[str, int] | None = None) -> None:
    """Recall, precision, complete miss and the rank metrics (`rank_metrics`; `grades`: the gold's graded
    relevance, NDCG's gains) of a ranked list at each k, per gold set."""
    for gold_name, gold in golds.items():
        g = set(gold)
        if not g:  # recall undefined without a gold set; data validation should prevent this
            continue
        for k in ks:
            h = hits(retrieved[:k], g)
            out[(arch, Metric.RECALL, k, gold_name)] = (h / len(g), 1.0)
            out[(arch, Metric.PRECISION, k, gold_name)] = (h / k, 1.0)
            out[(arch, Metric.MISS, k, gold_name)] = (float(h == 0), 1.0)
            for name, v in rank_metrics(retrieved, g, k, grades).items():
                out[(arch, name, k, gold_name)] = (v, 1.0)


def planner_obs(arch: str, plan: PlanBlock, top: Sequence[str], golds: Mapping[str, Sequence[str]],
                k: int, out: Obs) -> None:
    """Planner metrics at the main k; `top` is the retrieved set the planner was shown."""
    selected = plan.unique_selected
    r = set(top)
    inside = len(set(selected) & r)
    # Pass: the planner selected at least one of the APIs it was offered (a made-up name is no selection).
    out[(arch, Metric.PASS, k, None)] = (float(bool(plan.counted_selected)), 1.0)
    if r:
        out[(arch, Metric.SELECTION_RATE, k, None)] = (inside / len(r), 1.0)
    if selected:
        out[(arch, Metric.FIDELITY, k, None)] = (inside / len(selected), 1.0)
    out[(arch, Metric.PLAN_STEPS, k, None)] = (float(len(plan.steps)), 1.0)
    out[(arch, Metric.APIS_NAMED, k, None)] = (float(len(selected)), 1.0)
    for gold_name, gold in golds.items():
        if gold and not (r & set(gold)):
            # On a complete miss: a wrong tool (selected something) or a refusal; a parse error is neither.
            out[(arch, Metric.MISS_WRONG_TOOL, k, gold_name)] = (float(bool(selected)), 1.0)
            out[(arch, Metric.MISS_REFUSED, k, gold_name)] = (float(plan.refused), 1.0)


def token_obs(arch: str, tokens: Mapping[str, Tokens], k: int, out: Obs) -> None:
    """Per call type (`tokens_planner_prompt`, ...) and `tokens_total`, per query."""
    if not tokens:
        return
    total = 0.0
    for call, counts in sorted(tokens.items()):
        for kind, n in zip(TOKEN_KINDS, (counts.prompt, counts.completion), strict=True):
            total += n
            out[(arch, tokens_metric(call, kind), k, None)] = (float(n), 1.0)
    out[(arch, Metric.TOKENS_TOTAL, k, None)] = (total, 1.0)


def stub_obs(ptr: PtrBlock, golds: Mapping[str, Sequence[str]], ks: Sequence[int], out: Obs,
             arch: str = "ptr") -> None:
    """Gen%, stubs/query, Match% and stub-to-top-1 cosine (pooled over stubs), search width; of any
    architecture whose block keeps stubs (PtR's shape), under its own name."""
    out[(arch, Metric.GEN, None, None)] = (float(bool(ptr.stubs)), 1.0)
    out[(arch, Metric.STUBS_PER_QUERY, None, None)] = (float(len(ptr.stubs)), 1.0)
    # (top-1 id, its cosine) per stub that retrieved anything; a missing score leaves the cosine out.
    tops: list[tuple[str, float | None]] = []
    for i, h in enumerate(ptr.stub_hits):
        # A stub copied from the prompt's own example is not the model's reading of the request.
        if h and not (i < len(ptr.stubs) and ptr.stubs[i].example_copy):
            s = ptr.stub_scores[i] if i < len(ptr.stub_scores) and ptr.stub_scores[i] else None
            tops.append((h[0], float(s[0]) if s else None))
    for gold_name, gold in golds.items():
        g = set(gold)
        if not g or not tops:
            continue
        correct = [c for t, c in tops if t in g]
        wrong = [c for t, c in tops if t not in g]
        out[(arch, Metric.STUB_MATCH, None, gold_name)] = (float(len(correct)), float(len(tops)))
        cos_ok = [c for c in correct if c is not None]
        cos_bad = [c for c in wrong if c is not None]
        if cos_ok:
            out[(arch, Metric.STUB_COS_CORRECT, None, gold_name)] = (sum(cos_ok), float(len(cos_ok)))
        if cos_bad:
            out[(arch, Metric.STUB_COS_INCORRECT, None, gold_name)] = (sum(cos_bad), float(len(cos_bad)))
    for k in ks:
        if (w := ptr.width.get(k)) is not None:
            out[(arch, Metric.WIDTH, k, None)] = (float(w), 1.0)


def record_obs(record: Record, ks: Sequence[int] = DEFAULT_KS, k: int = DEFAULT_K) -> Obs:
    """All per-query observations of one record: every architecture it holds, and RtP vs PtR."""
    ks = sorted(set(ks) | {k})
    golds = {g: record.gold_set(g) for g in GOLDS}
    out: Obs = {}
    tops: dict[str, list[str]] = {}
    plans: dict[str, PlanBlock] = {}
    for arch in record.arch_names:
        block: ArchBlock | None = record.arch(arch)
        if block is None:
            continue
        out[(arch, Metric.N_QUERIES, None, None)] = (1.0, 1.0)
        plan = block.plan
        token_obs(arch, block.tokens, k, out)
        if plan is not None:
            out[(arch, Metric.PLANNER_PARSE_ERROR, None, None)] = (float(bool(plan.parse_error)), 1.0)
            out[(arch, Metric.PLANNER_LLM_ERROR, None, None)] = (float(bool(plan.llm_error)), 1.0)
            out[(arch, Metric.PLANNER_TRUNCATED, None, None)] = (float(plan.truncated), 1.0)
        if isinstance(block, PtrBlock):
            out[(arch, Metric.DISCOVERY_PARSE_ERROR, None, None)] = (float(bool(block.discovery_parse_error)), 1.0)
            out[(arch, Metric.DISCOVERY_LLM_ERROR, None, None)] = (float(bool(block.discovery_llm_error)), 1.0)
            out[(arch, Metric.DISCOVERY_TRUNCATED, None, None)] = (float(block.discovery_finish_reason == "length"), 1.0)
            out[(arch, Metric.FALLBACK, None, None)] = (float(block.fallback), 1.0)
        if block.errors:
            out[(arch, Metric.OWN_CALL_ERROR, None, None)] = (1.0, 1.0)
        if block.failure is not None:
            out[(arch, Metric.failed(block.failure.kind), None, None)] = (1.0, 1.0)
        if block.excluded:
            # Nothing to judge (a call the list depends on failed for good, or the architecture failed): the block
            # is left out of every retrieval, stub and planner metric and every test, whatever the architecture.
            continue
        if isinstance(block, PtrBlock):
            stub_obs(block, golds, ks, out, arch)
        retrieval_obs(arch, block.unique_retrieved, golds, ks, out, record.grades)
        tops[arch] = block.top(k)
        if plan is not None and plan.usable:
            planner_obs(arch, plan, tops[arch], golds, k, out)
            plans[arch] = plan
    if "rtp" in tops and "ptr" in tops:
        rtp, ptr = record.rtp, record.ptr
        assert rtp is not None and ptr is not None
        for kk in ks:
            out[("both", Metric.DIVERGENT, kk, None)] = (float(set(rtp.top(kk)) != set(ptr.top(kk))), 1.0)
            for gold_name in GOLDS:
                a, b = out.get(("rtp", Metric.RECALL, kk, gold_name)), out.get(("ptr", Metric.RECALL, kk, gold_name))
                if a is not None and b is not None:
                    # Per (model, run): which architecture recalled more of this query's gold.
                    out[("both", Metric.RECALL_WIN_RTP, kk, gold_name)] = (float(a[0] > b[0]), 1.0)
                    out[("both", Metric.RECALL_WIN_PTR, kk, gold_name)] = (float(b[0] > a[0]), 1.0)
                    out[("both", Metric.RECALL_TIE, kk, gold_name)] = (float(a[0] == b[0]), 1.0)
        if "rtp" in plans and "ptr" in plans:
            sel_r = set(plans["rtp"].unique_selected)
            sel_p = set(plans["ptr"].unique_selected)
            # Both empty = the same (empty) intended trajectory, hence 1.0; `both_refused` shows how often.
            union = sel_r | sel_p
            out[("both", Metric.JACCARD_SELECTED, k, None)] = (len(sel_r & sel_p) / len(union) if union else 1.0, 1.0)
            out[("both", Metric.BOTH_REFUSED, k, None)] = (float(not sel_r and not sel_p), 1.0)
    return out


def unique_ratio(distinct: int, total: int) -> float | None:
    """Unique% = distinct stub names / all stub names (counted over a run); None without stubs."""
    return distinct / total if total else None
