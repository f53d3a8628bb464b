"""Provider faults of the fault campaign (issue 11) and the real-server behaviours of issue 10, each against
the simulator in this process on a virtual clock (`clock`; `any_sim` tests once more on loopback:
tests/integration/test_transport_parity.py): rejected fields, useless retry hints, failure counts, structured
outputs, adaptive concurrency on a serial server, honest latency."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import pytest
from helpers import llm as F

from evaluator.llm.cache import call_key
from simulator import behaviour


@pytest.fixture
def sim() -> F.LocalSim:
    """The simulator in this process, behind the engine's in-process transport (no socket)."""
    return F.LocalSim()


SCHEMA = {"name": "plan", "schema": {"type": "object", "properties": {"steps": {"type": "array"}}}}


async def _all(llm, idx, **kw):
    return await asyncio.gather(*(llm.chat(F.msgs(i), run=0, prompt_version="v1", **kw) for i in idx))


# -- a field the host rejects ------------------------------------------------------------------------
async def test_seed_rejected_mid_run_is_dropped_for_queued_and_in_flight_calls(sim, tmp_path, caplog, clock):
    # The host accepts `seed` for 3 replies, then rejects it: calls already queued or in flight with
    # it must each be retried once without it, not lost.
    sim.configure(reject_seed=True, reject_after=3, latency_s=0.05)
    caplog.set_level(logging.WARNING, logger="evaluator.llm")
    async with sim.engine(F.sim_profile(sim, concurrency=4), cache_root=tmp_path) as llm:
        rs = await _all(llm, range(12))
    assert all(r.error is None for r in rs)
    assert [r.content for r in rs] == [behaviour.answer(F.msgs(i), seed=0, temperature=0.0) for i in range(12)]
    st = sim.stats()["by_status"]
    assert st["200"] == 12 and 1 <= st["400"] <= 4  # at most the calls that were in flight with it
    assert llm.stats.dropped_params == ["seed"] and llm.stats.errors == 0
    assert sum("rejects `seed`" in r.message for r in caplog.records) == 1  # one warning
    # Keys are those of the logical request: a resume finds every reply, with or without the seed sent.
    before = sim.stats()["requests"]
    async with sim.engine(F.sim_profile(sim, concurrency=4), cache_root=tmp_path) as llm:
        again = await _all(llm, range(12))
    assert all(r.cached for r in again) and sim.stats()["requests"] == before


async def test_any_rejected_optional_field_is_dropped(sim, clock):
    # Not a case list: an extra_body field the host does not know goes the same way.
    sim.configure(reject_params=["top_p"])
    async with sim.engine(F.sim_profile(sim, extra_body={"top_p": 0.5})) as llm:
        rs = await _all(llm, range(3))
        rejected_once = sim.stats()["by_status"]["400"]
        later = await _all(llm, range(3, 6))  # built after the drop: never sent with it
    assert all(r.error is None for r in rs + later) and llm.stats.dropped_params == ["top_p"]
    assert 1 <= rejected_once <= 3 and sim.stats()["by_status"] == {"400": rejected_once, "200": 6}


