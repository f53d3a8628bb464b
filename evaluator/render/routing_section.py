"""The routing study's section and figure, from a `RoutingResult`."""

from __future__ import annotations

import math

from evaluator.analysis.metric_defs import Metric
from evaluator.analysis.routing_study import (
    ARCH_LABEL,
    MAX_TAUS,
    SIGNALS,
    TOKENS,
    Policy,
    RoutingMeta,
    RoutingResult,
    Scored,
    policy_metric,
)
from evaluator.render.charts import png, pyplot
from evaluator.render.fmt import DASH, fint, mean_pm, simulated_note, table, text
from evaluator.results.schema import GOLDS


def _f(o: Scored, name: str, digits: int = 3) -> str:
    m, s = o.metric(name).mean, o.metric(name).std
    if m is None or math.isnan(m):
        return DASH
    return mean_pm(m, s, digits) if digits else fint(m)


def _tau(signal: str, tau: float) -> str:
    if math.isinf(tau):
        # ±inf are the "always" policies: say which, not the symbol.
        high = SIGNALS[signal][1] == "high"
        return "always PtR" if (tau > 0) == high else "always RtP"
    return f"{tau:.3f}" if signal == "score" else f"{tau:g}"


def _saving(o: Policy, ptr: Policy, rtp: Policy) -> str:
    t, tp, tr = o.mean(TOKENS), ptr.mean(TOKENS), rtp.mean(TOKENS)
    if not tp or t is None or tr is None:
        return DASH
    s = f"{100 * (tp - t) / tp:.1f}%"
    if tp > tr:
        s += f" ({100 * (tp - t) / (tp - tr):.0f}%)"
    return s


# What RtP's top-1 score is under each retriever (config.RETRIEVER_CHOICES), so τ is read on the right scale.
SCORE_NAMES = {"dense": "cosine", "bm25": "BM25 score (`--retriever bm25`)",
               "hybrid": "RRF score (`--retriever hybrid`; at most 2/61)"}


def section_md(result: RoutingResult) -> str:
    meta = result.meta
    k = meta.k
    out = ["## Complexity-adaptive routing (beyond the paper)\n"]
    if note := simulated_note(meta.simulated_models):
        out.append(note)
    out.append("\n".join([
        f"- Models: {', '.join(f'`{m}`' for m in meta.models)}; recall@{k} and precision@{k} per run, "
        "mean ± std over runs; both gold sets (`api_list` paper-comparable; `relevant` stricter).",
        f"- Score router: RtP when RtP's top-1 {SCORE_NAMES.get(meta.retriever, 'score')} ≥ τ, else PtR. "
        "Proxies (computable before any call): "
        "RtP when the query has at most θ words / clauses (clauses: sentence ends and conjunctions such as "
        "*and*, *also*, *then*).",
        "- Tokens: mean per query; a query sent to RtP pays its RtP planner call only, one sent to PtR pays "
        "discovery + PtR planner. *Saving* is against always-PtR, in parentheses the share of PtR's extra "
        "(discovery-driven) tokens avoided.",
        "- Objective to choose τ: maximise mean recall, ties broken by fewer tokens. Candidates are midpoints "
        "between observed values of the tuning queries plus ±inf (= always RtP / always PtR); past "
        f"{MAX_TAUS:,} candidates, {MAX_TAUS:,} of the midpoints at evenly spaced ranks.",
        "- Oracle: each subset sent wholesale to its better architecture (by mean recall), chosen on the "
        "queries it is scored on: an upper reference, not a deployable router.",
        f"- Held-out: (a) {split_text(meta)}; (b) {meta.folds}-fold cross-validation (folds stratified by "
        f"subset, seed {meta.fold_seed}): every query is routed by a τ chosen without its fold.",
    ]) + "\n")
    for model, res in result.models.items():
        sim = " (simulated LLM)" if model in meta.simulated_models else ""
        if res.excluded_run_queries:
            out.append(f"`{model}`: {res.excluded_run_queries} (run, query) pairs left out (PtR discovery "
                       "failed for good, or a record is missing).\n")
        for gold in GOLDS:
            rec, prec = policy_metric(Metric.RECALL, gold), policy_metric(Metric.PRECISION, gold)
            b = res.baselines[gold]
            subs = sorted(b.oracle.choice)
            header = ["policy", "threshold", "to RtP", f"R@{k}", f"P@{k}", "tokens/query", "saving vs PtR",
                      "to RtP by subset"]
            body = []
            for name, o in (("always RtP", b.always_rtp), ("always PtR", b.always_ptr)):
                body.append([name, "–", f"{100 * o.to_rtp:.0f}%", _f(o, rec),
                             _f(o, prec), _f(o, TOKENS, 0), _saving(o, b.always_ptr, b.always_rtp), "–"])
            oracle = b.oracle
            body.append(["per-subset oracle", text(", ".join(f"{s}→{ARCH_LABEL[c]}" for s, c in oracle.choice.items())),
                         f"{100 * oracle.to_rtp:.0f}%", _f(oracle, rec), _f(oracle, prec),
                         _f(oracle, TOKENS, 0), _saving(oracle, b.always_ptr, b.always_rtp), "–"])
            for signal, (label, _d) in SIGNALS.items():
                best = res.best_in_sample[signal][gold]
                by = text(", ".join(f"{s} {100 * best.to_rtp_by_subset[s]:.0f}%" for s in subs))
                body.append([f"{label}, best τ (in-sample)", _tau(signal, best.tau), f"{100 * best.to_rtp:.0f}%",
                             _f(best, rec), _f(best, prec), _f(best, TOKENS, 0),
                             _saving(best, b.always_ptr, b.always_rtp), by])
            out.append(f"### In-sample — model `{model}`{sim}, gold `{gold}`\n\n" + table(header, body) + "\n")

            header = ["evaluation", "signal", "τ (chosen on tuning queries)", "test n", "to RtP", f"R@{k}",
                      f"P@{k}", "tokens/query", f"always RtP R@{k}", f"always PtR R@{k}", f"oracle R@{k}",
                      "saving vs PtR"]
            body = []
            h = res.heldout[gold]
            split = f"{'+'.join(meta.split.train)} → {'+'.join(meta.split.test)}"
            evals = [(split, signal, _tau(signal, r.tau), r.test, r.test_baselines) for signal, r in h.subset_split.items()]
            evals += [(f"{meta.folds}-fold CV", signal, ", ".join(_tau(signal, x) for x in r.taus), r.test, r.test_baselines)
                      for signal, r in h.cv.items()]
            for label, signal, tau, t, tb in evals:
                body.append([label, SIGNALS[signal][0], tau, str(t.n_queries), f"{100 * t.to_rtp:.0f}%",
                             _f(t, rec), _f(t, prec), _f(t, TOKENS, 0),
                             _f(tb.always_rtp, rec), _f(tb.always_ptr, rec),
                             _f(tb.oracle, rec), _saving(t, tb.always_ptr, tb.always_rtp)])
            if body:
                out.append(f"### Held-out — model `{model}`{sim}, gold `{gold}`\n\n" + table(header, body) + "\n")
            else:
                out.append(f"### Held-out — model `{model}`, gold `{gold}`\n\nNo held-out split possible "
                           "(the tuning or test subsets are missing, or too few queries for the folds).\n")
    out.append("![routing](figures/routing.png)\n")  # sections are inlined into OUT/report.md
    return "\n".join(out)


