"""Scaling study (paper Table 10, Figure 3): RtP and PtR recall on sub-registries of growing size.

Computes from the study's records and embeddings and makes no LLM call: PtR reuses the stubs the study
saved (stub generation does not depend on the registry). A sub-registry is an index over some rows of
the full embedding matrix, so nothing is re-embedded. Imports nothing from `render`.

A sub-registry of target size n for subset S holds every gold API of S (the union of both gold sets,
`api_list` and `relevant`; the paper's "all Ground-Truth APIs for the subset under study") plus
n - |gold| distractors drawn without replacement from the other APIs, stratified by category in
proportion to the category sizes of that pool (APIs without a category form their own stratum).
Seed s at size n draws with `numpy.random.default_rng([s, n])`: same seed, same sub-registry, same
numbers. Where the gold union alone reaches n, the point is gold-only (no distractors, no variance).
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pydantic
import pydantic.dataclasses

from evaluator.analysis.metric_defs import Metric
from evaluator.analysis.metrics import recall
from evaluator.analysis.stats import mean_std
from evaluator.data import Registry
from evaluator.results import migrate
from evaluator.results.plans import stub_text
from evaluator.results.schema import (
    FORMAT_VERSION,
    GOLDS,
    About,
    PtrBlock,
    QueryId,
    Record,
    about_fields,
    plain,
    qid_key,
)
from evaluator.retrieval import ranking
from evaluator.retrieval.index import SubsetSearch, digest
from evaluator.retrieval.lexical import NO_HIT, BM25Index
from evaluator.retrieval.retrievers import FUSION_DEPTH, HybridSubsets, LexicalSubsets, SubSearch
from evaluator.settings.sections import AnalysisSettings

Encode = Callable[[list[str]], np.ndarray]

# The sub-registry sizes and draws of a caller that names none: the [analysis] section's defaults.
DEFAULT_SIZES: tuple[int, ...] = AnalysisSettings().scaling_sizes
DEFAULT_SEEDS = AnalysisSettings().scaling_seeds
NO_CATEGORY = "(no category)"
FULL = "full"


# ---------------------------------------------------------------- sub-registries


@dataclass
class SubRegistry:
    rows: np.ndarray  # registry rows, ascending
    gold_only: bool
    per_stratum: dict[str, int]  # distractors drawn from each stratum


def strata(categories: Sequence[str | None], exclude: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """The distractor pool split by category, in a fixed (sorted) order so draws are reproducible."""
    keep = np.ones(len(categories), dtype=bool)
    keep[exclude] = False
    groups: dict[str, list[int]] = {}
    for row in np.flatnonzero(keep).tolist():
        groups.setdefault(categories[row] or NO_CATEGORY, []).append(row)
    return [(name, np.asarray(groups[name], dtype=np.int64)) for name in sorted(groups)]


def allocate(sizes: Sequence[int], n: int) -> list[int]:
    """Split n draws across strata in proportion to their sizes (largest remainder; never more than a
    stratum holds). Exact proportions keep seed-to-seed variance to the choice of APIs only."""
    total = sum(sizes)
    if n >= total:
        return list(sizes)
    quotas = [n * s / total for s in sizes]
    counts = [math.floor(q) for q in quotas]
    # Ties broken by stratum order, which is sorted by name: deterministic.
    order = sorted(range(len(sizes)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return counts


def sample_subregistry(
    pool: Sequence[tuple[str, np.ndarray]], gold_rows: np.ndarray, size: int, rng: np.random.Generator
) -> SubRegistry:
    need = size - len(gold_rows)
    if need <= 0:
        return SubRegistry(np.sort(gold_rows), True, {})
    counts = allocate([len(rows) for _, rows in pool], need)
    picked = [gold_rows]
    per: dict[str, int] = {}
    for (name, rows), c in zip(pool, counts, strict=True):
        if c:
            picked.append(rng.choice(rows, size=c, replace=False))
            per[name] = c
    return SubRegistry(np.sort(np.concatenate(picked)), False, per)


def seed_rng(seed: int, size: int) -> np.random.Generator:
    return np.random.default_rng([seed, size])


# ---------------------------------------------------------------- inputs


@dataclass
class SubsetInput:
    """Everything one subset's points need, embedded once."""

    name: str
    query_ids: list[QueryId]
    query_vecs: np.ndarray  # (n, d)
    gold: dict[str, list[set[int]]]  # gold set -> per query, registry rows of its gold APIs
    gold_len: dict[str, list[int]]  # |G| per query, gold APIs missing from the registry included
    gold_rows: np.ndarray  # union of both gold sets, registry rows
    gold_missing: int  # gold APIs not in the registry (cannot be in any sub-registry)
    units: list[tuple[str, int]] = field(default_factory=list)  # PtR (model, run), one block of n each
    stub_vecs: np.ndarray | None = None
    owners: list[int] = field(default_factory=list)  # stub -> unit * n + query
    ptr_valid: np.ndarray | None = None  # (units, n): PtR evaluable (record present, discovery call ok)
    saved_rtp: list[list[str]] = field(default_factory=list)  # saved top-k, for the full-registry check
    saved_ptr: dict[tuple[int, int], list[str]] = field(default_factory=dict)
    texts: list[str] = field(default_factory=list)  # the queries', then the stubs' texts (bm25 / hybrid search them)