async def test_response_format_rejected_falls_back_to_free_text_once(sim, tmp_path, caplog, clock):
    # A host that takes no response_format at all: first the json_object form of the schema is
    # tried, then free text — each once for the model, with a warning.
    sim.configure(reject_params=["response_format"])
    caplog.set_level(logging.WARNING, logger="evaluator.llm")
    prof = F.sim_profile(sim, structured="json_schema")
    async with sim.engine(prof, cache_root=tmp_path) as llm:
        first = await llm.chat(F.msgs(0), run=0, prompt_version="v1", schema=SCHEMA)
        assert sim.stats()["by_status"] == {"400": 2, "200": 1}
        rs = await _all(llm, range(1, 4), schema=SCHEMA)
        after = llm.prepare(F.msgs(9), run=0, prompt_version="v1", schema=SCHEMA)
    assert all(r.error is None for r in [first, *rs]) and sim.stats()["by_status"] == {"400": 2, "200": 4}
    assert llm.stats.dropped_params == ["response_format:json_schema", "response_format"]
    assert "response_format" not in after.body and "response_format" in after.logical
    assert sum("structured output off" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize("status", [400, 422, 500])
async def test_json_schema_rejected_is_sent_as_json_object_with_its_schema(sim, tmp_path, status, clock):
    # llama-cpp-python takes response_format only as text/json_object (+ "schema"), and reports a
    # json_schema one as a 500 carrying a validation error; FastAPI servers as a 422.
    sim.configure(reject_json_schema=True, reject_status=status)
    async with sim.engine(F.sim_profile(sim, structured="json_schema", max_retries=0), cache_root=tmp_path) as llm:
        p = llm.prepare(F.msgs(1), run=0, prompt_version="v1", schema=SCHEMA)
        r = await llm.send(p)
        again = await llm.chat(F.msgs(1), run=0, prompt_version="v1", schema=SCHEMA)
        later = llm.prepare(F.msgs(2), run=0, prompt_version="v1", schema=SCHEMA)
    assert r.error is None and again.cached  # same key as requested
    assert llm.stats.dropped_params == ["response_format:json_schema"]
    assert sim.stats()["by_status"] == {str(status): 1, "200": 1}
    assert later.body["response_format"] == {"type": "json_object", "schema": SCHEMA["schema"]}
    assert llm.prepare(F.msgs(1), run=0, prompt_version="v1", schema=SCHEMA).key == p.key


@pytest.mark.parametrize("status", [422, 500])
async def test_a_validation_error_naming_a_field_is_handled_like_a_400(any_sim, status, clock):
    # FastAPI servers answer 422 with pydantic's error list; llama-cpp-python turns the same report
    # into a 500. Either way: the field goes, at once, with no retry budget spent.
    any_sim.configure(reject_params=["top_p"], reject_status=status)
    async with any_sim.engine(F.sim_profile(any_sim, extra_body={"top_p": 0.5}, max_retries=0)) as llm:
        r = await llm.chat(F.msgs(1), run=0, prompt_version="v1")
    assert r.error is None and llm.stats.dropped_params == ["top_p"]
    assert any_sim.stats()["by_status"] == {str(status): 1, "200": 1}


async def test_an_ordinary_500_mentioning_a_field_drops_nothing(sim, clock):
    sim.configure(script=["500"])
    async with sim.engine(F.sim_profile(sim)) as llm:
        r = await llm.chat(F.msgs(1), run=0, prompt_version="v1")
    assert r.error is None and llm.stats.dropped_params == [] and llm.stats.retries == 1


async def test_a_400_naming_no_optional_field_fails_that_call_only(sim, clock):
    async with sim.engine(F.sim_profile(sim)) as llm:
        bad = await llm.send(llm.prepare_body({"model": "sim-1"}))  # no messages: the request itself is wrong
        ok = await llm.chat(F.msgs(1), run=0, prompt_version="v1")
    assert bad.error and bad.error_kind == "http_400" and ok.error is None
    assert llm.stats.failed == {"http_400": 1} and llm.stats.dropped_params == []


# -- retry hints of 0, negative or garbage ----------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "style"), [("0", "openai"), ("-3", "openai"), ("soon", "openai"), ("0s", "gemini"), ("nope", "gemini")]
)
async def test_useless_retry_hints_fall_back_to_backoff_with_a_floor(sim, value, style, clock):
    sim.configure(script=["429"] * 3, retry_value=value, rate_style=style)
    prof = F.sim_profile(sim, backoff_base_s=0.2, backoff_max_s=5.0)
    async with sim.engine(prof) as llm:
        t0 = clock.now()
        r = await llm.chat(F.msgs(1), run=0, prompt_version="v1")
        waited = clock.now() - t0
    # Backoff floors 0.1 + 0.2 + 0.4 s: three retries, never resent at once.
    assert r.error is None and llm.stats.http_429 == 3 and sim.stats()["requests"] == 4
    assert waited >= 0.7


async def test_rate_limited_host_answering_retry_after_0_is_not_hammered(sim, clock):
    # 2 requests/s with `Retry-After: 0` and no announced limit: the engine must back off, not spin.
    sim.configure(rpm=120, burst_s=0.5, retry_value="0", retry_headers="seconds")
    async with sim.engine(F.sim_profile(sim, backoff_base_s=0.2, backoff_max_s=2.0)) as llm:
        rs = await _all(llm, range(4))
    assert all(r.error is None for r in rs)
    assert sim.stats()["requests"] <= 4 + 20  # before the fix: hundreds of 429s in a few seconds


