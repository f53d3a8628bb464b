"""PNG figures under `OUT/figures/` drawn from the summary rows (matplotlib, Agg backend).

Per model: the crossover (recall/precision per subset and architecture, Figure 2a), per-query win/loss
counts (Figure 2b), recall against k, and the five trajectory panels of Figure 4. A retrieval-only
output gets the RtP recall-against-k figure only.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evaluator.analysis.stats import Row, Summary
from evaluator.core.files import atomic_folder
from evaluator.results.schema import atomic_write

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

COLORS = {"rtp": "#1f77b4", "ptr": "#d62728", "both": "#555555"}
LABELS = {"rtp": "RtP", "ptr": "PtR", "both": "both"}
DPI = 100


def pyplot() -> Any:
    """matplotlib.pyplot on the headless Agg backend. Loaded on the first figure actually drawn: it
    costs ~0.5 s of start-up, and a rerun whose figures are unchanged draws none (`drawn`)."""
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


def _save(fig: Figure, path: Path) -> Path:
    plt = pyplot()
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def crossover(s: Summary, model: str, k: int, path: Path, title: str) -> Path:
    plt = pyplot()
    subs = s.subsets
    x = list(range(len(subs)))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, gold in zip(axes, ("api_list", "relevant"), strict=True):
        for arch in ("rtp", "ptr"):
            m = None if arch == "rtp" else model
            for metric, ls, mk in (("recall", "-", "o"), ("precision", "--", "s")):
                vals = [_ms(s.row(m, sub, arch, metric, k, gold)) for sub in subs]
                ax.errorbar(x, [v[0] for v in vals], yerr=[v[1] for v in vals], ls=ls, marker=mk, capsize=3,
                            color=COLORS[arch], label=f"{LABELS[arch]} {metric}")
        ax.set_xticks(x, subs)
        ax.set_title(f"gold {gold}, k={k}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("mean over queries")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Crossover: {title}")
    return _save(fig, path)


def winloss(s: Summary, model: str, k: int, path: Path, title: str) -> Path:
    plt = pyplot()
    subs = s.subsets
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    w = 0.38
    for ax, gold in zip(axes, ("api_list", "relevant"), strict=True):
        for i, arch in enumerate(("rtp", "ptr")):
            vals = [_ms(s.row(model, sub, arch, "wins", k, gold))[0] for sub in subs]
            bars = ax.bar([j + (i - 0.5) * w for j in range(len(subs))], vals, w, color=COLORS[arch],
                          label=f"{LABELS[arch]} wins")
            ax.bar_label(bars, fmt="%.0f", fontsize=8)
        ax.set_xticks(range(len(subs)), subs)
        ax.set_title(f"per-query recall@{k} wins, gold {gold}")
    axes[0].set_ylabel("queries")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Win/loss: {title}")
    return _save(fig, path)


def recall_vs_k(s: Summary, model: str | None, ks: Sequence[int], path: Path, title: str) -> Path:
    plt = pyplot()
    subs = s.subsets
    fig, axes = plt.subplots(1, max(1, len(subs)), figsize=(4 * max(1, len(subs)), 3.6), squeeze=False)
    for ax, sub in zip(axes[0], subs, strict=False):
        for gold, ls in (("api_list", "-"), ("relevant", ":")):
            archs = ("rtp", "ptr") if model is not None else ("rtp",)
            for arch in archs:
                m = None if arch == "rtp" else model
                vals = [_ms(s.row(m, sub, arch, "recall", kk, gold)) for kk in ks]
                ax.errorbar(list(ks), [v[0] for v in vals], yerr=[v[1] for v in vals], ls=ls, marker="o",
                            ms=3, capsize=2, color=COLORS[arch], label=f"{LABELS[arch]} [{gold}]")
        ax.set_xscale("log")
        ax.set_xticks(list(ks), [str(kk) for kk in ks])
        ax.set_xlabel("k")
        ax.set_title(sub)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("recall@k")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Recall vs k: {title}")
    return _save(fig, path)


def _bars(ax: Axes, s: Summary, model: str, k: int, series: Sequence[tuple[str, str, str | None, str]],
          pct: bool = False) -> None:
    """Grouped bars over subsets; `series` = (arch, metric, gold, label)."""
    subs = s.subsets
    w = 0.8 / max(1, len(series))
    for i, (arch, metric, gold, label) in enumerate(series):
        m = None if arch == "rtp" and metric == "miss" else model
        vals = [_ms(s.row(m, sub, arch, metric, k, gold)) for sub in subs]
        scale = 100.0 if pct else 1.0
        color = COLORS[arch]
        alpha = 1.0 if i % 2 == 0 or len(series) <= 2 else 0.55
        ax.bar([j + (i - (len(series) - 1) / 2) * w for j in range(len(subs))], [v[0] * scale for v in vals], w,
               yerr=[v[1] * scale for v in vals], capsize=2, color=color, alpha=alpha, label=label,
               hatch="//" if "refused" in metric or "apis" in metric else None)
    ax.set_xticks(range(len(subs)), subs, fontsize=8)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)


def trajectories(s: Summary, model: str, k: int, path: Path, title: str) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, 5, figsize=(22, 4))
    _bars(axes[0], s, model, k, [("ptr", "selection_rate", None, "PtR"), ("rtp", "selection_rate", None, "RtP")],
          pct=True)
    axes[0].set_title("(a) selection rate (%)")
    _bars(axes[1], s, model, k, [("ptr", "plan_steps", None, "PtR steps"), ("rtp", "plan_steps", None, "RtP steps"),
                                 ("ptr", "apis_named", None, "PtR APIs"), ("rtp", "apis_named", None, "RtP APIs")])
    axes[1].set_title("(b) plan complexity")
    _bars(axes[2], s, model, k, [("both", "jaccard_selected", None, "Jaccard")])
    axes[2].set_title("(c) Jaccard of selected sets")
    _bars(axes[3], s, model, k, [("ptr", "miss_wrong_tool", "api_list", "PtR wrong tool"),
                                 ("rtp", "miss_wrong_tool", "api_list", "RtP wrong tool"),
                                 ("ptr", "miss_refused", "api_list", "PtR refused"),
                                 ("rtp", "miss_refused", "api_list", "RtP refused")], pct=True)
    axes[3].set_title("(d) on complete miss, gold api_list (%)")
    _bars(axes[4], s, model, k, [("ptr", "fidelity", None, "PtR"), ("rtp", "fidelity", None, "RtP")], pct=True)
    axes[4].set_title("(e) fidelity (%)")
    fig.suptitle(f"Trajectories (k={k}): {title}")
    return _save(fig, path)


def render_figures(fig_dir: Path, s: Summary, *, k: int, ks: Sequence[int],
                   simulated: Collection[str] = (), store: Path | None = None) -> list[Path]:
    """Draw every figure the summary supports (unless `drawn` finds them unchanged); returns the
    written paths, sorted."""
    inputs = {"rows": [asdict(r) for r in s.rows], "k": k, "ks": list(ks), "simulated": sorted(simulated)}
    return drawn(fig_dir, "summary", inputs, lambda: _draw_summary(fig_dir, s, k=k, ks=ks, simulated=simulated),
                 store)


def _draw_summary(fig_dir: Path, s: Summary, *, k: int, ks: Sequence[int], simulated: Collection[str]) -> list[Path]:
    fig_dir.mkdir(parents=True, exist_ok=True)
    out: list[Path] = []
    models = s.models
    if not models:
        out.append(recall_vs_k(s, None, ks, fig_dir / "recall_vs_k.png", _title(None, simulated)))
    for m in models:
        title, slug = _title(m, simulated), _slug(m)
        has_ptr = any(s.row(m, sub, "ptr", "n_queries") is not None for sub in s.subsets)
        if has_ptr:
            out.append(crossover(s, m, k, fig_dir / f"crossover_{slug}.png", title))
            out.append(winloss(s, m, k, fig_dir / f"winloss_{slug}.png", title))
        out.append(recall_vs_k(s, m if has_ptr else None, ks, fig_dir / f"recall_vs_k_{slug}.png", title))
        out.append(trajectories(s, m, k, fig_dir / f"trajectories_{slug}.png", title))
    return sorted(out)


# ---------------------------------------------------------------- drawn once per change of their data

STAMPS = ".drawn.json"  # in the figures folder: per group, the digest of its inputs and of each PNG


_DRAWING_MODULES = ("figures.py", "scaling.py", "routing.py")


@functools.cache
def _code_digest() -> str:
    """The drawing code (this module and the scaling and routing figures') and matplotlib's version:
    a change to either redraws every figure."""
    h = hashlib.blake2b(digest_size=16)
    for name in _DRAWING_MODULES:
        f = Path(__file__).with_name(name)
        h.update(name.encode() + (f.read_bytes() if f.is_file() else b""))
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        h.update(importlib.metadata.version("matplotlib").encode())
    return h.hexdigest()


def _file_digest(path: Path) -> str | None:
    try:
        return hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()
    except OSError:
        return None


_VOLATILE = ("timing_s", "embed", "created")  # meta entries of an analysis that no figure shows


def figure_inputs(result: dict[str, Any]) -> dict[str, Any]:
    """A saved analysis (scaling.json, routing.json) less what changes on every rerun without
    changing its figure (timings, cache counts), so a rerun with the same numbers draws nothing."""
    meta = {k: v for k, v in (result.get("meta") or {}).items() if k not in _VOLATILE}
    return {**result, "meta": meta}


def drawn(fig_dir: Path, group: str, inputs: Any, draw: Callable[[], list[Path]], store: Path | None = None) -> list[Path]:
    """`draw()`'s figures, drawn only when `inputs` (JSON-able values the figures are drawn from) or
    the drawing code changed since they were last drawn, or a PNG is missing or altered; else the
    PNGs already there, byte for byte what drawing again would write (matplotlib's Agg output is
    deterministic). `store` (the cache folder's `figures/`) keeps every drawn set by the digest of its
    inputs, so a new output folder of an unchanged study gets copies instead of drawings. A rerun
    that changes nothing in the figures' data skips matplotlib altogether."""
    digest = hashlib.blake2b(json.dumps([_code_digest(), group, inputs], sort_keys=True, default=repr)
                             .encode(), digest_size=16).hexdigest()
    stamps_file = fig_dir / STAMPS
    try:
        stamps = json.loads(stamps_file.read_text())
    except (OSError, ValueError):
        stamps = {}
    if not isinstance(stamps, dict):
        stamps = {}
    old = stamps.get(group)
    if isinstance(old, dict) and old.get("inputs") == digest and isinstance(old.get("files"), dict) and all(
            _file_digest(fig_dir / name) == h for name, h in old["files"].items()):
        return sorted(fig_dir / name for name in old["files"])
    paths = _from_store(store / digest, fig_dir) if store is not None else None
    if paths is None:
        paths = draw()
        if store is not None:
            _to_store(paths, store / digest)
    stamps[group] = {"inputs": digest, "files": {p.name: _file_digest(p) for p in paths}}
    with contextlib.suppress(OSError):  # a read-only folder: the figures are there, only the next skip is lost
        atomic_write(stamps_file, json.dumps(stamps, indent=1, sort_keys=True))
    return sorted(paths)


_MANIFEST = "files.json"


def _from_store(folder: Path, fig_dir: Path) -> list[Path] | None:
    """The stored set copied into `fig_dir`, or None when absent or damaged (then it is drawn)."""
    try:
        files = json.loads((folder / _MANIFEST).read_text())
        blobs = {name: (folder / name).read_bytes() for name in files}
    except (OSError, ValueError, TypeError):
        return None
    if not isinstance(files, dict) or any(hashlib.blake2b(b, digest_size=16).hexdigest() != files[n] for n, b in blobs.items()):
        return None
    fig_dir.mkdir(parents=True, exist_ok=True)
    for name, b in blobs.items():
        atomic_write(fig_dir / name, b)  # a kill mid-copy leaves the old PNG, never half of one
    return [fig_dir / name for name in blobs]


def _to_store(paths: Sequence[Path], folder: Path) -> None:
    """Keep a drawn set under its digest, built atomically (a reader never sees half a set). A cache that
    cannot be written only costs the next run a drawing."""
    def build(tmp: Path) -> None:
        files = {}
        for p in paths:
            b = p.read_bytes()
            (tmp / p.name).write_bytes(b)
            files[p.name] = hashlib.blake2b(b, digest_size=16).hexdigest()
        (tmp / _MANIFEST).write_text(json.dumps(files, sort_keys=True))

    with contextlib.suppress(OSError):
        atomic_folder(folder, build)
