"""The N-way comparison of architectures (analysis.compare): on records holding four architectures, every
pair's paired Wilcoxon p equals scipy's on per-query values computed here from the raw lists, Holm's
adjustment equals statsmodels' (and a case worked by hand), Friedman equals scipy's, and the paper's
RtP-vs-PtR tests are untouched by the extra architectures."""

from __future__ import annotations

import gc
import itertools
import math
from collections import defaultdict

import pytest
from helpers import records as F
from helpers.records import EXTRA, with_extra_archs
from scipy import stats as sps

from evaluator.analysis import compare, stats
from evaluator.analysis.main_study import main_study
from evaluator.results.schema import Meta, as_records


@pytest.fixture(scope="module")
def recs() -> list[dict]:
    return with_extra_archs(F.study(("sim",), runs=3))


@pytest.fixture(scope="module")
def summary(recs: list[dict]) -> stats.Summary:
    return stats.summarize(as_records(recs))


@pytest.fixture(scope="module")
def comparison(summary: stats.Summary) -> compare.Comparison:
    return compare.architectures(summary, 5)


def run_averaged_recall(recs: list[dict], arch: str, subset: str, gold: str, k: int = 5) -> dict[int, float]:
    """Independently of the evaluator: per query, recall@k averaged over runs (RtP: its one list)."""
    vals: dict[int, list[float]] = defaultdict(list)
    seen = set()
    for r in recs:
        if r["subset"] != subset:
            continue
        block = r[arch] if arch in ("rtp", "ptr") else r["archs"][arch]
        if arch == "ptr" and block.get("discovery_llm_error"):
            continue  # excluded: no stubs to judge
        if arch == "rtp":
            if r["query_id"] in seen:
                continue
            seen.add(r["query_id"])
        g = set(r["gold"][gold])
        vals[r["query_id"]].append(len(set(block["retrieved"][:k]) & g) / len(g))
    return {q: sum(v) / len(v) for q, v in vals.items()}


def test_every_pair_of_four_architectures_is_tested(summary, comparison) -> None:
    assert summary.archs == ["rtp", "ptr", "hyde", "fusion"]
    pairs = comparison.pairs_of("sim", "G1_instruction", "recall", "api_list")
    assert {(p.a, p.b) for p in pairs} == set(itertools.combinations(summary.archs, 2))
    assert {p.metric for p in comparison.pairs} == {"recall", "precision", "ndcg", "mrr", "comp", "pass"}


def test_pairwise_wilcoxon_matches_scipy_on_values_computed_from_the_lists(recs, comparison) -> None:
    for subset, gold in (("G1_instruction", "api_list"), ("G2_instruction", "relevant")):
        for p in comparison.pairs_of("sim", subset, "recall", gold):
            x, y = run_averaged_recall(recs, p.a, subset, gold), run_averaged_recall(recs, p.b, subset, gold)
            common = sorted(x.keys() & y.keys())
            d = [round(x[q] - y[q], 9) for q in common]
            nz = [abs(v) for v in d if v]
            assert p.n == len(common)
            assert p.mean_a == pytest.approx(sum(x[q] for q in common) / len(common))
            assert p.wins_a == sum(x[q] > y[q] + 1e-12 for q in common)
            method = "exact" if len(set(nz)) == len(nz) and len(nz) <= 50 else "approx"
            assert p.pvalue == pytest.approx(sps.wilcoxon(d, zero_method="wilcox", method=method).pvalue)


def test_the_rtp_ptr_pair_is_the_papers_wilcoxon_test(summary, comparison) -> None:
    for subset in summary.subsets:
        for metric, gold in (("recall", "api_list"), ("precision", "relevant"), ("pass", None)):
            paper = summary.test("sim", subset, metric, 5, gold, "wilcoxon")
            pair = next(p for p in comparison.pairs_of("sim", subset, metric, gold) if (p.a, p.b) == ("rtp", "ptr"))
            assert paper is not None and pair.pvalue == paper.pvalue and pair.n == paper.n


def test_holm_equals_statsmodels_and_a_case_by_hand(comparison, monkeypatch) -> None:
    # by hand: p = .01, .04, .03, .005 -> sorted .005 .01 .03 .04 times 4 3 2 1 = .02 .03 .06 .04 -> running max
    assert compare.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert compare.holm([0.5, None, float("nan"), 0.6]) == [pytest.approx(1.0), None, None, pytest.approx(1.0)]
    multipletests = pytest.importorskip("statsmodels.stats.multitest").multipletests
    # its Holm branch calls gc.collect() on every call: a full collection of the worker's heap (torch and the rest,
    # loaded by the tests before) each time, ~10 s over these families; the values do not depend on it
    monkeypatch.setattr(gc, "collect", lambda *_a, **_k: 0)
    families = defaultdict(list)
    for p in comparison.pairs:
        families[(p.subset, p.metric, p.gold)].append(p)
    checked = 0
    for fam in families.values():
        defined = [p for p in fam if p.pvalue is not None]
        if len(defined) < 2:
            continue
        ref = multipletests([p.pvalue for p in defined], method="holm")[1]
        assert [p.p_holm for p in defined] == pytest.approx(list(ref))
        assert all(p.stars == stats.stars(p.p_holm) for p in defined)
        checked += 1
    assert checked >= 10


