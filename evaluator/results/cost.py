"""Tokens and cost per model, online and batch, under the profile's prices (`core.money`: absent = unknown).

Cached replies cost nothing: only tokens billed in this invocation are counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import Any

from pydantic import TypeAdapter
from pydantic.dataclasses import dataclass

from evaluator.core.money import cost_usd
from evaluator.llm.profiles import ModelProfile


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
    waited_s: float = 0.0
    errors: list[str] = field(default_factory=list)  # the first few reasons, for the report

    def as_dict(self) -> dict[str, Any]:
        return _BATCH_STATS.dump_python(self, mode="json")


_BATCH_STATS = TypeAdapter(BatchStats)


@dataclass
class Prices:
    input_per_mtok: float | None = None
    output_per_mtok: float | None = None
    batch_discount: float | None = None


@dataclass
class Channel:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usd: float | None = None  # None: the profile gives no price


@dataclass
class Cost:
    """One model's tokens and USD per channel (meta.json `cost`); None = unknown."""

    prices: Prices = field(default_factory=Prices)
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
    on_pt, on_ct = _tokens(online)
    b_pt, b_ct = _tokens(batch)
    on_usd = cost_usd(profile, on_pt, on_ct)
    b_usd = cost_usd(profile, b_pt, b_ct, batch=True) if (b_pt or b_ct) else (0.0 if on_usd is not None else None)
    total = None if on_usd is None or b_usd is None else on_usd + b_usd
    return Cost(
        Prices(profile.price_input_per_mtok, profile.price_output_per_mtok, profile.batch_discount),
        Channel(on_pt, on_ct, _r(on_usd)), Channel(b_pt, b_ct, _r(b_usd)), _r(total),
        # the saving the batch API bought
        _r(cost_usd(profile, on_pt + b_pt, on_ct + b_ct)),
    )


def _tokens(stats: Any | None) -> tuple[int, int]:
    """(prompt, completion) billed: from typed counters, or their `as_dict()` form (bench scripts)."""
    if stats is None:
        return 0, 0
    if isinstance(stats, Mapping):
        return int(stats.get("prompt_tokens", 0)), int(stats.get("completion_tokens", 0))
    return stats.prompt_tokens, stats.completion_tokens


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 6)
