"""PNG figures drawn from the summary rows (matplotlib, Agg backend): values in, PNG bytes out, by file name.

Per model: the crossover (recall/precision per subset and architecture, Figure 2a), per-query win/loss
counts (Figure 2b), recall against k, and the five trajectory panels of Figure 4; with three
architectures or more, the architectures side by side. A retrieval-only output gets the RtP
recall-against-k figure only. Where they are written, and when they are not drawn again, is
`app.figure_store`'s business: this module draws.
"""

from __future__ import annotations

import io
import re
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from evaluator.analysis.metric_defs import RETRIEVAL_METRICS, Metric
from evaluator.analysis.stats import Row, Summary

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

COLORS = {"rtp": "#1f77b4", "ptr": "#d62728", "both": "#555555"}
LABELS = {"rtp": "RtP", "ptr": "PtR", "both": "both"}
# Further architectures, in the order the study holds them (tab10 without RtP's blue and PtR's red).
MORE_COLORS = ("#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
DPI = 100


def color(s: Summary, arch: str) -> str:
    if arch in COLORS:
        return COLORS[arch]
    more = [a for a in s.archs if a not in COLORS]
    return MORE_COLORS[more.index(arch) % len(MORE_COLORS)] if arch in more else "#000000"


def label(arch: str) -> str:
    return LABELS.get(arch, arch)


def _archs(s: Summary, model: str | None) -> list[str]:
    """RtP, then the other architectures this model ran, in the run's order (retrieval only: RtP)."""
    if model is None:
        return ["rtp"]
    ran = {r.arch for r in s.rows if r.model == model}
    return ["rtp"] + [a for a in (s.archs or ["rtp", "ptr"]) if a != "rtp" and a in ran]


def pyplot() -> Any:
    """matplotlib.pyplot on the headless Agg backend. Loaded on the first figure actually drawn: its import is
    slow (bench/README.md, "render/charts.py"), and a rerun whose figures are unchanged draws none (`drawn`)."""
    import matplotlib

    matplotlib.use("Agg")  # headless: no display on CI or the device machine
    import matplotlib.pyplot as plt

    return plt


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name) or "model"


def _title(model: str | None, simulated: Collection[str]) -> str:
    if model is None:
        return "retrieval only"
    return model + (" (simulated LLM)" if model in simulated else "")


def _ms(row: Row | None) -> tuple[float, float]:
    if row is None or row.mean is None:
        return float("nan"), 0.0
    return row.mean, row.std or 0.0


def png(fig: Figure, dpi: int = DPI, **layout: Any) -> bytes:
    """The figure as PNG bytes (laid out tight first), closed."""
    plt = pyplot()
    fig.tight_layout(**layout)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()


def crossover(s: Summary, model: str, k: int, title: str) -> bytes:
    plt = pyplot()
    subs = s.subsets
    x = list(range(len(subs)))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, gold in zip(axes, ("api_list", "relevant"), strict=True):
        for arch in _archs(s, model):
            m = None if arch == "rtp" else model
            for metric, ls, mk in ((Metric.RECALL, "-", "o"), (Metric.PRECISION, "--", "s")):
                vals = [_ms(s.row(m, sub, arch, metric, k, gold)) for sub in subs]
                ax.errorbar(x, [v[0] for v in vals], yerr=[v[1] for v in vals], ls=ls, marker=mk, capsize=3,
                            color=color(s, arch), label=f"{label(arch)} {metric}")
        ax.set_xticks(x, subs)
        ax.set_title(f"gold {gold}, k={k}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("mean over queries")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Crossover: {title}")
    return png(fig)


def winloss(s: Summary, model: str, k: int, title: str) -> bytes:
    plt = pyplot()
    subs = s.subsets
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    w = 0.38
    for ax, gold in zip(axes, ("api_list", "relevant"), strict=True):
        for i, arch in enumerate(("rtp", "ptr")):
            vals = [_ms(s.row(model, sub, arch, Metric.WINS, k, gold))[0] for sub in subs]
            bars = ax.bar([j + (i - 0.5) * w for j in range(len(subs))], vals, w, color=COLORS[arch],
                          label=f"{LABELS[arch]} wins")
            ax.bar_label(bars, fmt="%.0f", fontsize=8)
        ax.set_xticks(range(len(subs)), subs)
        ax.set_title(f"per-query recall@{k} wins, gold {gold}")
    axes[0].set_ylabel("queries")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Win/loss: {title}")
    return png(fig)


def recall_vs_k(s: Summary, model: str | None, ks: Sequence[int], title: str) -> bytes:
    plt = pyplot()
    subs = s.subsets
    fig, axes = plt.subplots(1, max(1, len(subs)), figsize=(4 * max(1, len(subs)), 3.6), squeeze=False)
    for ax, sub in zip(axes[0], subs, strict=False):
        for gold, ls in (("api_list", "-"), ("relevant", ":")):
            for arch in _archs(s, model):
                m = None if arch == "rtp" else model
                vals = [_ms(s.row(m, sub, arch, Metric.RECALL, kk, gold)) for kk in ks]
                ax.errorbar(list(ks), [v[0] for v in vals], yerr=[v[1] for v in vals], ls=ls, marker="o",
                            ms=3, capsize=2, color=color(s, arch), label=f"{label(arch)} [{gold}]")
        ax.set_xscale("log")
        ax.set_xticks(list(ks), [str(kk) for kk in ks])
        ax.set_xlabel("k")
        ax.set_title(sub)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("recall@k")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Recall vs k: {title}")
    return png(fig)


