"""Comparisons: architectures against each other (N-way), and one run's side against another's (the viewer).

Architectures (`architectures`), per (model, subset, metric, gold) at the main k, on the run-averaged
per-query values the summary collected (`Summary.per_query`, the values the paper's Wilcoxon test ranks):
- every pair of architectures: the paired Wilcoxon signed-rank test (`stats.wilcoxon_paired`: exact
  differences, scipy's `zero_method="wilcox"`), its p adjusted with Holm's step-down correction over the
  pairs of that group (the family: one metric, subset, gold and model; an undefined p leaves the family);
- all of them at once: Friedman's test (`scipy.stats.friedmanchisquare`) on the queries every architecture
  has; it needs three architectures or more.
RtP's retrieval metrics need no LLM, so they are paired from its one deterministic value per query
(model null), as the paper's tests pair them. The paper's RtP-vs-PtR tests (`stats`) are unchanged.

Sides (`side_values`, `metric_deltas`): the viewer's comparison of runs: run-averaged per-query values of a
side's records, and per metric the means of two sides on their shared queries with a paired Wilcoxon test.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any, TypeVar

from evaluator.analysis import stats
from evaluator.analysis.metric_defs import NWAY_METRICS, RETRIEVAL_METRICS, Metric
from evaluator.analysis.metrics import Obs, record_obs
from evaluator.results.schema import GOLDS, Record, qid_key

Q = TypeVar("Q", bound=Hashable)  # a query's key


@dataclass(frozen=True)
class PairTest:
    """Architecture `a` against `b` on one metric: run-averaged per-query values, paired over queries."""

    model: str | None
    subset: str
    metric: str  # a `Metric` as saved
    k: int
    gold: str | None
    a: str
    b: str
    n: int  # paired queries
    mean_a: float | None
    mean_b: float | None
    wins_a: int  # queries where a's value is higher
    wins_b: int
    statistic: float | None  # Wilcoxon's W
    pvalue: float | None
    p_holm: float | None  # Holm-adjusted over the pairs of this (model, subset, metric, gold)
    stars: str  # of p_holm


@dataclass(frozen=True)
class FriedmanTest:
    """All architectures at once on one metric (the queries every one of them has)."""

    model: str | None
    subset: str
    metric: str  # a `Metric` as saved
    k: int
    gold: str | None
    archs: list[str]
    n: int
    statistic: float | None
    pvalue: float | None
    stars: str


@dataclass
class Comparison:
    """The N-way comparison of a study's architectures (summary.json's `comparisons` with three or more)."""

    archs: list[str]
    k: int
    pairs: list[PairTest] = field(default_factory=list)
    friedman: list[FriedmanTest] = field(default_factory=list)

    def pairs_of(self, model: str | None, subset: str, metric: Metric, gold: str | None) -> list[PairTest]:
        return [p for p in self.pairs if (p.model, p.subset, p.metric, p.gold) == (model, subset, metric, gold)]

    def friedman_of(self, model: str | None, subset: str, metric: Metric, gold: str | None) -> FriedmanTest | None:
        return next((f for f in self.friedman if (f.model, f.subset, f.metric, f.gold) == (model, subset, metric, gold)),
                    None)


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (statsmodels' `multipletests(method="holm")`), in input order.
    Sorted ascending, the i-th of m defined p-values becomes max over j <= i of min(1, (m - j + 1) p_(j));
    an undefined p (None or NaN) stays undefined and does not count in m."""
    defined = sorted((p, i) for i, p in enumerate(pvalues) if p is not None and math.isfinite(p))
    m = len(defined)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for j, (p, i) in enumerate(defined):
        running = max(running, min(1.0, (m - j) * p))
        out[i] = running
    return out


def friedman(columns: Sequence[Sequence[float | Fraction]]) -> tuple[float, float]:
    """(chi², p) of Friedman's test, one column per architecture, rows = queries; NaN when undefined
    (fewer than three columns or two rows, or every query ties across all of them)."""
    if len(columns) < 3 or len(columns[0]) < 2:
        return math.nan, math.nan
    # each query's values on true equality (stats.TIE_TOLERANCE): tied architectures share their rank
    tol = stats.tie_scale(*columns)
    rows = [stats.tied_values(row, tol) for row in zip(*columns, strict=True)]
    cols = [list(c) for c in zip(*rows, strict=True)]
    if all(len({c[i] for c in cols}) == 1 for i in range(len(cols[0]))):
        return math.nan, math.nan  # no query ranks the architectures apart: chi² is 0/0
    from scipy.stats import friedmanchisquare  # heavy: loaded on the first test (see stats._sps)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            res = friedmanchisquare(*cols)
        except ValueError:
            return math.nan, math.nan
    return stats.finite_or_nan(res.statistic), stats.finite_or_nan(res.pvalue)


