"""The scaling study's section (paper Table 10) and figure (Figure 3), from a `ScalingResult`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from evaluator.analysis.metric_defs import Metric
from evaluator.analysis.scaling_study import FULL, Key, Point, ScalingResult
from evaluator.analysis.stats import mean_std
from evaluator.render.charts import png, pyplot
from evaluator.render.fmt import DASH, fpct, mean_pm, models_or_none, simulated_note, table, text
from evaluator.results.schema import GOLDS


def _fmt(p: Point | None, key: Key) -> tuple[str, float]:
    """The key's mean±std over seeds as its metric is shown (`Spec.digits`, `Spec.pct`), † on a gold-only point."""
    if p is None or key not in p.values:
        return DASH, float("nan")
    m, s = mean_std(p.values[key])
    assert m is not None
    shown = key[2].spec
    text = mean_pm(m, (s or 0.0) if p.seeds else None, shown.digits, shown.pct)
    return text + ("†" if p.gold_only else ""), m


def _size_label(size: int | str, pts: Sequence[Point]) -> str:
    if size == FULL:
        return f"full ({pts[0].n_apis[0]:,})" if pts else "full"
    label = f"{int(size):,}"
    for p in pts:
        if p.gold_only:
            label += f" ({text(p.subset)}: gold-only, {p.n_apis[0]:,} APIs†)"
    return label


def section_md(result: ScalingResult) -> str:
    meta, points = result.meta, result.points
    subsets: list[str] = meta.subsets
    models: list[str] = meta.models
    k = meta.k
    div_subset = meta.divergence_subset
    sizes: list[int | str] = [*[s for s in meta.sizes if any(p.size == s for p in points)], FULL]
    at = {(p.subset, p.size): p for p in points}
    out = ["## Scaling study (Table 10)\n"]
    if note := simulated_note(meta.simulated_models):
        out.append(note)
    golds = meta.gold_union
    out.append("\n".join([
        f"- Models: {', '.join(f'`{m}`' for m in models) or 'none (retrieval only: RtP only)'}; runs: "
        f"{meta.runs} (PtR values are means over runs, then mean ± std over seeds)",
        f"- Embedder: `{meta.embedder}` ({meta.backend} {meta.precision}); registry: {meta.registry_size:,} APIs "
        f"(`{meta.registry_choice}`); recall@{k}",
        *([f"- Retriever: `{meta.retriever}`; a sub-registry is searched with the full registry's BM25 statistics "
           "(IDF, mean length), so points differ only in which APIs compete, as for dense"]
          if meta.retriever != "dense" else []),
        "- Sub-registry: every gold API of the subset (union of `api_list` and `relevant`: "
        + ", ".join(f"{text(s)} {golds[s].union:,}" for s in subsets)
        + ") + distractors drawn in proportion to category sizes (uncategorised APIs are one stratum); "
        f"{meta.seeds} seeds per size (`numpy.random.default_rng([seed, size])`); the full registry "
        "has no randomness.",
        "- † gold-only point: the subset's gold APIs alone reach the target size (no distractors, no variance).",
        f"- Div%: share of {text(div_subset)} queries whose RtP and PtR top-{k} sets differ "
        "(STUDY.md); Disj%: share whose top-k sets share no API (the paper's §3.2 wording), "
        "both on that subset's sub-registries.",
        f"- Subsets: {text(', '.join(subsets))} ({meta.subsets_rule}).",
    ]) + "\n")
    for model in models_or_none(models):
        for gold in GOLDS:
            title = f"### Recall@{k} by registry size — gold `{gold}`" + (f", model `{model}`" if model else "")
            if model and model in meta.simulated_models:
                title += " (simulated LLM)"
            header = ["Registry size"]
            for s in subsets:
                header += [f"{text(s)} RtP"] + ([f"{text(s)} PtR"] if model else [])
            if model and div_subset in subsets:
                header += [f"{text(div_subset)} Div%", f"{text(div_subset)} Disj%"]
            body = []
            for size in sizes:
                line = [_size_label(size, [at[(s, size)] for s in subsets if (s, size) in at])]
                for s in subsets:
                    p = at.get((s, size))
                    r, rv = _fmt(p, ("rtp", None, Metric.RECALL, gold))
                    if model:
                        q, qv = _fmt(p, ("ptr", model, Metric.RECALL, gold))
                        best = max(rv, qv)
                        line += [f"**{r}**" if rv == best and rv != qv else r,
                                 f"**{q}**" if qv == best and rv != qv else q]
                    else:
                        line.append(r)
                if model and div_subset in subsets:
                    p = at.get((div_subset, size))
                    line += [_fmt(p, ("both", model, Metric.DIVERGENT, None))[0],
                             _fmt(p, ("both", model, Metric.DISJOINT, None))[0]]
                body.append(line)
            out.append(title + "\n\n" + table(header, body) + "\n")
    checks = result.full_registry_check
    if checks:
        parts = []
        for s, c in checks.items():
            seg = f"{text(s)}: RtP {fpct(c.rtp_same_topk)}"
            if c.ptr_same_topk is not None:
                seg += f", PtR {fpct(c.ptr_same_topk)}"
            parts.append(seg)
        out.append(f"Full-registry check (recomputed top-{k} equal to the run's saved top-{k}): "
                   + "; ".join(parts) + ". Values well below 100% mean the embeddings or registry differ from "
                   "the run's.\n")
    out.append("![scaling](figures/scaling.png)\n")  # sections are inlined into OUT/report.md
    return "\n".join(out)


