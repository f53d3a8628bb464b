"""Per-query metrics from one `queries.jsonl` record (definitions in `../shared/STUDY.md`).

Every metric of a query is an observation `(num, den)`: the per-run aggregate of a metric is
`sum(num) / sum(den)` over the queries of the run. A plain per-query mean has `den = 1`; pooled ratios
(Match%, stub cosine) carry their own denominators; a metric that is undefined for a query (fidelity
when nothing was selected) is simply not observed, so it drops out of the mean. Count metrics (error
and fallback flags, `n_queries`) are summed instead; see `COUNT_METRICS`.

Observations are keyed by `MetricKey = (arch, metric, k, gold)`; `k` and `gold` are None where the
metric does not depend on them. `arch` is "rtp", "ptr" or "both" (cross-architecture).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

GOLDS: tuple[str, ...] = ("api_list", "relevant")
DEFAULT_KS: tuple[int, ...] = (1, 3, 5, 10, 20)
DEFAULT_K = 5

MetricKey = tuple[str, str, int | None, str | None]
Obs = dict[MetricKey, tuple[float, float]]

# Pure retrieval metrics of RtP need no LLM, so they are one deterministic value per query whatever
# the model or run: stats reports them once, with model = null.
RETRIEVAL_METRICS = frozenset({"recall", "precision", "miss"})
# Aggregated per run as a sum (how many), not as a ratio.
COUNT_METRICS = frozenset(
    {
        "n_queries",
        "planner_parse_error",
        "planner_llm_error",
        "discovery_parse_error",
        "discovery_llm_error",
        "fallback",
    }
)
# Paired per-query tests (Wilcoxon) and win/loss counts are run on these.
PAIRED_METRICS = frozenset({"recall", "precision", "pass"})


def _unique(items: Iterable[Any]) -> list[Any]:
    """Order-preserving dedupe; selections may repeat an API the planner names twice."""
    return list(dict.fromkeys(x for x in items if x is not None))


def _topk(block: Mapping[str, Any], k: int) -> list[str]:
    return _unique((block.get("retrieved") or [])[:k])


def retrieval_obs(arch: str, retrieved: Sequence[str], golds: Mapping[str, Sequence[str]], ks: Sequence[int],
                  out: Obs) -> None:
    """recall@k = |R∩G|/|G|, precision@k = |R∩G|/k (k nominal, as in the paper), miss = R∩G = ∅."""
    for gold_name, gold in golds.items():
        g = set(gold)
        if not g:  # recall undefined without a gold set; data validation should prevent this
            continue
        for k in ks:
            hits = len(set(retrieved[:k]) & g)
            out[(arch, "recall", k, gold_name)] = (hits / len(g), 1.0)
            out[(arch, "precision", k, gold_name)] = (hits / k, 1.0)
            out[(arch, "miss", k, gold_name)] = (float(hits == 0), 1.0)


def _plan_usable(plan: Mapping[str, Any] | None) -> bool:
    # A call that failed for good is an infrastructure outcome, not a planner decision: excluded.
    return plan is not None and not plan.get("llm_error")


def planner_obs(arch: str, plan: Mapping[str, Any], top: Sequence[str], golds: Mapping[str, Sequence[str]],
                k: int, out: Obs) -> None:
    """Planner metrics at the main k; `top` is the retrieved set the planner was shown."""
    selected = _unique(plan.get("selected") or [])
    r = set(top)
    inside = len(set(selected) & r)
    out[(arch, "pass", k, None)] = (float(bool(selected)), 1.0)
    if r:
        out[(arch, "selection_rate", k, None)] = (inside / len(r), 1.0)
    if selected:
        out[(arch, "fidelity", k, None)] = (inside / len(selected), 1.0)
    out[(arch, "plan_steps", k, None)] = (float(len(plan.get("steps") or [])), 1.0)
    out[(arch, "apis_named", k, None)] = (float(len(selected)), 1.0)
    for gold_name, gold in golds.items():
        if gold and not (r & set(gold)):
            # On a complete miss: a wrong tool (selected something) or a refusal; a parse error is neither.
            refused = not selected and not plan.get("parse_error")
            out[(arch, "miss_wrong_tool", k, gold_name)] = (float(bool(selected)), 1.0)
            out[(arch, "miss_refused", k, gold_name)] = (float(refused), 1.0)


def token_obs(arch: str, tokens: Mapping[str, Any] | None, k: int, out: Obs) -> None:
    """Per call type (`tokens_planner_prompt`, ...) and `tokens_total`, per query."""
    if not tokens:
        return
    total = 0.0
    for call, counts in sorted(tokens.items()):
        if not isinstance(counts, Mapping):
            continue
        for kind in ("prompt", "completion"):
            n = float(counts.get(kind) or 0)
            total += n
            out[(arch, f"tokens_{call}_{kind}", k, None)] = (n, 1.0)
    out[(arch, "tokens_total", k, None)] = (total, 1.0)


def stub_obs(ptr: Mapping[str, Any], golds: Mapping[str, Sequence[str]], ks: Sequence[int], out: Obs) -> None:
    """Gen%, stubs/query, Match% and stub-to-top-1 cosine (pooled over stubs), search width."""
    stubs = ptr.get("stubs") or []
    out[("ptr", "gen", None, None)] = (float(bool(stubs)), 1.0)
    out[("ptr", "stubs_per_query", None, None)] = (float(len(stubs)), 1.0)
    hits = ptr.get("stub_hits") or []
    scores = ptr.get("stub_scores") or []
    # (top-1 id, its cosine) per stub that retrieved anything; a missing score leaves the cosine out.
    tops: list[tuple[str, float | None]] = []
    for i, h in enumerate(hits):
        if h:
            s = scores[i] if i < len(scores) and scores[i] else None
            tops.append((h[0], float(s[0]) if s else None))
    for gold_name, gold in golds.items():
        g = set(gold)
        if not g or not tops:
            continue
        correct = [c for t, c in tops if t in g]
        wrong = [c for t, c in tops if t not in g]
        out[("ptr", "stub_match", None, gold_name)] = (float(len(correct)), float(len(tops)))
        cos_ok = [c for c in correct if c is not None]
        cos_bad = [c for c in wrong if c is not None]
        if cos_ok:
            out[("ptr", "stub_cos_correct", None, gold_name)] = (sum(cos_ok), float(len(cos_ok)))
        if cos_bad:
            out[("ptr", "stub_cos_incorrect", None, gold_name)] = (sum(cos_bad), float(len(cos_bad)))
    width = ptr.get("width") or {}
    for k in ks:
        w = width.get(str(k), width.get(k)) if isinstance(width, Mapping) else None
        if w is not None:
            out[("ptr", "width", k, None)] = (float(w), 1.0)


def record_obs(record: Mapping[str, Any], ks: Sequence[int] = DEFAULT_KS, k: int = DEFAULT_K) -> Obs:
    """All per-query observations of one record, both architectures and cross-architecture."""
    ks = sorted(set(ks) | {k})
    golds = {g: (record.get("gold") or {}).get(g) or [] for g in GOLDS}
    out: Obs = {}
    tops: dict[str, list[str]] = {}
    plans: dict[str, Mapping[str, Any]] = {}
    for arch in ("rtp", "ptr"):
        block = record.get(arch)
        if not block:
            continue
        out[(arch, "n_queries", None, None)] = (1.0, 1.0)
        plan = block.get("plan")
        token_obs(arch, block.get("tokens"), k, out)
        if plan is not None:
            out[(arch, "planner_parse_error", None, None)] = (float(bool(plan.get("parse_error"))), 1.0)
            out[(arch, "planner_llm_error", None, None)] = (float(bool(plan.get("llm_error"))), 1.0)
        if arch == "ptr":
            for flag in ("discovery_parse_error", "discovery_llm_error", "fallback"):
                out[(arch, flag, None, None)] = (float(bool(block.get(flag))), 1.0)
            if block.get("discovery_llm_error"):
                continue  # no stubs to judge: PtR retrieval and planning are excluded for this query
            stub_obs(block, golds, ks, out)
        retrieved = _unique(block.get("retrieved") or [])
        retrieval_obs(arch, retrieved, golds, ks, out)
        tops[arch] = _topk(block, k)
        if _plan_usable(plan):
            assert plan is not None
            planner_obs(arch, plan, tops[arch], golds, k, out)
            plans[arch] = plan
    if "rtp" in tops and "ptr" in tops:
        rtp, ptr = record["rtp"], record["ptr"]
        for kk in ks:
            out[("both", "divergent", kk, None)] = (float(set(_topk(rtp, kk)) != set(_topk(ptr, kk))), 1.0)
            for gold_name in GOLDS:
                a, b = out.get(("rtp", "recall", kk, gold_name)), out.get(("ptr", "recall", kk, gold_name))
                if a is not None and b is not None:
                    # Per (model, run): which architecture recalled more of this query's gold.
                    out[("both", "recall_win_rtp", kk, gold_name)] = (float(a[0] > b[0]), 1.0)
                    out[("both", "recall_win_ptr", kk, gold_name)] = (float(b[0] > a[0]), 1.0)
                    out[("both", "recall_tie", kk, gold_name)] = (float(a[0] == b[0]), 1.0)
        if "rtp" in plans and "ptr" in plans:
            a = set(_unique(plans["rtp"].get("selected") or []))
            b = set(_unique(plans["ptr"].get("selected") or []))
            # Both empty = the same (empty) intended trajectory, hence 1.0; `both_refused` shows how often.
            out[("both", "jaccard_selected", k, None)] = (len(a & b) / len(a | b) if a | b else 1.0, 1.0)
            out[("both", "both_refused", k, None)] = (float(not a and not b), 1.0)
    return out


def stub_names(record: Mapping[str, Any]) -> list[str]:
    """Normalised stub names of a record (for Unique%, a per-run, per-subset ratio)."""
    ptr = record.get("ptr") or {}
    if ptr.get("discovery_llm_error"):
        return []
    return [str(s.get("name") or "").strip().lower() for s in ptr.get("stubs") or [] if isinstance(s, Mapping)]


def unique_ratio(names: Sequence[str]) -> float | None:
    """Unique% = distinct stub names / all stub names; None without stubs."""
    return len(set(names)) / len(names) if names else None
