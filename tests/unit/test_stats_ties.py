"""Paired tests decide ties on the values' true equality, for irrational metrics too (`stats.TIE_TOLERANCE`).

A study of three architectures whose NDCG@5 values are equal by different sums (1/log2(3) and its kin summed one
way for one query and another way for the next, run averages of different lists): every pairwise Wilcoxon test,
win count and Friedman test equals scipy's on the same values computed in 60-digit decimal arithmetic, where
equal is equal. The former rule (each value rounded to a fraction of denominator <= 10^6) disagrees with that
reference on this study, so the test would catch it coming back."""

from __future__ import annotations

import math
import random
import warnings
from decimal import Decimal, getcontext
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats as sps

from evaluator.analysis import compare
from evaluator.analysis import stats as S
from evaluator.analysis.metric_defs import Metric
from evaluator.results.schema import as_records

K = 5
RUNS = 2
ARCHS = ("rtp", "ptr", "hyde")
getcontext().prec = 60
LN2 = Decimal(2).ln()


def _ndcg(ranked: list[str], gold: set[str]) -> Decimal:
    """NDCG@K (binary, trec_eval's ndcg_cut) in 60-digit decimals."""
    dcg = sum((LN2 / Decimal(i + 2).ln() for i, d in enumerate(ranked[:K]) if d in gold), Decimal(0))
    idcg = sum((LN2 / Decimal(i + 2).ln() for i in range(min(len(gold), K))), Decimal(0))
    return dcg / idcg


def _block(ids: list[str], ptr: bool = False) -> dict:
    b = {"retrieved": ids, "scores": [1.0 - i / 10 for i in range(len(ids))], "plan": None, "tokens": {}}
    return {**b, "stubs": []} if ptr else b


def _study(seed: int, n: int = 60) -> tuple[list, dict[str, dict[int, Decimal]]]:
    """Records of `n` queries x RUNS runs (RtP's list the same in every run), and each architecture's run-averaged
    NDCG@K per query in decimals."""
    rng = random.Random(seed)
    docs = [f"T::a{i}" for i in range(12)]
    recs, truth = [], {a: {} for a in ARCHS}
    for q in range(n):
        gold = rng.sample(docs, rng.choice([1, 2, 3]))
        rtp = rng.sample(docs, 8)
        sums = {a: Decimal(0) for a in ARCHS}
        for run in range(RUNS):
            lists = {"rtp": rtp, "ptr": rng.sample(docs, 8), "hyde": rng.sample(docs, 8)}
            recs.append({"model": "sim", "run": run, "subset": "s", "query_id": q, "query": f"q{q}",
                         "gold": {"api_list": gold, "relevant": gold},
                         "archs": {a: _block(lists[a], ptr=a == "ptr") for a in ARCHS}})
            for a in ARCHS:
                sums[a] += _ndcg(lists[a], set(gold))
        for a in ARCHS:
            truth[a][q] = sums[a] / RUNS
    return as_records(recs), truth


def _tied(values: list[Decimal]) -> np.ndarray:
    """Decimals as floats, equal ones (to 30 digits) as one float: the ties the data truly has."""
    first: dict[Decimal, float] = {}
    return np.array([first.setdefault(round(v, 30), float(v)) for v in values])


def _wilcoxon(d: np.ndarray) -> tuple[float, float]:
    if not np.any(d != 0):
        return math.nan, math.nan
    nz = np.abs(d[d != 0])
    method = "exact" if nz.size <= S.WILCOXON_EXACT_MAX_N and np.unique(nz).size == nz.size else "approx"
    res = sps.wilcoxon(d, zero_method="wilcox", method=method)
    return float(res.statistic), float(res.pvalue)


def _old_rule(x: list, y: list) -> tuple[float, float]:
    """The former rule: each value the nearest fraction of denominator <= 10^6."""
    d = np.array([float(Fraction(a).limit_denominator(10**6) - Fraction(b).limit_denominator(10**6))
                  for a, b in zip(x, y, strict=True)])
    return _wilcoxon(d)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pairwise_ndcg_tests_equal_scipy_on_truly_tied_values(seed: int) -> None:
    recs, truth = _study(seed)
    summary = S.summarize(recs, [K], K)
    comparison = compare.architectures(summary, K, metrics=[Metric.NDCG])
    pairs = comparison.pairs_of("sim", "s", "ndcg", "api_list")
    assert {(p.a, p.b) for p in pairs} == {("rtp", "ptr"), ("rtp", "hyde"), ("ptr", "hyde")}
    old_differs = 0
    for p in pairs:
        qs = sorted(truth[p.a])
        d = [truth[p.a][q] - truth[p.b][q] for q in qs]
        mags = _tied([abs(v) for v in d])
        ref = np.array([0.0 if round(v, 30) == 0 else math.copysign(m, v) for v, m in zip(d, mags, strict=True)])
        w, pv = _wilcoxon(ref)
        assert p.n == len(qs) and p.statistic == w and p.pvalue == pytest.approx(pv, rel=1e-12), (p.a, p.b)
        assert (p.wins_a, p.wins_b) == (int((ref > 0).sum()), int((ref < 0).sum()))
        # the float values themselves do not tie where the truth does: the tolerance is what makes them
        x, y = S.paired_values(summary.per_query, (None if p.a == "rtp" else "sim", "s", p.a, "ndcg", K, "api_list"),
                               ("sim", "s", p.b, "ndcg", K, "api_list"))
        old_differs += _old_rule(x, y)[0] != w
    assert old_differs, "this study should hold NDCG values equal by different sums"
    # Friedman across the three, each query's values tied as the truth ties them
    qs = sorted(truth["rtp"])
    rows = [_tied([truth[a][q] for a in ARCHS]) for q in qs]
    ref = sps.friedmanchisquare(*[[r[i] for r in rows] for i in range(len(ARCHS))])
    f = comparison.friedman_of("sim", "s", "ndcg", "api_list")
    assert f is not None and f.statistic == pytest.approx(ref.statistic, rel=1e-12)
    assert f.pvalue == pytest.approx(ref.pvalue, rel=1e-12)


def test_t_tests_see_truly_equal_runs_as_constant() -> None:
    # three runs whose mean is the same number reached by different float sums
    runs = [0.1 + 0.2, 0.3, 0.7 - 0.4]
    assert len(set(runs)) == 3 and all(abs(r - 0.3) < 1e-15 for r in runs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # scipy: "precision loss ... nearly identical"
        naive = sps.ttest_1samp(runs, 0.3)
    assert math.isfinite(naive.statistic)  # on the raw floats scipy finds a "difference"
    assert all(math.isnan(v) for v in S.ttest_one_sample(runs, 0.3))  # as scipy on the tied values: none
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert math.isnan(sps.ttest_1samp([0.3, 0.3, 0.3], 0.3).statistic)
    assert all(math.isnan(v) for v in S.ttest_two_sample(runs, [0.3, 0.3]))
    t, p = S.ttest_two_sample(runs, [0.5, 0.6])  # a real difference stands, as scipy computes it on tied values
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # one constant side: scipy says so, the pooled test stands
        ref = sps.ttest_ind([0.3, 0.3, 0.3], [0.5, 0.6])
    assert t == pytest.approx(ref.statistic, rel=1e-9) and p == pytest.approx(ref.pvalue, rel=1e-9)
