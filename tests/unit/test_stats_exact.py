"""The paired Wilcoxon test ranks exact differences, so mathematically tied differences are ties."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from scipy import stats as sps

from evaluator.analysis.stats import query_means, wilcoxon_paired


def _runs(numerators: list[int], denominator: int) -> list[float]:
    return [n / denominator for n in numerators]


def test_tied_run_averages_are_ties_and_match_an_exact_rational_reference() -> None:
    # Per query: RtP recall (one value, retrieval is deterministic) against PtR recall in 4 runs, with gold
    # sets of 3, 5, 6 and 7 APIs. Many queries have the same exact difference built from different floats.
    rng = np.random.default_rng(7)
    rtp: dict[int, list[float]] = {}
    ptr: dict[int, list[float]] = {}
    truth: list[Fraction] = []  # the true difference of each query, from the integers
    for q in range(60):
        g = int(rng.choice([3, 5, 6, 7]))
        a = int(rng.integers(0, g + 1))
        b = [int(x) for x in rng.integers(0, g + 1, size=4)]
        rtp[q] = [a / g]
        ptr[q] = _runs(b, g)
        truth.append(Fraction(a, g) - Fraction(sum(b), 4 * g))
    x_map, y_map = query_means(rtp), query_means(ptr)
    x = [x_map[q] for q in range(60)]
    y = [y_map[q] for q in range(60)]

    # The naive float path sees more distinct |differences| than there are true ones: spurious non-ties.
    naive = np.array([math.fsum(rtp[q]) / 1 - math.fsum(ptr[q]) / 4 for q in range(60)])
    assert len({abs(v) for v in truth if v}) < len(set(np.abs(naive[naive != 0])))

    # Reference: the same test on integers (differences scaled by a common denominator), where ties are exact.
    common = math.lcm(*(v.denominator for v in truth))
    ints = np.array([int(v * common) for v in truth])
    ref = sps.wilcoxon(ints, zero_method="wilcox", method="approx")
    w, p = wilcoxon_paired(x, y)
    assert w == ref.statistic
    assert p == ref.pvalue

    # Plain floats in, same answer: equal values tie whatever float stands for them.
    w2, p2 = wilcoxon_paired([float(v) for v in x], [float(v) for v in y])
    assert (w2, p2) == (w, p)


def test_all_tied_pairs_have_no_test() -> None:
    w, p = wilcoxon_paired([0.1 + 0.2, 1 / 3], [0.3, (0.1 * 10) / 3])
    assert math.isnan(w) and math.isnan(p)
