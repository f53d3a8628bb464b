"""LLMEngine against the simulator in this process (no socket), on a virtual clock (`clock`: every wait exact,
none slept): replies, every error class, 429 forms, the gate, pacing.

A test that takes `any_sim` must hold on either transport: tests/integration/test_transport_parity.py runs it
again through the aiohttp transport and the simulator's server on loopback.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from helpers import llm as F

from evaluator.core.errors import FatalLLMError
from evaluator.llm.decide import resume_time
from simulator import behaviour


@pytest.fixture
def sim() -> F.LocalSim:
    """The simulator in this process, behind the engine's in-process transport (no socket)."""
    return F.LocalSim()


async def test_reply_tokens_and_cache_hit(sim, tmp_path, clock):
    async with sim.engine(F.sim_profile(sim), cache_root=tmp_path) as llm:
        first = await llm.chat(F.msgs(1), run=2, prompt_version="v1")
        again = await llm.chat(F.msgs(1), run=2, prompt_version="v1")
    assert first.error is None and not first.cached
    assert first.content == behaviour.answer(F.msgs(1), seed=2, temperature=0.0)
    assert first.prompt_tokens > 0 and first.completion_tokens > 0
    assert again.cached and (again.content, again.prompt_tokens) == (first.content, first.prompt_tokens)
    assert sim.stats()["by_status"] == {"200": 1}
    s = llm.stats.as_dict()
    assert (s["calls"], s["cache_hits"], s["requests"]) == (2, 1, 1)
    assert s["latency_s"]["n"] == 1 and s["latency_s"]["p50"] >= 0


async def test_request_carries_seed_model_sampling(sim, tmp_path):
    prof = F.sim_profile(sim, temperature=0.7, max_tokens=77, extra_body={"top_p": 0.5})
    async with sim.engine(prof) as llm:
        r = await llm.chat(F.msgs(3), run=3, prompt_version="v1")
    assert r.content == behaviour.answer(F.msgs(3), seed=3, temperature=0.7)


@pytest.mark.parametrize(
    "knobs",
    [
        {"script": ["500", "503"]},
        {"script": ["500", "503"], "list_errors": True},  # Gemini-style list error bodies
        {"script": ["malformed"]},
        {"script": ["drop", "drop"]},
        {"script": ["hang"], "hang_s": 3.0},  # past the client's 0.3 s timeout
    ],
    ids=["5xx", "5xx-list-body", "malformed-json", "connection-drop", "timeout"],
)
async def test_transient_errors_are_retried(any_sim, tmp_path, knobs, clock):
    any_sim.configure(**knobs)
    async with any_sim.engine(F.sim_profile(any_sim, timeout_s=0.3), cache_root=tmp_path) as llm:
        r = await llm.chat(F.msgs(4), run=0, prompt_version="v1")
    assert r.error is None and r.content == behaviour.answer(F.msgs(4), seed=0, temperature=0.0)
    assert llm.stats.retries == len(knobs["script"])
    assert llm.stats.requests == len(knobs["script"]) + 1


async def test_retries_exhausted_is_nonfatal_and_not_cached(sim, tmp_path, clock):
    sim.configure(p_503=1.0)
    async with sim.engine(F.sim_profile(sim, max_retries=2), cache_root=tmp_path) as llm:
        r = await llm.chat(F.msgs(5), run=0, prompt_version="v1")
        assert r.content is None and "HTTP 503" in r.error and "after 3 tries" in r.error
        sim.configure(p_503=0.0)
        ok = await llm.chat(F.msgs(5), run=0, prompt_version="v1")
    assert ok.error is None and not ok.cached  # the error was never stored
    assert llm.stats.errors == 1 and sim.stats()["by_status"] == {"503": 3, "200": 1}


FORMS = [("seconds", 0.95, 1.8), ("date", 0.0, 2.5), ("ms", 0.05, 0.6), ("reset", 0.05, 0.6)]


# The headers cross aiohttp alike: tests/integration/test_transport_parity.py (the counts, not the waits).
@pytest.mark.parametrize(("form", "least", "most"), FORMS)
async def test_429_honours_each_retry_after_form(sim, form, least, most, clock):
    # A scripted 429 asks for 50 ms; "seconds" rounds up to 1 s, "date" to the next whole second.
    sim.configure(script=["429"], retry_headers=form)
    async with sim.engine(F.sim_profile(sim)) as llm:
        t0 = clock.now()
        r = await llm.chat(F.msgs(6), run=0, prompt_version="v1")
        waited = clock.now() - t0
    assert r.error is None and llm.stats.http_429 == 1 and llm.stats.retries == 1
    assert least <= waited <= most