# -- calls that failed for good ---------------------------------------------------------------------
async def test_failed_calls_are_counted_by_kind_and_not_cached(sim, tmp_path, clock):
    sim.configure(script=["503", "503", "hang"], hang_s=2.0)
    prof = F.sim_profile(sim, max_retries=1, timeout_s=0.3)
    async with sim.engine(prof, cache_root=tmp_path) as llm:
        first = await llm.chat(F.msgs(1), run=0, prompt_version="v1")  # 503, 503: gives up
        second = await llm.chat(F.msgs(2), run=0, prompt_version="v1")  # hang (timeout), then a reply
        bad = await llm.send(llm.prepare_body({"model": "sim-1"}))
    assert first.error_kind == "http_503" and "after 2 tries" in first.error
    assert second.error is None and llm.stats.timeouts == 1
    assert llm.stats.failed == {"http_400": 1, "http_503": 1} and llm.stats.errors == 2
    assert bad.error_kind == "http_400"
    assert llm.stats.as_dict()["failed"] == {"http_400": 1, "http_503": 1}


# -- structured outputs -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("json_schema", {"type": "json_schema", "json_schema": {"name": "plan", "schema": SCHEMA["schema"]}}),
        ("json_object", {"type": "json_object"}),
        ("json_object_schema", {"type": "json_object", "schema": SCHEMA["schema"]}),
        ("none", None),
    ],
)
def test_schema_becomes_response_format_per_profile(sim, mode, expected):
    llm = sim.engine(F.sim_profile(sim, structured=mode))
    with_schema = llm.prepare(F.msgs(1), run=0, prompt_version="v1", schema=SCHEMA)
    plain = llm.prepare(F.msgs(1), run=0, prompt_version="v1")
    assert with_schema.body.get("response_format") == expected and "response_format" not in plain.body
    # Part of the key when sent; absent, the key is the one every earlier cache used.
    assert (with_schema.key != plain.key) == (expected is not None)
    assert plain.key == call_key(llm._prefix, F.msgs(1), 0, "v1")


async def test_structured_call_reaches_the_server_with_its_schema(sim, tmp_path, clock):
    async with sim.engine(F.sim_profile(sim, structured="json_schema"), cache_root=tmp_path) as llm:
        p = llm.prepare(F.msgs(1), run=0, prompt_version="v1", schema=SCHEMA)
        r = await llm.send(p)
        again = await llm.chat(F.msgs(1), run=0, prompt_version="v1", schema=SCHEMA)
        free = await llm.chat(F.msgs(1), run=0, prompt_version="v1")
    assert r.error is None and again.cached and not free.cached and sim.stats()["requests"] == 2


# -- a serial server: adaptive concurrency, timeouts from send, held slots ------------------------------
async def test_adaptive_concurrency_keeps_a_serial_server_from_queueing(sim, clock):
    # A one-slot server (CPU llama.cpp): with 16 fixed slots the last requests would wait 15 x 0.1 s
    # on the server and pass the 1 s timeout; adaptive stays near one request in flight.
    sim.configure(serial=True, latency_s=0.1)
    prof = F.sim_profile(sim, concurrency=16, adaptive_concurrency=True, timeout_s=1.0, max_retries=0)
    async with sim.engine(prof) as llm:
        rs = await _all(llm, range(16))
    st = sim.stats()
    assert all(r.error is None for r in rs) and llm.stats.timeouts == 0 and st["abandoned"] == 0
    assert st["max_waiting"] <= 4 and st["requests"] == 16 and llm.stats.concurrency_limit <= 4  # fixed: 15 waiting


@pytest.mark.parametrize("slots", [1, 3])
async def test_adaptive_concurrency_settles_at_the_slots_a_llama_cpp_server_announces(any_sim, slots, clock):
    # llama.cpp's /props says `total_slots` (tests/fixtures/providers/llama_cpp/props.json): more requests in
    # flight only queue there, each adding its wait to every latency (issue 31: a 1-slot server, limit 4, p50 9 s -> 32 s).
    any_sim.configure(slots=slots, latency_s=0.05, latency="lognormal", latency_sigma=0.6)
    prof = F.sim_profile(any_sim, concurrency=16, adaptive_concurrency=True)
    async with any_sim.engine(prof) as llm:
        rs = await _all(llm, range(40))
    st = any_sim.stats()
    assert all(r.error is None for r in rs)
    assert llm.stats.concurrency_limit <= slots and llm.stats.max_in_flight <= slots
    assert st["max_waiting"] == 0 and st["max_in_flight"] <= slots


