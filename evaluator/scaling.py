"""Scaling study (paper Table 10, Figure 3): RtP and PtR recall on sub-registries of growing size.

Runs from a finished output folder and makes no LLM call: PtR reuses the stubs the run saved (stub
generation does not depend on the registry). Every vector comes from the run's embedding cache, and
a sub-registry is an index over some rows of the full embedding matrix, so nothing is re-embedded.

A sub-registry of target size n for subset S holds every gold API of S (the union of both gold sets,
`api_list` and `relevant`; the paper's "all Ground-Truth APIs for the subset under study") plus
n - |gold| distractors drawn without replacement from the other APIs, stratified by category in
proportion to the category sizes of that pool (APIs without a category form their own stratum).
Seed s at size n draws with `numpy.random.default_rng([s, n])`: same seed, same sub-registry, same
numbers. Where the gold union alone reaches n, the point is gold-only (no distractors, no variance).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import retrieve
from .data import GOLD_SETS, DataError, Registry, load_registry
from .index import VectorIndex
from .parse import Stub, stub_text
from .records import read_records
from .report import table
from .stats import mean_std

Encode = Callable[[list[str]], np.ndarray]

DEFAULT_SIZES = (1000, 2000, 5000, 10000, 20000)
DEFAULT_SEEDS = 5
NO_CATEGORY = "(no category)"
FULL = "full"


# ---------------------------------------------------------------- output folder


def read_meta(out_dir: Path) -> dict[str, Any]:
    path = out_dir / "meta.json"
    if not path.is_file():
        raise DataError(f"{out_dir}: no meta.json; pass the --out folder of a finished run.")
    return json.loads(path.read_text(encoding="utf-8"))


def read_output_records(out_dir: Path) -> list[dict[str, Any]]:
    path = out_dir / "queries.jsonl"
    if not path.is_file():
        raise DataError(f"{out_dir}: no queries.jsonl; pass the --out folder of a finished run.")
    return read_records(path)


def match_subsets(available: Sequence[str], wanted: Sequence[str]) -> list[str]:
    """`wanted` holds subset names or prefixes (`G1` matches `G1_instruction`), as on the run's CLI."""
    out: list[str] = []
    for w in wanted:
        hit = [s for s in available if s == w] or [s for s in available if s.startswith(w)]
        if not hit:
            raise DataError(f"Subset {w!r} is not in this output; it has {', '.join(available) or 'none'}.")
        out += [s for s in hit if s not in out]
    return out


def simulated_models(meta: Mapping[str, Any]) -> list[str]:
    return [str(m.get("name")) for m in meta.get("models") or [] if isinstance(m, Mapping) and m.get("simulated")]


def simulated_note(simulated: bool, models: Sequence[str]) -> str:
    if not simulated:
        return ""
    names = ", ".join(f"`{m}`" for m in models) or "the model"
    return (f"> **SIMULATED LLM ({names}):** the LLM was simulated by a heuristic, so these numbers measure "
            "the pipeline, not a language model.\n")


def write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


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
    query_ids: list[int]
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


def _stub_texts(ptr: Mapping[str, Any]) -> list[str]:
    out = []
    for s in ptr.get("stubs") or []:
        if isinstance(s, Mapping):
            out.append(stub_text(Stub(str(s.get("name") or ""), str(s.get("reasoning") or ""))))
    return out