def test_friedman_matches_scipy(recs, comparison) -> None:
    f = comparison.friedman_of("sim", "G1_instruction", "recall", "api_list")
    assert f is not None and f.archs == ["rtp", "ptr", "hyde", "fusion"]
    cols = [run_averaged_recall(recs, a, "G1_instruction", "api_list") for a in f.archs]
    common = sorted(set.intersection(*(set(c) for c in cols)))
    ref = sps.friedmanchisquare(*[[c[q] for q in common] for c in cols])
    assert f.n == len(common) and f.statistic == pytest.approx(ref.statistic) and f.pvalue == pytest.approx(ref.pvalue)
    # two architectures: no Friedman test; identical columns: undefined, not an error
    assert compare.friedman([[1.0, 0.5], [0.0, 0.5]]) == (pytest.approx(math.nan, nan_ok=True),) * 2
    assert all(math.isnan(v) for v in compare.friedman([[0.5, 1.0, 0.0]] * 3))


def test_extra_architectures_leave_the_papers_rows_and_tests_alone(recs, summary) -> None:
    plain = stats.summarize(as_records([{k: v for k, v in r.items() if k != "archs"} for r in recs]))
    only = [r for r in summary.rows if r.arch not in EXTRA]
    assert [(r.model, r.subset, r.arch, r.metric, r.k, r.gold, r.values) for r in only] == [
        (r.model, r.subset, r.arch, r.metric, r.k, r.gold, r.values) for r in plain.rows]
    assert summary.tests == plain.tests
    # every architecture has its rows, NDCG/MRR/COMP included
    for arch in EXTRA:
        for metric in ("recall", "precision", "ndcg", "mrr", "comp", "pass"):
            assert summary.row("sim", "G1_instruction", arch, metric, 5, None if metric == "pass" else "api_list")
    # summary.json gains `comparisons` only with three architectures or more
    meta = Meta(k=5, ks=[1, 3, 5, 10, 20], runs=3)
    assert main_study(as_records([{k: v for k, v in r.items() if k != "archs"} for r in recs]), meta).comparison is None
    # the viewer's one pair of a two-architecture run: the paper's Wilcoxon tests at k, as summary.json keeps them
    two = compare.from_paper_tests(plain.tests, 5)
    assert two is not None and {(p.a, p.b) for p in two.pairs} == {("rtp", "ptr")} and not two.friedman
    assert all(p.p_holm == p.pvalue for p in two.pairs) and compare.comparison_dict(two) is None
    res = main_study(as_records(recs), meta)
    assert res.comparison is not None
    d = stats.summary_dict(res.summary, {}, compare.comparison_dict(res.comparison))
    assert d["comparisons"]["archs"] == summary.archs and len(d["comparisons"]["pairs"]) == len(res.comparison.pairs)


def test_a_four_architecture_folder_renders_every_architecture(recs, tmp_path) -> None:
    """report.md, summary.json, the figures and the viewer's data of a folder whose records hold four
    architectures: each shows all four; the pairs and Friedman come from analysis.compare."""
    import json
    import re

    from evaluator.app.outputs import render_outputs
    from evaluator.results.schema import OutputDir

    out = F.write_out(tmp_path / "out", recs, F.meta(("sim",), runs=3))
    render_outputs(OutputDir(out))
    report = (out / "report.md").read_text(encoding="utf-8")
    for title in ("Table N1: Architectures compared", "Table N2: Every pair of architectures",
                  "Table N3: All architectures at once"):
        assert report.count(title) == 2  # once per gold set
    n1 = report[report.index("Table N1"):report.index("Table N2")]
    assert all(f"| {a} |" in n1 for a in ("RtP", "PtR", "hyde", "fusion"))
    n2 = report[report.index("Table N2"):report.index("Table N3")]
    assert "| hyde | fusion |" in n2 and "| RtP | PtR |" in n2
    assert "Recall hyde" not in report and "G1_instruction hyde" in report  # Table 1's columns take every arch
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["comparisons"]["archs"] == ["rtp", "ptr", "hyde", "fusion"]
    assert {(p["a"], p["b"]) for p in summary["comparisons"]["pairs"]} == set(
        itertools.combinations(["rtp", "ptr", "hyde", "fusion"], 2))
    assert (out / "figures" / "architectures_sim.png").read_bytes().startswith(b"\x89PNG")
    page = (out / "view.html").read_text(encoding="utf-8")
    data = json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S).group(1))
    assert data["datasets"][0]["archs"] == ["rtp", "ptr", "hyde", "fusion"]
    assert all(set(r["blocks"]) == {"hyde", "fusion"} and r["archs"] == ["rtp", "ptr", "hyde", "fusion"]
               for r in data["records"])
    tests = data["datasets"][0]["arch_tests"]
    assert {(t["a"], t["b"]) for t in tests} == {(p["a"], p["b"]) for p in summary["comparisons"]["pairs"]}