def figure(result: RoutingResult) -> bytes:
    """`routing.png`: recall against tokens per signal's sweep, the baselines and the oracle."""
    plt = pyplot()

    meta = result.meta
    models = list(result.models)
    fig, axes = plt.subplots(len(models), len(GOLDS), figsize=(6 * len(GOLDS), 4.2 * len(models)),
                             squeeze=False)
    styles = {"score": ("#2ca02c", "o", "-"), "words": ("#9467bd", ".", "--"), "clauses": ("#8c564b", ".", ":")}
    for mi, model in enumerate(models):
        res = result.models[model]
        for gi, gold in enumerate(GOLDS):
            ax = axes[mi][gi]
            rec = policy_metric(Metric.RECALL, gold)
            for signal, (color, marker, ls) in styles.items():
                pts = sorted(res.sweeps[signal], key=lambda p: _mean(p, TOKENS))
                ax.plot([_mean(p, TOKENS) for p in pts], [_mean(p, rec) for p in pts],
                        color=color, marker=marker, ls=ls, ms=3, lw=1, alpha=0.8,
                        label=f"{SIGNALS[signal][0]} (one point per τ)")
                best = res.best_in_sample[signal][gold]
                ax.scatter([_mean(best, TOKENS)], [_mean(best, rec)], s=90, facecolors="none",
                           edgecolors=color, linewidths=1.5, zorder=5)
            ax.scatter([], [], s=90, facecolors="none", edgecolors="#555555", label="best τ (in-sample), circled")
            b = res.baselines[gold]
            for name, policy, mk, color in (("always RtP", b.always_rtp, "s", "#1f77b4"),
                                            ("always PtR", b.always_ptr, "^", "#d62728"),
                                            ("per-subset oracle", b.oracle, "*", "#000000")):
                ax.scatter([_mean(policy, TOKENS)], [_mean(policy, rec)], marker=mk, s=110,
                           color=color, label=name, zorder=6)
            ax.set_xlabel("tokens per query (mean)")
            ax.set_ylabel(f"recall@{meta.k} (gold {gold})")
            title = f"{model}" + (" (simulated LLM)" if model in meta.simulated_models else "")
            ax.set_title(f"{title}: recall vs tokens, all queries (in-sample)", fontsize=10)
            ax.grid(alpha=0.3)
    # One legend under the panels: inside, it hides the sweep's points.
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    return png(fig, rect=(0, 0.1 / len(models), 1, 1))




def _mean(o: Scored, name: str) -> float:
    m = o.mean(name)
    return math.nan if m is None else m  # matplotlib leaves a NaN point out, as it left out a null


def split_text(meta: RoutingMeta) -> str:
    train, test = meta.split.train, meta.split.test
    if not train or not test:
        return "no subset split (it needs at least two subsets: one to tune τ on, one to report on)"
    return f"τ tuned on {'+'.join(train)}, reported on {'+'.join(test)} ({meta.split_rule})"
