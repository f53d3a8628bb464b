"""One model's pace (`Pacing`): its 429 gate every call waits at, its RPM and TPM pacers, and the limits its
server's rate-limit headers announce.

A profile that follows its provider's rate-limit headers (`follow_rate_headers`) paces to the limits they
announce on every reply, up or down from its own start (`announced`: Anthropic's
`anthropic-ratelimit-requests-limit`, OpenAI's `x-ratelimit-limit-requests` / `-tokens`), and while a header
says a limit is spent (`...-remaining: 0`) every call waits at the gate until its reset (Anthropic: an RFC 3339
time; OpenAI: a duration such as "6m0s").

The pacers themselves are the limiters of `limiters` (this process) or shared across processes (`SharedRates`,
passed to the engine as `pacer_factory` / `token_pacer_factory`); this module holds one model's use of them.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from evaluator.llm.limiters import RequestPacer, SlowDownGate, TokenBucket
from evaluator.llm.profiles import ModelProfile
from evaluator.llm.retry import parse_duration

log = logging.getLogger("evaluator.llm")


class Pacer(Protocol):
    """Paces requests to `rpm` per minute; `acquire` returns when the next one may go."""

    rpm: float

    async def acquire(self) -> None: ...

    def defer(self, seconds: float) -> None: ...


PacerFactory = Callable[[ModelProfile, float], Pacer]


def local_pacer(profile: ModelProfile, rpm: float) -> Pacer:
    """The default pacer: this process only (llm/limiters.py). A shared one is passed as `pacer_factory`."""
    return RequestPacer(rpm)


class TokenPacer(Protocol):
    """Paces tokens to a per-minute budget; `acquire(n)` returns when `n` more may go."""

    async def acquire(self, n: float) -> None: ...

    def defer(self, seconds: float) -> None: ...


TokenPacerFactory = Callable[[ModelProfile, float], TokenPacer]


def local_token_pacer(profile: ModelProfile, tpm: float) -> TokenPacer:
    """The default TPM pacer: this process only. A shared one (llm/limiters.py `SharedRates.tpm`) is passed
    as `token_pacer_factory`."""
    return TokenBucket(tpm)


@dataclass(frozen=True)
class Announced:
    """What a reply's rate-limit headers say: the RPM and TPM limits, and how long until a spent one resets."""

    rpm: float | None = None
    tpm: float | None = None
    spent_for_s: float | None = None  # a limit's remaining is 0: seconds until it resets


def _number(v: str | None) -> float | None:
    try:
        x = float(v) if v else None
    except ValueError:
        return None
    return x if x is not None and math.isfinite(x) and x > 0 else None


def _until(reset: str, now: float) -> float | None:
    """Seconds until a reset header's time: an RFC 3339 time (Anthropic) or a duration (OpenAI)."""
    try:
        return max(0.0, datetime.fromisoformat(reset.strip()).timestamp() - now)
    except ValueError:
        return parse_duration(reset)


# (limit header, remaining header, reset header) per limit, Anthropic's then OpenAI's.
_ANTHROPIC = "anthropic-ratelimit-"
_SPENT = [(f"{_ANTHROPIC}{k}-remaining", f"{_ANTHROPIC}{k}-reset")
          for k in ("requests", "tokens", "input-tokens", "output-tokens")] + [
          (f"x-ratelimit-remaining-{k}", f"x-ratelimit-reset-{k}") for k in ("requests", "tokens")]


def announced(headers: Mapping[str, str], now: float | None = None) -> Announced:
    """The limits a reply's headers announce (see the module doc); nothing for a reply without them."""
    now = time.time() if now is None else now
    rpm = _number(headers.get(f"{_ANTHROPIC}requests-limit")) or _number(headers.get("x-ratelimit-limit-requests"))
    tpm = _number(headers.get("x-ratelimit-limit-tokens"))
    waits = [w for remaining, reset in _SPENT
             if (headers.get(remaining) or "").strip() == "0" and (w := _until(headers.get(reset) or "", now))]
    return Announced(rpm, tpm, max(waits) if waits else None)


class Pacing:
    """The gate (closed by a 429 for everyone) and the profile's RPM/TPM pacers."""

    def __init__(self, profile: ModelProfile, rng: random.Random, pacer_factory: PacerFactory,
                 token_pacer_factory: TokenPacerFactory) -> None:
        self._profile = profile
        self.gate = SlowDownGate(rng)
        self._new_pacer = pacer_factory
        self._pacer = pacer_factory(profile, profile.pacing.rpm) if profile.pacing.rpm else None
        self._new_token_pacer = token_pacer_factory
        self._tpm_limit = profile.pacing.tpm
        self.tpm = token_pacer_factory(profile, profile.pacing.tpm) if profile.pacing.tpm else None

    async def pace(self, est_tokens: int) -> None:
        """Wait for this request's turn: its RPM slot, then its tokens (`est_tokens`, TPM only)."""
        if self._pacer is not None:
            await self._pacer.acquire()
        if self.tpm is not None:
            await self.tpm.acquire(est_tokens)
        if self.gate.closed():
            # A 429 arrived while we queued: wait it out with everyone, then use the pacing slot
            # we already hold rather than throwing it away and queueing again.
            await self.gate.wait()

    def follow(self, headers: Mapping[str, str]) -> None:
        """Pace to what a reply's rate-limit headers announce (`follow_rate_headers`; see the module doc)."""
        a = announced(headers)
        if a.rpm is not None and (self._pacer is None or abs(a.rpm - self._pacer.rpm) > 0.01 * a.rpm):
            log.info("%s: the provider announces %g requests/min; pacing to it", self._profile.name, a.rpm)
            self._pacer = self._new_pacer(self._profile, a.rpm)
        if a.tpm is not None and a.tpm != self._tpm_limit:
            self._tpm_limit = a.tpm
            self.tpm = self._new_token_pacer(self._profile, a.tpm)
        if a.spent_for_s:
            self.slow_down(min(a.spent_for_s, self._profile.retries.max_wait_s))

    def slow_down(self, seconds: float) -> None:
        """A 429 asking for `seconds`: the gate closes for everyone, and a paced model's schedule moves back by
        as much as the gate's close was extended (a bunch of 429s at once moves it once), so the requests
        queued behind it keep their spacing and the server's bucket regains the deficit the 429 reported."""
        before = max(self.gate.resume_at, time.monotonic())
        self.gate.close_for(seconds)
        moved = self.gate.resume_at - before
        if moved > 0:
            for pacer in (self._pacer, self.tpm):
                if pacer is not None:
                    pacer.defer(moved)

    def learn_rpm(self, rpm: float) -> None:
        """Pace to a limit the server announced when we had none or a higher one (blind profiles)."""
        if self._pacer is None or rpm < self._pacer.rpm:
            log.info("%s: server announces %g requests/min; pacing to it", self._profile.name, rpm)
            self._pacer = self._new_pacer(self._profile, rpm)