def _none(x: float) -> float | None:
    return None if math.isnan(x) else x


def _group_model(arch: str, metric: Metric, model: str | None) -> str | None:
    # RtP retrieval is deterministic: one value per query, kept with model null (stats.summarize)
    return None if arch == "rtp" and metric in RETRIEVAL_METRICS else model


def architectures(summary: stats.Summary, k: int, metrics: Iterable[Metric] = NWAY_METRICS) -> Comparison:
    """Every pair of the summary's architectures (Holm within each family) and Friedman across them, per model,
    subset, metric and gold at k."""
    archs = list(summary.archs)
    out = Comparison(archs, k)
    per_query = summary.per_query
    for model in summary.models:
        for subset in summary.subsets:
            for metric in metrics:
                for gold in (list(GOLDS) if metric.spec.gold else [None]):
                    means = {a: stats.query_means(v) for a in archs
                             if (v := per_query.get((_group_model(a, metric, model), subset, a, metric, k, gold)))}
                    present = [a for a in archs if a in means]
                    family = []
                    for a, b in itertools.combinations(present, 2):
                        x, y = means[a], means[b]
                        common = sorted(set(x) & set(y), key=qid_key)
                        if not common:
                            continue
                        xa, yb = [x[q] for q in common], [y[q] for q in common]
                        w, p = stats.wilcoxon_paired(xa, yb)
                        family.append((a, b, len(common), float(sum(xa) / len(xa)), float(sum(yb) / len(yb)),
                                       *stats.wins(xa, yb), _none(w), _none(p)))
                    adjusted = holm([f[8] for f in family])
                    out.pairs += [PairTest(model, subset, metric, k, gold, *f, p_holm=ph, stars=stats.stars(ph))
                                  for f, ph in zip(family, adjusted, strict=True)]
                    if len(present) >= 3:
                        common = sorted(set.intersection(*(set(means[a]) for a in present)), key=qid_key)
                        chi, p = friedman([[means[a][q] for q in common] for a in present]) if common else (
                            math.nan, math.nan)
                        out.friedman.append(FriedmanTest(model, subset, metric, k, gold, present, len(common),
                                                         _none(chi), _none(p), stats.stars(_none(p))))
    return out


# ---------------------------------------------------------------- sides (the viewer's comparison of runs)

SideKey = tuple[str, Metric, str | None]  # arch, metric, gold
# Metrics of the comparison of runs: (arch, metric, gold or None), all at each run's main k.
COMPARED: tuple[SideKey, ...] = (
    ("ptr", Metric.RECALL, "api_list"), ("ptr", Metric.RECALL, "relevant"), ("rtp", Metric.RECALL, "api_list"),
    ("rtp", Metric.RECALL, "relevant"), ("ptr", Metric.PRECISION, "api_list"), ("rtp", Metric.PRECISION, "api_list"),
    ("ptr", Metric.PASS, None), ("rtp", Metric.PASS, None))
QueryKey = tuple[str, tuple[int, int | str]]  # subset, the query id's sort key (schema.qid_key)


@dataclass(frozen=True)
class MetricDelta:
    """Side B against side A on one metric over their shared queries (the viewer's field names)."""

    subset: str  # "all" or one subset
    arch: str
    metric: str  # a `Metric` as saved
    gold: str | None
    n: int
    a: float
    b: float
    delta: float
    p: float | None  # paired Wilcoxon on the run-averaged per-query values
    stars: str


