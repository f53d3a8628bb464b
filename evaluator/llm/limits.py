"""Client-side pacing for one model: RPM throttle, optional TPM budget, and the shared 429 gate."""

from __future__ import annotations

import asyncio
import random
import time

# Pace a little under the nominal limit: the server's clock sees our requests with network and
# event-loop jitter, and a request that lands 1 ms early costs a 429 and a full Retry-After wait.
RPM_SAFETY = 0.99
# Requests that may go at once after a lull (and at the start), in seconds of rate: providers
# enforce per-minute limits with at least this much burst allowance, and the bench floor assumes it.
_BURST_S = 1.0


class RequestPacer:
    """At most `rpm` requests per minute, spaced evenly: the generic cell rate algorithm (GCRA).

    Request i is scheduled at T_i = max(T_{i-1} + 1/rate, now - burst): slots come from the schedule,
    not from when the previous request actually left, so event-loop lag never compounds, and after a
    lull (or at the start) at most `burst_s` worth may go at once. We first used asyncio-throttle here; its sliding log
    stamps each start with the (late) time the poller saw it, and on this 2-core machine that lag
    cost 2-4% of the allowed rate in bench/fanout, for a limit the study's run time is set by.
    Reserving a slot is synchronous, so no lock is needed and waiting calls cost no CPU.
    """

    def __init__(self, rpm: float, safety: float = RPM_SAFETY, burst_s: float = _BURST_S) -> None:
        self.rpm = rpm
        self.interval = 60.0 / (rpm * safety)
        self.burst = burst_s
        self._next: float | None = None

    async def acquire(self) -> None:
        now = time.monotonic()
        # One interval short of the full burst: a provider's bucket of exactly `burst_s` would
        # otherwise be emptied with the next request already due.
        earliest = now - self.burst + self.interval
        slot = earliest if self._next is None else max(self._next, earliest)
        self._next = slot + self.interval
        if slot > now:
            await asyncio.sleep(slot - now)


class TokenBucket:
    """Tokens-per-minute budget: a token bucket holding one second's worth, refilled continuously."""

    def __init__(self, tpm: float, burst_s: float = 1.0) -> None:
        self.rate = tpm / 60.0
        self.capacity = max(1.0, self.rate * burst_s)
        self.tokens = self.capacity
        self.stamp = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self, n: float) -> None:
        n = min(n, self.capacity)  # a single huge request must still be able to go
        async with self._lock:
            while True:
                now = time.monotonic()
                self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
                self.stamp = now
                if self.tokens >= n:
                    self.tokens -= n
                    return
                await asyncio.sleep((n - self.tokens) / self.rate)


class SlowDownGate:
    """One 429 pauses the whole model's stream until the server's retry time, not just that call.

    Calls check the gate before each send; while it is closed they sleep until it reopens, then
    add a small random offset so they do not all hit the server in the same millisecond.
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        self.resume_at = 0.0
        self.pauses = 0
        self._rng = rng or random.Random()

    def close_for(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        if until > self.resume_at:
            self.resume_at = until
            self.pauses += 1

    def closed(self) -> bool:
        return self.resume_at > time.monotonic()

    async def wait(self) -> None:
        waited = 0.0
        while (delay := self.resume_at - time.monotonic()) > 0:
            waited += delay
            await asyncio.sleep(delay)
        if waited:
            await asyncio.sleep(self._rng.uniform(0.0, min(0.25, 0.05 * waited)))