# Bars of these metrics are hatched: they sit beside another metric's bars of the same architecture's colour.
HATCHED = frozenset({Metric.MISS_REFUSED, Metric.APIS_NAMED})


def _bars(ax: Axes, s: Summary, model: str, k: int, series: Sequence[tuple[str, Metric, str | None, str]]) -> None:
    """Grouped bars over subsets; `series` = (arch, metric, gold, label), each in percent where its metric is
    shown so (`Spec.pct`)."""
    subs = s.subsets
    w = 0.8 / max(1, len(series))
    for i, (arch, metric, gold, label) in enumerate(series):
        m = None if arch == "rtp" and metric in RETRIEVAL_METRICS else model
        vals = [_ms(s.row(m, sub, arch, metric, k, gold)) for sub in subs]
        scale = 100.0 if metric.spec.pct else 1.0
        color = COLORS[arch]
        alpha = 1.0 if i % 2 == 0 or len(series) <= 2 else 0.55
        ax.bar([j + (i - (len(series) - 1) / 2) * w for j in range(len(subs))], [v[0] * scale for v in vals], w,
               yerr=[v[1] * scale for v in vals], capsize=2, color=color, alpha=alpha, label=label,
               hatch="//" if metric in HATCHED else None)
    ax.set_xticks(range(len(subs)), subs, fontsize=8)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)


def trajectories(s: Summary, model: str, k: int, title: str) -> bytes:
    plt = pyplot()
    fig, axes = plt.subplots(1, 5, figsize=(22, 4))
    _bars(axes[0], s, model, k, [("ptr", Metric.SELECTION_RATE, None, "PtR"),
                                 ("rtp", Metric.SELECTION_RATE, None, "RtP")])
    axes[0].set_title("(a) selection rate (%)")
    _bars(axes[1], s, model, k, [("ptr", Metric.PLAN_STEPS, None, "PtR steps"),
                                 ("rtp", Metric.PLAN_STEPS, None, "RtP steps"),
                                 ("ptr", Metric.APIS_NAMED, None, "PtR APIs"),
                                 ("rtp", Metric.APIS_NAMED, None, "RtP APIs")])
    axes[1].set_title("(b) plan complexity")
    _bars(axes[2], s, model, k, [("both", Metric.JACCARD_SELECTED, None, "Jaccard")])
    axes[2].set_title("(c) Jaccard of selected sets")
    _bars(axes[3], s, model, k, [("ptr", Metric.MISS_WRONG_TOOL, "api_list", "PtR wrong tool"),
                                 ("rtp", Metric.MISS_WRONG_TOOL, "api_list", "RtP wrong tool"),
                                 ("ptr", Metric.MISS_REFUSED, "api_list", "PtR refused"),
                                 ("rtp", Metric.MISS_REFUSED, "api_list", "RtP refused")])
    axes[3].set_title("(d) on complete miss, gold api_list (%)")
    _bars(axes[4], s, model, k, [("ptr", Metric.FIDELITY, None, "PtR"), ("rtp", Metric.FIDELITY, None, "RtP")])
    axes[4].set_title("(e) fidelity (%)")
    fig.suptitle(f"Trajectories (k={k}): {title}")
    return png(fig)


def summary_figures(s: Summary, *, k: int, ks: Sequence[int], simulated: Collection[str] = ()) -> dict[str, bytes]:
    """Every figure the summary supports: file name -> PNG bytes."""
    out: dict[str, bytes] = {}
    models = s.models
    if not models:
        out["recall_vs_k.png"] = recall_vs_k(s, None, ks, _title(None, simulated))
    for m in models:
        title, slug = _title(m, simulated), _slug(m)
        has_ptr = any(s.row(m, sub, "ptr", Metric.N_QUERIES) is not None for sub in s.subsets)
        if has_ptr:
            out[f"crossover_{slug}.png"] = crossover(s, m, k, title)
            out[f"winloss_{slug}.png"] = winloss(s, m, k, title)
        out[f"recall_vs_k_{slug}.png"] = recall_vs_k(s, m if has_ptr else None, ks, title)
        out[f"trajectories_{slug}.png"] = trajectories(s, m, k, title)
        if len(_archs(s, m)) >= 3:
            out[f"architectures_{slug}.png"] = every_architecture(s, m, k, title)
    return dict(sorted(out.items()))


def every_architecture(s: Summary, model: str, k: int, title: str) -> bytes:
    """Every architecture side by side per subset: recall, NDCG, COMP (gold api_list) and pass rate at k."""
    plt = pyplot()
    subs = s.subsets
    archs = _archs(s, model)
    panels = ((Metric.RECALL, "api_list"), (Metric.NDCG, "api_list"), (Metric.COMP, "api_list"), (Metric.PASS, None))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4))
    w = 0.8 / len(archs)
    for ax, (metric, gold) in zip(axes, panels, strict=True):
        for i, arch in enumerate(archs):
            m = None if arch == "rtp" and metric in RETRIEVAL_METRICS else model
            vals = [_ms(s.row(m, sub, arch, metric, k, gold)) for sub in subs]
            ax.bar([j + (i - (len(archs) - 1) / 2) * w for j in range(len(subs))], [v[0] for v in vals], w,
                   yerr=[v[1] for v in vals], capsize=2, color=color(s, arch), label=label(arch))
        ax.set_xticks(range(len(subs)), subs, fontsize=8)
        ax.set_title(f"{metric}@{k}" + (f" (gold {gold})" if gold else ""))
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Architectures compared: {title}")
    return png(fig)
