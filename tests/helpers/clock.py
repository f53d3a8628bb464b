"""A virtual clock for code that waits on asyncio timers: time moves only when every task waits, and then at once
to the next timer. A wait of 2 s takes no time and measures exactly 2 s, on any machine, under any load.

    async def test_x(clock):              # the fixture: this test's event loop, time.monotonic/time/perf_counter
        t0 = clock.now()                  # virtual from here to the test's end
        await something_that_backs_off()
        assert clock.now() - t0 == 1.5

    run_virtual(lambda loop: main(loop))  # a fresh loop on the virtual clock, for a synchronous test

Only for work done in this process with no real I/O (the in-process simulator behind `MockTransport`, pacers,
gates): a loop waiting on a socket, a thread or a child process would see its timers fire before the reply came.
A loop where every task waits, no timer is set and no thread wakes it (a deadlock) ends with an error instead of
hanging.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest

WALL_START = 1_700_000_000.0  # time.time() at the start of a virtual test: a whole second, so dates round alike
MONOTONIC_START = 1_000.0
TICK_S = 1e-9  # the least a loop's time moves when a timer is due and nothing else is ready
DEADLOCK_S = 30.0  # real seconds a loop with no timer may wait for a thread before it counts as a deadlock


class VirtualClock:
    """The clock of one event loop: `loop.time()`, `time.monotonic()`, `time.perf_counter()` and `time.time()`
    all read it while it is installed."""

    def __init__(self, start: float = MONOTONIC_START) -> None:
        self.start = start
        self.elapsed = 0.0

    def now(self) -> float:
        """The loop's time (monotonic)."""
        return self.start + self.elapsed

    def wall(self) -> float:
        return WALL_START + self.elapsed

    def install(self, loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch) -> None:
        selector = loop._selector  # type: ignore[attr-defined]
        select = selector.select

        def virtual_select(timeout: float | None = None) -> Any:
            ready = select(0)
            if ready:
                return ready
            if timeout == 0:
                due = loop._scheduled and loop._scheduled[0]._when <= self.now()  # type: ignore[attr-defined]
                if due and not loop._ready:  # type: ignore[attr-defined]
                    # a timer due now and nothing else to run: code that waits for time to pass in steps too
                    # small to move a float (a token bucket's last fraction) would spin forever; a tick moves it
                    self.elapsed += TICK_S
                return ready
            if timeout is None:  # no timer: only a thread can wake the loop (the executor's shutdown at the end)
                ready = select(DEADLOCK_S)
                if not ready:
                    raise RuntimeError(f"virtual clock: every task waits, no timer is set and nothing woke the loop "
                                       f"in {DEADLOCK_S:.0f} s (a deadlock)")
                return ready
            self.elapsed += timeout
            return []

        monkeypatch.setattr(loop, "time", self.now)
        monkeypatch.setattr(selector, "select", virtual_select)
        for name in ("monotonic", "perf_counter"):
            monkeypatch.setattr(time, name, self.now)
        monkeypatch.setattr(time, "time", self.wall)


class RealClock:
    """The clock a test on a real socket must use instead (tests/integration/test_transport_parity.py): time.monotonic."""

    def now(self) -> float:
        return time.monotonic()


@pytest.fixture
async def clock(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[VirtualClock]:
    """The virtual clock on this test's event loop (an async test); undone at its end."""
    c = VirtualClock()
    c.install(asyncio.get_running_loop(), monkeypatch)
    yield c


def run_virtual(main: Callable[[asyncio.AbstractEventLoop], Coroutine[Any, Any, Any]], *,
                start: float = MONOTONIC_START) -> Any:
    """`main(loop)` run to its end on a new event loop on a virtual clock that reads `start` at first (time.* as
    well, until it returns)."""
    loop = asyncio.new_event_loop()
    with pytest.MonkeyPatch.context() as mp:
        VirtualClock(start).install(loop, mp)
        try:
            return loop.run_until_complete(main(loop))
        finally:
            loop.close()
