"""`python -m evaluator models`: the providers `--model PROVIDER/MODEL` knows and the dated prices of their known
models (llm/catalog.py, configs/providers.toml), with each key variable and whether it is set (never its value)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from evaluator.core.errors import ConfigError
from evaluator.llm import catalog
from evaluator.llm.profiles import available_profiles


def _price(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def _columns(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def models_text(only: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The listing the command prints; `only`: one provider."""
    env = os.environ if env is None else env
    known = catalog.providers()
    if only is not None and only not in known:
        raise ConfigError(f"models: unknown provider {only!r}; known: {', '.join(known)}")
    chosen = [p for n, p in known.items() if only is None or n == only]
    rows = [["provider", "key variable", "key set", "base URL", "batch", "prompt caching", "notes"]]
    for p in chosen:
        key = p.api_key_env or "-"
        is_set = "-" if not p.api_key_env else ("yes" if env.get(p.api_key_env, "").strip() else
                                                "no" if p.api_key_required else "no (optional)")
        url = p.base_url or f"(--base-url or {p.base_url_env})"
        if p.base_url and p.base_url_env:
            url += f" ({p.base_url_env})"
        cache = p.prompt_cache if p.prompt_cache == "none" else f"{p.prompt_cache} (>= {p.cache_min_tokens:,} tokens)"
        rows.append([p.name, key, is_set, url, p.batch or "-", cache, p.notes])
    out = ["Providers: --model PROVIDER/MODEL (e.g. anthropic/claude-sonnet-4-5); a profile file may name "
           "`provider = \"...\"` and override any default.", "", *_columns(rows), ""]
    rows = [["model", "input", "output", "cached input", "cache write", "batch", "context", "prices as of"]]
    for p in chosen:
        for model, e in p.models.items():
            discount = e.batch_discount if e.batch_discount is not None else p.batch_discount
            batch = f"-{discount:.0%}" if p.batch and discount else "-"
            rows.append([f"{p.name}/{model}", _price(e.input), _price(e.output), _price(e.cached_input),
                         _price(e.cache_write), batch, f"{e.context:,}" if e.context else "-", p.prices_date or "-"])
    if len(rows) > 1:
        out += ["Known models (USD per 1M tokens; batch: the share off through the batch API). Prices were copied by "
                "hand from each provider's page on the date shown: check them before relying on them. Any other "
                "model id runs with its provider's defaults and unknown prices.", "", *_columns(rows), ""]
    sources = [f"  {p.name}: {p.prices_source}" for p in chosen if p.prices_source]
    if sources:
        out += ["Sources:", *sources]
    hosted = [p.name for p in chosen if p.self_hosted]
    if hosted:
        out.append(f"Self-hosted ({', '.join(hosted)}): any model the server serves, priced $0 (no per-token bill).")
    if only is None:
        out.append(f"Profiles (--model NAME): {', '.join(available_profiles())}")
    return "\n".join(out)