async def test_adaptive_concurrency_grows_on_a_parallel_server(sim, clock):
    sim.configure(latency_s=0.05)
    prof = F.sim_profile(sim, concurrency=32, adaptive_concurrency=True)
    async with sim.engine(prof) as llm:
        await _all(llm, range(120))
    assert llm.stats.concurrency_limit >= 8 and sim.stats()["max_in_flight"] >= 8


async def test_adaptive_concurrency_halves_on_429s(sim, clock):
    sim.configure(latency_s=0.02)
    prof = F.sim_profile(sim, concurrency=32, adaptive_concurrency=True)
    async with sim.engine(prof) as llm:
        await _all(llm, range(60))
        grown = llm.stats.concurrency_limit
        sim.configure(script=["429"], retry_headers="ms")
        await _all(llm, range(100, 101))
    assert grown >= 4 and llm.stats.concurrency_limit <= grown / 2 + 1


async def test_timed_out_slot_is_not_reused_while_the_server_still_works(any_sim, clock):
    # The server needs 0.45 s; the client gives up at 0.3 s. The next request must not be queued
    # behind the abandoned one: its slot stays taken another timeout_s.
    any_sim.configure(serial=True, latency_s=0.45)
    prof = F.sim_profile(any_sim, concurrency=1, timeout_s=0.3, max_retries=0)
    async with any_sim.engine(prof) as llm:
        first = await llm.chat(F.msgs(1), run=0, prompt_version="v1")
        second = asyncio.create_task(llm.chat(F.msgs(2), run=0, prompt_version="v1"))
        await asyncio.sleep(0.2)
        waiting_meanwhile = any_sim.stats()["max_waiting"]
        await second
    assert first.error_kind == "timeout" and waiting_meanwhile == 0
    assert any_sim.stats()["abandoned"] >= 1


async def test_attempt_timeout_counts_from_send_not_from_queueing(sim, clock):
    # Six calls through one slot, 0.2 s each: the last waits ~1 s for its turn, well past the 0.5 s
    # timeout, and must still not time out — its clock starts when it is sent.
    sim.configure(latency_s=0.2)
    async with sim.engine(F.sim_profile(sim, concurrency=1, timeout_s=0.5, max_retries=0)) as llm:
        rs = await _all(llm, range(6))
    assert all(r.error is None for r in rs) and llm.stats.timeouts == 0 and sim.stats()["requests"] == 6


async def test_latency_is_server_time_and_queueing_is_reported_apart(sim, clock):
    sim.configure(latency_s=0.1)
    async with sim.engine(F.sim_profile(sim, concurrency=1)) as llm:
        await _all(llm, range(5))
    s = llm.stats.as_dict()
    assert s["latency_s"]["n"] == 5 and s["queue_s"]["n"] == 5
    # Five calls through one slot: the last queued ~0.4 s, but each was served in ~0.1 s.
    assert s["queue_s"]["p90"] > s["latency_s"]["p90"] and s["queue_s"]["p90"] >= 0.3


# -- batch import parity ----------------------------------------------------------------------------
async def test_store_reply_caches_exactly_as_the_online_path(sim, tmp_path, clock):
    async with sim.engine(F.sim_profile(sim), cache_root=tmp_path / "a") as llm:
        online = await llm.send(llm.prepare(F.msgs(1), run=0, prompt_version="v1"), keep_raw=True)
    offline = sim.engine(F.sim_profile(sim), cache_root=tmp_path / "b")  # no HTTP session
    p = offline.prepare(F.msgs(1), run=0, prompt_version="v1")
    stored = offline.store_reply(p.key, online.raw)
    hit = offline.lookup(p.key)
    bad = offline.store_reply("other", {"choices": []})
    offline.close_cache()
    assert dataclasses.replace(stored, raw=None) == dataclasses.replace(online, raw=None)
    assert hit is not None and hit.content == online.content and hit.cached
    assert bad.error and offline.lookup("other") is None