def build_inputs(
    records: Sequence[Mapping[str, Any]], registry: Registry, subsets: Sequence[str], encode: Encode, k: int
) -> list[SubsetInput]:
    """Groups records by subset and embeds queries and stubs: one encode call for each kind."""
    by_subset: dict[str, dict[int, Mapping[str, Any]]] = {s: {} for s in subsets}
    units_of: dict[str, set[tuple[str, int]]] = {s: set() for s in subsets}
    for r in records:
        if r["subset"] in by_subset:
            by_subset[r["subset"]].setdefault(int(r["query_id"]), r)
            if r.get("ptr") is not None and r.get("model") is not None:
                units_of[r["subset"]].add((str(r["model"]), int(r["run"])))
    query_texts: list[str] = []
    stub_texts: list[str] = []
    # Per subset: where its queries start in query_texts, and (owner, stub text index or None = the raw query).
    plans: list[tuple[SubsetInput, int, list[tuple[int, int | None]]]] = []
    row = registry.row
    for name in subsets:
        qs = by_subset[name]
        qids = sorted(qs)
        gold: dict[str, list[set[int]]] = {g: [] for g in GOLD_SETS}
        gold_len: dict[str, list[int]] = {g: [] for g in GOLD_SETS}
        union: set[str] = set()
        for q in qids:
            for g in GOLD_SETS:
                ids = list(dict.fromkeys((qs[q].get("gold") or {}).get(g) or []))
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
            saved_rtp=[list((qs[q].get("rtp") or {}).get("retrieved") or [])[:k] for q in qids],
        )
        first_query = len(query_texts)
        query_texts += [str(qs[q]["query"]) for q in qids]
        stub_plan: list[tuple[int, int | None]] = []
        n = len(qids)
        qpos = {q: i for i, q in enumerate(qids)}
        unit_pos = {u: j for j, u in enumerate(si.units)}
        si.ptr_valid = np.zeros((len(si.units), n), dtype=bool)
        for r in records:
            if r["subset"] != name or r.get("ptr") is None or r.get("model") is None:
                continue
            u, qi = unit_pos[(str(r["model"]), int(r["run"]))], qpos[int(r["query_id"])]
            ptr = r["ptr"]
            si.saved_ptr[(u, qi)] = list(ptr.get("retrieved") or [])[:k]
            if ptr.get("discovery_llm_error"):
                continue  # as in metrics: no stubs to judge, PtR is not scored for this query
            si.ptr_valid[u, qi] = True
            texts = _stub_texts(ptr)
            owner = u * n + qi
            if not texts and ptr.get("fallback"):
                stub_plan.append((owner, None))  # the run searched with the raw query
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
        out.append(si)
    return out


# ---------------------------------------------------------------- evaluation


def _recall(rows: Sequence[int], gold: set[int], n_gold: int) -> float:
    return len(set(rows) & gold) / n_gold if n_gold else float("nan")


Key = tuple[str, str | None, str, str | None]  # (arch, model, metric, gold)


@dataclass
class Searched:
    """Top-k registry rows of one subset on one (sub-)registry: per query, and per (PtR unit, query)."""

    rtp: list[list[int]]
    ptr: list[list[int]]  # index unit * n + query


def search(index: VectorIndex, si: SubsetInput, k: int) -> Searched:
    """Two batched searches: every query, then every stub of every (model, run) at once."""
    rtp = [r.rows[:k] for r in retrieve.rtp(index, si.query_vecs, k)]
    ptr: list[list[int]] = []
    if si.units:
        assert si.stub_vecs is not None
        n_units = len(si.units) * len(si.query_ids)
        ptr = [r.rows[:k] for r in retrieve.ptr(index, si.stub_vecs, si.owners, n_units, k, [k])]
    return Searched(rtp, ptr)


def score(si: SubsetInput, found: Searched) -> dict[Key, float]:
    """One point, one seed. PtR values: mean over queries per run, then over the model's runs."""
    n = len(si.query_ids)
    out: dict[Key, float] = {}
    for g in GOLD_SETS:
        out[("rtp", None, "recall", g)] = float(
            np.nanmean([_recall(found.rtp[q], si.gold[g][q], si.gold_len[g][q]) for q in range(n)])
        )
    per_model: dict[str, dict[tuple[str, str | None], list[float]]] = {}
    for u, (model, _run) in enumerate(si.units):
        assert si.ptr_valid is not None
        valid = np.flatnonzero(si.ptr_valid[u]).tolist()
        if not valid:
            continue
        acc = per_model.setdefault(model, {})
        tops = {q: set(found.ptr[u * n + q]) for q in valid}
        for g in GOLD_SETS:
            vals = [_recall(list(tops[q]), si.gold[g][q], si.gold_len[g][q]) for q in valid]
            acc.setdefault(("recall", g), []).append(float(np.nanmean(vals)))
        # divergent: the top-k sets differ (STUDY.md); disjoint: they share nothing (the paper's 3.2 wording).
        acc.setdefault(("divergent", None), []).append(float(np.mean([tops[q] != set(found.rtp[q]) for q in valid])))
        acc.setdefault(("disjoint", None), []).append(float(np.mean([not tops[q] & set(found.rtp[q]) for q in valid])))
    for model, acc in per_model.items():
        for (metric, g), vals in acc.items():
            out[("ptr" if metric == "recall" else "both", model, metric, g)] = statistics.fmean(vals)
    return out