@dataclass
class _QueryFacts:
    """What the points need of a query (its first record)."""

    text: str
    gold: dict[str, list[str]]  # gold set -> its API ids, deduplicated
    rtp_top: list[str]  # RtP's saved top-k


@dataclass
class _PtrFacts:
    """What the points need of one PtR record."""

    model: str
    run: int
    query_id: QueryId
    top: list[str]  # its saved top-k
    excluded: bool
    texts: list[str]  # its stubs as embedded
    fallback: bool


def _stub_texts(ptr: PtrBlock) -> list[str]:
    return [stub_text(s) for s in ptr.stubs]


def build_inputs(
    records: Sequence[Record], registry: Registry, subsets: Sequence[str], encode: Encode, k: int
) -> list[SubsetInput]:
    """Groups records by subset and embeds queries and stubs: one encode call for each kind. One pass over the
    records, keeping what the points need of each (a stream over queries.jsonl is not held)."""
    by_subset: dict[str, dict[Any, _QueryFacts]] = {s: {} for s in subsets}
    units_of: dict[str, set[tuple[str, int]]] = {s: set() for s in subsets}
    ptr_recs: dict[str, list[_PtrFacts]] = {s: [] for s in subsets}  # records with a PtR block, in record order
    for r in records:
        if r.subset in by_subset:
            if r.query_id not in by_subset[r.subset]:
                by_subset[r.subset][r.query_id] = _QueryFacts(
                    r.query, {g: list(dict.fromkeys(r.gold_set(g))) for g in GOLDS},
                    list(r.rtp.retrieved[:k]) if r.rtp else [])
            if r.ptr is not None and r.model is not None:
                units_of[r.subset].add((r.model, r.run))
                ptr = r.ptr
                ptr_recs[r.subset].append(_PtrFacts(r.model, r.run, r.query_id, list(ptr.retrieved[:k]), ptr.excluded,
                                                    _stub_texts(ptr), ptr.fallback))
    query_texts: list[str] = []
    stub_texts: list[str] = []
    # Per subset: where its queries start in query_texts, and (owner, stub text index or None = the raw query).
    plans: list[tuple[SubsetInput, int, list[tuple[int, int | None]]]] = []
    row = registry.row
    for name in subsets:
        qs = by_subset[name]
        qids = sorted(qs, key=qid_key)
        gold: dict[str, list[set[int]]] = {g: [] for g in GOLDS}
        gold_len: dict[str, list[int]] = {g: [] for g in GOLDS}
        union: set[str] = set()
        for q in qids:
            for g in GOLDS:
                ids = qs[q].gold[g]
                gold[g].append({row[i] for i in ids if i in row})
                gold_len[g].append(len(ids))
                union.update(ids)
        si = SubsetInput(
            name=name,
            query_ids=qids,
            query_vecs=np.zeros((0, 0), np.float32),
            gold=gold,
            gold_len=gold_len,
            gold_rows=np.asarray(sorted(row[i] for i in union if i in row), dtype=np.int64),
            gold_missing=sum(i not in row for i in union),
            units=sorted(units_of[name]),
            saved_rtp=[qs[q].rtp_top for q in qids],
        )
        first_query = len(query_texts)
        query_texts += [qs[q].text for q in qids]
        stub_plan: list[tuple[int, int | None]] = []
        n = len(qids)
        qpos = {q: i for i, q in enumerate(qids)}
        unit_pos = {u: j for j, u in enumerate(si.units)}
        si.ptr_valid = np.zeros((len(si.units), n), dtype=bool)
        for p in ptr_recs[name]:
            u, qi = unit_pos[(p.model, p.run)], qpos[p.query_id]
            si.saved_ptr[(u, qi)] = p.top
            if p.excluded:
                continue  # as in metrics: no stubs to judge, PtR is not scored for this query
            si.ptr_valid[u, qi] = True
            texts = p.texts
            owner = u * n + qi
            if not texts and p.fallback:
                stub_plan.append((owner, None))  # the study searched with the raw query
                continue
            for t in texts:
                stub_plan.append((owner, len(stub_texts)))
                stub_texts.append(t)
        plans.append((si, first_query, stub_plan))
    qv = encode(query_texts)
    sv = encode(stub_texts) if stub_texts else np.zeros((0, qv.shape[1]), np.float32)
    out = []
    for si, first, stub_plan in plans:
        n = len(si.query_ids)
        si.query_vecs = qv[first : first + n]
        si.owners = [owner for owner, _ in stub_plan]
        vecs = [si.query_vecs[owner % n] if t is None else sv[t] for owner, t in stub_plan]
        si.stub_vecs = np.stack(vecs).astype(np.float32) if vecs else np.zeros((0, qv.shape[1]), np.float32)
        si.texts = query_texts[first : first + n] + [query_texts[first + owner % n] if t is None else stub_texts[t]
                                                     for owner, t in stub_plan]
        out.append(si)
    return out


