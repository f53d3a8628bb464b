"""The engine's tests that must hold on either transport (those taking `any_sim` in tests/unit), run once more
through the engine's aiohttp transport against the simulator's server on loopback: the same assertions, on real
time (`clock` is the real one here, so none of them asserts on a wait)."""

from __future__ import annotations

import pytest
from helpers import llm as F
from helpers.clock import RealClock
from unit import test_llm_engine as engine
from unit import test_llm_faults as faults
from unit.test_llm_engine import (  # noqa: F401 (collected here again, on the socket)
    test_endpoint_rejecting_seed_is_retried_without_it,
    test_fatal_401_stops_and_redacts_key,
    test_transient_errors_are_retried,
)
from unit.test_llm_faults import (  # noqa: F401 (collected here again, on the socket)
    test_a_validation_error_naming_a_field_is_handled_like_a_400,
    test_timed_out_slot_is_not_reused_while_the_server_still_works,
)


@pytest.fixture
def any_sim(socket_sim: F.SocketSim) -> F.SocketSim:
    return socket_sim


@pytest.fixture
def clock() -> RealClock:
    return RealClock()


async def test_adaptive_concurrency_settles_at_three_announced_slots(any_sim, clock):
    # three slots only: one slot is 40 calls one after another, the slowest case, run in process
    await faults.test_adaptive_concurrency_settles_at_the_slots_a_llama_cpp_server_announces(any_sim, 3, clock)


@pytest.mark.parametrize("form", [f[0] for f in engine.FORMS if f[2] < 1.0])  # the sub-second ones
async def test_each_retry_after_form_crosses_aiohttp(any_sim, form):
    # the waits are checked on the virtual clock (tests/unit/test_llm_engine.py); here the headers' effect
    any_sim.configure(script=["429"], retry_headers=form)
    async with any_sim.engine(F.sim_profile(any_sim)) as llm:
        r = await llm.chat(F.msgs(6), run=0, prompt_version="v1")
    assert r.error is None and llm.stats.http_429 == 1 and llm.stats.retries == 1