def full_check(registry: Registry, si: SubsetInput, found: Searched) -> dict[str, Any]:
    """Share of queries whose recomputed full-registry top-k equals the saved one: a low value means
    the embedder, cache or registry differ from the run's."""
    ids = registry.ids
    same = [{ids[r] for r in rows} == set(saved) for rows, saved in zip(found.rtp, si.saved_rtp, strict=True) if saved]
    out: dict[str, Any] = {"rtp_same_topk": float(np.mean(same)) if same else None}
    if si.units and si.saved_ptr:
        assert si.ptr_valid is not None
        n = len(si.query_ids)
        same = [{ids[r] for r in found.ptr[u * n + q]} == set(saved)
                for (u, q), saved in si.saved_ptr.items() if si.ptr_valid[u, q]]
        out["ptr_same_topk"] = float(np.mean(same)) if same else None
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
    seeds: int, k: int, log: Callable[[str], None] = lambda _: None,
) -> tuple[list[Point], dict[str, Any]]:
    cats = [a.category for a in registry.apis]
    points: list[Point] = []
    checks: dict[str, Any] = {}
    full_index = VectorIndex(api_vecs)
    for si in inputs:
        pool = strata(cats, si.gold_rows)
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
                for key, v in score(si, search(VectorIndex(api_vecs, rows=sub.rows), si, k)).items():
                    values.setdefault(key, []).append(v)
            points.append(Point(si.name, size, n_apis, gold_only, [] if gold_only else draws, values, per))
            log(f"{si.name}: size {size:,}{' (gold only)' if gold_only else ''}: {time.perf_counter() - t:.1f}s")
        found = search(full_index, si, k)
        points.append(Point(si.name, FULL, [len(registry)], False, [], {key: [v] for key, v in score(si, found).items()}))
        checks[si.name] = full_check(registry, si, found)
    return points, checks


# ---------------------------------------------------------------- outputs


def tidy_rows(points: Sequence[Point]) -> list[dict[str, Any]]:
    rows = []
    for p in points:
        for (arch, model, metric, gold), vals in sorted(p.values.items(), key=lambda kv: str(kv[0])):
            m, s = mean_std(vals)
            rows.append({"subset": p.subset, "size": p.size, "n_apis": p.n_apis, "gold_only": p.gold_only,
                         "arch": arch, "model": model, "metric": metric, "gold": gold,
                         "mean": m, "std": s if p.seeds else None, "values": vals})
    return rows


def _fmt(p: Point | None, key: Key, pct: bool = False) -> tuple[str, float]:
    if p is None or key not in p.values:
        return "–", float("nan")
    m, s = mean_std(p.values[key])
    assert m is not None
    mean = f"{100 * m:.1f}" if pct else f"{m:.3f}".lstrip("0")
    if p.seeds:
        sd = s or 0.0
        mean += f"±{100 * sd:.1f}" if pct else "±" + f"{sd:.3f}".lstrip("0")
    return mean + ("†" if p.gold_only else ""), m


def _size_label(size: int | str, pts: Sequence[Point]) -> str:
    if size == FULL:
        return f"full ({pts[0].n_apis[0]:,})" if pts else "full"
    label = f"{int(size):,}"
    for p in pts:
        if p.gold_only:
            label += f" ({p.subset.split('_')[0]}: gold-only, {p.n_apis[0]:,} APIs†)"
    return label


