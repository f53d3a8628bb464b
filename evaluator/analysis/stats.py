"""Aggregation over queries and runs, significance tests, and the tidy rows of `summary.json`.

Per run: the mean over queries (see `metrics` for the `(num, den)` convention). Across runs: mean and
sample standard deviation (ddof = 1; null with one run). RtP retrieval needs no LLM, so its rows have
`model = null` and a single value, computed once per query even when several models or runs carry the
same RtP block.

Tests (a separate `tests` list in summary.json, one entry per test):
- `ttest_1samp`: PtR's per-run means of precision/recall against the deterministic RtP value.
- `ttest_ind`: pass rate, RtP runs vs PtR runs (Student's two-sample test, equal variances, scipy default).
- `wilcoxon`: paired per-query signed-rank test on per-query values averaged over runs
  (`zero_method="wilcox"`: queries with equal values carry no sign and are dropped, scipy's default;
  exact null distribution for <= 50 untied differences, else the tie-corrected normal approximation).
Degenerate inputs (one run, zero variance, all differences zero) give NaN p-values, never an error.
"""

from __future__ import annotations

import functools
import math
import statistics
import warnings
from array import array
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
from pydantic.dataclasses import dataclass as pydantic_dataclass

from evaluator.analysis import metrics
from evaluator.analysis.metric_defs import (
    COUNT_METRICS,
    NWAY_METRICS,
    PAIRED_METRICS,
    RETRIEVAL_METRICS,
    Metric,
    MetricName,
)
from evaluator.results.schema import FORMAT_VERSION, Record, qid_key
from evaluator.results.stream import in_key_order


def _sps() -> Any:
    """scipy.stats, loaded on the first test computed: it is half of the command's start-up, which a
    retrieval-only run or `--help` never needs."""
    from scipy import stats

    return stats

GroupKey = tuple[str | None, str, str, MetricName, int | None, str | None]  # model, subset, arch, metric, k, gold


@dataclass(frozen=True)
class Row:
    model: str | None
    subset: str
    arch: str
    metric: str  # a `MetricName` as saved (summary.json's rows, read back by the viewer)
    k: int | None
    gold: str | None
    mean: float | None
    std: float | None
    values: list[float]


@dataclass(frozen=True)
class Test:
    model: str | None
    subset: str
    metric: str  # a `Metric` as saved
    k: int | None
    gold: str | None
    test: str  # "ttest_1samp" | "ttest_ind" | "wilcoxon"
    statistic: float | None
    pvalue: float | None
    stars: str
    n: int  # runs (t-tests: PtR runs) or paired queries (wilcoxon)


@pydantic_dataclass
class Checks:
    """summary.json's `checks`: record counts and the consistency check of the saved RtP lists."""

    records: int = 0
    queries_per_subset: dict[str, int] = field(default_factory=dict)
    rtp_inconsistent_queries: int = 0  # queries whose saved RtP lists differ between models or runs