# ---------------------------------------------------------------- evaluation


Key = tuple[str, str | None, Metric, str | None]  # (arch, model, metric, gold)


@dataclass
class Searched:
    """Top-k registry rows of one subset on one (sub-)registry: per query, and per (PtR unit, query)."""

    rtp: list[list[int]]
    ptr: list[list[int]]  # index unit * n + query


def searcher(api_vecs: np.ndarray, si: SubsetInput, k: int, smallest: int,
             api64: Callable[[], np.ndarray] | None = None, memo: Path | None = None,
             matrix_digest: str | None = None, lexical: BM25Index | None = None,
             retriever: str = "dense") -> SubSearch:
    """Dense: one float32 pass of the subset's queries and stubs over the full registry, which every
    sub-registry's search then reads (with `memo`, a folder where an unchanged study's results are
    kept: the pass is then not made). bm25: the texts' BM25 scores made once, filtered per sub-registry;
    hybrid: both, each to the fusion depth, fused per sub-registry (retrievers.HybridSubsets)."""
    if retriever == "bm25":
        assert lexical is not None
        return LexicalSubsets(lexical, si.texts)
    vecs = si.query_vecs if si.stub_vecs is None else np.concatenate([si.query_vecs, si.stub_vecs])
    if retriever == "hybrid":
        assert lexical is not None
        return HybridSubsets(SubsetSearch(api_vecs, vecs, max(k, FUSION_DEPTH), smallest, api64, memo, matrix_digest),
                             LexicalSubsets(lexical, si.texts))
    return SubsetSearch(api_vecs, vecs, k, smallest, api64, memo, matrix_digest)


