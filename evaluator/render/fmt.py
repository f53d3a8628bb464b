"""The one number format of the report, and the Markdown table."""

from __future__ import annotations

import math
from collections.abc import Sequence

from evaluator.analysis.metric_defs import MetricName, spec
from evaluator.analysis.stats import Row, Test

DASH = "–"


def fnum(x: float | None, digits: int = 3) -> str:
    """A number with `digits` decimals and its leading zero (`0.512`); a dash when undefined."""
    return DASH if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def fpct(x: float | None, digits: int = 1) -> str:
    return DASH if x is None or not math.isfinite(x) else f"{100 * x:.{digits}f}%"


def fint(x: float | None) -> str:
    return DASH if x is None or not math.isfinite(x) else f"{x:,.0f}"


def mean_pm(mean: float | None, std: float | None, digits: int = 3, pct: bool = False) -> str:
    """'mean±std' (or just the mean when there is no std)."""
    if mean is None:
        return DASH
    f = fpct if pct else fnum
    return f(mean, digits) + (f"±{f(std, digits)}" if std is not None else "")


def fms(row: Row | None, digits: int = 3, pct: bool = False) -> str:
    return DASH if row is None else mean_pm(row.mean, row.std, digits, pct)


def fmetric(row: Row | None, metric: MetricName) -> str:
    """A row of `metric` as its definition shows it (`Spec.digits`, `Spec.pct`): mean±std over runs."""
    shown = spec(metric)
    return fms(row, shown.digits, shown.pct)


def format_p(p: float | None) -> str:
    if p is None or not math.isfinite(p):
        return DASH
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def ptest(t: Test | None) -> str:
    if t is None:
        return DASH
    p = format_p(t.pvalue)
    return p if p == DASH else f"{p}{t.stars}" if t.stars != "n.s." else f"{p} n.s."


def bold(s: str, on: bool) -> str:
    return f"**{s}**" if on and s != DASH else s


def better(a: Row | None, b: Row | None) -> tuple[bool, bool]:
    """Which of two rows has the higher mean (for bold); neither on a tie or a missing value."""
    if a is None or b is None or a.mean is None or b.mean is None or a.mean == b.mean:
        return False, False
    return a.mean > b.mean, b.mean > a.mean


def best(rows: Sequence[Row | None]) -> list[bool]:
    """Which rows have the highest mean (for bold): none when fewer than two have a value or all are equal
    (with two rows, `better`)."""
    means = [r.mean if r is not None else None for r in rows]
    defined = [m for m in means if m is not None]
    if len(defined) < 2 or len(set(defined)) == 1:
        return [False] * len(rows)
    return [m is not None and m == max(defined) for m in means]


# How a report names an architecture: the paper's two by their abbreviations, any other by its own name.
ARCH_LABELS = {"rtp": "RtP", "ptr": "PtR", "both": "both"}


def arch_label(arch: str) -> str:
    return ARCH_LABELS.get(arch, arch)


# Text from the data or a reply (a query, a plan step, an id, a server's error) shown in report.md: HTML's markup
# characters as entities, a table's `|`, a code span's backtick and the escape character escaped, a link's `](`
# broken, line breaks as spaces, so it renders as the text it is in every Markdown previewer (a registry or a reply
# holding `<script>`, `<img onerror=...>` or `[x](javascript:...)` is shown, never run). Other text is left as it is.
_TEXT = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "|": "\\|", "`": "\\`", "\\": "\\\\", "\n": " ",
                       "\r": " "})


def text(s: str) -> str:
    """`s` (from the data or a reply) as Markdown that renders as that text (see `_TEXT`)."""
    return s.translate(_TEXT).replace("](", "]\\(")


def code(s: str) -> str:
    """`s` (an id, a stub's name) as a code span; one holding markup characters as escaped text instead (inside a
    code span an entity would show as written, and not every previewer keeps HTML inert there), and a backtick
    or a `|` never ends the span or the table cell."""
    if any(c in s for c in "<>&"):
        return text(s)
    return "`" + s.replace("`", "'").replace("|", "\\|").replace("\n", " ").replace("\r", " ") + "`"


def table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def section(title: str, caption: str, body: str) -> str:
    return f"### {title}\n\n_{caption}_\n\n{body}\n"


def simulated_note(models: Sequence[str]) -> str:
    if not models:
        return ""
    names = ", ".join(f"`{m}`" for m in models)
    return (f"> **SIMULATED LLM ({names}):** the LLM was simulated by a heuristic, so these numbers measure "
            "the pipeline, not a language model.\n")


def models_or_none(models: Sequence[str]) -> list[str | None]:
    """The models, or `[None]` for a retrieval-only run (its rows carry model = null)."""
    return [*models] if models else [None]
