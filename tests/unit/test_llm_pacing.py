"""RPM pacing against the provider's token bucket (issue 42: self-inflicted 429s at 0), on a virtual clock.

The simulator (and a provider) admits at most B + r*t requests by time t: a token bucket of B = one second of
rate, full at the start, refilled at r. Requests reach it later than the pacer lets them go, and not all equally
late; the pacer's schedule must leave room for that spread (`limiters.JITTER_S`), and a 429 must move the schedule
back rather than release the requests queued behind it together. Each test runs the pacer on an event loop whose
clock only moves when every task sleeps (helpers/clock.py): the schedule is computed exactly, nothing is timed.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from typing import Any

from helpers.clock import run_virtual

from evaluator.llm import revised
from evaluator.llm.limiters import JITTER_S, PACED_BURST_S, RPM_SAFETY, RequestPacer
from evaluator.llm.pacing import Pacing, local_pacer, local_token_pacer
from evaluator.llm.profiles import ModelProfile

RPM = 6000.0  # 100 requests a second
RATE = RPM / 60


def _released(n: int, *, burst_s: float = PACED_BURST_S, defer_at: float | None = None,
              defer_s: float = 0.0) -> list[float]:
    """When each of `n` requests queued at t=0 is let go (and, with `defer_at`, a 429 moving the schedule then)."""
    async def main(loop: asyncio.AbstractEventLoop) -> list[float]:
        pacer = RequestPacer(RPM, burst_s=burst_s, clock=loop.time)
        out: list[float] = []

        async def one() -> None:
            await pacer.acquire()
            out.append(loop.time())

        async def refusal() -> None:
            assert defer_at is not None
            await asyncio.sleep(defer_at)
            pacer.defer(defer_s)

        extra = [refusal()] if defer_at is not None else []
        await asyncio.gather(*(one() for _ in range(n)), *extra)
        return sorted(out)
    return run_virtual(main, start=0.0)


def _refused(arrivals: list[float], burst_s: float = 1.0) -> int:
    """Requests the simulator's bucket (simulator/server.py `_Bucket`: B + r*t, full at t=0) refuses."""
    cap = max(1.0, RATE * burst_s)
    tokens, stamp, refused = cap, 0.0, 0
    for t in sorted(arrivals):
        tokens, stamp = min(cap, tokens + (t - stamp) * RATE), t
        if tokens >= 1:
            tokens -= 1
        else:
            refused += 1
    return refused


def _late(sent: list[float], first_s: float, seed: int = 0) -> list[float]:
    """Arrivals at the server: nothing before `first_s` (the run's first connections still being accepted; a busy
    server), what was sent before arriving together then; every request up to 5 ms late besides, at random."""
    rng = random.Random(seed)
    return [max(t, first_s) + rng.uniform(0, 0.005) for t in sent]


def test_the_start_burst_leaves_the_jitter_margin_in_the_servers_bucket():
    sent = _released(400)
    at_once = sum(t == 0.0 for t in sent)
    assert at_once == math.floor(PACED_BURST_S * RATE * RPM_SAFETY)  # 74 of the bucket's 100
    # then evenly spaced a little under the limit: never faster than the rate
    paced = sent[at_once:]
    assert min(b - a for a, b in zip(paced, paced[1:], strict=False)) >= 1 / RATE
    # the server starts counting late by most of the margin: nothing refused
    assert _refused(_late(sent, JITTER_S * 0.9)) == 0
    # the schedule that spent the whole burst (before issue 42) was refused as soon as the server started 30 ms late
    assert _refused(_late(_released(400, burst_s=1.0), 0.03)) > 0


def test_a_429_moves_every_slot_not_yet_used_and_keeps_the_spacing():
    before = _released(200)
    after = _released(200, defer_at=0.5, defer_s=0.3)
    assert [t for t in after if t <= 0.5] == [t for t in before if t <= 0.5]  # gone already: unchanged
    moved = [t for t in before if t > 0.5]
    assert after[len(after) - len(moved):] == [t + 0.3 for t in moved]  # handed out or not, all moved, spaced
    assert not any(0.5 < t < 0.8 for t in after)  # nothing left while the server asked to wait


def _profile(**kw: Any) -> ModelProfile:
    return revised(ModelProfile(name="p", model="m"), base_url="http://127.0.0.1:9/v1", **kw)


def test_a_bunch_of_429s_at_once_moves_the_schedule_once(monkeypatch):
    monkeypatch.setattr(time, "monotonic", lambda: 0.0)  # the twenty 429s arrive in the same instant
    pacing = Pacing(_profile(rpm=RPM), random.Random(0), local_pacer, local_token_pacer)
    pacer = pacing._pacer
    assert isinstance(pacer, RequestPacer)
    for _ in range(20):  # twenty requests refused together, each asking for 0.2 s
        pacing.slow_down(0.2)
    assert pacing.gate.closed()
    assert pacer._moved.total == 0.2  # once, not twenty times


def _released_around_a_stall(n: int, stall_at: float, stall_s: float, *, guard: bool = True) -> list[float]:
    """As `_released`, with this process stalled for `stall_s` at `stall_at` (a long synchronous step: no task
    runs while the clock moves on), so every holder whose slot passed meanwhile wakes at once."""
    async def main(loop: asyncio.AbstractEventLoop) -> list[float]:
        pacer = RequestPacer(RPM, clock=loop.time)
        if not guard:
            async def leave(n: float) -> None:
                return None
            pacer._leaving.acquire = leave  # type: ignore[method-assign]
        out: list[float] = []

        async def one() -> None:
            await pacer.acquire()
            out.append(loop.time())

        async def stall() -> None:
            await asyncio.sleep(stall_at)
            loop.time.__self__.elapsed += stall_s  # type: ignore[attr-defined]  # the virtual clock, moved in one step

        await asyncio.gather(*(one() for _ in range(n)), stall())
        return sorted(out)
    return run_virtual(main, start=0.0)


def test_a_stall_releases_no_more_than_the_burst_at_once():
    # 2 s without running: 200 slots passed; a schedule alone lets them all go when the process wakes, more than
    # the server's bucket (1 s of rate) holds
    assert _refused(_released_around_a_stall(800, 1.5, 2.0, guard=False)) > 0
    sent = _released_around_a_stall(800, 1.5, 2.0)
    assert _refused(sent) == 0 and len(sent) == 800
    woke = 1.5 + 2.0
    assert sum(t == woke for t in sent) <= math.floor(PACED_BURST_S * RATE) + 1  # the burst, JITTER_S under it
    assert _refused(_late(sent, JITTER_S * 0.9)) == 0  # and the start's margin still holds