def search(found: SubSearch, si: SubsetInput, rows: np.ndarray, k: int) -> Searched:
    """Top-k on the sub-registry `rows`, as `VectorIndex(api_vecs, rows).exact_search` gives it: every
    query, then every stub of every (model, run), re-ranked per (run, query) as the study did."""
    n = len(si.query_ids)
    scores, hits = found.search(rows, k)
    rtp = [[x for x in r[:k] if x != NO_HIT] for r in hits[:n].tolist()]  # BM25 found nothing: no row
    ptr: list[list[int]] = []
    if si.units:
        n_units = len(si.units) * n
        ptr = ranking.ptr_rows(scores[n:], hits[n:], si.owners, n_units, k)
    return Searched(rtp, ptr)


def score(si: SubsetInput, found: Searched) -> dict[Key, float]:
    """One point, one seed. PtR values: mean over queries per run, then over the model's runs."""
    n = len(si.query_ids)
    out: dict[Key, float] = {}
    for g in GOLDS:
        out[("rtp", None, Metric.RECALL, g)] = float(
            np.nanmean([recall(found.rtp[q], si.gold[g][q], si.gold_len[g][q]) for q in range(n)])
        )
    per_model: dict[str, dict[tuple[Metric, str | None], list[float]]] = {}
    for u, (model, _run) in enumerate(si.units):
        assert si.ptr_valid is not None
        valid = np.flatnonzero(si.ptr_valid[u]).tolist()
        if not valid:
            continue
        acc = per_model.setdefault(model, {})
        tops = {q: set(found.ptr[u * n + q]) for q in valid}
        for g in GOLDS:
            vals = [recall(list(tops[q]), si.gold[g][q], si.gold_len[g][q]) for q in valid]
            acc.setdefault((Metric.RECALL, g), []).append(float(np.nanmean(vals)))
        # divergent: the top-k sets differ (STUDY.md); disjoint: they share nothing (the paper's 3.2 wording).
        acc.setdefault((Metric.DIVERGENT, None), []).append(float(np.mean([tops[q] != set(found.rtp[q]) for q in valid])))
        acc.setdefault((Metric.DISJOINT, None), []).append(float(np.mean([not tops[q] & set(found.rtp[q]) for q in valid])))
    for model, acc in per_model.items():
        for (metric, gold), vals in acc.items():
            out[("ptr" if metric is Metric.RECALL else "both", model, metric, gold)] = statistics.fmean(vals)
    return out


@pydantic.dataclasses.dataclass
class FullCheck:
    """Per subset: the share of queries whose recomputed full-registry top-k equals the saved one."""

    rtp_same_topk: float | None = None  # None: no saved RtP list to compare
    ptr_same_topk: float | None = pydantic.Field(default=None, exclude_if=lambda v: v is None)  # absent: no PtR


def full_check(registry: Registry, si: SubsetInput, found: Searched) -> FullCheck:
    """Share of queries whose recomputed full-registry top-k equals the saved one: a low value means
    the embedder, cache or registry differ from the run's."""
    ids = registry.ids
    same = [{ids[r] for r in rows} == set(saved) for rows, saved in zip(found.rtp, si.saved_rtp, strict=True) if saved]
    out = FullCheck(float(np.mean(same)) if same else None)
    if si.units and si.saved_ptr:
        assert si.ptr_valid is not None
        n = len(si.query_ids)
        same = [{ids[r] for r in found.ptr[u * n + q]} == set(saved)
                for (u, q), saved in si.saved_ptr.items() if si.ptr_valid[u, q]]
        out.ptr_same_topk = float(np.mean(same)) if same else None
    return out