class _Series(NamedTuple):
    """One line of a scaling figure: mean registry sizes, the metric's means and their standard deviations."""

    xs: list[float]
    means: list[Any]  # float (None where a point has no value: drawn as a gap)
    stds: list[float]


def figure(result: ScalingResult) -> bytes:
    """`scaling.png`: recall against registry size per subset and gold, and the divergence."""
    plt = pyplot()

    meta, points = result.meta, result.points
    subsets, models, k = meta.subsets, meta.models, meta.k
    div_subset = meta.divergence_subset
    with_div = bool(models) and div_subset in subsets
    ncols = len(subsets) + int(with_div)
    fig, axes = plt.subplots(len(GOLDS), ncols, figsize=(4.2 * ncols, 3.4 * len(GOLDS)), squeeze=False)
    colors = ["#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2"]

    def series(subset: str, key: Key) -> _Series:
        xs: list[float] = []
        ms: list[Any] = []
        ss: list[float] = []
        for p in sorted((p for p in points if p.subset == subset and key in p.values),
                        key=lambda p: max(p.n_apis)):
            m, s = mean_std(p.values[key])
            xs.append(float(np.mean(p.n_apis)))
            ms.append(m)
            ss.append(s or 0.0)
        return _Series(xs, ms, ss)

    def draw(ax: Any, xs: list, ms: list, ss: list, color: str, label: str, ls: str = "-") -> None:
        if not xs:
            return
        m, s = np.asarray(ms, float), np.asarray(ss, float)
        ax.plot(xs, m, marker="o" if ls == "-" else "s", ls=ls, color=color, label=label)
        ax.fill_between(xs, m - s, m + s, color=color, alpha=0.2)

    for gi, gold in enumerate(GOLDS):
        for si, subset in enumerate(subsets):
            ax = axes[gi][si]
            draw(ax, *series(subset, ("rtp", None, Metric.RECALL, gold)), "#1f77b4", "RtP")
            for mi, model in enumerate(models):
                draw(ax, *series(subset, ("ptr", model, Metric.RECALL, gold)), colors[mi % len(colors)],
                     f"PtR ({model})" if len(models) > 1 else "PtR")
            for p in points:
                if p.subset == subset and p.gold_only:
                    ax.axvline(p.n_apis[0], color="#999999", ls=":", lw=1)
            ax.set_xscale("log")
            ax.set_title(f"{subset} recall@{k} (gold {gold})", fontsize=10)
            ax.set_xlabel("registry size (APIs)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        if with_div:
            ax = axes[gi][-1]
            if gi == 0:
                for mi, model in enumerate(models):
                    for metric, ls in ((Metric.DIVERGENT, "-"), (Metric.DISJOINT, "--")):
                        xs, ms, ss = series(div_subset, ("both", model, metric, None))
                        draw(ax, xs, [100 * m for m in ms], [100 * s for s in ss], colors[mi % len(colors)],
                             f"{'Div%' if metric is Metric.DIVERGENT else 'Disj%'}" + (f" ({model})" if len(models) > 1 else ""),
                             ls)
                ax.set_xscale("log")
                ax.set_title(f"{div_subset} top-{k} divergence (%)", fontsize=10)
                ax.set_xlabel("registry size (APIs)")
                ax.grid(alpha=0.3)
                ax.legend(fontsize=8)
            else:
                ax.axis("off")
    title = "Scaling: " + (", ".join(models) if models else "retrieval only") + f" · {meta.embedder}"
    if meta.simulated_models:
        title += " · SIMULATED LLM"
    fig.suptitle(title, fontsize=11)
    return png(fig)