def section_md(result: dict[str, Any], points: Sequence[Point]) -> str:
    meta = result["meta"]
    subsets: list[str] = meta["subsets"]
    models: list[str] = meta["models"]
    k = meta["k"]
    div_subset = meta["divergence_subset"]
    sizes: list[int | str] = [*[s for s in meta["sizes"] if any(p.size == s for p in points)], FULL]
    at = {(p.subset, p.size): p for p in points}
    short = {s: s.split("_")[0] for s in subsets}
    out = ["## Scaling study (Table 10)\n"]
    if note := simulated_note(meta["simulated"], meta["simulated_models"]):
        out.append(note)
    golds = meta["gold_union"]
    out.append("\n".join([
        f"- Models: {', '.join(f'`{m}`' for m in models) or 'none (retrieval only: RtP only)'}; runs: "
        f"{meta['runs']} (PtR values are means over runs, then mean ± std over seeds)",
        f"- Embedder: `{meta['embedder']}` ({meta['precision']}); registry: {meta['registry_size']:,} APIs "
        f"(`{meta['registry_choice']}`); recall@{k}",
        "- Sub-registry: every gold API of the subset (union of `api_list` and `relevant`: "
        + ", ".join(f"{short[s]} {golds[s]['union']:,}" for s in subsets)
        + ") + distractors drawn in proportion to category sizes (uncategorised APIs are one stratum); "
        f"{meta['seeds']} seeds per size (`numpy.random.default_rng([seed, size])`); the full registry "
        "has no randomness.",
        "- † gold-only point: the subset's gold APIs alone reach the target size (no distractors, no variance).",
        f"- Div%: share of {short.get(div_subset, div_subset)} queries whose RtP and PtR top-{k} sets differ "
        "(STUDY.md); Disj%: share whose top-k sets share no API (the paper's §3.2 wording), "
        "both on that subset's sub-registries.",
        f"- Run time: {meta['timing_s']['total']:.1f}s; embeddings: {meta['embed']['embedded']} texts "
        f"embedded (cache misses), {meta['embed'].get('cache_hits', '–')} cache hits.",
    ]) + "\n")
    for model in models or [None]:
        for gold in GOLD_SETS:
            title = f"### Recall@{k} by registry size — gold `{gold}`" + (f", model `{model}`" if model else "")
            if model and model in meta["simulated_models"]:
                title += " (simulated LLM)"
            header = ["Registry size"]
            for s in subsets:
                header += [f"{short[s]} RtP"] + ([f"{short[s]} PtR"] if model else [])
            if model and div_subset in subsets:
                header += [f"{short[div_subset]} Div%", f"{short[div_subset]} Disj%"]
            body = []
            for size in sizes:
                line = [_size_label(size, [at[(s, size)] for s in subsets if (s, size) in at])]
                for s in subsets:
                    p = at.get((s, size))
                    r, rv = _fmt(p, ("rtp", None, "recall", gold))
                    if model:
                        q, qv = _fmt(p, ("ptr", model, "recall", gold))
                        best = max(rv, qv)
                        line += [f"**{r}**" if rv == best and rv != qv else r,
                                 f"**{q}**" if qv == best and rv != qv else q]
                    else:
                        line.append(r)
                if model and div_subset in subsets:
                    p = at.get((div_subset, size))
                    line += [_fmt(p, ("both", model, "divergent", None), pct=True)[0],
                             _fmt(p, ("both", model, "disjoint", None), pct=True)[0]]
                body.append(line)
            out.append(title + "\n\n" + table(header, body) + "\n")
    checks = result.get("full_registry_check") or {}
    if checks:
        parts = []
        for s, c in checks.items():
            seg = f"{short.get(s, s)}: RtP {_pct(c.get('rtp_same_topk'))}"
            if c.get("ptr_same_topk") is not None:
                seg += f", PtR {_pct(c['ptr_same_topk'])}"
            parts.append(seg)
        out.append(f"Full-registry check (recomputed top-{k} equal to the run's saved top-{k}): "
                   + "; ".join(parts) + ". Values well below 100% mean the embeddings or registry differ from "
                   "the run's.\n")
    out.append("![scaling](figures/scaling.png)\n")  # sections are inlined into OUT/report.md
    return "\n".join(out)


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def figure(result: dict[str, Any], points: Sequence[Point], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # headless
    import matplotlib.pyplot as plt

    meta = result["meta"]
    subsets, models, k = meta["subsets"], meta["models"], meta["k"]
    div_subset = meta["divergence_subset"]
    with_div = bool(models) and div_subset in subsets
    ncols = len(subsets) + int(with_div)
    fig, axes = plt.subplots(len(GOLD_SETS), ncols, figsize=(4.2 * ncols, 3.4 * len(GOLD_SETS)), squeeze=False)
    colors = ["#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2"]

    def series(subset: str, key: Key) -> tuple[list, list, list]:
        xs, ms, ss = [], [], []
        for p in sorted((p for p in points if p.subset == subset and key in p.values),
                        key=lambda p: max(p.n_apis)):
            m, s = mean_std(p.values[key])
            xs.append(float(np.mean(p.n_apis)))
            ms.append(m)
            ss.append(s or 0.0)
        return xs, ms, ss

    def draw(ax: Any, xs: list, ms: list, ss: list, color: str, label: str, ls: str = "-") -> None:
        if not xs:
            return
        m, s = np.asarray(ms, float), np.asarray(ss, float)
        ax.plot(xs, m, marker="o" if ls == "-" else "s", ls=ls, color=color, label=label)
        ax.fill_between(xs, m - s, m + s, color=color, alpha=0.2)

    for gi, gold in enumerate(GOLD_SETS):
        for si, subset in enumerate(subsets):
            ax = axes[gi][si]
            draw(ax, *series(subset, ("rtp", None, "recall", gold)), "#1f77b4", "RtP")
            for mi, model in enumerate(models):
                draw(ax, *series(subset, ("ptr", model, "recall", gold)), colors[mi % len(colors)],
                     f"PtR ({model})" if len(models) > 1 else "PtR")
            for p in points:
                if p.subset == subset and p.gold_only:
                    ax.axvline(p.n_apis[0], color="#999999", ls=":", lw=1)
            ax.set_xscale("log")
            ax.set_title(f"{subset.split('_')[0]} recall@{k} (gold {gold})", fontsize=10)
            ax.set_xlabel("registry size (APIs)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        if with_div:
            ax = axes[gi][-1]
            if gi == 0:
                for mi, model in enumerate(models):
                    for metric, ls in (("divergent", "-"), ("disjoint", "--")):
                        xs, ms, ss = series(div_subset, ("both", model, metric, None))
                        draw(ax, xs, [100 * m for m in ms], [100 * s for s in ss], colors[mi % len(colors)],
                             f"{'Div%' if metric == 'divergent' else 'Disj%'}" + (f" ({model})" if len(models) > 1 else ""),
                             ls)
                ax.set_xscale("log")
                ax.set_title(f"{div_subset.split('_')[0]} top-{k} divergence (%)", fontsize=10)
                ax.set_xlabel("registry size (APIs)")
                ax.grid(alpha=0.3)
                ax.legend(fontsize=8)
            else:
                ax.axis("off")
    title = "Scaling: " + (", ".join(models) if models else "retrieval only") + f" · {meta['embedder']}"
    if meta.get("simulated"):
        title += " · SIMULATED LLM"
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- command


def resolve_cache_dir(meta: Mapping[str, Any], override: str | None) -> Path:
    from .config import Settings

    value = override or (meta.get("settings") or {}).get("cache_dir") or "cache"
    return Settings().resolve_path(value)


def make_encoder(meta: Mapping[str, Any], cache_dir: Path, device: str, progress: bool) -> tuple[Encode, Any]:
    """The run's embedder, reading the run's cache: the same model name and precision give the same keys."""
    from .embed import Embedder

    settings = meta.get("settings") or {}
    model = settings.get("embedder") or meta.get("embedder")
    precision = meta.get("precision") or settings.get("precision") or "auto"
    emb = Embedder(model, device=device, precision=precision, cache_dir=cache_dir, progress=progress)
    return (lambda texts: emb.encode(texts, desc="embedding (cache misses)")), emb


def run_scaling(
    out_dir: Path, *, sizes: Sequence[int] = DEFAULT_SIZES, seeds: int = DEFAULT_SEEDS,
    subsets: Sequence[str] = ("G1", "G2"), divergence_subset: str = "G1", k: int | None = None,
    data_dir: str | None = None, encode: Encode | None = None, cache_dir: str | None = None,
    device: str = "auto", progress: bool = True, log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Runs the study and writes scaling.json, sections/50-scaling.md and figures/scaling.png."""
    t0 = time.perf_counter()
    timing: dict[str, float] = {}
    out_dir = Path(out_dir)
    meta = read_meta(out_dir)
    records = read_output_records(out_dir)
    k = int(k or meta.get("k") or 5)
    available = sorted({str(r["subset"]) for r in records})
    chosen = match_subsets(available, subsets)
    div_match = [s for s in chosen if s == divergence_subset] or [s for s in chosen if s.startswith(divergence_subset)]
    div = div_match[0] if div_match else divergence_subset  # not among the chosen subsets: no divergence column
    data = data_dir or meta.get("data_dir") or (meta.get("settings") or {}).get("data_dir")
    if not data:
        raise DataError(f"{out_dir}/meta.json names no data_dir; pass --data DIR.")
    choice = (meta.get("registry") or {}).get("choice", "full")
    registry = load_registry(data, choice)
    expected = (meta.get("registry") or {}).get("size")
    if expected and expected != len(registry):
        log(f"warning: the registry now has {len(registry):,} APIs, the run had {expected:,}")
    timing["load"] = time.perf_counter() - t0

    embedder = None
    if encode is None:
        encode, embedder = make_encoder(meta, resolve_cache_dir(meta, cache_dir), device, progress)
    t = time.perf_counter()
    api_vecs = encode(registry.texts())
    inputs = build_inputs(records, registry, chosen, encode, k)
    timing["embed"] = time.perf_counter() - t
    embed_stats = asdict(embedder.stats) if embedder is not None else {"embedded": 0, "injected_encoder": True}
    if embed_stats.get("embedded"):
        log(f"note: {embed_stats['embedded']} texts were not in the embedding cache and were embedded now")

    t = time.perf_counter()
    points, checks = run_points(registry, api_vecs, inputs, sorted(set(sizes)), seeds, k, log)
    timing["search"] = time.perf_counter() - t
    models = sorted({m for si in inputs for m, _ in si.units})
    runs = sorted({r for si in inputs for _, r in si.units})
    result: dict[str, Any] = {
        "meta": {
            "out_dir": str(out_dir), "models": models, "runs": len(runs), "simulated": bool(meta.get("simulated")),
            "simulated_models": simulated_models(meta),
            "embedder": (embedder.cache_name if embedder else meta.get("embedder")) or "injected",
            "precision": (embedder.precision if embedder else meta.get("precision")) or "–",
            "registry_size": len(registry), "registry_choice": choice, "data_dir": str(data),
            "k": k, "sizes": sorted(set(sizes)), "seeds": seeds, "subsets": chosen, "divergence_subset": div,
            "gold_definition": "union of api_list and relevant gold APIs of the subset",
            "gold_union": {si.name: {"union": len(si.gold_rows) + si.gold_missing, "in_registry": len(si.gold_rows),
                                     "missing_from_registry": si.gold_missing, "queries": len(si.query_ids),
                                     "stubs": int(len(si.owners))} for si in inputs},
            "sampling": "gold union + distractors stratified by category (uncategorised = one stratum), "
                        "largest-remainder allocation proportional to the pool's category sizes, "
                        "numpy.random.default_rng([seed, size])",
            "embed": embed_stats,
        },
        "points": [{"subset": p.subset, "size": p.size, "n_apis": p.n_apis, "gold_only": p.gold_only,
                    "seeds": p.seeds, "distractors_per_stratum": p.distractors_per_stratum} for p in points],
        "rows": tidy_rows(points),
        "full_registry_check": checks,
    }
    timing["total"] = time.perf_counter() - t0
    result["meta"]["timing_s"] = {key: round(v, 2) for key, v in timing.items()}
    write_text(out_dir / "sections" / "50-scaling.md", section_md(result, points))
    figure(result, points, out_dir / "figures" / "scaling.png")
    result["meta"]["timing_s"]["total"] = round(time.perf_counter() - t0, 2)
    write_text(out_dir / "scaling.json", json.dumps(result, indent=2, sort_keys=True, default=_json_default) + "\n")
    return result


def _json_default(x: Any) -> Any:
    if isinstance(x, np.integer | np.floating):
        return x.item()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def _ints(value: str) -> list[int]:
    try:
        return [int(v.replace("_", "")) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {value!r}") from None


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m evaluator scaling",
        description="Scaling study (paper Table 10): RtP and PtR recall on sub-registries of growing size, "
        "from a finished output folder; no LLM call, embeddings from the run's cache.",
    )
    p.add_argument("out_dir", type=Path)
    p.add_argument("--sizes", type=_ints, default=list(DEFAULT_SIZES), help="sub-registry sizes (default 1000,2000,5000,10000,20000); the full registry is always added")
    p.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, help="distractor draws per size (default 5)")
    p.add_argument("--subsets", default="G1,G2", help="comma list of subsets or prefixes (default G1,G2)")
    p.add_argument("--divergence-subset", default="G1", help="subset whose top-k divergence is reported (default G1)")
    p.add_argument("--k", type=int, help="retrieval budget (default: the run's k)")
    p.add_argument("--data", help="data folder (default: the run's, from meta.json)")
    p.add_argument("--cache-dir", help="embedding cache root (default: the run's)")
    p.add_argument("--device", default="auto", help="device for cache misses (default auto)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.seeds < 1 or any(s < 1 for s in args.sizes):
        p.error("--seeds and every size must be at least 1")
    res = run_scaling(
        args.out_dir, sizes=args.sizes, seeds=args.seeds, subsets=[s.strip() for s in args.subsets.split(",") if s.strip()],
        divergence_subset=args.divergence_subset, k=args.k, data_dir=args.data, cache_dir=args.cache_dir,
        device=args.device, progress=not args.no_progress,
        log=lambda m: print(m, file=sys.stderr),
    )
    print(f"Scaling study in {res['meta']['timing_s']['total']:.1f}s: {args.out_dir}/scaling.json, "
          f"sections/50-scaling.md, figures/scaling.png")
    from .report import render

    render(args.out_dir)  # report.md appends sections/*.md: keep it in step
    print(f"Updated {args.out_dir}/report.md")
    return 0