@dataclass
class Point:
    subset: str
    size: int | str  # target size, or "full"
    n_apis: list[int]  # actual size per draw
    gold_only: bool
    seeds: list[int]  # seeds drawn ([] for the full registry and gold-only points: no randomness)
    values: dict[Key, list[float]]  # per seed
    distractors_per_stratum: dict[str, int] = field(default_factory=dict)  # first seed's draw


def run_points(
    registry: Registry, api_vecs: np.ndarray, inputs: Sequence[SubsetInput], sizes: Sequence[int],
    seeds: int, k: int, log: Callable[[str], None] = lambda _: None, memo: Path | None = None,
    lexical: BM25Index | None = None, retriever: str = "dense",
) -> tuple[list[Point], dict[str, Any]]:
    cats = [a.category for a in registry.apis]
    points: list[Point] = []
    checks: dict[str, FullCheck] = {}
    all_rows = np.arange(len(registry))
    api64 = functools.cache(lambda: np.asarray(api_vecs, dtype=np.float64))  # the re-scoring's copy, made once
    matrix = digest(api_vecs) if memo is not None else None
    for si in inputs:
        pool = strata(cats, si.gold_rows)
        found = searcher(api_vecs, si, k, min([*sizes, len(registry)]), api64, memo, matrix, lexical, retriever)
        for size in sizes:
            if size >= len(registry):
                log(f"{si.name}: size {size:,} is not below the registry's {len(registry):,}; the full point covers it")
                continue
            t = time.perf_counter()
            gold_only = len(si.gold_rows) >= size
            draws = [0] if gold_only else list(range(seeds))
            values: dict[Key, list[float]] = {}
            n_apis: list[int] = []
            per: dict[str, int] = {}
            for s in draws:
                sub = sample_subregistry(pool, si.gold_rows, size, seed_rng(s, size))
                if s == draws[0]:
                    per = sub.per_stratum
                n_apis.append(len(sub.rows))
                for key, v in score(si, search(found, si, sub.rows, k)).items():
                    values.setdefault(key, []).append(v)
            points.append(Point(si.name, size, n_apis, gold_only, [] if gold_only else draws, values, per))
            log(f"{si.name}: size {size:,}{' (gold only)' if gold_only else ''}: {time.perf_counter() - t:.1f}s")
        full = search(found, si, all_rows, k)
        points.append(Point(si.name, FULL, [len(registry)], False, [], {key: [v] for key, v in score(si, full).items()}))
        checks[si.name] = full_check(registry, si, full)
        found.save()
    return points, checks


# ---------------------------------------------------------------- outputs


def _saved_order(key: Key) -> str:
    """The rows' order in scaling.json: by the key's text as its names are saved (the metric's name, not the
    member's repr)."""
    arch, model, metric, gold = key
    return str((arch, model, str(metric), gold))


def tidy_rows(points: Sequence[Point]) -> list[dict[str, Any]]:
    rows = []
    for p in points:
        for (arch, model, metric, gold), vals in sorted(p.values.items(), key=lambda kv: _saved_order(kv[0])):
            m, s = mean_std(vals)
            rows.append({"subset": p.subset, "size": p.size, "n_apis": p.n_apis, "gold_only": p.gold_only,
                         "arch": arch, "model": model, "metric": metric, "gold": gold,
                         "mean": m, "std": s if p.seeds else None, "values": vals})
    return rows



# ---------------------------------------------------------------- the study


@pydantic.dataclasses.dataclass
class GoldUnion:
    union: int  # gold APIs of the subset (api_list and relevant)
    in_registry: int
    missing_from_registry: int
    queries: int
    stubs: int


