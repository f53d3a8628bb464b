"""Tokens and cost per model, online and batch, under the profile's prices (`core.money`: absent = unknown).

Cached replies cost nothing: only tokens billed in this invocation are counted. Of the prompt tokens, those the
provider served from its prompt cache (and those written into it) are counted apart and priced at their rate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import Any, NamedTuple

from pydantic import TypeAdapter
from pydantic.dataclasses import dataclass

from evaluator.core.money import cost_usd
from evaluator.llm.profiles import ModelProfile, Prices


@dataclass
class BatchStats:
    """Per model; `meta.json` carries `as_dict()`. Tokens are those billed for batch replies."""

    batches: int = 0  # batches created (splits and re-submissions included)
    submitted: int = 0  # requests submitted, re-submissions included
    stored: int = 0  # replies stored in the cache
    failed: int = 0  # requests the provider answered with an error
    not_run: int = 0  # requests of expired or cancelled batches that never ran
    unusable: int = 0  # 200 replies the engine would not cache (cut at max_tokens, empty)
    resubmitted: int = 0
    split: int = 0  # batches split after the provider rejected their size
    queue_waits: int = 0  # batches refused for a full account queue, submitted again once others finished
    resumed: int = 0  # batches of an earlier run picked up again
    cancelled: int = 0
    conflicting: int = 0  # custom_ids the output answered twice, differently: neither reply is used
    online: int = 0  # requests the batch API did not answer, sent online instead (--batch-fallback online)
    usage_estimated: int = 0  # replies without usage: their tokens by the token rule (core/tokens.py)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0  # of prompt_tokens: served from the provider's prompt cache
    cache_write_tokens: int = 0  # of prompt_tokens: written into it
    waited_s: float = 0.0
    errors: list[str] = field(default_factory=list)  # the first few reasons, for the report

    def as_dict(self) -> dict[str, Any]:
        return _BATCH_STATS.dump_python(self, mode="json")


_BATCH_STATS = TypeAdapter(BatchStats)


@dataclass
class Channel:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usd: float | None = None  # None: the profile gives no price
    cached_prompt_tokens: int = 0  # of prompt_tokens: from the provider's prompt cache (at the cached price)
    cache_write_tokens: int = 0  # of prompt_tokens: written into it


@dataclass
class Cost:
    """One model's tokens and USD per channel (meta.json `cost`); None = unknown."""

    prices: Prices = field(default_factory=Prices)  # the profile's [prices], as the model was priced
    online: Channel = field(default_factory=Channel)
    batch: Channel = field(default_factory=Channel)
    total_usd: float | None = None
    all_online_usd: float | None = None  # what the same tokens would have cost online


def usd(x: float | None, missing: str) -> str:
    """The one dollar format of the report, the viewer and the dry run: four decimals (a study's
    calls cost fractions of a cent); `missing` where the price is unknown."""
    return missing if x is None else f"${x:,.4f}"


def accounting(profile: ModelProfile, online: Any | None, batch: Any | None) -> Cost:
    """The `meta.json` block for one model from its online and batch counters (`CallStats`/`BatchStats`,
    or None for a channel not used): tokens and USD per channel, and the total (None = unknown)."""
    on, b = _tokens(online), _tokens(batch)
    p = profile.prices
    on_usd = cost_usd(p, on[0], on[1], cached=on[2], cache_write=on[3])
    b_usd = (cost_usd(p, b[0], b[1], batch=True, cached=b[2], cache_write=b[3]) if (b[0] or b[1])
             else (0.0 if on_usd is not None else None))
    total = None if on_usd is None or b_usd is None else on_usd + b_usd
    return Cost(
        p, Channel(on[0], on[1], _r(on_usd), on[2], on[3]), Channel(b[0], b[1], _r(b_usd), b[2], b[3]), _r(total),
        # the saving the batch API bought
        _r(cost_usd(p, on[0] + b[0], on[1] + b[1], cached=on[2] + b[2], cache_write=on[3] + b[3])),
    )


_COUNTS = ("prompt_tokens", "completion_tokens", "cached_prompt_tokens", "cache_write_tokens")


class _Billed(NamedTuple):
    prompt: int
    completion: int
    cached: int  # of prompt: read from the provider's prompt cache
    cache_write: int  # of prompt: written into it


def _tokens(stats: Any | None) -> _Billed:
    """The tokens billed: from typed counters, or their `as_dict()` form (bench scripts)."""
    if stats is None:
        return _Billed(0, 0, 0, 0)
    if isinstance(stats, Mapping):
        return _Billed(*(int(stats.get(k, 0)) for k in _COUNTS))
    return _Billed(*(int(getattr(stats, k, 0)) for k in _COUNTS))


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 6)
