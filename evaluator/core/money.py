"""The one price rule: USD for a number of prompt and completion tokens under a profile's prices.

Prices are USD per million tokens (a profile's [prices]: `input_per_mtok`, `output_per_mtok`, online) and
`batch_discount`, the share off for batch requests (0.5 = half price), applied here and nowhere else.
Of the prompt tokens, those the provider served from its prompt cache are priced at
`cached_input_per_mtok` and those written into it at `cache_write_per_mtok` (Anthropic's cache
writes); either price not given is the input price (no saving, no surcharge known). The batch discount applies
to all of them (Anthropic's and OpenAI's cached and batch prices stack).
A price that is not given is unknown, never zero: `cost_usd` says None, and the report, the viewer and
the dry run say "unknown". A spending cap cannot count with unknowns, so `capped_usd` refuses them (the
run checks every profile's prices before any work, `llm.budget.check_priced`).
"""

from __future__ import annotations

from typing import Protocol


class Priced(Protocol):
    """A model profile's prices (`llm.profiles.Prices`, a profile's [prices])."""

    @property
    def input_per_mtok(self) -> float | None: ...
    @property
    def output_per_mtok(self) -> float | None: ...
    @property
    def batch_discount(self) -> float | None: ...
    @property
    def cached_input_per_mtok(self) -> float | None: ...
    @property
    def cache_write_per_mtok(self) -> float | None: ...


def cost_usd(prices: Priced, prompt_tokens: int, completion_tokens: int, *, batch: bool = False,
             cached: int = 0, cache_write: int = 0) -> float | None:
    """USD for these tokens, online or through the batch API; None when unknown: no price (or, for batch,
    no `batch_discount`). `cached` and `cache_write` are the prompt tokens read from and written into the
    provider's prompt cache (part of `prompt_tokens`)."""
    pin, pout = prices.input_per_mtok, prices.output_per_mtok
    if pin is None or pout is None:
        return None
    pread = pin if prices.cached_input_per_mtok is None else prices.cached_input_per_mtok
    pwrite = pin if prices.cache_write_per_mtok is None else prices.cache_write_per_mtok
    cached = max(0, min(cached, prompt_tokens))
    cache_write = max(0, min(cache_write, prompt_tokens - cached))
    fresh = prompt_tokens - cached - cache_write
    usd = (fresh * pin + cached * pread + cache_write * pwrite + completion_tokens * pout) / 1e6
    if batch:
        if prices.batch_discount is None:
            return None
        usd *= 1.0 - prices.batch_discount
    return usd


def capped_usd(prices: Priced, prompt_tokens: int, completion_tokens: int, *, batch: bool = False,
               cached: int = 0, cache_write: int = 0) -> float:
    """What a spending cap counts for these tokens: `cost_usd`, where a batch whose discount is unknown
    counts at the online price (a cap assumes no saving it cannot see). Unpriced is an error: a capped run
    checks every profile's prices before any work."""
    online = cost_usd(prices, prompt_tokens, completion_tokens, cached=cached, cache_write=cache_write)
    if online is None:
        raise ValueError("a spending cap needs prices; llm.budget.check_priced rules an unpriced profile out")
    usd = cost_usd(prices, prompt_tokens, completion_tokens, batch=True, cached=cached,
                   cache_write=cache_write) if batch else None
    return online if usd is None else usd