@pydantic.dataclasses.dataclass
class ScalingMeta(About):
    """`scaling.json`'s `meta`: what was run, and what the section states about it."""

    models: list[str] = field(default_factory=list)
    runs: int = 0
    registry_size: int = 0
    k: int = 5
    sizes: list[int] = field(default_factory=list)
    seeds: int = 0
    subsets: list[str] = field(default_factory=list)
    divergence_subset: str = ""
    gold_definition: str = "union of api_list and relevant gold APIs of the subset"
    gold_union: dict[str, GoldUnion] = field(default_factory=dict)
    sampling: str = ("gold union + distractors stratified by category (uncategorised = one stratum), "
                     "largest-remainder allocation proportional to the pool's category sizes, "
                     "numpy.random.default_rng([seed, size])")
    timing_s: float = 0.0
    # The embedding cache's work when the `scaling` command re-embedded (embed.EmbedStats's counters and
    # seconds); absent after a study.
    embed: dict[str, int | float] | None = pydantic.Field(default=None, exclude_if=lambda v: v is None)


_SCALING_META = pydantic.TypeAdapter(ScalingMeta)
_CHECKS = pydantic.TypeAdapter(dict[str, FullCheck])


@dataclass
class ScalingResult:
    """`scaling.json`: `meta` (what was run), the points (with per-seed values) and the full-registry check."""

    meta: ScalingMeta
    points: list[Point]
    full_registry_check: dict[str, FullCheck]  # subset ->

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "meta": plain(self.meta),
            "points": [{"subset": p.subset, "size": p.size, "n_apis": p.n_apis, "gold_only": p.gold_only,
                        "seeds": p.seeds, "distractors_per_stratum": p.distractors_per_stratum} for p in self.points],
            "rows": tidy_rows(self.points),
            "full_registry_check": {s: plain(c) for s, c in self.full_registry_check.items()},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ScalingResult:
        d = migrate.scaling(d)  # any saved version (a no-op on what OutputDir.read_json returns)
        pts = {(p["subset"], p["size"]): Point(p["subset"], p["size"], list(p["n_apis"]), bool(p["gold_only"]),
                                               list(p["seeds"]), {}, dict(p.get("distractors_per_stratum") or {}))
               for p in d.get("points") or []}
        for r in d.get("rows") or []:
            key = (r["arch"], r["model"], Metric.named(r["metric"]), r["gold"])
            pts[(r["subset"], r["size"])].values[key] = list(r["values"])
        return cls(_SCALING_META.validate_python(d["meta"]), list(pts.values()),
                   _CHECKS.validate_python(d.get("full_registry_check") or {}))


def scaling_study(
    records: Sequence[Record], registry: Registry, api_vecs: np.ndarray, encode: Encode, *, subsets: Sequence[str],
    divergence_subset: str, k: int, sizes: Sequence[int] = DEFAULT_SIZES, seeds: int = DEFAULT_SEEDS,
    about: About | Mapping[str, Any] | None = None, log: Callable[[str], None] = lambda _: None,
    memo: Path | None = None, retriever: str = "dense", lexical: BM25Index | None = None,
) -> ScalingResult:
    """`subsets` are full subset names present in `records`; `about` is copied into the result's meta
    (embedder, registry choice, simulated models: what the section states). `memo`: a folder where
    the sub-registry searches are kept (index.SubsetSearch), so an unchanged rerun reads them."""
    t0 = time.perf_counter()
    inputs = build_inputs(records, registry, subsets, encode, k)
    points, checks = run_points(registry, api_vecs, inputs, sorted(set(sizes)), seeds, k, log, memo, lexical,
                                retriever)
    models = sorted({m for si in inputs for m, _ in si.units})
    runs = sorted({r for si in inputs for _, r in si.units})
    meta = ScalingMeta(
        **(about_fields(about) | {"retriever": retriever}), models=models, runs=len(runs),
        registry_size=len(registry), k=k,
        sizes=sorted(set(sizes)), seeds=seeds, subsets=list(subsets), divergence_subset=divergence_subset,
        gold_union={si.name: GoldUnion(len(si.gold_rows) + si.gold_missing, len(si.gold_rows), si.gold_missing,
                                       len(si.query_ids), int(len(si.owners))) for si in inputs},
        timing_s=round(time.perf_counter() - t0, 2))
    return ScalingResult(meta, points, checks)
