"""Carrying out `decide`'s verdicts: what each one does to the call, the model and the command.

decide.py says what to do with an attempt's outcome (a pure function); `Decisions.apply` does it: keep the
reply, retry after a wait (a 429 closes the model's gate for everyone), send again without the fields or
schema form the host rejected, give the call up (a counted failure), or stop the command (`FatalLLMError`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from evaluator.core.errors import FatalLLMError
from evaluator.core.redact import redact
from evaluator.llm.accounting import ModelStats
from evaluator.llm.decide import (
    CallState,
    Decision,
    DowngradeSchema,
    DropFields,
    GiveUp,
    Reply,
    Retry,
    StopRun,
    resume_time,
)
from evaluator.llm.pacing import Pacing
from evaluator.llm.profiles import ModelProfile
from evaluator.llm.reply import ChatResult
from evaluator.llm.retry import CONTEXT_EXCEEDED
from evaluator.llm.wire import WireShape

log = logging.getLogger("evaluator.llm")


@dataclass
class Call:
    """One fresh call on its way: what it sends and what it went through."""

    key: str
    logical: dict[str, Any]  # the provider request body (see `engine.Prepared.body`)
    keep_raw: bool
    est_tokens: int  # for the TPM budget only
    started: float
    queued: bool = True  # until the first send
    state: CallState = field(default_factory=CallState)


Keep = Callable[[Call, ChatResult], Awaitable[None]]  # store a reply for good (the engine's cache)
TellOnce = Callable[..., None]  # (what, msg, *args): a warning told once per model


class Decisions:
    """Applies decisions for one model. `secret` (the API key) is redacted from every reason it logs."""

    def __init__(self, profile: ModelProfile, stats: ModelStats, pacing: Pacing, shape: WireShape,
                 secret: str | None, keep: Keep, tell_once: TellOnce) -> None:
        self._profile = profile
        self._stats = stats
        self._pacing = pacing
        self._shape = shape
        self._secret = secret
        self._keep = keep
        self._tell_once = tell_once
        self._long_wait_told = False

    async def apply(self, d: Decision, call: Call) -> ChatResult | None:
        """Carry out `d`; the call's result, or None to attempt again. A stop raises `FatalLLMError`."""
        st = call.state
        if isinstance(d, Reply):
            await self._keep(call, d.result)
            return d.result
        if isinstance(d, Retry):
            await self._retry(d, call)
            return None
        if isinstance(d, DowngradeSchema | DropFields):
            if isinstance(d, DowngradeSchema):
                self._shape.downgrade(d.reason)
            names = d.also_drop if isinstance(d, DowngradeSchema) else d.names
            if names:
                self._shape.drop(names, d.reason)
                st.retried_without |= names
            self._stats.retries += 1
            return None  # at once, without them; not a failure of this call
        if isinstance(d, GiveUp):
            self._stats.fail(d.kind)
            if d.kind == CONTEXT_EXCEEDED:
                self._tell_once(CONTEXT_EXCEEDED, "%s: the server refuses requests longer than its context [%s]; "
                                "those calls failed (counted as context_exceeded): restart the server with a larger "
                                "context (llama.cpp: --ctx-size) and rerun", self._profile.name,
                                redact(d.reason, self._secret)[:200])
            return ChatResult(None, None, error=redact(d.reason, self._secret), error_kind=d.kind)
        assert isinstance(d, StopRun)
        if d.is_429:
            st.rate_limited += 1
        raise FatalLLMError(redact(d.message, self._secret))

    async def _retry(self, d: Retry, call: Call) -> None:
        st = call.state
        if d.cause == "truncated":
            st.truncations += 1
        elif d.cause == "empty":
            st.empty += 1
        elif d.cause == "daily_quota":
            st.daily_quota += 1
            st.rate_limited += 1
        elif d.is_429:
            st.rate_limited += 1
        else:
            st.failures += 1
        self._stats.retries += 1
        if d.limit_rpm:
            self._pacing.learn_rpm(d.limit_rpm)
        if d.hint_s is not None and d.hint_s > self._profile.retries.max_wait_s:
            self._tell_long_wait(d)
        if d.cause not in ("truncated", "empty"):
            log.debug("%s: retry in %.2fs: %s", self._profile.name, d.after_s, redact(d.reason, self._secret))
        if d.is_429:
            self._pacing.slow_down(d.after_s)  # everyone waits, this call included (at the gate)
        elif d.after_s > 0:
            await asyncio.sleep(d.after_s)

    def _tell_long_wait(self, d: Retry) -> None:
        """Once per model: what the server asked for and when it expects requests again."""
        if self._long_wait_told or d.hint_s is None:
            return
        self._long_wait_told = True
        p = self._profile
        log.warning(
            "%s: the server asks to wait %.0f s before the next request (requests again after %s) [%s]; "
            "retrying every %g s (max_wait_s) meanwhile; a longer wait than %s s (give_up_after_s) stops the run",
            p.name, d.hint_s, resume_time(time.time() + d.hint_s, time.time()), redact(d.reason, self._secret)[:200],
            p.retries.max_wait_s, f"{p.retries.give_up_after_s:g}",
        )