def side_values(recs: Iterable[tuple[Obs, Q]], k: int,
                compared: Sequence[SideKey] = COMPARED) -> dict[SideKey, dict[Q, Fraction]]:
    """Run-averaged per-query value (exact) of each compared metric of one side: `recs` = (observations of a
    record at k, its query's key)."""
    vals: dict[SideKey, dict[Q, list[float]]] = defaultdict(lambda: defaultdict(list))
    for obs, qi in recs:
        for arch, metric, gold in compared:
            if (o := obs.get((arch, metric, k, gold))) is not None:
                vals[(arch, metric, gold)][qi].append(o[0] / o[1])
    return {key: stats.query_means(v) for key, v in vals.items()}


def metric_deltas(a: Mapping[SideKey, Mapping[Q, Fraction]], b: Mapping[SideKey, Mapping[Q, Fraction]],
                  shared: Sequence[Q], subset_of: Callable[[Q], str],
                  compared: Sequence[SideKey] = COMPARED) -> list[MetricDelta]:
    """Per subset ("all" first) and compared metric: both sides' means on the shared queries, B − A, and the
    paired Wilcoxon p (six decimals, as the page shows them)."""
    out = []
    for subset in [None, *sorted({subset_of(q) for q in shared})]:
        qs = [q for q in shared if subset is None or subset_of(q) == subset]
        for key in compared:
            va, vb = a.get(key, {}), b.get(key, {})
            common = [q for q in qs if q in va and q in vb]
            if not common:
                continue
            x, y = [va[q] for q in common], [vb[q] for q in common]
            ma, mb = float(sum(x) / len(x)), float(sum(y) / len(y))
            p = _none(stats.wilcoxon_paired(x, y)[1])
            out.append(MetricDelta(subset or "all", key[0], key[1], key[2], len(common), round(ma, 6), round(mb, 6),
                                   round(mb - ma, 6), p, stats.stars(p)))
    return out


@dataclass
class RunPair:
    """Side `b` against side `a` (the first): the queries both have, and each compared metric's delta."""

    a: int
    b: int
    k: tuple[int, int]  # each side's main k
    shared: list[QueryKey]  # sorted
    only_a: int
    only_b: int
    metrics: list[MetricDelta]


@dataclass
class RunsComparison:
    """Every other side against the first (the viewer's comparison of runs)."""

    values: list[dict[SideKey, dict[QueryKey, Fraction]]]  # per side: run-averaged per-query values
    pairs: list[RunPair]


def query_key(r: Record) -> QueryKey:
    return (r.subset, qid_key(r.query_id))


def runs(sides: Sequence[tuple[Iterable[Record], int]]) -> RunsComparison | None:
    """Sides (each: its records, read once, and its main k) compared with the first; None with fewer than two."""
    if len(sides) < 2:
        return None
    qsets: list[set[QueryKey]] = [set() for _ in sides]

    def observed(recs: Iterable[Record], k: int, seen: set[QueryKey]) -> Iterator[tuple[Obs, QueryKey]]:
        for r in recs:
            seen.add(query_key(r))
            yield record_obs(r, ks=[k], k=k), query_key(r)

    values = [side_values(observed(recs, k, qsets[i]), k) for i, (recs, k) in enumerate(sides)]
    pairs = []
    for j in range(1, len(sides)):
        shared = sorted(qsets[0] & qsets[j])
        pairs.append(RunPair(0, j, (sides[0][1], sides[j][1]), shared, len(qsets[0] - qsets[j]),
                             len(qsets[j] - qsets[0]), metric_deltas(values[0], values[j], shared, lambda q: q[0])))
    return RunsComparison(values, pairs)


def comparison_dict(c: Comparison) -> dict[str, Any] | None:
    """summary.json's `comparisons` (the JSON shape of `Comparison`); None with two architectures, whose one
    pair is the paper's Wilcoxon test, already in `tests` (so a two-architecture summary.json is as before)."""
    return asdict(c) if len(c.archs) >= 3 else None


def from_paper_tests(tests: Iterable[stats.Test], k: int) -> Comparison | None:
    """The paper's RtP-vs-PtR Wilcoxon tests at k as the one pair of a two-architecture comparison (Holm over a
    family of one leaves p as it is); means and wins are in the summary's rows, not repeated here."""
    pairs = [PairTest(t.model, t.subset, t.metric, k, t.gold, "rtp", "ptr", t.n, None, None, 0, 0, t.statistic,
                      t.pvalue, t.pvalue, t.stars) for t in tests if t.test == "wilcoxon" and t.k == k]
    return Comparison(["rtp", "ptr"], k, pairs) if pairs else None
