"""The report's "Cost and batch" section, from `meta.json`'s `cost` and `batch` blocks (values only)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _usd(x: float | None) -> str:
    return "unknown" if x is None else f"${x:,.4f}"


def cost_section_md(cost: Mapping[str, Any], batch: Mapping[str, Any] | None = None) -> str | None:
    """Markdown for tokens and cost per model (online, batch, total, all-online equivalent); None if empty."""
    if not cost:
        return None
    lines = [
        "## Cost and batch",
        "",
        "Tokens billed in this invocation (cached replies cost nothing), priced with the profile's "
        "`price_input_per_mtok` / `price_output_per_mtok` and, for batch requests, `batch_discount` "
        "(unknown when the profile gives no price).",
        "",
        "| model | online tokens (in / out) | batch tokens (in / out) | online USD | batch USD | total USD | same tokens all online |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, c in cost.items():
        on, b = c.get("online", {}), c.get("batch", {})
        lines.append(
            f"| {name} | {on.get('prompt_tokens', 0):,} / {on.get('completion_tokens', 0):,} "
            f"| {b.get('prompt_tokens', 0):,} / {b.get('completion_tokens', 0):,} | {_usd(on.get('usd'))} "
            f"| {_usd(b.get('usd'))} | {_usd(c.get('total_usd'))} | {_usd(c.get('all_online_usd'))} |"
        )
    if batch:
        lines += ["", "| model | batches | requests submitted | stored | failed | not run (expired/cancelled) | re-submitted | waited |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, s in batch.items():
            lines.append(
                f"| {name} | {s.get('batches', 0)} | {s.get('submitted', 0):,} | {s.get('stored', 0):,} | {s.get('failed', 0):,} "
                f"| {s.get('not_run', 0):,} | {s.get('resubmitted', 0):,} | {s.get('waited_s', 0.0):.0f} s |"
            )
        errs = [f"{n}: {e}" for n, s in batch.items() for e in s.get("errors", [])]
        if errs:
            lines += ["", "First batch errors: " + "; ".join(errs[:5])]
    return "\n".join(lines) + "\n"
