"""One model's pace: the 429 gate every call waits at, RPM and TPM pacing, and a limit the server announces.

The pacers themselves are in limits.py (this process) or shared across processes (`SharedRates`, passed
to the engine as `pacer_factory` / `token_pacer_factory`); this module holds the engine's use of them.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Protocol

from evaluator.llm.limits import RequestPacer, SlowDownGate, TokenBucket
from evaluator.llm.profiles import ModelProfile

log = logging.getLogger("evaluator.llm")


class Pacer(Protocol):
    """Paces requests to `rpm` per minute; `acquire` returns when the next one may go."""

    rpm: float

    async def acquire(self) -> None: ...

    def defer(self, seconds: float) -> None: ...


PacerFactory = Callable[[ModelProfile, float], Pacer]


def local_pacer(profile: ModelProfile, rpm: float) -> Pacer:
    """The default pacer: this process only (llm/limits.py). A shared one is passed as `pacer_factory`."""
    return RequestPacer(rpm)


class TokenPacer(Protocol):
    """Paces tokens to a per-minute budget; `acquire(n)` returns when `n` more may go."""

    async def acquire(self, n: float) -> None: ...

    def defer(self, seconds: float) -> None: ...


TokenPacerFactory = Callable[[ModelProfile, float], TokenPacer]


def local_token_pacer(profile: ModelProfile, tpm: float) -> TokenPacer:
    """The default TPM pacer: this process only. A shared one (llm/limits.py `SharedRates.tpm`) is passed
    as `token_pacer_factory`."""
    return TokenBucket(tpm)


class Pacing:
    """The gate (closed by a 429 for everyone) and the profile's RPM/TPM pacers."""

    def __init__(self, profile: ModelProfile, rng: random.Random, pacer_factory: PacerFactory,
                 token_pacer_factory: TokenPacerFactory) -> None:
        self._profile = profile
        self.gate = SlowDownGate(rng)
        self._new_pacer = pacer_factory
        self._pacer = pacer_factory(profile, profile.rpm) if profile.rpm else None
        self.tpm = token_pacer_factory(profile, profile.tpm) if profile.tpm else None

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
