"""The report's "Cost and batch" section, from `meta.json`'s `cost` and `batch` blocks (values only)."""

from __future__ import annotations

from collections.abc import Mapping

from evaluator.core.redact import redact
from evaluator.render.fmt import table, text
from evaluator.results.cost import BatchStats, Cost, usd


def _usd(x: float | None) -> str:
    return usd(x, "unknown")


def cost_section_md(cost: Mapping[str, Cost], batch: Mapping[str, BatchStats] | None = None) -> str | None:
    """Markdown for tokens and cost per model (online, batch, total, all-online equivalent); None if empty."""
    if not cost:
        return None
    rows = []
    for name, c in cost.items():
        on, b = c.online, c.batch
        rows.append([name, f"{on.prompt_tokens:,} / {on.completion_tokens:,}",
                     f"{b.prompt_tokens:,} / {b.completion_tokens:,}",
                     f"{on.cached_prompt_tokens + b.cached_prompt_tokens:,} / {on.cache_write_tokens + b.cache_write_tokens:,}",
                     _usd(on.usd), _usd(b.usd), _usd(c.total_usd), _usd(c.all_online_usd)])
    lines = [
        "## Cost and batch",
        "",
        "Tokens billed in this invocation (cached replies cost nothing), priced with the profile's [prices] "
        "`input_per_mtok` / `output_per_mtok` and, for batch requests, `batch_discount` "
        "(unknown when the profile gives no price). Prompt tokens the provider served from its prompt cache "
        "(cached input, part of the tokens in) are priced at `cached_input_per_mtok`, those written into "
        "it at `cache_write_per_mtok` (the input price when not given).",
        "",
        table(["model", "online tokens (in / out)", "batch tokens (in / out)", "cached input / cache writes",
               "online USD", "batch USD", "total USD", "same tokens all online"], rows),
    ]
    sources = [f"- `{name}`: {c.prices.source}" for name, c in cost.items() if c.prices.source]
    if sources:
        lines += ["", "Prices:", "", *sources]
    if batch:
        rows = [[name, str(s.batches), f"{s.submitted:,}", f"{s.stored:,}", f"{s.failed:,}", f"{s.not_run:,}",
                 f"{s.resubmitted:,}", f"{s.waited_s:.0f} s"] for name, s in batch.items()]
        lines += ["", table(["model", "batches", "requests submitted", "stored", "failed",
                             "not run (expired/cancelled)", "re-submitted", "waited"], rows)]
        # Redacted again: a meta.json written before errors were redacted at the source may hold a key.
        errs = [text(redact(f"{n}: {e}")) for n, s in batch.items() for e in s.errors]
        if errs:
            lines += ["", "First batch errors: " + "; ".join(errs[:5])]
    return "\n".join(lines) + "\n"
