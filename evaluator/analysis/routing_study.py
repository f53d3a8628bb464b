"""Complexity-adaptive routing (beyond the paper), from the saved records alone: no embedding, no LLM.

A router sends each query to RtP or PtR. The score router sends it to RtP when RtP's own top-1 cosine
(`Record.rtp.scores[0]`, free: the pipeline already computed it) is at least τ, else to PtR; the cheap proxies
the paper names send it to RtP when the query's word count (or clause count) is at most θ. A query
routed to RtP pays only its RtP planner call; one routed to PtR pays discovery + PtR planner.

Objective for choosing τ: maximise mean recall@k (over runs) on the tuning queries, ties broken by
fewer tokens, then by the lower threshold. Thresholds are midpoints between consecutive observed
values of the tuning queries, plus ±inf (the two "always" policies), so a chosen τ never sits on a
test query's value. The in-sample sweep is optimistic by construction; the held-out evaluations
choose τ on some queries and score it on others: (a) tuned on the `train` subsets, reported on the
`test` subsets (settings; by default the last subset in sorted order is the test set and the others
tune, e.g. G1+G2 → G3); (b) seeded k-fold cross-validation, folds stratified by subset.

Queries whose PtR discovery call failed for good are left out of that run (as in the metrics), so
every policy is compared on the same queries. Imports nothing from `render`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pydantic
import pydantic.dataclasses

from evaluator.analysis.metric_defs import Metric
from evaluator.analysis.metrics import Obs, retrieval_obs
from evaluator.results import migrate
from evaluator.results.schema import (
    FORMAT_VERSION,
    GOLDS,
    About,
    ArchBlock,
    QueryId,
    Record,
    about_fields,
    plain,
    qid_key,
)
from evaluator.settings.sections import AnalysisSettings

# name -> (label, direction): "high" sends high values to RtP, "low" sends low values to RtP.
SIGNALS: dict[str, tuple[str, str]] = {
    "score": ("RtP top-1 score", "high"),
    "words": ("query length (words)", "low"),
    "clauses": ("clause count", "low"),
}
ARCH_LABEL = {"rtp": "RtP", "ptr": "PtR"}
METRICS = (Metric.RECALL, Metric.PRECISION)
TOKENS = Metric.TOKENS  # a policy's tokens per query, saved under this name


def policy_metric(metric: Metric, gold: str) -> str:
    """A policy's metric on one gold set as routing.json names it ("recall:api_list")."""
    return f"{metric}:{gold}"


_WORD_RE = re.compile(r"[\w'’-]+")
# Sentence ends and the conjunctions that usually open a further sub-goal ("... and also tell me",
# "Then find ..."). A heuristic on purpose: the proxy must cost nothing before any model call.
_CLAUSE_SPLIT_RE = re.compile(
    r"[.!?;]+|\b(?:and|also|then|plus|additionally|moreover|furthermore|besides)\b", re.IGNORECASE
)


def word_count(text: str) -> int:
    return len(_WORD_RE.findall(text))


def clause_count(text: str) -> int:
    return max(1, sum(bool(_WORD_RE.search(seg)) for seg in _CLAUSE_SPLIT_RE.split(text)))


# ---------------------------------------------------------------- per-model arrays


@dataclass
class ModelData:
    """Per-query values of one model, as (runs, queries) arrays; queries in (subset, query_id) order."""

    model: str
    runs: list[int]
    keys: list[tuple[str, QueryId]]  # (subset, query_id)
    subsets: np.ndarray  # (n,) subset name per query
    signals: dict[str, np.ndarray]  # name -> (n,)
    rtp: dict[str, np.ndarray]  # "recall:api_list", ..., "tokens" -> (R, n)
    ptr: dict[str, np.ndarray]
    valid: np.ndarray  # (R, n) bool: both architectures scoreable for this query in this run
    excluded: int = 0  # (run, query) pairs left out: PtR discovery failed or a record is missing


