"""Tokens and cost per model, online and batch, under the profile's prices (absent = unknown).

Profile keys: `price_input_per_mtok`, `price_output_per_mtok` (USD per million prompt / completion
tokens, online) and `batch_discount` (the share off for batch requests, 0.5 = half price). Cached
replies cost nothing: only tokens billed in this invocation are counted.
"""

from __future__ import annotations

from typing import Any

from ..llm.profiles import ModelProfile


def price(profile: ModelProfile, prompt_tokens: int, completion_tokens: int, *, batch: bool = False) -> float | None:
    """USD for these tokens, or None when the profile gives no price (or no discount for batch)."""
    pin = getattr(profile, "price_input_per_mtok", None)
    pout = getattr(profile, "price_output_per_mtok", None)
    if pin is None or pout is None:
        return None
    usd = (prompt_tokens * pin + completion_tokens * pout) / 1e6
    if batch:
        discount = getattr(profile, "batch_discount", None)
        if discount is None:
            return None
        usd *= 1.0 - discount
    return usd


def accounting(profile: ModelProfile, online: dict[str, Any] | None, batch: dict[str, Any] | None) -> dict[str, Any]:
    """The `meta.json` block for one model: tokens and USD per channel, and the total (None = unknown)."""
    on_pt = int((online or {}).get("prompt_tokens") or 0)
    on_ct = int((online or {}).get("completion_tokens") or 0)
    b_pt = int((batch or {}).get("prompt_tokens") or 0)
    b_ct = int((batch or {}).get("completion_tokens") or 0)
    on_usd = price(profile, on_pt, on_ct)
    b_usd = price(profile, b_pt, b_ct, batch=True) if (b_pt or b_ct) else (0.0 if on_usd is not None else None)
    total = None if on_usd is None or b_usd is None else on_usd + b_usd
    # What the same tokens would have cost online: the saving the batch API bought.
    online_equiv = price(profile, on_pt + b_pt, on_ct + b_ct)
    return {
        "prices": {
            "input_per_mtok": getattr(profile, "price_input_per_mtok", None),
            "output_per_mtok": getattr(profile, "price_output_per_mtok", None),
            "batch_discount": getattr(profile, "batch_discount", None),
        },
        "online": {"prompt_tokens": on_pt, "completion_tokens": on_ct, "usd": _r(on_usd)},
        "batch": {"prompt_tokens": b_pt, "completion_tokens": b_ct, "usd": _r(b_usd)},
        "total_usd": _r(total),
        "all_online_usd": _r(online_equiv),
    }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 6)
