"""A spending cap for one invocation (`--budget USD`).

The engine reserves a call's worst case (its prompt tokens, counted by `core.tokens.prompt_tokens`, at the input
price plus `max_tokens` at the output price) before each HTTP attempt and settles it with the tokens
the provider reports; a call that could pass the cap is not sent. While other reservations are still
open a call waits for them to settle (their real cost is usually far below the worst case) and is
refused only when nothing is open and it still does not fit, so the cap is used, not just approached.
From the first refusal on every later call is refused: the command stops cleanly, and the replies already
received stay cached, so a rerun with a larger budget pays for none of them again.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from evaluator.core.errors import ConfigError
from evaluator.core.money import capped_usd
from evaluator.core.tokens import prompt_tokens
from evaluator.llm.profiles import ModelProfile


def context_overflow(profile: ModelProfile, body: dict[str, Any]) -> str | None:
    """Why `body` cannot fit the model's context (the profile's `context_tokens`), or None (it fits, or the
    profile states no context size). The prompt is counted by the one token rule (`core.tokens.prompt_tokens`);
    a prompt larger than the whole context is refused by every server (llama.cpp: "exceeds the available
    context size", vLLM: "maximum context length"), so sending it only spends an attempt and its retries. The
    rule is an estimate: a prompt just under the line may still be refused, never one above it is sent."""
    ctx = profile.prompt.context_tokens
    if ctx is None:
        return None
    n = prompt_tokens(body, profile.prompt.chars_per_token)
    if n <= ctx:
        return None
    return (f"prompt of ~{n:,} tokens exceeds the model's context of {ctx:,} tokens (profile [prompt] context_tokens); "
            "not sent")


def worst_case_usd(profile: ModelProfile, body: dict[str, Any], *, batch: bool = False) -> float:
    """What one attempt of `body` can cost at most: its prompt, and every completion token it may use
    (online, or as one request of a batch: `core.money.capped_usd`)."""
    max_tokens = body.get("max_tokens") or profile.sampling.max_tokens or 0
    return capped_usd(profile.prices, prompt_tokens(body, profile.prompt.chars_per_token), int(max_tokens), batch=batch)


def unpriced(p: ModelProfile) -> str | None:
    """Why a model's USD is unknown (no price for it), or None when it has its prices."""
    if p.prices.input_per_mtok is not None and p.prices.output_per_mtok is not None:
        return None
    provider = p.connection.provider
    if provider is not None and p.prices.source is None:
        return (f"{p.model!r} is not in the price table of {provider} (configs/providers.toml); give "
                "[prices] input_per_mtok and output_per_mtok in a profile file naming [connection] provider = "
                f"\"{provider}\" to price it")
    missing = [k for k in ("input_per_mtok", "output_per_mtok") if getattr(p.prices, k) is None]
    return (f"model profile {p.name!r} has no [prices] {' or '.join(missing)}: add them to its .toml "
            "(USD per 1M tokens)")


def check_priced(profiles: dict[str, ModelProfile], where: str = "--budget") -> None:
    """Before any work: a budget needs every model's prices and a bounded completion (`max_tokens`)."""
    for p in profiles.values():
        if (why := unpriced(p)) is not None:
            raise ConfigError(f"{where} needs prices: {why}, or run without a budget")
        if not p.sampling.max_tokens:
            raise ConfigError(f"{where} needs a bounded reply, and model profile {p.name!r} sets no max_tokens; "
                              "set [sampling] max_tokens in its .toml or pass --max-tokens N")


@dataclass
class Budget:
    """The cap shared by every engine of one invocation (USD at online prices)."""

    limit_usd: float
    spent_usd: float = 0.0  # settled: what the provider billed by its own token counts
    reserved_usd: float = 0.0  # worst cases of the attempts in flight
    stopped: bool = False
    _settled: asyncio.Event | None = field(default=None, repr=False)

    def reserve(self, usd: float) -> bool:
        """Hold `usd` for one attempt if the cap allows it now (no waiting)."""
        if self.stopped or self.spent_usd + self.reserved_usd + usd > self.limit_usd:
            return False
        self.reserved_usd += usd
        return True

    async def admit(self, usd: float) -> bool:
        """`reserve`, waiting while other reservations are open; False (and the command stops) when it cannot fit."""
        while not self.reserve(usd):
            if self.stopped or self.reserved_usd <= 1e-15:
                self.stopped = True
                return False
            if self._settled is None:
                self._settled = asyncio.Event()
            self._settled.clear()
            await self._settled.wait()
        return True

    def settle(self, reserved_usd: float, spent_usd: float) -> None:
        """An attempt reserved with `reserved_usd` is over; the provider billed `spent_usd` for it."""
        self.reserved_usd = max(0.0, self.reserved_usd - reserved_usd)
        self.spent_usd += spent_usd
        if self._settled is not None:
            self._settled.set()

    @property
    def remaining_usd(self) -> float:
        return max(0.0, self.limit_usd - self.spent_usd)

    def stop_message(self) -> str:
        """The one line the CLI prints when the cap stopped the command (the engine raises it as `BudgetExhausted`)."""
        return (f"budget reached: spent ${self.spent_usd:.4f} of ${self.limit_usd:.4f} (online prices, the provider's "
                "token counts), and the next call could pass it. Every reply received is cached: rerun the same "
                "command with a larger --budget to continue (add --dry-run to see what remains).")
