"""The metric definitions (analysis/metric_defs.py) against what the analyses compute and save: every metric a
record yields or a summary row names is defined, keyed by the k and gold set its definition says, summed as it
says; the saved names are the ones older output folders hold."""

from __future__ import annotations

import helpers.records as F
import pytest

from evaluator.analysis import stats
from evaluator.analysis.metric_defs import (
    COUNT_METRICS,
    NWAY_METRICS,
    PAIRED_METRICS,
    RANK_METRICS,
    RETRIEVAL_METRICS,
    TOKENS_OF_CALL,
    Aggregate,
    AtK,
    Metric,
    Spec,
    spec,
    tokens_metric,
)
from evaluator.analysis.metrics import record_obs
from evaluator.results.schema import FAILURE_KINDS, as_records

KS, K = (1, 3, 5, 10, 20), 5

# The names summary.json, scaling.json and routing.json hold (and the viewer reads): renaming one is a change of
# the saved format (results/migrate.py), not a refactoring.
SAVED_NAMES = {
    "recall", "precision", "miss", "ndcg", "mrr", "comp", "pass", "selection_rate", "fidelity", "plan_steps",
    "apis_named", "miss_wrong_tool", "miss_refused", "tokens_total", "tokens", "gen", "stubs_per_query",
    "stub_unique", "stub_match", "stub_cos_correct", "stub_cos_incorrect", "width", "n_queries",
    "planner_parse_error", "planner_llm_error", "planner_truncated", "discovery_parse_error", "discovery_llm_error",
    "discovery_truncated", "fallback", "own_call_error", "failed_arch_error", "failed_contract", "failed_timeout",
    "failed_cycle", "divergent", "disjoint", "recall_win_rtp", "recall_win_ptr", "recall_tie", "wins", "ties",
    "jaccard_selected", "both_refused",
}


def _defined(name: str) -> bool:
    return name in SAVED_NAMES or (name.startswith("tokens_") and name.endswith(("_prompt", "_completion")))


def _spec_of(name: str) -> Spec:
    """The definition of a row's metric, as the viewer reads it back from summary.json (a plain name)."""
    return Metric.named(name).spec if name in SAVED_NAMES else TOKENS_OF_CALL


@pytest.fixture(scope="module")
def raw() -> list[dict]:
    recs = F.study(("sim",), runs=2)
    # a block whose own call failed, one whose architecture failed: their counts are metrics too
    recs[0]["ptr"]["errors"] = {"discovery": "HTTP 500"}
    recs[1]["ptr"]["failure"] = {"kind": "timeout", "error": "past 300 s"}
    return recs


def test_the_saved_names_are_those_of_older_output_folders() -> None:
    assert {m.value for m in Metric} == SAVED_NAMES
    assert all(type(m.value) is str and str(m) == m.value and f"{m}" == m.value for m in Metric)
    assert tokens_metric("planner", "prompt") == "tokens_planner_prompt"


def test_every_metric_a_record_yields_is_defined_and_keyed_as_its_definition_says(raw: list[dict]) -> None:
    seen = set()
    for rec in as_records(raw):
        for (_arch, metric, k, gold) in record_obs(rec, KS, K):
            assert _defined(metric), metric
            d = spec(metric)
            assert (k is None) == (d.k is AtK.NONE), (metric, k)
            assert d.k is not AtK.MAIN or k == K, (metric, k)
            assert d.k is not AtK.EACH or k in KS, (metric, k)
            assert (gold is not None) == d.gold, (metric, gold)
            assert d.retrieval or metric not in RETRIEVAL_METRICS
            seen.add(metric)
    # the fixture reaches every kind of metric: retrieval, rank, planner, stubs, tokens, counts, RtP vs PtR
    assert {Metric.RECALL, Metric.NDCG, Metric.PASS, Metric.STUB_MATCH, Metric.TOKENS_TOTAL, Metric.OWN_CALL_ERROR,
            Metric.FAILED_TIMEOUT, Metric.DIVERGENT, Metric.JACCARD_SELECTED} <= seen
    assert tokens_metric("discovery", "completion") in seen and spec(tokens_metric("x", "prompt")) is TOKENS_OF_CALL


def test_summary_rows_are_made_as_each_definition_says(raw: list[dict]) -> None:
    s = stats.summarize(as_records(raw), KS, K)
    assert s.rows
    for r in s.rows:
        assert _defined(r.metric), r.metric
        d = _spec_of(r.metric)
        if d.aggregate is Aggregate.SUM:  # a count: whole numbers per run
            assert all(v == int(v) for v in r.values), r
        if r.arch == "rtp" and r.metric in RETRIEVAL_METRICS:  # deterministic retrieval: one value, no model
            assert r.model is None and len(r.values) == 1
    derived = {r.metric for r in s.rows if _spec_of(r.metric).aggregate is Aggregate.DERIVED}
    assert derived == {Metric.STUB_UNIQUE, Metric.WINS, Metric.TIES}
    # the failed block and the block with a failed own call are counted, under their definitions' names
    failed = s.row("sim", raw[1]["subset"], "ptr", Metric.failed("timeout"))
    own = s.row("sim", raw[0]["subset"], "ptr", Metric.OWN_CALL_ERROR)
    assert failed is not None and sum(failed.values) == 1 and own is not None and sum(own.values) == 1


def test_the_groups_are_derived_from_the_definitions() -> None:
    assert RANK_METRICS == (Metric.NDCG, Metric.MRR, Metric.COMP)
    assert NWAY_METRICS == (Metric.RECALL, Metric.PRECISION, Metric.NDCG, Metric.MRR, Metric.COMP, Metric.PASS)
    assert {Metric.RECALL, Metric.PRECISION, Metric.PASS} == PAIRED_METRICS
    assert {Metric.RECALL, Metric.PRECISION, Metric.MISS, Metric.NDCG, Metric.MRR, Metric.COMP} == RETRIEVAL_METRICS
    assert {Metric.failed(kind) for kind in FAILURE_KINDS} <= COUNT_METRICS
    assert [Metric.failed(kind).value for kind in FAILURE_KINDS] == [f"failed_{kind}" for kind in FAILURE_KINDS]
    # the tables bold the best of the metrics compared side by side: each says which way is better
    assert all(m.spec.higher_is_better for m in NWAY_METRICS)
    assert all(m.spec.label and m.spec.counts and m.spec.counts in (m.__doc__ or "") for m in Metric)
    assert all(Metric.named(m.value) is m for m in Metric)
    with pytest.raises(KeyError):
        Metric.named("recal")