def _retrieval(block: ArchBlock, gold: Mapping[str, Sequence[str]], k: int) -> dict[str, float]:
    obs: Obs = {}
    # Deduplicated as in metrics.record_obs, so "always RtP/PtR" here match the main tables.
    retrieval_obs("x", block.unique_retrieved, gold, [k], obs)
    return {policy_metric(m, g): obs[("x", m, k, g)][0] for m in METRICS for g in GOLDS if ("x", m, k, g) in obs}


def model_data(records: Sequence[Record], model: str, k: int) -> ModelData:
    """Two passes over the records (a stream over queries.jsonl is not held): the model's runs and queries,
    then their values into arrays."""
    run_set: set[int] = set()
    key_set: set[tuple[str, QueryId]] = set()
    for r in records:
        if r.model == model:
            run_set.add(r.run)
            key_set.add((r.subset, r.query_id))
    recs = (r for r in records if r.model == model)
    runs = sorted(run_set)
    keys = sorted(key_set, key=lambda sq: (sq[0], qid_key(sq[1])))
    pos = {key: i for i, key in enumerate(keys)}
    rpos = {run: j for j, run in enumerate(runs)}
    n, R = len(keys), len(runs)
    names = [policy_metric(m, g) for m in METRICS for g in GOLDS] + [TOKENS]
    rtp = {name: np.zeros((R, n)) for name in names}
    ptr = {name: np.zeros((R, n)) for name in names}
    valid = np.zeros((R, n), dtype=bool)
    score = np.full(n, -np.inf)
    text = [""] * n
    for r in recs:
        j, i = rpos[r.run], pos[(r.subset, r.query_id)]
        text[i] = r.query
        rb, pb = r.rtp, r.ptr
        if rb is not None and rb.scores:
            score[i] = float(rb.scores[0])  # identical across runs: RtP retrieval is deterministic
        if pb is None or pb.excluded or rb is None or rb.excluded:
            continue
        gold = {g: r.gold_set(g) for g in GOLDS}
        for block, into in ((rb, rtp), (pb, ptr)):
            for name, v in _retrieval(block, gold, k).items():
                into[name][j, i] = v
            into[TOKENS][j, i] = float(block.total_tokens)
        valid[j, i] = True
    signals = {
        "score": score,
        "words": np.array([word_count(t) for t in text], dtype=float),
        "clauses": np.array([clause_count(t) for t in text], dtype=float),
    }
    return ModelData(model, runs, keys, np.array([s for s, _ in keys]), signals, rtp, ptr, valid,
                     excluded=int(R * n - valid.sum()))


# ---------------------------------------------------------------- policies


def route(signal: np.ndarray, tau: float, direction: str) -> np.ndarray:
    """True where the query goes to RtP."""
    return signal >= tau if direction == "high" else signal <= tau


@dataclass
class PolicyScore:
    """A policy scored on some queries: per metric the per-run means, then mean and std over runs."""

    values: dict[str, list[float]]
    to_rtp: float  # share of the scored queries sent to RtP
    n_queries: int

    def mean(self, name: str) -> float:
        v = self.values[name]
        return float(np.mean(v)) if v else float("nan")

    def std(self, name: str) -> float | None:
        v = self.values[name]
        return float(np.std(v, ddof=1)) if len(v) >= 2 else None

    def scored(self) -> Policy:
        """The typed, saved form: per metric the runs' values with their mean and std."""
        return Policy(to_rtp=self.to_rtp, n_queries=self.n_queries,
                      metrics={name: Stat(mean=self.mean(name), std=self.std(name), values=v)
                               for name, v in self.values.items()})


# ---------------------------------------------------------------- typed results (routing.json)
# Each is the JSON shape of routing.json (unchanged since release 0.1.0): a policy's metrics sit beside
# its other fields there ("recall:api_list": {...}, "to_rtp": ...); here they are gathered in `metrics`.


class Stat(pydantic.BaseModel):
    """One metric of a policy over runs: mean, std (None below two runs), per-run values (not in a sweep)."""

    mean: float | None
    std: float | None
    values: list[float] | None = pydantic.Field(default=None, exclude_if=lambda v: v is None)


