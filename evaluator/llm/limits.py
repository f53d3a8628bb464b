"""Client-side pacing for one model: RPM throttle, optional TPM budget, the shared 429 gate, and the
concurrency limit (fixed, or adaptive AIMD when the server's capacity is unknown)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import statistics
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
        self._rng = rng or random.Random()

    def close_for(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        if until > self.resume_at:
            self.resume_at = until

    def closed(self) -> bool:
        return self.resume_at > time.monotonic()

    async def wait(self) -> None:
        waited = 0.0
        while (delay := self.resume_at - time.monotonic()) > 0:
            waited += delay
            await asyncio.sleep(delay)
        if waited:
            await asyncio.sleep(self._rng.uniform(0.0, min(0.25, 0.05 * waited)))


class ConcurrencyLimit:
    """At most `limit` attempts in flight. Fixed at `maximum`, or adaptive (AIMD) when `adaptive`.

    Adaptive follows TCP congestion control, as inspect_ai's adaptive connections do: start at
    `start`, add one slot per answered attempt while below the threshold (slow start: the limit
    doubles per round trip), then one slot per `limit` answers; halve it on a timeout, a 429 or a
    burst of 5xx (2 in the last 8 answers), at most once per window (answers to attempts sent before
    the last decrease do not count again).

    Latency decides whether to grow: the baseline is the lowest running median of the last 9
    answers (so one lucky fast reply does not set it, and noise on a parallel server stays inside
    it). An answer within 2x the baseline lets the limit grow (if the limit is actually reached);
    a slower one ends slow start; one over 3x takes one slot off (a serial server answers n times
    slower at n in flight, so it settles at 2-3 there instead of queueing requests until they time out).

    `release(hold_s)` keeps a slot taken for `hold_s` more seconds: after a timeout the server is
    most likely still working on the abandoned request, so sending another one in its place would
    only queue behind it and time out in turn.
    """

    GROW_UNDER = 2.0  # x baseline: latency "holds"
    SHRINK_OVER = 3.0  # x baseline: requests are queueing at the server

    def __init__(self, maximum: int, *, adaptive: bool = False, start: int = 1) -> None:
        self.maximum = maximum
        self.adaptive = adaptive
        self.limit = float(min(maximum, max(1, start))) if adaptive else float(maximum)
        self.ssthresh = float(maximum)
        self.in_use = 0
        self.peak = 0  # most attempts in flight at once (held slots included)
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._epoch = 0
        self._window: collections.deque[float] = collections.deque(maxlen=9)
        self._base: float | None = None
        self._recent_5xx: collections.deque[bool] = collections.deque(maxlen=8)

    def _cap(self) -> int:
        return max(1, int(self.limit))

    async def acquire(self) -> int:
        """Take a slot; returns the window it was taken in (hand it back to `answered`/`congested`)."""
        if self.in_use < self._cap() and not self._waiters:
            self._take()
            return self._epoch
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._release_now()  # the slot was handed over just as we were cancelled
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(fut)
            raise
        return self._epoch  # `_wake` took the slot on our behalf

    def _take(self) -> None:
        self.in_use += 1
        self.peak = max(self.peak, self.in_use)

    def release(self, hold_s: float = 0.0) -> None:
        if hold_s > 0:
            asyncio.get_running_loop().call_later(hold_s, self._release_now)
        else:
            self._release_now()

    def _release_now(self) -> None:
        self.in_use -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.in_use < self._cap():
            fut = self._waiters.popleft()
            if not fut.done():
                self._take()
                fut.set_result(None)

    # -- signals (no-ops for a fixed limit) ------------------------------------------------------
    def answered(self, epoch: int, latency_s: float, *, server_error: bool = False) -> None:
        """An attempt got an HTTP answer (2xx, or a 5xx with `server_error`) after `latency_s`."""
        if not self.adaptive:
            return
        self._recent_5xx.append(server_error)
        if server_error:
            if sum(self._recent_5xx) >= 2:
                self.congested(epoch)
            return
        self._window.append(latency_s)
        median = statistics.median(self._window)
        self._base = median if self._base is None else min(self._base, median)
        if latency_s <= self.GROW_UNDER * self._base:
            if self.in_use >= self._cap() and self.limit < self.maximum:
                self.limit = min(float(self.maximum), self.limit + (1.0 if self.limit < self.ssthresh else 1.0 / self.limit))
                self._wake()
            return
        self.ssthresh = min(self.ssthresh, self.limit)  # latency no longer holds: no more doubling
        if latency_s > self.SHRINK_OVER * self._base and self.limit > 1:
            self.limit = max(1.0, self.limit - 1.0)
            self.ssthresh = self.limit

    def congested(self, epoch: int) -> None:
        """A timeout or a 429 (or a 5xx burst): halve the limit, once per window."""
        if not self.adaptive or epoch < self._epoch:
            return
        self._epoch += 1
        self.ssthresh = max(1.0, self.limit / 2.0)
        self.limit = self.ssthresh
        self._recent_5xx.clear()
