"""Client-side pacing for one model: RPM throttle, optional TPM budget, and the shared 429 gate."""

from __future__ import annotations

import asyncio
import math
import random
import time

from asyncio_throttle import Throttler

# Pace a little under the nominal limit: the server's clock sees our requests with network and
# event-loop jitter, and a request that lands 1 ms early costs a 429 and a full Retry-After wait.
RPM_SAFETY = 0.98
_WINDOW_S = 0.1


class RequestPacer:
    """At most `rpm` requests per minute, spread evenly rather than in one burst per minute.

    asyncio-throttle keeps a sliding log of `rate_limit` starts per `period`; we pick a window of
    about 0.1 s (one request per window at low rates) so the stream is smooth: a one-second window
    would release a second's worth at once, and a provider's bucket with little headroom answers
    such bursts with 429s.
    Only the head of a FIFO lock polls the throttler, so hundreds of waiting calls cost no CPU.
    """

    def __init__(self, rpm: float, safety: float = RPM_SAFETY) -> None:
        self.rpm = rpm
        per_s = rpm * safety / 60.0
        rate_limit = max(1, math.floor(per_s * _WINDOW_S))
        self.throttler = Throttler(rate_limit=rate_limit, period=rate_limit / per_s, retry_interval=0.002)
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self._lock:
            await self.throttler.acquire()


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