class Scored(pydantic.BaseModel):
    """A policy's metrics ("recall:api_list", "precision:relevant", "tokens"), saved beside its fields."""

    to_rtp: float  # share of the scored queries sent to RtP
    metrics: dict[str, Stat] = pydantic.Field(default_factory=dict)

    @pydantic.model_validator(mode="before")
    @classmethod
    def _gather(cls, data: Any) -> Any:
        if not isinstance(data, Mapping) or "metrics" in data:
            return data
        fields = cls.model_fields
        return {**{k: v for k, v in data.items() if k in fields},
                "metrics": {k: v for k, v in data.items() if k not in fields}}

    @pydantic.model_serializer(mode="wrap")
    def _spread(self, handler: pydantic.SerializerFunctionWrapHandler) -> dict[str, Any]:
        d = handler(self)
        return {**{k: v for k, v in d.items() if k != "metrics"}, **d.get("metrics", {})}

    def metric(self, name: str) -> Stat:
        return self.metrics[name]

    def mean(self, name: str) -> float | None:
        return self.metrics[name].mean


class SweepPoint(Scored):
    tau: float


class Policy(Scored):
    n_queries: int  # queries it was scored on


class BestTau(Policy):
    """The in-sample best threshold of one signal, for one gold set."""

    tau: float
    to_rtp_by_subset: dict[str, float] = pydantic.Field(default_factory=dict)


class Oracle(Policy):
    choice: dict[str, str] = pydantic.Field(default_factory=dict)  # subset -> "rtp" | "ptr"


class Baselines(pydantic.BaseModel):
    always_rtp: Policy
    always_ptr: Policy
    oracle: Oracle


class SplitEval(pydantic.BaseModel):
    """τ chosen on the tuning subsets, scored on the test subsets."""

    tau: float
    train: Policy
    test: Policy
    test_baselines: Baselines


class CrossVal(pydantic.BaseModel):
    """Every query routed by a τ chosen without its fold (one τ per fold)."""

    taus: list[float]
    test: Policy
    test_baselines: Baselines


class Heldout(pydantic.BaseModel):
    """Per signal; a kind of evaluation that was not possible is absent."""

    subset_split: dict[str, SplitEval] = pydantic.Field(default_factory=dict, exclude_if=lambda v: not v)
    cv: dict[str, CrossVal] = pydantic.Field(default_factory=dict, exclude_if=lambda v: not v)


class ModelRouting(pydantic.BaseModel):
    """One model's routing study: sweeps and best τ per signal, baselines and held-out results per gold set."""

    n_queries: int
    runs: list[int]
    excluded_run_queries: int  # (run, query) pairs left out: PtR discovery failed or a record is missing
    baselines: dict[str, Baselines] = pydantic.Field(default_factory=dict)  # gold ->
    sweeps: dict[str, list[SweepPoint]] = pydantic.Field(default_factory=dict)  # signal ->
    best_in_sample: dict[str, dict[str, BestTau]] = pydantic.Field(default_factory=dict)  # signal -> gold ->
    heldout: dict[str, Heldout] = pydantic.Field(default_factory=dict)  # gold ->


def score_policy(d: ModelData, to_rtp: np.ndarray, sel: np.ndarray | None = None) -> PolicyScore:
    return score_policies(d, to_rtp[None, :], sel)[0]


def score_policies(d: ModelData, to_rtp: np.ndarray, sel: np.ndarray | None = None) -> list[PolicyScore]:
    """`score_policy` of each row of `to_rtp` (policies x queries) at once: a threshold sweep scores
    every candidate in one array operation per run and metric instead of one small mean each
    (bench/README.md, "analysis/routing_study.py"). Each row's mean is numpy's own reduction
    over that row's selected values, so every value equals the one-policy computation bit for bit."""
    sel = np.ones(len(d.keys), dtype=bool) if sel is None else sel
    m = len(to_rtp)
    values: dict[str, list[list[float]]] = {name: [[] for _ in range(m)] for name in d.rtp}
    for j in range(len(d.runs)):
        use = sel & d.valid[j]
        if not use.any():
            continue
        for name in d.rtp:
            a, b = d.rtp[name][j][use], d.ptr[name][j][use]
            # In blocks of policies, so the (policies x queries) array stays small whatever the queries; each
            # row's mean is the same in a block as in the whole.
            for lo in range(0, m, POLICY_BLOCK):
                chosen = to_rtp[lo : lo + POLICY_BLOCK, use]
                # C order: numpy then sums each row as it sums a 1-D array (an F-ordered array sums column
                # by column, and the last bits of the means differ from the one-policy computation's)
                means = np.ascontiguousarray(np.where(chosen, a, b)).mean(axis=1)
                for i, v in enumerate(means.tolist(), lo):
                    values[name][i].append(v)
    shares = np.ascontiguousarray(to_rtp[:, sel]).mean(axis=1).tolist() if sel.any() else [float("nan")] * m
    n = int(sel.sum())
    return [PolicyScore({name: values[name][i] for name in d.rtp}, float(shares[i]), n) for i in range(m)]


