"""The limiters, each a building block with no knowledge of a model: the RPM pacer (`RequestPacer`), the TPM
budget (`TokenBucket`), the 429 gate (`SlowDownGate`), the same pacers shared by every process that uses one folder
(`SharedPacer`, `SharedRates`: one API key, several terminals), the concurrency limit (`ConcurrencyLimit`: fixed,
or adaptive AIMD when the server's capacity is unknown, capped at the slots a llama.cpp server announces), and
what a self-hosted server says of itself (`read_server_facts`, asked through the transport by
`ask_server_facts`). One model's use of them, its pace, is `pacing.Pacing`."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import random
import sqlite3
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from evaluator.core.cache_layout import CacheLayout
from evaluator.core.errors import ConfigError
from evaluator.llm.profiles import ModelProfile, resolve_api_key
from evaluator.llm.transport import NoReply, Request, Transport

# Pace a little under the nominal limit: the server's clock sees our requests with network and
# event-loop jitter, and a request that lands 1 ms early costs a 429 and a full Retry-After wait.
RPM_SAFETY = 0.99
# The burst allowance providers give a per-minute limit, in seconds of rate (at least this much; the bench
# floor and the simulator's token bucket assume it).
_BURST_S = 1.0
# Seconds of rate the pacers leave unused in the provider's bucket. Requests reach that bucket with delays that
# vary (this event loop's lag, a new connection, the server's own scheduling on shared cores), and a schedule
# that spends the whole burst at the start is only as early as its first request is late: when the run's first
# request reaches the server 10 ms later than the ones after it, the bucket is empty 10 ms before each paced
# request for the rest of the study, and every wobble is a 429. This margin absorbs the spread bench/fanout.py
# meets, once per run (bench/README.md, "llm/limiters.py"). The 1% under the limit (`RPM_SAFETY`) widens the
# margin further as the study goes on.
JITTER_S = 0.4
# What the pacers let go at once after a lull (and at the start), in seconds of rate (the dry run's floor too).
PACED_BURST_S = _BURST_S - JITTER_S


class _Moved:
    """How far a pacer's schedule was moved back by 429s (`defer`), for the slots already handed out: their
    holders sleep the difference when they wake, so the requests queued behind a 429 keep their spacing
    instead of leaving together when the wait ends (one 429 drew a bunch of them so in bench/fanout.py)."""

    def __init__(self) -> None:
        self.total = 0.0

    async def hold(self, seen: float) -> None:
        """Sleep what the schedule moved since `seen` (the total when the slot was handed out)."""
        while self.total > seen:
            extra, seen = self.total - seen, self.total
            await asyncio.sleep(extra)


class RequestPacer:
    """At most `rpm` requests per minute, spaced evenly: the generic cell rate algorithm (GCRA).

    Request i is scheduled at T_i = max(T_{i-1} + 1/rate, now - burst): slots come from the schedule,
    not from when the previous request actually left, so event-loop lag never compounds, and after a
    lull (or at the start) at most `burst_s` worth may go at once (`PACED_BURST_S`: the provider's burst less
    `JITTER_S`, at least one request). Not asyncio-throttle: its sliding log stamps each start with the
    (late) time the poller saw it, and that lag costs part of the allowed rate (bench/README.md,
    "llm/limiters.py"), for a limit the study's run time is set by.
    Reserving a slot is synchronous, so no lock is needed and waiting calls cost no CPU.
    """

    def __init__(self, rpm: float, safety: float = RPM_SAFETY, burst_s: float = PACED_BURST_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rpm = rpm
        self.interval = 60.0 / (rpm * safety)
        self.burst = burst_s
        self._clock = clock  # the event loop's (a test's virtual loop passes its own)
        self._next: float | None = None
        self._moved = _Moved()
        # The moment a request leaves, held to a bucket of `burst_s` at the nominal rate. When this process stalls
        # (a collection of a large heap, a long synchronous step), every holder whose slot passed wakes at once,
        # a backlog past what the provider's bucket holds; the schedule runs 1 % under the rate, so this binds
        # only on such a clump (bench/README.md, "llm/limiters.py").
        self._leaving = TokenBucket(rpm, burst_s, clock=clock)

    async def acquire(self) -> None:
        now = self._clock()
        # One interval short of the burst (so `burst_s` worth in all, the first at `now`), and never later
        # than now after a lull: a limit under one request a second still lets the first go at once.
        earliest = now - max(0.0, self.burst - self.interval)
        slot = earliest if self._next is None else max(self._next, earliest)
        self._next = slot + self.interval
        seen = self._moved.total
        if slot > now:
            await asyncio.sleep(slot - now)
        await self._moved.hold(seen)
        await self._leaving.acquire(1)

    def defer(self, seconds: float) -> None:
        """The server refused a paced request (a 429) and asks for `seconds`: every slot not yet used, handed
        out or not, moves back by that much. The bucket on the server refills meanwhile, so the margin the
        schedule keeps grows by the deficit the 429 reported, and the next wobble finds it."""
        now = self._clock()
        self._next = max(now if self._next is None else self._next, now) + seconds
        self._moved.total += seconds


class SharedPacer:
    """The GCRA of `RequestPacer` with its schedule on disk, so every process on one key shares one rate.

    A provider limits a key, not a process: two terminals that each pace to the full RPM send twice
    the limit together and pay for it in 429s. Here the theoretical arrival time (TAT) of each limit
    lives in one SQLite row (`<folder>/rate.db`, WAL), keyed by endpoint, model and a fingerprint of
    the API key (a truncated SHA-256; never the key). Each acquire is one atomic UPSERT ... RETURNING
    (one transaction, no read-modify-write race): `tat = max(tat, now - max(0, burst - cost)) + cost`, and the
    caller waits until `tat - cost`. Wall-clock time (`time.time`), the one clock processes share.

    As `RequestPacer` (`acquire()`, one request, paced a little under `per_minute`) and as
    `TokenBucket` (`acquire(n)` tokens, `safety=1`): a request bigger than the burst may still go.
    """

    def __init__(self, folder: Path | str, key: str, per_minute: float, *, safety: float = RPM_SAFETY,
                 burst_s: float = PACED_BURST_S) -> None:
        self.rpm = per_minute  # the name `RequestPacer` has (the engine lowers it on a server's hint)
        self.unit = 60.0 / (per_minute * safety)  # seconds of schedule per request (or per token)
        self.burst = burst_s
        self.key = key
        self._moved = _Moved()
        self._leaving = TokenBucket(per_minute, burst_s)  # this process's own clumps, as `RequestPacer`'s
        Path(folder).mkdir(parents=True, exist_ok=True)
        # autocommit: each statement is its own transaction; a busy database is waited for, not an error
        self._db = sqlite3.connect(str(Path(folder) / "rate.db"), timeout=30.0, isolation_level=None,
                                   check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=OFF")  # a lost schedule after a power cut costs a burst, no more
        self._db.execute("CREATE TABLE IF NOT EXISTS gcra (key TEXT PRIMARY KEY, tat REAL NOT NULL)")

    def reserve(self, n: float = 1.0) -> float:
        """Book the next slot for `n` units; returns its wall-clock time (it may be in the past: go now)."""
        cost = min(n * self.unit, max(self.burst, self.unit))  # a request over the burst may still go
        earliest = time.time() - max(0.0, self.burst - cost)  # as `RequestPacer`: `burst_s` worth at once
        (tat,) = self._db.execute(
            "INSERT INTO gcra (key, tat) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET tat = max(gcra.tat, excluded.tat - ?) + ? RETURNING tat",
            (self.key, earliest + cost, cost, cost)).fetchone()
        return tat - cost

    async def acquire(self, n: float = 1.0) -> None:
        seen = self._moved.total
        wait = self.reserve(n) - time.time()
        if wait > 0:
            await asyncio.sleep(wait)
        await self._moved.hold(seen)
        await self._leaving.acquire(n)

    def defer(self, seconds: float) -> None:
        """As `RequestPacer.defer`: the shared schedule moves back (every process's next slots); the slots this
        process already handed out move too."""
        self._db.execute("UPDATE gcra SET tat = max(tat, ?) + ? WHERE key = ?", (time.time(), seconds, self.key))
        self._moved.total += seconds

    def close(self) -> None:
        self._db.close()


def rate_key(endpoint: str, model: str, api_key: str | None, what: str) -> str:
    """The row of one limit (`what`: "rpm" or "tpm") of one key on one model; holds no secret."""
    fingerprint = hashlib.sha256(f"evaluator-rate\n{api_key or ''}".encode()).hexdigest()[:12]
    return f"{endpoint.rstrip('/')}|{model}|{fingerprint}|{what}"


def rate_folder(rate_dir: str | Path | None, cache_root: Path | str) -> Path:
    """Where shared pacing lives: `--rate-dir`, else beside the response cache (processes on one cache share)."""
    return Path(rate_dir) if rate_dir else CacheLayout(cache_root).rates


class SharedRates:
    """Pacers whose limits every process using `folder` shares, one row per (endpoint, model, key).

    Called as `(profile, rpm)` it is the engine's `pacer_factory` (RPM); `tpm(profile)` paces tokens.
    """

    def __init__(self, folder: Path | str) -> None:
        self.folder = Path(folder)

    def _key(self, profile: ModelProfile, what: str) -> str:
        try:
            api_key = resolve_api_key(profile)
        except ConfigError:  # no key: the engine refuses to start anyway; the row is keyed without one
            api_key = None
        return rate_key(profile.connection.base_url, profile.model, api_key, what)

    def __call__(self, profile: ModelProfile, rpm: float) -> SharedPacer:
        return SharedPacer(self.folder, self._key(profile, "rpm"), rpm)

    def tpm(self, profile: ModelProfile, tpm: float) -> SharedPacer:
        return SharedPacer(self.folder, self._key(profile, "tpm"), tpm, safety=1.0)


class TokenBucket:
    """A per-minute budget (tokens, or requests leaving): a token bucket holding `burst_s` worth (`PACED_BURST_S`
    unless told), refilled continuously."""

    def __init__(self, per_minute: float, burst_s: float = PACED_BURST_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = per_minute / 60.0
        self.capacity = max(1.0, self.rate * burst_s)
        self.tokens = self.capacity
        self._clock = clock
        self.stamp = clock()
        self._lock = asyncio.Lock()

    async def acquire(self, n: float) -> None:
        n = min(n, self.capacity)  # a single huge request must still be able to go
        async with self._lock:
            while True:
                now = self._clock()
                self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
                self.stamp = now
                if self.tokens >= n:
                    self.tokens -= n
                    return
                await asyncio.sleep((n - self.tokens) / self.rate)

    def defer(self, seconds: float) -> None:
        """As `RequestPacer.defer`: `seconds` of tokens taken off (the bucket may go below empty)."""
        now = self._clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate) - seconds * self.rate
        self.stamp = now


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

    def cap_at(self, slots: int) -> None:
        """The server announced `slots` parallel slots: never more in flight than that (a request beyond
        them only queues at the server, adding its wait to every latency)."""
        self.maximum = max(1, min(self.maximum, slots))
        self.limit = min(self.limit, float(self.maximum))
        self.ssthresh = min(self.ssthresh, float(self.maximum))

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


@dataclass(frozen=True)
class ServerFacts:
    """What a self-hosted server says about itself: its parallel slots and its context size (None: not said)."""

    slots: int | None = None
    n_ctx: int | None = None


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def read_server_facts(props: Any = None, slots: Any = None, models: Any = None) -> ServerFacts:
    """The facts in decoded bodies of llama.cpp's `GET /props` (`total_slots`,
    `default_generation_settings.n_ctx`) and `GET /slots` (one entry per slot, each with `n_ctx`), and of
    `GET /v1/models` (llama.cpp: `data[0].meta.n_ctx`; vLLM: `data[0].max_model_len`). Recorded bodies:
    tests/fixtures/providers/online/llama_cpp_*.json."""
    n_slots = n_ctx = None
    if isinstance(props, dict):
        n_slots = _count(props.get("total_slots"))
        gen = props.get("default_generation_settings")
        n_ctx = _count(gen.get("n_ctx")) if isinstance(gen, dict) else None
        n_ctx = n_ctx or _count(props.get("n_ctx"))
    if isinstance(slots, list) and slots and all(isinstance(x, dict) for x in slots):
        n_slots = n_slots or len(slots)
        n_ctx = n_ctx or _count(slots[0].get("n_ctx"))
    data = models.get("data") if isinstance(models, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        meta = data[0].get("meta")
        n_ctx = n_ctx or (_count(meta.get("n_ctx")) if isinstance(meta, dict) else None) or _count(data[0].get("max_model_len"))
    return ServerFacts(n_slots, n_ctx)


async def ask_server_facts(transport: Transport, base_url: str, headers: Mapping[str, str]) -> ServerFacts:
    """Ask the server at `base_url` (…/v1) for its facts: `/props`, then `/slots` and `/v1/models` while a
    fact is still unknown. Hosted providers answer 404 to these (nothing is billed): their facts are unknown."""
    base = base_url.rstrip("/")
    root = base[: -len("/v1")] if base.endswith("/v1") else base
    bodies: list[Any] = []
    for url in (f"{root}/props", f"{root}/slots", f"{base}/models"):
        try:
            resp = await transport.send(Request("GET", url, headers=headers, timeout_s=5.0))
            bodies.append(orjson.loads(resp.body) if resp.status == 200 else None)
        except (NoReply, orjson.JSONDecodeError):
            bodies.append(None)
        facts = read_server_facts(*bodies)
        if facts.slots is not None and facts.n_ctx is not None:
            break
    return read_server_facts(*bodies)