async def test_429_gemini_body_form(sim, clock):
    sim.configure(rate_style="gemini", rpm=60, burst_s=1.0)  # 1 request, then 1 per second
    async with sim.engine(F.sim_profile(sim)) as llm:
        t0 = clock.now()
        rs = await asyncio.gather(*(llm.chat(F.msgs(i), run=0, prompt_version="v1") for i in range(2)))
        waited = clock.now() - t0
    assert all(r.error is None for r in rs)
    assert llm.stats.http_429 >= 1 and 0.8 <= waited <= 2.5  # retryDelay read from the JSON list body


async def test_429_pauses_the_whole_model(sim, clock):
    sim.configure(script=["429"], retry_headers="seconds")  # Retry-After: 1
    async with sim.engine(F.sim_profile(sim)) as llm:
        t0 = clock.now()
        first = asyncio.create_task(llm.chat(F.msgs(7), run=0, prompt_version="v1"))
        await asyncio.sleep(0.15)  # the 429 has arrived; these new calls must wait with it
        later = await asyncio.gather(*(llm.chat(F.msgs(i), run=0, prompt_version="v1") for i in range(8, 12)))
        elapsed = clock.now() - t0
        await first
    assert all(r.error is None for r in later) and elapsed >= 0.95
    assert sim.stats()["by_status"] == {"429": 1, "200": 5}


async def test_client_rpm_pacing_avoids_429s(sim, clock):
    sim.configure(rpm=1200, burst_s=1.0)  # 20/s
    async with sim.engine(F.sim_profile(sim, rpm=1200)) as llm:
        t0 = clock.now()
        rs = await asyncio.gather(*(llm.chat(F.msgs(i), run=0, prompt_version="v1") for i in range(40)))
        elapsed = clock.now() - t0
    assert all(r.error is None for r in rs)
    assert sim.stats()["by_status"] == {"200": 40}  # unpaced, 20 of the 40 would be refused
    assert 0.9 <= elapsed <= 3.0  # a burst of 14 (limiters.PACED_BURST_S), then the other 26 at 19.8/s


async def test_client_tpm_budget(sim, clock):
    async with sim.engine(F.sim_profile(sim, tpm=60 * 400, max_tokens=100)) as llm:  # ~400 tokens/s
        t0 = clock.now()
        await asyncio.gather(*(llm.chat(F.msgs(i), run=0, prompt_version="v1") for i in range(8)))
        elapsed = clock.now() - t0
    assert elapsed >= 0.9  # 8 x (~40 prompt + 100) tokens > the one-second bucket


async def test_fatal_401_stops_and_redacts_key(any_sim, tmp_path, caplog, clock):
    any_sim.configure(api_key="sk-the-right-key-000000000000")
    prof = F.sim_profile(any_sim, api_key_env="SIM_API_KEY")
    caplog.set_level("DEBUG")
    async with any_sim.engine(prof, cache_root=tmp_path, api_key=F.FAKE_KEY) as llm:
        with pytest.raises(FatalLLMError) as e:
            await llm.chat(F.msgs(8), run=0, prompt_version="v1")
        with pytest.raises(FatalLLMError):  # later fresh calls stop at once, sending nothing
            await llm.chat(F.msgs(9), run=0, prompt_version="v1")
        assert F.FAKE_KEY not in repr(llm)
    msg = str(e.value)
    assert "HTTP 401" in msg and "set SIM_API_KEY" in msg
    assert F.FAKE_KEY not in msg and F.FAKE_KEY not in caplog.text
    assert any_sim.stats()["by_status"] == {"401": 1}


async def test_right_key_is_accepted(sim):
    sim.configure(api_key=F.FAKE_KEY)
    async with sim.engine(F.sim_profile(sim), api_key=F.FAKE_KEY) as llm:
        r = await llm.chat(F.msgs(10), run=0, prompt_version="v1")
    assert r.error is None