# At most this many thresholds per sweep. Every midpoint of a continuous signal (the top-1 score) is one per
# query: uncapped, the sweep grows with the square of the queries and routing.json keeps a point per query
# (bench/README.md, "analysis/routing_study.py"). Below the cap (the paper's 500 queries: ~500) every midpoint
# is tried.
MAX_TAUS = 1024
POLICY_BLOCK = 64  # policies scored at once (score_policies)


def candidates(values: np.ndarray) -> np.ndarray:
    """-inf, midpoints between consecutive distinct finite values, +inf; past `MAX_TAUS` of them, that many
    midpoints at evenly spaced ranks (the first and the last included)."""
    u = np.unique(values[np.isfinite(values)])
    mids = (u[:-1] + u[1:]) / 2
    if len(mids) > MAX_TAUS - 2:
        mids = mids[np.unique(np.linspace(0, len(mids) - 1, MAX_TAUS - 2).round().astype(np.int64))]
    return np.concatenate([[-np.inf], mids, [np.inf]])


def sweep(d: ModelData, signal: str, sel: np.ndarray | None = None,
          taus: np.ndarray | None = None) -> list[tuple[float, PolicyScore]]:
    sel = np.ones(len(d.keys), dtype=bool) if sel is None else sel
    direction = SIGNALS[signal][1]
    s = d.signals[signal]
    taus = candidates(s[sel]) if taus is None else taus
    policies = np.stack([route(s, float(t), direction) for t in taus]) if len(taus) else np.zeros((0, len(s)), bool)
    return [(float(t), o) for t, o in zip(taus, score_policies(d, policies, sel), strict=True)]


class _Objective(NamedTuple):
    """What `choose` minimises, in order."""

    recall: float  # the mean recall, negated
    tokens: float
    tau: float


def choose(points: Sequence[tuple[float, PolicyScore]], gold: str) -> tuple[float, PolicyScore]:
    """The objective: highest mean recall, then fewest tokens, then the lowest threshold."""
    def key(p: tuple[float, PolicyScore]) -> _Objective:
        # Rounded so that float noise in a mean never outranks a real token saving.
        return _Objective(-round(p[1].mean(policy_metric(Metric.RECALL, gold)), 9), round(p[1].mean(TOKENS), 6), p[0])

    return min(points, key=key)


def oracle(d: ModelData, gold: str, sel: np.ndarray | None = None) -> tuple[np.ndarray, dict[str, str]]:
    """Each subset sent wholesale to the architecture with the higher mean recall on it (in-sample)."""
    sel = np.ones(len(d.keys), dtype=bool) if sel is None else sel
    to_rtp = np.zeros(len(d.keys), dtype=bool)
    choice: dict[str, str] = {}
    for sub in sorted(set(d.subsets[sel].tolist())):
        m = sel & (d.subsets == sub)
        r = score_policy(d, np.ones_like(m), m)
        p = score_policy(d, np.zeros_like(m), m)
        key_r = (-round(r.mean(policy_metric(Metric.RECALL, gold)), 9), r.mean(TOKENS))
        key_p = (-round(p.mean(policy_metric(Metric.RECALL, gold)), 9), p.mean(TOKENS))
        choice[sub] = "rtp" if key_r <= key_p else "ptr"
        to_rtp[m] = choice[sub] == "rtp"
    return to_rtp, choice