@dataclass
class Summary:
    rows: list[Row]
    tests: list[Test]
    checks: Checks = field(default_factory=Checks)
    archs: list[str] = field(default_factory=list)  # architectures present, in the records' order (not saved)
    # Per group key: each query's per-run values of the paired metrics (the N-way tests' input, kept with three
    # architectures or more; not saved).
    per_query: Mapping[GroupKey, Mapping[Any, list[float]]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._rows = {(r.model, r.subset, r.arch, r.metric, r.k, r.gold): r for r in self.rows}
        self._tests = {(t.model, t.subset, t.metric, t.k, t.gold, t.test): t for t in self.tests}

    def row(self, model: str | None, subset: str, arch: str, metric: MetricName, k: int | None = None,
            gold: str | None = None) -> Row | None:
        return self._rows.get((model, subset, arch, metric, k, gold))

    def test(self, model: str | None, subset: str, metric: Metric, k: int | None, gold: str | None,
             test: str) -> Test | None:
        return self._tests.get((model, subset, metric, k, gold, test))

    @property
    def models(self) -> list[str]:
        return sorted({r.model for r in self.rows if r.model is not None})

    @property
    def subsets(self) -> list[str]:
        return sorted({r.subset for r in self.rows})


# ---------------------------------------------------------------- tests


def stars(p: float | None) -> str:
    """Paper's convention: * <.05, ** <.01, *** <.001, n.s. otherwise; '' when undefined."""
    if p is None or not math.isfinite(p):
        return ""
    if p < 0.001:
        return "***"
    if p < 0.01:
        return "**"
    if p < 0.05:
        return "*"
    return "n.s."


def finite_or_nan(x: Any) -> float:
    x = float(x)
    return x if math.isfinite(x) else math.nan


def ttest_one_sample(values: Sequence[float], popmean: float) -> tuple[float, float]:
    """(t, p); NaN with fewer than two runs or zero run-to-run variance (t would be ±inf). Runs whose values are
    equal (`TIE_TOLERANCE`) are equal: a sample of them is constant."""
    if len(values) < 2 or not math.isfinite(popmean):
        return math.nan, math.nan
    v = tied_values([*values, popmean], tie_scale(values, [popmean]))
    popmean, v = v[-1], v[:-1]
    if statistics.pvariance(v) == 0.0:
        return math.nan, math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = _sps().ttest_1samp(v, popmean)
    return finite_or_nan(res.statistic), finite_or_nan(res.pvalue)


def ttest_two_sample(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """(t, p) of Student's two-sample t-test; NaN when either side has < 2 runs or both are constant (values
    equal as `TIE_TOLERANCE` says)."""
    if len(a) < 2 or len(b) < 2:
        return math.nan, math.nan
    both = tied_values([*a, *b], tie_scale(a, b))
    a, b = both[: len(a)], both[len(a):]
    if statistics.pvariance(a) + statistics.pvariance(b) == 0.0:
        return math.nan, math.nan
    with warnings.catch_warnings():
        # one constant side is fine (the pooled variance is not zero) but scipy warns about its moments
        warnings.simplefilter("ignore", RuntimeWarning)
        res = _sps().ttest_ind(a, b)
    return finite_or_nan(res.statistic), finite_or_nan(res.pvalue)


WILCOXON_EXACT_MAX_N = 50

# Ties are decided on the values' true equality. Each per-query value is taken as the exact rational its float
# is, run averages and differences are computed exactly, and two values count as equal when they differ by at most
# TIE_TOLERANCE of the largest magnitude among the values compared (1e-9 of 1 for every metric of [0, 1]).
# Floating point leaves equal values apart by far less: averaging runs in another order, or NDCG's irrational
# terms (1/log2(3) summed one way for one query and another way for the next), differ by ~1e-16 (rounding the
# values to rationals of denominators up to 10^6, as before, left them ~1e-12 apart and untied). Distinct values
# of the study's metrics are far further apart: recall, precision and pass are ratios of small integers (at least
# 1/(gold size x k x runs)^2 apart), NDCG sums of at most k terms 1/log2(i + 1). The same rule ties the paired
# differences (zeros dropped, equal magnitudes share their rank), the win counts and the t-tests' constant samples.
TIE_TOLERANCE = 1e-9


@functools.lru_cache(maxsize=65536)
def exact(value: float | Fraction) -> Fraction:
    """The exact rational a per-query value (a float) is: sums and differences of them carry no rounding."""
    return Fraction(value)


def tie_scale(*groups: Sequence[float | Fraction]) -> Fraction:
    """What values are told apart against: the largest magnitude among them (1 when all are 0), times
    TIE_TOLERANCE."""
    top = max((abs(exact(v)) for g in groups for v in g), default=Fraction(0))
    return (top or Fraction(1)) * exact(TIE_TOLERANCE)


def tied_values(values: Sequence[float | Fraction], tol: Fraction) -> list[float]:
    """`values` as floats, each group of values within `tol` of its neighbour (in sorted order) replaced by the
    group's first: equal values become the same float, so a test sees exactly the ties the data has."""
    if not values:
        return []
    ex = [exact(v) for v in values]
    order = sorted(range(len(ex)), key=ex.__getitem__)
    out = [0.0] * len(ex)
    head = prev = ex[order[0]]
    for i in order:
        if ex[i] - prev > tol:
            head = ex[i]
        prev = ex[i]
        out[i] = float(head)
    return out


def differences(x: Sequence[float | Fraction], y: Sequence[float | Fraction]) -> list[float]:
    """The paired differences x - y on true equality: 0 where the two values tie, and equal magnitudes equal."""
    tol = tie_scale(x, y)
    d = [exact(a) - exact(b) for a, b in zip(x, y, strict=True)]
    nonzero = [abs(v) for v in d if abs(v) > tol]
    mags = iter(tied_values(nonzero, tol))
    return [0.0 if abs(v) <= tol else math.copysign(next(mags), v) for v in d]


def wins(x: Sequence[float | Fraction], y: Sequence[float | Fraction]) -> tuple[int, int]:
    """(pairs where x is higher, pairs where y is), ties (true equality, `TIE_TOLERANCE`) in neither."""
    d = differences(x, y)
    return sum(v > 0 for v in d), sum(v < 0 for v in d)


def wilcoxon_paired(x: Sequence[float | Fraction], y: Sequence[float | Fraction]) -> tuple[float, float]:
    """(W, p) of the paired signed-rank test on the differences' true values (`differences`); NaN when no pair
    differs."""
    d = np.array(differences(x, y), dtype=float)
    if d.size == 0 or not np.any(d != 0):
        return math.nan, math.nan
    nz = np.abs(d[d != 0])
    # scipy's "auto" falls back to a permutation test on small tied samples: slow, and randomised when the
    # sample is large enough. Exact distribution without ties, normal approximation (tie-corrected) with.
    method = "exact" if nz.size <= WILCOXON_EXACT_MAX_N and np.unique(nz).size == nz.size else "approx"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            res = _sps().wilcoxon(d, zero_method="wilcox", method=method)
    except ValueError:
        return math.nan, math.nan
    return finite_or_nan(res.statistic), finite_or_nan(res.pvalue)


# ---------------------------------------------------------------- aggregation


def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    mean = math.fsum(values) / len(values)
    return mean, (statistics.stdev(values) if len(values) >= 2 else None)


class ExactSum:
    """A sum of floats exact whatever their number and order, in bounded memory: up to `FOLD` values are kept
    (a C double each) and `value` is their `math.fsum`; past that they are folded into an integer in units
    of 2**-1074, every finite double being a whole number of those, and `value` divides it once, correctly
    rounded as fsum is, so the result is the same float either way. (Not every observation: that is memory
    per record, bench/README.md, "analysis/stats.py".)"""

    FOLD = 1024
    SCALE = 1 << 1074
    __slots__ = ("buf", "total", "folded", "special")

    def __init__(self) -> None:
        self.buf: array[float] = array("d")
        self.total = 0
        self.folded = False
        self.special = 0.0  # the sum of the infinities and NaNs folded (no integer holds them)

    def append(self, x: float) -> None:
        self.buf.append(x)
        if len(self.buf) >= self.FOLD:
            self._fold()

    def _fold(self) -> None:
        for x in self.buf:
            if not math.isfinite(x):
                self.special += x
                continue
            n, d = x.as_integer_ratio()
            self.total += n * (self.SCALE // d)
        self.buf = array("d")
        self.folded = True

    def value(self) -> float:
        if not self.folded:
            return math.fsum(self.buf)
        self._fold()
        return self.total / self.SCALE + self.special  # int / int: correctly rounded


class PerQuery(Mapping[GroupKey, Mapping[Any, list[float]]]):
    """Per group key, each query's per-run values, as `Mapping[key, {query id: [values]}]`: a C double and a
    query number per value, the per-query lists made when a key is read (one key at a time, by the tests).
    (Not lists in dicts: bench/README.md, "analysis/stats.py".)"""

    def __init__(self) -> None:
        self._qids: list[Any] = []
        self._number: dict[Any, int] = {}
        self._values: dict[GroupKey, tuple[array[float], array[int]]] = {}  # values, query numbers (int32)

    def add(self, key: GroupKey, qid: Any, value: float) -> None:
        n = self._number.get(qid)
        if n is None:
            n = self._number[qid] = len(self._qids)
            self._qids.append(qid)
        got = self._values.get(key)
        if got is None:
            got = self._values[key] = (array("d"), array("i"))
        got[0].append(value)
        got[1].append(n)

    def __getitem__(self, key: GroupKey) -> dict[Any, list[float]]:
        values, numbers = self._values[key]
        out: dict[Any, list[float]] = {}
        for v, n in zip(values, numbers, strict=True):
            out.setdefault(self._qids[n], []).append(v)
        return out

    def __iter__(self) -> Iterator[GroupKey]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


def summarize(records: Iterable[Record], ks: Sequence[int] = metrics.DEFAULT_KS,
              k: int = metrics.DEFAULT_K, *, ordered: bool = False) -> Summary:
    """Rows, tests and consistency checks from raw records (any order: they are sorted first, unless `ordered`
    says they come in record_key order; a stream over queries.jsonl, `results.stream.SavedRecords`, does), read
    once, one record at a time."""
    ks = sorted(set(ks) | {k})
    # Sorting plus exact sums make every aggregate independent of the order the pipeline wrote records in.
    recs = records if ordered else in_key_order(records)
    acc: dict[GroupKey, dict[int, tuple[ExactSum, ExactSum]]] = defaultdict(dict)
    per_query = PerQuery()
    # Per (model, subset, run): the distinct stub names and how many there were (Unique% needs no more)
    names: dict[tuple[str | None, str, int], tuple[set[str], list[int]]] = defaultdict(lambda: (set(), [0]))
    # Each query's RtP list, as a hash of its first record's, not the list (bench/README.md,
    # "analysis/stats.py")
    rtp_seen: dict[tuple[str, Any], int] = {}
    inconsistent = 0
    queries: dict[str, set[Any]] = defaultdict(set)
    arch_order: dict[str, None] = {}  # architectures in the order the records hold them
    n_records = 0

    for rec in recs:
        n_records += 1
        model, run, subset, qid = rec.model, rec.run, rec.subset, rec.query_id
        queries[subset].add(qid)
        obs = metrics.record_obs(rec, ks, k)
        arch_names = rec.arch_names
        nway = len(arch_names) >= 3
        for a in arch_names:
            arch_order.setdefault(a)
        first_rtp = True
        if rec.rtp is not None:
            ret = hash(tuple(rec.rtp.retrieved))
            prev = rtp_seen.get((subset, qid))
            if prev is None:
                rtp_seen[(subset, qid)] = ret
            else:
                first_rtp = False
                inconsistent += int(prev != ret)
        for (arch, metric, kk, gold), (num, den) in obs.items():
            m: str | None = model
            r = run
            if arch == "rtp" and metric in RETRIEVAL_METRICS:
                if not first_rtp:
                    continue  # deterministic: counted once per query
                m, r = None, 0
            key = (m, subset, arch, metric, kk, gold)
            sums = acc[key].get(r)
            if sums is None:
                sums = acc[key][r] = (ExactSum(), ExactSum())
            sums[0].append(num)
            sums[1].append(den)
            # the N-way comparison's further metrics only where it is made: a record of three architectures or more
            if metric in PAIRED_METRICS or (nway and kk == k and metric in NWAY_METRICS):
                per_query.add(key, qid, num / den)
        if rec.ptr is not None:
            distinct, count = names[(model, subset, run)]
            distinct.update(rec.ptr.stub_names)
            count[0] += len(rec.ptr.stub_names)

    rows: list[Row] = []
    for key, by_run in acc.items():
        metric = key[3]
        values: list[float] = []
        for r in sorted(by_run):
            nums, dens = by_run[r]
            if metric in COUNT_METRICS:
                values.append(nums.value())
            elif (d := dens.value()) > 0:
                values.append(nums.value() / d)
        if values:
            mean, std = mean_std(values)
            rows.append(Row(*key, mean=mean, std=std, values=values))

    unique: dict[tuple[str | None, str], list[float]] = defaultdict(list)
    for (model, subset, _run), (distinct, count) in sorted(names.items(),
                                                           key=lambda kv: (kv[0][0] or "", kv[0][1], kv[0][2])):
        if (u := metrics.unique_ratio(len(distinct), count[0])) is not None:
            unique[(model, subset)].append(u)
    for (model, subset), values in unique.items():
        mean, std = mean_std(values)
        rows.append(Row(model, subset, "ptr", Metric.STUB_UNIQUE, None, None, mean, std, values))

    summary = Summary(rows=rows, tests=[])
    extra_rows, tests = _tests_and_wins(summary, per_query, ks, k)
    rows.extend(extra_rows)
    rows.sort(key=_row_sort_key)
    tests.sort(key=lambda t: (t.model or "", t.subset, t.metric, t.k if t.k is not None else -1, t.gold or "", t.test))
    checks = Checks(records=n_records, queries_per_subset={s: len(q) for s, q in sorted(queries.items())},
                    rtp_inconsistent_queries=inconsistent)
    # the per-query values stay for the N-way comparison only (three architectures or more): a report of two
    # architectures holds no more than it did
    return Summary(rows=rows, tests=tests, checks=checks, archs=list(arch_order),
                   per_query=per_query if len(arch_order) >= 3 else PerQuery())


def _row_sort_key(r: Row) -> tuple[Any, ...]:
    return (r.model or "", r.subset, r.arch, r.metric, r.k if r.k is not None else -1, r.gold or "")


def query_means(values: Mapping[Any, list[float]]) -> dict[Any, Fraction]:
    # Exact run averages: the paired test and the win counts compare them (`differences`).
    return {q: _exact_mean(tuple(v)) for q, v in values.items() if v}


@functools.lru_cache(maxsize=65536)
def _exact_mean(values: tuple[float, ...]) -> Fraction:
    """Most queries repeat a few run patterns ((1.0, 1.0, 1.0, 1.0), ...): each is converted once (the
    Fraction arithmetic is most of the summary statistics' time: bench/README.md, "analysis/stats.py")."""
    return sum((exact(x) for x in values), Fraction(0)) / len(values)


def paired_values(per_query: Mapping[GroupKey, Mapping[Any, list[float]]], a: GroupKey,
                  b: GroupKey) -> tuple[list[Fraction], list[Fraction]]:
    """The run-averaged per-query values of two groups on the queries both have, in query order."""
    x, y = query_means(per_query.get(a, {})), query_means(per_query.get(b, {}))
    common = sorted(set(x) & set(y), key=qid_key)
    return [x[q] for q in common], [y[q] for q in common]


def _tests_and_wins(s: Summary, per_query: Mapping[GroupKey, Mapping[Any, list[float]]], ks: Sequence[int],
                    k: int) -> tuple[list[Row], list[Test]]:
    rows: list[Row] = []
    tests: list[Test] = []

    def add_test(model: str, subset: str, metric: Metric, kk: int | None, gold: str | None, name: str,
                 res: tuple[float, float], n: int) -> None:
        stat, p = res
        tests.append(Test(model, subset, metric, kk, gold, name, None if math.isnan(stat) else stat,
                          None if math.isnan(p) else p, stars(p), n))

    for model in s.models:
        for subset in s.subsets:
            for metric in (Metric.RECALL, Metric.PRECISION):
                for kk in ks:
                    for gold in metrics.GOLDS:
                        rtp = s.row(None, subset, "rtp", metric, kk, gold)
                        ptr = s.row(model, subset, "ptr", metric, kk, gold)
                        if rtp is None or ptr is None or rtp.mean is None:
                            continue
                        add_test(model, subset, metric, kk, gold, "ttest_1samp",
                                 ttest_one_sample(ptr.values, rtp.mean), len(ptr.values))
                        x, y = paired_values(per_query, (None, subset, "rtp", metric, kk, gold),
                                       (model, subset, "ptr", metric, kk, gold))
                        add_test(model, subset, metric, kk, gold, "wilcoxon", wilcoxon_paired(x, y), len(x))
                        if metric is Metric.RECALL:
                            # Wins on run-averaged per-query recall: the same values the Wilcoxon test ranks.
                            wr, wp = (float(w) for w in wins(x, y))
                            rows += [
                                Row(model, subset, "rtp", Metric.WINS, kk, gold, wr, None, [wr]),
                                Row(model, subset, "ptr", Metric.WINS, kk, gold, wp, None, [wp]),
                                Row(model, subset, "both", Metric.TIES, kk, gold, len(x) - wr - wp, None,
                                    [len(x) - wr - wp]),
                            ]
            rtp = s.row(model, subset, "rtp", Metric.PASS, k)
            ptr = s.row(model, subset, "ptr", Metric.PASS, k)
            if rtp is not None and ptr is not None:
                add_test(model, subset, Metric.PASS, k, None, "ttest_ind", ttest_two_sample(rtp.values, ptr.values),
                         len(ptr.values))
                x, y = paired_values(per_query, (model, subset, "rtp", Metric.PASS, k, None),
                               (model, subset, "ptr", Metric.PASS, k, None))
                add_test(model, subset, Metric.PASS, k, None, "wilcoxon", wilcoxon_paired(x, y), len(x))
    return rows, tests


# ---------------------------------------------------------------- JSON


def _clean(x: Any) -> Any:
    """NaN/inf -> null and numpy scalars -> Python: summary.json holds no NaN (schema.dumps writes it)."""
    if isinstance(x, float | np.floating):
        x = float(x)
        return x if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, Mapping):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def summary_dict(summary: Summary, meta: Mapping[str, Any], comparisons: Mapping[str, Any] | None = None
                 ) -> dict[str, Any]:
    """summary.json; `comparisons` (analysis.compare, three architectures or more) is added when given."""
    return _clean({
        "format_version": FORMAT_VERSION,
        "meta": dict(meta),
        "rows": [asdict(r) for r in summary.rows],
        "tests": [asdict(t) for t in summary.tests],
        "checks": asdict(summary.checks),
        **({"comparisons": dict(comparisons)} if comparisons is not None else {}),
    })