async def test_daily_quota_is_fatal_and_keeps_finished_calls(sim, tmp_path, clock):
    sim.configure(daily_quota=2)
    async with sim.engine(F.sim_profile(sim), cache_root=tmp_path) as llm:
        for i in range(2):
            assert (await llm.chat(F.msgs(i), run=0, prompt_version="v1")).error is None
        with pytest.raises(FatalLLMError, match="daily quota exhausted; resume after ") as e:
            await llm.chat(F.msgs(2), run=0, prompt_version="v1")
        again = await llm.chat(F.msgs(0), run=0, prompt_version="v1")  # cached replies still served
    assert again.cached
    # The simulator's RetryInfo says 43200s: the time to resume is 12 h from now, to the minute.
    expected = resume_time(time.time() + 43200, time.time())
    assert f"resume after {expected} with the same command" in str(e.value)


async def test_reasoning_only_reply_is_cached_and_marked(sim, tmp_path):
    sim.configure(script=["null"])  # content null, the text only in reasoning_content
    async with sim.engine(F.sim_profile(sim), cache_root=tmp_path) as llm:
        r = await llm.chat(F.msgs(11), run=0, prompt_version="v1")
    async with sim.engine(F.sim_profile(sim), cache_root=tmp_path) as llm:  # a resume
        again = await llm.chat(F.msgs(11), run=0, prompt_version="v1")
    expected = behaviour.answer(F.msgs(11), seed=0, temperature=0.0)
    assert r.error is None and r.content == expected and r.reasoning_only and not r.cached
    assert again.cached and again.reasoning_only and again.content == expected  # free on resume
    assert sim.stats()["requests"] == 1


async def test_truncated_reply_is_returned_and_cached_after_its_retries(sim, tmp_path, clock):
    sim.configure(script=["length", "length"])  # cut twice: the retry is cut too
    async with sim.engine(F.sim_profile(sim, truncation_retries=1), cache_root=tmp_path) as llm:
        r = await llm.chat(F.msgs(12), run=0, prompt_version="v1")
        again = await llm.chat(F.msgs(12), run=0, prompt_version="v1")
    full = behaviour.answer(F.msgs(12), seed=0, temperature=0.0)
    # The last cut reply is the model's real output: its text is kept for the parser, and cached.
    assert r.error is None and r.truncated and r.content and full.startswith(r.content) and r.content != full
    assert again.cached and again.truncated and again.content == r.content
    assert llm.stats.truncated == 2 and llm.stats.errors == 0 and sim.stats()["requests"] == 2


async def test_truncated_reasoning_only_reply_keeps_its_text(sim, tmp_path):
    sim.configure(p_null=1.0, null_finish="length")  # gpt-oss out of tokens while reasoning
    async with sim.engine(F.sim_profile(sim, truncation_retries=0), cache_root=tmp_path) as llm:
        r = await llm.chat(F.msgs(13), run=0, prompt_version="v1")
    assert r.error is None and r.truncated and r.reasoning_only and r.content


async def test_identical_concurrent_calls_share_one_request(sim, clock):
    sim.configure(latency_s=0.05)
    async with sim.engine(F.sim_profile(sim)) as llm:
        rs = await asyncio.gather(*(llm.chat(F.msgs(13), run=0, prompt_version="v1") for _ in range(5)))
    assert len({r.content for r in rs}) == 1 and sim.stats()["requests"] == 1
    assert sum(r.cached for r in rs) == 4


async def test_concurrency_limit(sim, clock):
    sim.configure(latency_s=0.05)
    async with sim.engine(F.sim_profile(sim, concurrency=3)) as llm:
        await asyncio.gather(*(llm.chat(F.msgs(i), run=0, prompt_version="v1") for i in range(12)))
    assert sim.stats()["max_in_flight"] == 3


async def test_endpoint_rejecting_seed_is_retried_without_it(any_sim, tmp_path, clock):
    any_sim.configure(reject_seed=True)
    async with any_sim.engine(F.sim_profile(any_sim), cache_root=tmp_path) as llm:
        r0 = await llm.chat(F.msgs(21), run=0, prompt_version="v1")
        r1 = await llm.chat(F.msgs(21), run=1, prompt_version="v1")
    assert r0.error is None and r1.error is None
    assert not r1.cached  # runs stay separate samples in the cache without the seed on the wire
    assert any_sim.stats()["by_status"] == {"400": 1, "200": 2}  # one rejection, then never sent again
