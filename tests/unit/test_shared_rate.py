"""One rate per API key shared through a folder (`SharedPacer`: a GCRA row in SQLite), on a frozen clock: two pacers
on one row book one schedule, on two rows two; the TPM budget likewise; a budget call waits for open reservations.
Each pacer here has its own database connection, as each process has (two processes: tests/integration)."""

from __future__ import annotations

import asyncio
import time

import pytest
from helpers.clock import run_virtual

from evaluator.llm import revised
from evaluator.llm.budget import Budget
from evaluator.llm.limiters import PACED_BURST_S, SharedPacer, SharedRates, rate_key
from evaluator.llm.profiles import ModelProfile

T = 1_700_000_000.0  # the wall-clock instant every reservation below is made at


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time", lambda: T)  # the shared schedule's clock (wall time: the one processes share)


def booked(pacers: list[SharedPacer], n: int, cost: float = 1.0) -> list[float]:
    """`n` reservations from each pacer in turn, as two processes interleave them: the slots, sorted, in seconds from T
    (a slot in the past means: go now)."""
    return sorted(round(p.reserve(cost) - T, 9) for _ in range(n) for p in pacers)


def test_two_pacers_on_one_row_book_one_schedule(tmp_path, frozen):
    one = booked([SharedPacer(tmp_path / "one", "k", 600.0)], 50)
    shared = booked([SharedPacer(tmp_path / "two", "k", 600.0), SharedPacer(tmp_path / "two", "k", 600.0)], 25)
    assert shared == one  # 50 requests from two pacers: the schedule of one pacer sending 50
    gaps = [b - a for a, b in zip(shared, shared[1:], strict=False)]
    assert min(gaps) >= 60.0 / 600.0 - 1e-9  # one after another, never faster than the rate
    assert shared[-1] >= 49 * 60.0 / 600.0 - PACED_BURST_S  # 50 slots: all but a burst's worth paced


def test_different_keys_do_not_share(tmp_path, frozen):
    a, b = rate_key("http://h/v1", "m", "key-a", "rpm"), rate_key("http://h/v1", "m", "key-b", "rpm")
    assert a != b and "key-a" not in a  # a fingerprint, never the key
    alone = booked([SharedPacer(tmp_path / "alone", a, 600.0)], 25)
    both = booked([SharedPacer(tmp_path / "both", a, 600.0), SharedPacer(tmp_path / "both", b, 600.0)], 25)
    assert both[::2] == both[1::2] == alone  # each key at the full rate: every slot twice


def test_the_tpm_budget_is_shared_too(tmp_path, frozen):
    profile = revised(ModelProfile(name="p", model="m"), base_url="http://127.0.0.1:9/v1", tpm=6000)  # 100 tokens/s
    a, b = SharedRates(tmp_path).tpm(profile, 6000), SharedRates(tmp_path).tpm(profile, 6000)  # two processes' pacers
    slots = booked([a, b], 5, cost=40)  # 400 tokens in all
    assert slots == booked([SharedRates(tmp_path / "alone").tpm(profile, 6000)], 10, cost=40)  # one budget
    # a burst (limiters.PACED_BURST_S), then 100 tokens/s: the last 40 tokens go no sooner than (400 - 75 - 40) / 100 s
    assert slots[-1] >= (400 - 75 - 40) / 100


def test_a_budget_call_waits_for_open_reservations_then_stops():
    async def go(_loop: asyncio.AbstractEventLoop) -> tuple[bool, bool, float]:
        b = Budget(1.0)
        assert b.reserve(0.6)  # in flight, worst case 0.6
        waiter = asyncio.create_task(b.admit(0.6))  # does not fit now: waits for the open one
        await asyncio.sleep(0.01)
        assert not waiter.done()
        b.settle(0.6, 0.1)  # it cost 0.1
        first = await waiter  # 0.1 + 0.6 fits
        b.settle(0.6, 0.5)  # spent 0.6 now
        second = await b.admit(0.6)  # nothing open and 0.6 + 0.6 > 1: the run stops
        return first, second, b.spent_usd

    first, second, spent = run_virtual(go)
    assert first and not second and spent == 0.6
