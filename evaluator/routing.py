"""Complexity-adaptive routing (beyond the paper), from the saved records alone: no embedding, no LLM.

A router sends each query to RtP or PtR. The score router sends it to RtP when RtP's own top-1 cosine
(`rtp.scores[0]`, free: the pipeline already computed it) is at least τ, else to PtR; the cheap proxies
the paper names send it to RtP when the query's word count (or clause count) is at most θ. A query
routed to RtP pays only its RtP planner call; one routed to PtR pays discovery + PtR planner.

Objective for choosing τ: maximise mean recall@k (over runs) on the tuning queries, ties broken by
fewer tokens, then by the lower threshold. Thresholds are midpoints between consecutive observed
values of the tuning queries, plus ±inf (the two "always" policies), so a chosen τ never sits on a
test query's value. The in-sample sweep is optimistic by construction; the held-out evaluations
choose τ on some queries and score it on others: (a) tuned on G1+G2, reported on G3; (b) seeded
k-fold cross-validation, folds stratified by subset.

Queries whose PtR discovery call failed for good are left out of that run (as in the metrics), so
every policy is compared on the same queries.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .data import GOLD_SETS, DataError
from .metrics import retrieval_obs
from .report import table
from .scaling import read_meta, read_output_records, simulated_models, simulated_note, write_text

# name -> (label, direction): "high" sends high values to RtP, "low" sends low values to RtP.
SIGNALS: dict[str, tuple[str, str]] = {
    "score": ("RtP top-1 score", "high"),
    "words": ("query length (words)", "low"),
    "clauses": ("clause count", "low"),
}
ARCH_LABEL = {"rtp": "RtP", "ptr": "PtR"}
DEFAULT_FOLDS = 5
METRICS = ("recall", "precision")

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
    keys: list[tuple[str, int]]  # (subset, query_id)
    subsets: np.ndarray  # (n,) subset name per query
    signals: dict[str, np.ndarray]  # name -> (n,)
    rtp: dict[str, np.ndarray]  # "recall:api_list", ..., "tokens" -> (R, n)
    ptr: dict[str, np.ndarray]
    valid: np.ndarray  # (R, n) bool: both architectures scoreable for this query in this run
    excluded: int = 0  # (run, query) pairs left out: PtR discovery failed or a record is missing


def _tokens(block: Mapping[str, Any] | None) -> float:
    total = 0.0
    for counts in ((block or {}).get("tokens") or {}).values():
        if isinstance(counts, Mapping):
            total += float(counts.get("prompt") or 0) + float(counts.get("completion") or 0)
    return total


def _retrieval(block: Mapping[str, Any], gold: Mapping[str, Sequence[str]], k: int) -> dict[str, float]:
    obs: dict = {}
    # Deduplicated as in metrics.record_obs, so "always RtP/PtR" here match the main tables.
    retrieved = list(dict.fromkeys(x for x in block.get("retrieved") or [] if x is not None))
    retrieval_obs("x", retrieved, gold, [k], obs)
    return {f"{m}:{g}": obs[("x", m, k, g)][0] for m in METRICS for g in GOLD_SETS if ("x", m, k, g) in obs}


def model_data(records: Sequence[Mapping[str, Any]], model: str, k: int) -> ModelData:
    recs = [r for r in records if r.get("model") == model]
    runs = sorted({int(r["run"]) for r in recs})
    keys = sorted({(str(r["subset"]), int(r["query_id"])) for r in recs})
    pos = {key: i for i, key in enumerate(keys)}
    rpos = {run: j for j, run in enumerate(runs)}
    n, R = len(keys), len(runs)
    names = [f"{m}:{g}" for m in METRICS for g in GOLD_SETS] + ["tokens"]
    rtp = {name: np.zeros((R, n)) for name in names}
    ptr = {name: np.zeros((R, n)) for name in names}
    valid = np.zeros((R, n), dtype=bool)
    score = np.full(n, -np.inf)
    text = [""] * n
    for r in recs:
        j, i = rpos[int(r["run"])], pos[(str(r["subset"]), int(r["query_id"]))]
        text[i] = str(r.get("query") or "")
        rb, pb = r.get("rtp") or {}, r.get("ptr")
        if rb.get("scores"):
            score[i] = float(rb["scores"][0])  # identical across runs: RtP retrieval is deterministic
        if pb is None or pb.get("discovery_llm_error") or not rb:
            continue
        gold = {g: (r.get("gold") or {}).get(g) or [] for g in GOLD_SETS}
        for block, into in ((rb, rtp), (pb, ptr)):
            for name, v in _retrieval(block, gold, k).items():
                into[name][j, i] = v
            into["tokens"][j, i] = _tokens(block)
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
class Outcome:
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

    def as_dict(self) -> dict[str, Any]:
        return {"to_rtp": self.to_rtp, "n_queries": self.n_queries,
                **{name: {"mean": self.mean(name), "std": self.std(name), "values": v}
                   for name, v in self.values.items()}}


def score_policy(d: ModelData, to_rtp: np.ndarray, sel: np.ndarray | None = None) -> Outcome:
    sel = np.ones(len(d.keys), dtype=bool) if sel is None else sel
    values: dict[str, list[float]] = {name: [] for name in d.rtp}
    for j in range(len(d.runs)):
        use = sel & d.valid[j]
        if not use.any():
            continue
        for name in d.rtp:
            v = np.where(to_rtp, d.rtp[name][j], d.ptr[name][j])
            values[name].append(float(v[use].mean()))
    share = float(to_rtp[sel].mean()) if sel.any() else float("nan")
    return Outcome(values, share, int(sel.sum()))


def candidates(values: np.ndarray) -> np.ndarray:
    """-inf, midpoints between consecutive distinct finite values, +inf."""
    u = np.unique(values[np.isfinite(values)])
    return np.concatenate([[-np.inf], (u[:-1] + u[1:]) / 2, [np.inf]])


def sweep(d: ModelData, signal: str, sel: np.ndarray | None = None,
          taus: np.ndarray | None = None) -> list[tuple[float, Outcome]]:
    sel = np.ones(len(d.keys), dtype=bool) if sel is None else sel
    direction = SIGNALS[signal][1]
    s = d.signals[signal]
    taus = candidates(s[sel]) if taus is None else taus
    return [(float(t), score_policy(d, route(s, float(t), direction), sel)) for t in taus]


def choose(points: Sequence[tuple[float, Outcome]], gold: str) -> tuple[float, Outcome]:
    """The objective: highest mean recall, then fewest tokens, then the lowest threshold."""
    def key(p: tuple[float, Outcome]) -> tuple[float, float, float]:
        # Rounded so that float noise in a mean never outranks a real token saving.
        return (-round(p[1].mean(f"recall:{gold}"), 9), round(p[1].mean("tokens"), 6), p[0])

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
        key_r = (-round(r.mean(f"recall:{gold}"), 9), r.mean("tokens"))
        key_p = (-round(p.mean(f"recall:{gold}"), 9), p.mean("tokens"))
        choice[sub] = "rtp" if key_r <= key_p else "ptr"
        to_rtp[m] = choice[sub] == "rtp"
    return to_rtp, choice


def baselines(d: ModelData, gold: str, sel: np.ndarray | None = None) -> dict[str, Any]:
    n = len(d.keys)
    o_mask, o_choice = oracle(d, gold, sel)
    return {
        "always_rtp": score_policy(d, np.ones(n, dtype=bool), sel).as_dict(),
        "always_ptr": score_policy(d, np.zeros(n, dtype=bool), sel).as_dict(),
        "oracle": score_policy(d, o_mask, sel).as_dict() | {"choice": o_choice},
    }


def split_masks(d: ModelData, train: Sequence[str], test: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    def match(prefixes: Sequence[str]) -> np.ndarray:
        return np.array([any(s == p or s.startswith(p) for p in prefixes) for s in d.subsets.tolist()], dtype=bool)

    return match(train), match(test)


def fold_ids(d: ModelData, folds: int, seed: int) -> np.ndarray:
    """Fold of each query: shuffled within each subset (seeded), then dealt round-robin."""
    rng = np.random.default_rng(seed)
    out = np.zeros(len(d.keys), dtype=int)
    for sub in sorted(set(d.subsets.tolist())):
        idx = np.flatnonzero(d.subsets == sub)
        out[rng.permutation(idx)] = np.arange(len(idx)) % folds
    return out


def heldout_split(d: ModelData, signal: str, gold: str, train: np.ndarray, test: np.ndarray) -> dict[str, Any]:
    tau, fit = choose(sweep(d, signal, train), gold)
    applied = route(d.signals[signal], tau, SIGNALS[signal][1])
    return {"tau": tau, "train": fit.as_dict(), "test": score_policy(d, applied, test).as_dict(),
            "test_baselines": baselines(d, gold, test)}


def cross_validate(d: ModelData, signal: str, gold: str, folds: np.ndarray) -> dict[str, Any]:
    to_rtp = np.zeros(len(d.keys), dtype=bool)
    taus: list[float] = []
    for f in sorted(set(folds.tolist())):
        test = folds == f
        tau, _ = choose(sweep(d, signal, ~test), gold)  # chosen without the fold it is scored on
        to_rtp[test] = route(d.signals[signal], tau, SIGNALS[signal][1])[test]
        taus.append(tau)
    return {"taus": taus, "test": score_policy(d, to_rtp).as_dict(), "test_baselines": baselines(d, gold)}


# ---------------------------------------------------------------- study


@dataclass
class Options:
    k: int
    train: list[str] = field(default_factory=lambda: ["G1", "G2"])
    test: list[str] = field(default_factory=lambda: ["G3"])
    folds: int = DEFAULT_FOLDS
    seed: int = 0


def analyse_model(d: ModelData, opt: Options) -> dict[str, Any]:
    out: dict[str, Any] = {"n_queries": len(d.keys), "runs": d.runs, "excluded_run_queries": d.excluded,
                           "baselines": {}, "sweeps": {}, "best_in_sample": {}, "heldout": {}}
    train, test = split_masks(d, opt.train, opt.test)
    folds = fold_ids(d, opt.folds, opt.seed)
    for signal in SIGNALS:
        pts = sweep(d, signal)
        out["sweeps"][signal] = [{"tau": t, "to_rtp": o.to_rtp,
                                  **{name: {"mean": o.mean(name), "std": o.std(name)} for name in o.values}}
                                 for t, o in pts]
        for gold in GOLD_SETS:
            tau, best = choose(pts, gold)
            out["best_in_sample"].setdefault(signal, {})[gold] = {"tau": tau, **best.as_dict(),
                                                                  "to_rtp_by_subset": _share_by_subset(d, signal, tau)}
    for gold in GOLD_SETS:
        out["baselines"][gold] = baselines(d, gold)
        h = out["heldout"].setdefault(gold, {})
        for signal in SIGNALS:
            if train.any() and test.any():
                h.setdefault("subset_split", {})[signal] = heldout_split(d, signal, gold, train, test)
            if len(set(folds.tolist())) >= 2:
                h.setdefault("cv", {})[signal] = cross_validate(d, signal, gold, folds)
    return out


def _share_by_subset(d: ModelData, signal: str, tau: float) -> dict[str, float]:
    to_rtp = route(d.signals[signal], tau, SIGNALS[signal][1])
    return {sub: float(to_rtp[d.subsets == sub].mean()) for sub in sorted(set(d.subsets.tolist()))}


def run_routing(out_dir: Path, opt: Options | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    meta = read_meta(out_dir)
    records = read_output_records(out_dir)
    opt = opt or Options(k=int(meta.get("k") or 5))
    models = sorted({str(r["model"]) for r in records if r.get("model") is not None and r.get("ptr") is not None})
    if not models:
        raise DataError(f"{out_dir}: no PtR records (a retrieval-only run?); routing needs both architectures.")
    result: dict[str, Any] = {
        "meta": {
            "out_dir": str(out_dir), "models": models, "k": opt.k, "simulated": bool(meta.get("simulated")),
            "simulated_models": simulated_models(meta), "embedder": meta.get("embedder"),
            "subsets": sorted({str(r["subset"]) for r in records}),
            "signals": {name: {"label": label, "rtp_when": "signal >= tau" if direc == "high" else "signal <= tau"}
                        for name, (label, direc) in SIGNALS.items()},
            "objective": "max mean recall@k over runs (per gold set), ties: fewer tokens, then lower tau",
            "thresholds": "midpoints between consecutive observed values of the tuning queries, plus -inf and +inf",
            "tokens": "mean per query of prompt+completion tokens: RtP planner if routed to RtP, "
                      "PtR discovery + planner if routed to PtR",
            "split": {"train": opt.train, "test": opt.test}, "folds": opt.folds, "fold_seed": opt.seed,
        },
        "models": {},
    }
    for m in models:
        d = model_data(records, m, opt.k)
        result["models"][m] = analyse_model(d, opt)
        if d.excluded:
            log(f"{m}: {d.excluded} (run, query) pairs left out (PtR discovery failed or record missing)")
    result["meta"]["timing_s"] = round(time.perf_counter() - t0, 2)
    write_text(out_dir / "sections" / "60-routing.md", section_md(result))
    figure(result, out_dir / "figures" / "routing.png")
    write_text(out_dir / "routing.json", json.dumps(result, indent=2, sort_keys=True, default=_json_default) + "\n")
    return result


def _json_default(x: Any) -> Any:
    if isinstance(x, np.integer | np.floating | np.bool_):
        return x.item()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


# ---------------------------------------------------------------- report


def _f(o: Mapping[str, Any], name: str, digits: int = 3) -> str:
    m, s = o[name]["mean"], o[name]["std"]
    if m is None or (isinstance(m, float) and math.isnan(m)):
        return "–"
    txt = f"{m:.{digits}f}" if digits else f"{m:,.0f}"
    if s is not None and digits:
        txt += "±" + f"{s:.{digits}f}".lstrip("0")
    return txt.lstrip("0") if digits and txt.startswith("0.") else txt


def _tau(signal: str, tau: float) -> str:
    if math.isinf(tau):
        # ±inf are the "always" policies: say which, not the symbol.
        high = SIGNALS[signal][1] == "high"
        return "always PtR" if (tau > 0) == high else "always RtP"
    return f"{tau:.3f}" if signal == "score" else f"{tau:g}"


def _saving(o: Mapping[str, Any], ptr: Mapping[str, Any], rtp: Mapping[str, Any]) -> str:
    t, tp, tr = o["tokens"]["mean"], ptr["tokens"]["mean"], rtp["tokens"]["mean"]
    if not tp:
        return "–"
    s = f"{100 * (tp - t) / tp:.1f}%"
    if tp > tr:
        s += f" ({100 * (tp - t) / (tp - tr):.0f}%)"
    return s


def section_md(result: Mapping[str, Any]) -> str:
    meta = result["meta"]
    k = meta["k"]
    out = ["## Complexity-adaptive routing (beyond the paper)\n"]
    if note := simulated_note(meta["simulated"], meta["simulated_models"]):
        out.append(note)
    out.append("\n".join([
        f"- Models: {', '.join(f'`{m}`' for m in meta['models'])}; recall@{k} and precision@{k} per run, "
        "mean ± std over runs; both gold sets (`api_list` paper-comparable; `relevant` stricter).",
        "- Score router: RtP when RtP's top-1 cosine ≥ τ, else PtR. Proxies (computable before any call): "
        "RtP when the query has at most θ words / clauses (clauses: sentence ends and conjunctions such as "
        "*and*, *also*, *then*).",
        "- Tokens: mean per query; a query sent to RtP pays its RtP planner call only, one sent to PtR pays "
        "discovery + PtR planner. *Saving* is against always-PtR, in parentheses the share of PtR's extra "
        "(discovery-driven) tokens avoided.",
        "- Objective to choose τ: maximise mean recall, ties broken by fewer tokens. Candidates are midpoints "
        "between observed values of the tuning queries plus ±inf (= always RtP / always PtR).",
        "- Oracle: each subset sent wholesale to its better architecture (by mean recall), chosen on the "
        "queries it is scored on: an upper reference, not a deployable router.",
        f"- Held-out: (a) τ tuned on {'+'.join(meta['split']['train'])}, reported on "
        f"{'+'.join(meta['split']['test'])}; (b) {meta['folds']}-fold cross-validation (folds stratified by "
        f"subset, seed {meta['fold_seed']}): every query is routed by a τ chosen without its fold.",
    ]) + "\n")
    for model, res in result["models"].items():
        sim = " (simulated LLM)" if model in meta["simulated_models"] else ""
        if res["excluded_run_queries"]:
            out.append(f"`{model}`: {res['excluded_run_queries']} (run, query) pairs left out (PtR discovery "
                       "failed for good, or a record is missing).\n")
        for gold in GOLD_SETS:
            b = res["baselines"][gold]
            subs = sorted(b["oracle"]["choice"])
            header = ["policy", "threshold", "to RtP", f"R@{k}", f"P@{k}", "tokens/query", "saving vs PtR",
                      "to RtP by subset"]
            body = []
            for name, o in (("always RtP", b["always_rtp"]), ("always PtR", b["always_ptr"])):
                body.append([name, "–", f"{100 * o['to_rtp']:.0f}%", _f(o, f"recall:{gold}"),
                             _f(o, f"precision:{gold}"), _f(o, "tokens", 0), _saving(o, b["always_ptr"], b["always_rtp"]), "–"])
            o = b["oracle"]
            body.append(["per-subset oracle", ", ".join(f"{s.split('_')[0]}→{ARCH_LABEL[c]}" for s, c in o["choice"].items()),
                         f"{100 * o['to_rtp']:.0f}%", _f(o, f"recall:{gold}"), _f(o, f"precision:{gold}"),
                         _f(o, "tokens", 0), _saving(o, b["always_ptr"], b["always_rtp"]), "–"])
            for signal, (label, _d) in SIGNALS.items():
                o = res["best_in_sample"][signal][gold]
                by = ", ".join(f"{s.split('_')[0]} {100 * o['to_rtp_by_subset'][s]:.0f}%" for s in subs)
                body.append([f"{label}, best τ (in-sample)", _tau(signal, o["tau"]), f"{100 * o['to_rtp']:.0f}%",
                             _f(o, f"recall:{gold}"), _f(o, f"precision:{gold}"), _f(o, "tokens", 0),
                             _saving(o, b["always_ptr"], b["always_rtp"]), by])
            out.append(f"### In-sample — model `{model}`{sim}, gold `{gold}`\n\n" + table(header, body) + "\n")

            header = ["evaluation", "signal", "τ (chosen on tuning queries)", "test n", "to RtP", f"R@{k}",
                      f"P@{k}", "tokens/query", f"always RtP R@{k}", f"always PtR R@{k}", f"oracle R@{k}",
                      "saving vs PtR"]
            body = []
            h = res["heldout"][gold]
            for ev, label in (("subset_split", f"{'+'.join(meta['split']['train'])} → {'+'.join(meta['split']['test'])}"),
                              ("cv", f"{meta['folds']}-fold CV")):
                for signal, r in (h.get(ev) or {}).items():
                    tb, t = r["test_baselines"], r["test"]
                    tau = _tau(signal, r["tau"]) if "tau" in r else ", ".join(_tau(signal, x) for x in r["taus"])
                    body.append([label, SIGNALS[signal][0], tau, str(t["n_queries"]), f"{100 * t['to_rtp']:.0f}%",
                                 _f(t, f"recall:{gold}"), _f(t, f"precision:{gold}"), _f(t, "tokens", 0),
                                 _f(tb["always_rtp"], f"recall:{gold}"), _f(tb["always_ptr"], f"recall:{gold}"),
                                 _f(tb["oracle"], f"recall:{gold}"),
                                 _saving(t, tb["always_ptr"], tb["always_rtp"])])
            if body:
                out.append(f"### Held-out — model `{model}`{sim}, gold `{gold}`\n\n" + table(header, body) + "\n")
            else:
                out.append(f"### Held-out — model `{model}`, gold `{gold}`\n\nNo held-out split possible "
                           "(the tuning or test subsets are missing, or too few queries for the folds).\n")
    out.append("![routing](figures/routing.png)\n")  # sections are inlined into OUT/report.md
    return "\n".join(out)


def figure(result: Mapping[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # headless
    import matplotlib.pyplot as plt

    meta = result["meta"]
    models = list(result["models"])
    fig, axes = plt.subplots(len(models), len(GOLD_SETS), figsize=(6 * len(GOLD_SETS), 4.2 * len(models)),
                             squeeze=False)
    styles = {"score": ("#2ca02c", "o", "-"), "words": ("#9467bd", ".", "--"), "clauses": ("#8c564b", ".", ":")}
    for mi, model in enumerate(models):
        res = result["models"][model]
        for gi, gold in enumerate(GOLD_SETS):
            ax = axes[mi][gi]
            for signal, (color, marker, ls) in styles.items():
                pts = sorted(res["sweeps"][signal], key=lambda p: p["tokens"]["mean"])
                ax.plot([p["tokens"]["mean"] for p in pts], [p[f"recall:{gold}"]["mean"] for p in pts],
                        color=color, marker=marker, ls=ls, ms=3, lw=1, alpha=0.8,
                        label=f"{SIGNALS[signal][0]} (one point per τ)")
                best = res["best_in_sample"][signal][gold]
                ax.scatter([best["tokens"]["mean"]], [best[f"recall:{gold}"]["mean"]], s=90, facecolors="none",
                           edgecolors=color, linewidths=1.5, zorder=5)
            ax.scatter([], [], s=90, facecolors="none", edgecolors="#555555", label="best τ (in-sample), circled")
            b = res["baselines"][gold]
            for name, key, mk, color in (("always RtP", "always_rtp", "s", "#1f77b4"),
                                         ("always PtR", "always_ptr", "^", "#d62728"),
                                         ("per-subset oracle", "oracle", "*", "#000000")):
                ax.scatter([b[key]["tokens"]["mean"]], [b[key][f"recall:{gold}"]["mean"]], marker=mk, s=110,
                           color=color, label=name, zorder=6)
            ax.set_xlabel("tokens per query (mean)")
            ax.set_ylabel(f"recall@{meta['k']} (gold {gold})")
            title = f"{model}" + (" (simulated LLM)" if model in meta["simulated_models"] else "")
            ax.set_title(f"{title}: recall vs tokens, all queries (in-sample)", fontsize=10)
            ax.grid(alpha=0.3)
    # One legend under the panels: inside, it hides the sweep's points.
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.1 / len(models), 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- command


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m evaluator routing",
        description="Complexity-adaptive routing (RtP when RtP's top-1 score >= tau, else PtR; also query "
        "length and clause count) from a finished output folder; no embedding, no LLM call.",
    )
    p.add_argument("out_dir", type=Path)
    p.add_argument("--k", type=int, help="retrieval budget (default: the run's k)")
    p.add_argument("--train", default="G1,G2", help="subsets tau is tuned on for the split evaluation (default G1,G2)")
    p.add_argument("--test", default="G3", help="subsets it is reported on (default G3)")
    p.add_argument("--folds", type=int, default=DEFAULT_FOLDS, help="cross-validation folds (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the fold assignment (default 0)")
    args = p.parse_args(argv)
    if args.folds < 2:
        p.error("--folds must be at least 2")
    meta = read_meta(args.out_dir)
    opt = Options(k=args.k or int(meta.get("k") or 5), train=[s for s in args.train.split(",") if s],
                  test=[s for s in args.test.split(",") if s], folds=args.folds, seed=args.seed)
    res = run_routing(args.out_dir, opt, log=lambda m: print(m, file=sys.stderr))
    print(f"Routing study in {res['meta']['timing_s']:.1f}s: {args.out_dir}/routing.json, "
          "sections/60-routing.md, figures/routing.png")
    from .report import render

    render(args.out_dir)  # report.md appends sections/*.md: keep it in step
    print(f"Updated {args.out_dir}/report.md")
    return 0
