"""The one price rule: USD for a number of prompt and completion tokens under a profile's prices.

Prices are USD per million tokens (`price_input_per_mtok`, `price_output_per_mtok`, online) and
`batch_discount`, the share off for batch requests (0.5 = half price), applied here and nowhere else.
A price that is not given is unknown, never zero: `cost_usd` says None, and the report, the viewer and
the dry run say "unknown". A spending cap cannot count with unknowns, so `capped_usd` refuses them (the
run checks every profile's prices before any work, `llm.budget.check_priced`).
"""

from __future__ import annotations

from typing import Protocol


class Priced(Protocol):
    """A model profile's prices (`llm.profiles.ModelProfile`)."""

    @property
    def price_input_per_mtok(self) -> float | None: ...
    @property
    def price_output_per_mtok(self) -> float | None: ...
    @property
    def batch_discount(self) -> float | None: ...


def cost_usd(prices: Priced, prompt_tokens: int, completion_tokens: int, *, batch: bool = False) -> float | None:
    """USD for these tokens, online or through the batch API; None when unknown: no price (or, for batch,
    no `batch_discount`)."""
    pin, pout = prices.price_input_per_mtok, prices.price_output_per_mtok
    if pin is None or pout is None:
        return None
    usd = (prompt_tokens * pin + completion_tokens * pout) / 1e6
    if batch:
        if prices.batch_discount is None:
            return None
        usd *= 1.0 - prices.batch_discount
    return usd


def capped_usd(prices: Priced, prompt_tokens: int, completion_tokens: int, *, batch: bool = False) -> float:
    """What a spending cap counts for these tokens: `cost_usd`, where a batch whose discount is unknown
    counts at the online price (a cap assumes no saving it cannot see). Unpriced is an error: a capped run
    checks every profile's prices before any work."""
    online = cost_usd(prices, prompt_tokens, completion_tokens)
    if online is None:
        raise ValueError("a spending cap needs prices; llm.budget.check_priced rules an unpriced profile out")
    usd = cost_usd(prices, prompt_tokens, completion_tokens, batch=True) if batch else None
    return online if usd is None else usd