def baselines(d: ModelData, gold: str, sel: np.ndarray | None = None) -> Baselines:
    n = len(d.keys)
    o_mask, o_choice = oracle(d, gold, sel)
    best = score_policy(d, o_mask, sel).scored()
    return Baselines(always_rtp=score_policy(d, np.ones(n, dtype=bool), sel).scored(),
                     always_ptr=score_policy(d, np.zeros(n, dtype=bool), sel).scored(),
                     oracle=Oracle(to_rtp=best.to_rtp, n_queries=best.n_queries, metrics=best.metrics, choice=o_choice))


def split_masks(d: ModelData, train: Sequence[str], test: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """`train`/`test` are full subset names (see `config.match_subsets` for prefixes)."""
    subs = d.subsets.tolist()
    return (np.array([s in train for s in subs], dtype=bool), np.array([s in test for s in subs], dtype=bool))


def fold_ids(d: ModelData, folds: int, seed: int) -> np.ndarray:
    """Fold of each query: shuffled within each subset (seeded), then dealt round-robin."""
    rng = np.random.default_rng(seed)
    out = np.zeros(len(d.keys), dtype=int)
    for sub in sorted(set(d.subsets.tolist())):
        idx = np.flatnonzero(d.subsets == sub)
        out[rng.permutation(idx)] = np.arange(len(idx)) % folds
    return out


def heldout_split(d: ModelData, signal: str, gold: str, train: np.ndarray, test: np.ndarray) -> SplitEval:
    tau, fit = choose(sweep(d, signal, train), gold)
    applied = route(d.signals[signal], tau, SIGNALS[signal][1])
    return SplitEval(tau=tau, train=fit.scored(), test=score_policy(d, applied, test).scored(),
                     test_baselines=baselines(d, gold, test))


def cross_validate(d: ModelData, signal: str, gold: str, folds: np.ndarray) -> CrossVal:
    to_rtp = np.zeros(len(d.keys), dtype=bool)
    taus: list[float] = []
    for f in sorted(set(folds.tolist())):
        test = folds == f
        tau, _ = choose(sweep(d, signal, ~test), gold)  # chosen without the fold it is scored on
        to_rtp[test] = route(d.signals[signal], tau, SIGNALS[signal][1])[test]
        taus.append(tau)
    return CrossVal(taus=taus, test=score_policy(d, to_rtp).scored(), test_baselines=baselines(d, gold))


# ---------------------------------------------------------------- study


@dataclass
class Options:
    k: int
    train: list[str] = field(default_factory=list)  # full subset names; empty: no held-out split
    test: list[str] = field(default_factory=list)
    folds: int = AnalysisSettings().routing_folds  # the [analysis] section's defaults
    seed: int = AnalysisSettings().routing_seed


def analyse_model(d: ModelData, opt: Options) -> ModelRouting:
    out = ModelRouting(n_queries=len(d.keys), runs=d.runs, excluded_run_queries=d.excluded)
    train, test = split_masks(d, opt.train, opt.test)
    folds = fold_ids(d, opt.folds, opt.seed)
    for signal in SIGNALS:
        pts = sweep(d, signal)
        out.sweeps[signal] = [SweepPoint(tau=t, to_rtp=o.to_rtp, metrics={
            name: Stat(mean=o.mean(name), std=o.std(name)) for name in o.values}) for t, o in pts]
        for gold in GOLDS:
            tau, best = choose(pts, gold)
            p = best.scored()
            out.best_in_sample.setdefault(signal, {})[gold] = BestTau(
                tau=tau, to_rtp=p.to_rtp, n_queries=p.n_queries, metrics=p.metrics,
                to_rtp_by_subset=_share_by_subset(d, signal, tau))
    for gold in GOLDS:
        out.baselines[gold] = baselines(d, gold)
        h = out.heldout.setdefault(gold, Heldout())
        for signal in SIGNALS:
            if train.any() and test.any():
                h.subset_split[signal] = heldout_split(d, signal, gold, train, test)
            if len(set(folds.tolist())) >= 2:
                h.cv[signal] = cross_validate(d, signal, gold, folds)
    return out


def _share_by_subset(d: ModelData, signal: str, tau: float) -> dict[str, float]:
    to_rtp = route(d.signals[signal], tau, SIGNALS[signal][1])
    return {sub: float(to_rtp[d.subsets == sub].mean()) for sub in sorted(set(d.subsets.tolist()))}




@pydantic.dataclasses.dataclass
class Signal:
    label: str
    rtp_when: str  # "signal >= tau" or "signal <= tau"


@pydantic.dataclasses.dataclass
class Split:
    train: list[str] = field(default_factory=list)  # subsets τ is tuned on
    test: list[str] = field(default_factory=list)  # held-out subsets it is reported on


@pydantic.dataclasses.dataclass
class RoutingMeta(About):
    """`routing.json`'s `meta`: signals, objective, split, and what the section states about the study."""

    models: list[str] = field(default_factory=list)
    k: int = 5
    subsets: list[str] = field(default_factory=list)
    signals: dict[str, Signal] = field(default_factory=lambda: {
        name: Signal(label, "signal >= tau" if direc == "high" else "signal <= tau")
        for name, (label, direc) in SIGNALS.items()})
    objective: str = "max mean recall@k over runs (per gold set), ties: fewer tokens, then lower tau"
    thresholds: str = ("midpoints between consecutive observed values of the tuning queries, plus -inf and +inf "
                       f"(past {MAX_TAUS} candidates, {MAX_TAUS} of the midpoints at evenly spaced ranks)")
    tokens: str = ("mean per query of prompt+completion tokens: RtP planner if routed to RtP, "
                   "PtR discovery + planner if routed to PtR")
    split: Split = field(default_factory=Split)
    folds: int = 5
    fold_seed: int = 0
    timing_s: float = 0.0

    @property
    def has_split(self) -> bool:
        """A held-out subset split needs subsets on both sides."""
        return bool(self.split.train and self.split.test)


_ROUTING_META = pydantic.TypeAdapter(RoutingMeta)


@dataclass
class RoutingResult:
    """`routing.json`: `meta` (signals, objective, split) and per model the sweeps, baselines and held-out results."""

    meta: RoutingMeta
    models: dict[str, ModelRouting]

    def to_dict(self) -> dict[str, Any]:
        return {"format_version": FORMAT_VERSION, "meta": plain(self.meta), "models": _MODELS.dump_python(self.models)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RoutingResult:
        d = migrate.routing(d)  # any saved version (a no-op on what OutputDir.read_json returns)
        return cls(_ROUTING_META.validate_python(d["meta"]), _MODELS.validate_python(d.get("models") or {}))


# python mode: ±inf (the "always" thresholds) and NaN stay floats, as json writes them
_MODELS = pydantic.TypeAdapter(dict[str, ModelRouting])


def routing_study(records: Sequence[Record], opt: Options, about: About | Mapping[str, Any] | None = None,
                  log: Callable[[str], None] = lambda _: None) -> RoutingResult:
    """Every model with PtR records; `about` is copied into the result's meta (simulated models, embedder)."""
    t0 = time.perf_counter()
    with_ptr: set[str] = set()
    subsets: set[str] = set()
    for r in records:  # one pass: the records may be a stream over queries.jsonl
        subsets.add(r.subset)
        if r.model is not None and r.ptr is not None:
            with_ptr.add(r.model)
    models = sorted(with_ptr)
    meta = RoutingMeta(**about_fields(about), models=models, k=opt.k, subsets=sorted(subsets),
                       split=Split(opt.train, opt.test), folds=opt.folds, fold_seed=opt.seed)
    out: dict[str, ModelRouting] = {}
    for m in models:
        d = model_data(records, m, opt.k)
        out[m] = analyse_model(d, opt)
        if d.excluded:
            log(f"{m}: {d.excluded} (run, query) pairs left out (PtR discovery failed or record missing)")
    meta.timing_s = round(time.perf_counter() - t0, 2)
    return RoutingResult(meta, out)
