"""The concurrency limit on its own (no network): AIMD signals, held slots, cancellation."""

from __future__ import annotations

import asyncio

import pytest

from evaluator.llm.limiters import ConcurrencyLimit


async def _fill(lim: ConcurrencyLimit) -> int:
    """Take every free slot (the limit is then 'reached', the only state in which it may grow)."""
    epoch = 0
    while lim.in_use < max(1, int(lim.limit)):
        epoch = await lim.acquire()
    return epoch


async def test_fixed_limit_ignores_signals():
    lim = ConcurrencyLimit(8)
    e = await _fill(lim)
    lim.congested(e)
    lim.answered(e, 100.0)
    assert lim.limit == 8 and lim.in_use == 8


async def test_slow_start_doubles_while_latency_holds_and_stops_at_the_maximum():
    lim = ConcurrencyLimit(16, adaptive=True)
    assert lim.limit == 1
    for _ in range(40):
        e = await _fill(lim)
        for _ in range(lim.in_use):
            lim.answered(e, 1.0)
            lim.release()
    assert lim.limit == 16


async def test_latency_that_does_not_hold_stops_growth_and_queueing_shrinks_it():
    lim = ConcurrencyLimit(16, adaptive=True, start=4)
    e = await _fill(lim)
    lim.answered(e, 1.0)  # baseline
    lim.answered(e, 2.5)  # > 2x: no growth, slow start over
    assert lim.limit == 5 and lim.ssthresh == 5
    lim.answered(e, 3.5)  # > 3x: requests are queueing at the server
    assert lim.limit == 4


async def test_429_and_timeouts_halve_once_per_window():
    lim = ConcurrencyLimit(64, adaptive=True, start=32)
    e = await _fill(lim)
    lim.congested(e)
    lim.congested(e)  # another answer to a request of the same window: already reacted
    assert lim.limit == 16
    lim.congested(e + 1)  # a request sent after the decrease
    assert lim.limit == 8


async def test_a_burst_of_5xx_halves_but_a_single_one_does_not():
    lim = ConcurrencyLimit(64, adaptive=True, start=32)
    e = await _fill(lim)
    lim.answered(e, 1.0, server_error=True)
    assert lim.limit == 32
    lim.answered(e, 1.0, server_error=True)
    assert lim.limit == 16


async def test_held_slot_is_not_reused_until_the_hold_ends():
    lim = ConcurrencyLimit(1)
    await lim.acquire()
    lim.release(hold_s=0.2)
    waiter = asyncio.create_task(lim.acquire())
    await asyncio.sleep(0.1)
    assert not waiter.done() and lim.in_use == 1
    await asyncio.wait_for(waiter, 1.0)
    assert lim.in_use == 1


async def test_cancelled_waiter_gives_its_slot_back():
    lim = ConcurrencyLimit(1)
    await lim.acquire()
    waiters = [asyncio.create_task(lim.acquire()) for _ in range(3)]
    await asyncio.sleep(0)
    waiters[0].cancel()
    lim.release()
    await asyncio.sleep(0)
    with pytest.raises(asyncio.CancelledError):
        await waiters[0]
    assert waiters[1].done() and not waiters[2].done() and lim.in_use == 1
    waiters[2].cancel()
    lim.release()
    assert lim.in_use == 0
