"""Aggregation and tests: scipy cross-checks, degenerate cases, RtP-once rows, order independence."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from helpers import records as F
from scipy import stats as sps

from evaluator.analysis import stats as S
from evaluator.render.fmt import format_p
from evaluator.results.schema import as_records, dumps


def summarize(recs: list[dict], *args: object) -> S.Summary:
    return S.summarize(as_records(recs), *args)  # records as queries.jsonl holds them


@pytest.fixture(scope="module")
def recs() -> list[dict]:
    return F.study(("sim", "other"), runs=4)


@pytest.fixture(scope="module")
def summary(recs: list[dict]) -> S.Summary:
    return summarize(recs)


def test_rtp_retrieval_once_with_model_null(summary: S.Summary) -> None:
    rtp = [r for r in summary.rows if r.arch == "rtp" and r.metric in ("recall", "precision", "miss")]
    assert rtp and all(r.model is None and len(r.values) == 1 and r.std is None for r in rtp)
    # planner metrics of RtP vary by model and run
    p = summary.row("sim", "G1_instruction", "rtp", "pass", 5)
    assert p is not None and len(p.values) == 4
    assert summary.checks.rtp_inconsistent_queries == 0


def test_mean_and_sample_std(summary: S.Summary) -> None:
    r = summary.row("sim", "G2_instruction", "ptr", "recall", 5, "api_list")
    assert r is not None and len(r.values) == 4
    assert r.mean == pytest.approx(statistics.fmean(r.values))
    assert r.std == pytest.approx(statistics.stdev(r.values))  # ddof = 1


def test_ttests_match_scipy(summary: S.Summary) -> None:
    for sub in ("G1_instruction", "G2_instruction"):
        rtp = summary.row(None, sub, "rtp", "recall", 5, "api_list")
        ptr = summary.row("sim", sub, "ptr", "recall", 5, "api_list")
        t = summary.test("sim", sub, "recall", 5, "api_list", "ttest_1samp")
        ref = sps.ttest_1samp(ptr.values, rtp.mean)
        assert t.pvalue == pytest.approx(ref.pvalue) and t.statistic == pytest.approx(ref.statistic)
        assert t.stars == S.stars(ref.pvalue) and t.n == 4

        a = summary.row("sim", sub, "rtp", "pass", 5)
        b = summary.row("sim", sub, "ptr", "pass", 5)
        t2 = summary.test("sim", sub, "pass", 5, None, "ttest_ind")
        ref2 = sps.ttest_ind(a.values, b.values)
        assert t2.pvalue == pytest.approx(ref2.pvalue) and t2.statistic == pytest.approx(ref2.statistic)


def test_wilcoxon_and_wins_by_hand(recs: list[dict], summary: S.Summary) -> None:
    sub, k, gold = "G2_instruction", 5, "api_list"

    def recall(block: dict, g: list[str]) -> float:
        return len(set(block["retrieved"][:k]) & set(g)) / len(set(g))

    rtp: dict[int, float] = {}
    ptr: dict[int, list[float]] = {}
    for r in recs:
        if r["subset"] != sub or r["model"] != "sim":
            continue
        rtp[r["query_id"]] = recall(r["rtp"], r["gold"][gold])
        if not r["ptr"]["discovery_llm_error"]:
            ptr.setdefault(r["query_id"], []).append(recall(r["ptr"], r["gold"][gold]))
    qs = sorted(set(rtp) & set(ptr))
    x = [rtp[q] for q in qs]
    y = [statistics.fmean(ptr[q]) for q in qs]
    t = summary.test("sim", sub, "recall", k, gold, "wilcoxon")
    assert t.n == len(qs)
    nz = [abs(a - b) for a, b in zip(x, y, strict=True) if a != b]
    method = "exact" if len(nz) <= S.WILCOXON_EXACT_MAX_N and len(set(nz)) == len(nz) else "approx"
    assert t.pvalue == pytest.approx(sps.wilcoxon(x, y, zero_method="wilcox", method=method).pvalue)
    assert summary.row("sim", sub, "rtp", "wins", k, gold).mean == sum(a > b for a, b in zip(x, y, strict=True))
    assert summary.row("sim", sub, "ptr", "wins", k, gold).mean == sum(b > a for a, b in zip(x, y, strict=True))


def test_degenerate_cases_give_nan() -> None:
    assert all(math.isnan(v) for v in S.ttest_one_sample([0.3], 0.2))
    assert all(math.isnan(v) for v in S.ttest_one_sample([0.3, 0.3, 0.3], 0.2))  # zero variance
    assert all(math.isnan(v) for v in S.ttest_two_sample([0.5, 0.5], [0.5, 0.5]))
    assert all(math.isnan(v) for v in S.ttest_two_sample([0.5], [0.4, 0.6]))
    assert all(math.isnan(v) for v in S.wilcoxon_paired([0.1, 0.2], [0.1, 0.2]))  # all differences zero
    assert all(math.isnan(v) for v in S.wilcoxon_paired([], []))
    assert S.stars(math.nan) == "" and format_p(math.nan) == "–" and format_p(None) == "–"
    assert [S.stars(p) for p in (0.0005, 0.005, 0.03, 0.2)] == ["***", "**", "*", "n.s."]
    assert format_p(0.0004) == "<0.001" and format_p(0.0217) == "0.022"


def test_single_run_summary_has_null_pvalues() -> None:
    s = summarize(F.study(("sim",), runs=1))
    t = s.test("sim", "G1_instruction", "recall", 5, "api_list", "ttest_1samp")
    assert t is not None and t.pvalue is None and t.stars == ""
    r = s.row("sim", "G1_instruction", "ptr", "recall", 5, "api_list")
    assert r.std is None and len(r.values) == 1
    text = dumps(S.summary_dict(s, {}), indent=1)
    assert "NaN" not in text


def test_order_independent(recs: list[dict], summary: S.Summary) -> None:
    shuffled = list(recs)
    random.Random(3).shuffle(shuffled)
    assert dumps(S.summary_dict(summarize(shuffled), {})) == dumps(S.summary_dict(summary, {}))


def test_rows_sorted_and_unique(summary: S.Summary) -> None:
    keys = [(r.model or "", r.subset, r.arch, r.metric, -1 if r.k is None else r.k, r.gold or "")
            for r in summary.rows]
    assert keys == sorted(keys) and len(keys) == len(set(keys))
    assert summary.row("sim", "G1_instruction", "ptr", "stub_unique") is not None
    assert summary.row("sim", "G1_instruction", "both", "jaccard_selected", 5) is not None
    assert summary.row("sim", "G1_instruction", "ptr", "n_queries").values == [14.0] * 4


def test_inconsistent_rtp_is_counted(recs: list[dict]) -> None:
    changed = [dict(r) for r in recs]
    changed[-1] = dict(changed[-1], rtp=dict(changed[-1]["rtp"], retrieved=["Z::z"] * 3))
    assert summarize(changed).checks.rtp_inconsistent_queries == 1
