"""The simulator on loopback: OpenAI format, stats, admin config, limits and each injected fault."""

from __future__ import annotations

import asyncio
import dataclasses

import aiohttp
import orjson
import pytest
from helpers import llm as F
from helpers.procs import PYTHON, run, simulator, wait_until

from evaluator.core.tokens import prompt_tokens
from simulator import behaviour
from simulator.server import SimConfig


async def _post(sim, body: dict | None = None, headers: dict | None = None, session=None):
    body = body or {"model": "sim-1", "messages": F.msgs(0), "seed": 1, "temperature": 0}
    own = session is None
    session = session or aiohttp.ClientSession()
    try:
        async with session.post(sim.base_url + "/chat/completions", data=orjson.dumps(body), headers=headers) as r:
            return r.status, dict(r.headers), await r.read()
    finally:
        if own:
            await session.close()


async def test_models_and_chat_format(sim):
    async with aiohttp.ClientSession() as s, s.get(sim.base_url + "/models") as r:
        assert r.status == 200 and (await r.json())["data"][0]["id"] == "sim-1"
    status, _, raw = await _post(sim)
    reply = orjson.loads(raw)
    assert status == 200 and reply["object"] == "chat.completion"
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == behaviour.answer(F.msgs(0), seed=1, temperature=0.0)
    u = reply["usage"]
    assert u["prompt_tokens"] > 0 and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]


async def test_the_simulator_bills_the_engines_token_rule_response_format_included(sim):
    """The dry run's and the budget's prompt estimate (core.tokens) is the simulator's bill, with a schema too."""
    plain = {"model": "sim-1", "messages": F.msgs(0), "seed": 1, "temperature": 0}
    schema = {"type": "json_schema", "json_schema": {"name": "stubs", "schema": {"type": "object", "properties": {
        "stubs": {"type": "array", "items": {"type": "string"}}}}}}
    billed = []
    for body in (plain, {**plain, "response_format": schema}):
        _, _, raw = await _post(sim, body)
        billed.append(orjson.loads(raw)["usage"]["prompt_tokens"])
        assert billed[-1] == prompt_tokens(body)
    assert billed[1] > billed[0]  # the schema is part of the prompt a provider reads


async def test_stats_count_concurrency_and_repeats(sim):
    sim.configure(latency_s=0.05)
    async with aiohttp.ClientSession() as s:
        await asyncio.gather(*(_post(sim, session=s) for _ in range(3)))
        await asyncio.gather(*(_post(sim, {"model": "m", "messages": F.msgs(i)}, session=s) for i in range(5)))
    st = sim.stats()
    assert st["requests"] == 8 and st["by_status"] == {"200": 8} and st["in_flight"] == 0
    assert st["max_in_flight"] == 5 and st["ok"] == 8 and st["distinct_ok"] == 6 and st["repeated_ok"] == 1
    sim.reset_stats()
    assert sim.stats()["requests"] == 0


async def test_bad_request_and_bad_knob(sim):
    status, _, _ = await _post(sim, {"model": "x"})
    assert status == 400
    with pytest.raises(ValueError, match="unknown fault"):
        sim.configure(script=["explode"])
    with pytest.raises(ValueError):
        sim.configure(no_such_knob=1)


async def test_rpm_limit_openai_headers(sim):
    sim.configure(rpm=120, burst_s=1.0)  # bucket of 2, 2/s
    codes = [(await _post(sim))[0] for _ in range(3)]
    assert codes == [200, 200, 429]
    status, headers, raw = await _post(sim)
    assert status == 429 and float(headers["retry-after-ms"]) > 0 and int(headers["Retry-After"]) >= 1
    assert headers["x-ratelimit-reset-requests"].endswith("ms") and headers["x-ratelimit-remaining-requests"] == "0"
    assert orjson.loads(raw)["error"]["code"] == "rate_limit_exceeded"


async def test_tpm_limit(sim):
    sim.configure(tpm=60 * 100)  # 100 tokens/s, bucket of 100
    codes = [(await _post(sim, {"model": "m", "messages": F.msgs(i), "max_tokens": 60}))[0] for i in range(3)]
    assert codes[0] == 200 and 429 in codes


async def test_rpm_limit_gemini_body(sim):
    sim.configure(rpm=60, rate_style="gemini")
    await _post(sim)
    status, headers, raw = await _post(sim)
    body = orjson.loads(raw)
    assert status == 429 and "retry-after" not in {k.lower() for k in headers}
    assert isinstance(body, list) and body[0]["error"]["status"] == "RESOURCE_EXHAUSTED"
    info = [d for d in body[0]["error"]["details"] if d["@type"].endswith("RetryInfo")]
    assert info[0]["retryDelay"].endswith("s")


@pytest.mark.parametrize(
    ("fault", "status"), [("500", 500), ("503", 503), ("429", 429), ("401", 401), ("quota", 429), ("malformed", 200)]
)
async def test_scripted_faults(sim, fault, status):
    sim.configure(script=[fault], list_errors=True)
    got, _, raw = await _post(sim)
    assert got == status
    if fault == "malformed":
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(raw)
    elif fault in ("500", "503"):
        assert isinstance(orjson.loads(raw), list)
    assert (await _post(sim))[0] == 200  # the script is used up
    assert sim.stats()["faults"] == {fault: 1}


async def test_null_and_length_replies(sim):
    sim.configure(script=["null", "length"], null_finish="length")
    _, _, raw = await _post(sim)
    choice = orjson.loads(raw)["choices"][0]
    assert choice["message"]["content"] is None and choice["message"]["reasoning_content"]
    assert choice["finish_reason"] == "length"
    _, _, raw = await _post(sim)
    assert orjson.loads(raw)["choices"][0]["finish_reason"] == "length"


async def test_drop_and_hang(sim):
    sim.configure(script=["drop", "hang"], hang_s=5.0)
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.ClientError):
            await _post(sim, session=s)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await _post(sim, session=s)
    st = wait_until(lambda: (st := sim.stats())["in_flight"] == 0 and st, what="the hung handler cancelled")
    assert st["by_status"].get("drop") == 1 and st["in_flight"] == 0


async def test_api_key_required(sim):
    sim.configure(api_key=F.FAKE_KEY)
    assert (await _post(sim))[0] == 401
    assert (await _post(sim, headers={"Authorization": "Bearer nope"}))[0] == 401
    assert (await _post(sim, headers={"Authorization": f"Bearer {F.FAKE_KEY}"}))[0] == 200


async def test_daily_quota(sim):
    sim.configure(daily_quota=1)
    assert (await _post(sim))[0] == 200
    status, _, raw = await _post(sim)
    assert status == 429 and "PerDay" in raw.decode()


def test_random_faults_are_seeded():
    cfg = SimConfig(p_500=0.3, p_503=0.2, seed=7)

    def run() -> list[int]:
        with simulator(**dataclasses.asdict(cfg)) as h:
            return [asyncio.run(_post(h))[0] for _ in range(30)]

    first = run()
    assert first == run() and {500, 503, 200} <= set(first)


def test_cli_flags():
    done = run([PYTHON, "-m", "simulator", "--help"])
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for flag in ("--latency-s", "--rpm", "--rate-style", "--p-503", "--p-hang", "--list-errors", "--script", "--seed"):
        assert flag in out


def test_lognormal_latency_and_scale():
    with simulator(latency="lognormal", latency_s=0.02, latency_sigma=0.3, latency_scale=0.5) as h:
        assert h.configure()["latency"] == "lognormal"
        assert asyncio.run(_post(h))[0] == 200


async def test_rejected_params_after_n_replies(sim):
    sim.configure(reject_params=["seed", "response_format"], reject_after=1)
    first, _, _ = await _post(sim)  # carries seed; the first reply is still served
    status, _, raw = await _post(sim)
    assert (first, status) == (200, 400) and b'Unknown name \\"seed\\"' in raw
    status, _, _ = await _post(sim, {"model": "m", "messages": F.msgs(1)})  # without them: served
    assert status == 200
    sim.configure(reject_status=422)
    status, _, raw = await _post(sim, {"model": "m", "messages": F.msgs(1), "response_format": {"type": "json_object"}})
    assert status == 422 and orjson.loads(raw)["detail"][0]["loc"] == ["body", "response_format"]


@pytest.mark.parametrize("value", ["0", "-3", "soon"])
async def test_retry_value_is_sent_verbatim(sim, value):
    sim.configure(script=["429"], retry_value=value)
    status, headers, _ = await _post(sim)
    assert status == 429 and headers["Retry-After"] == value and headers["retry-after-ms"] == value
    sim.configure(script=["429"], retry_value=value, rate_style="gemini")
    _, _, raw = await _post(sim)
    details = orjson.loads(raw)[0]["error"]["details"]
    assert [d["retryDelay"] for d in details if "retryDelay" in d] == [value]


async def test_serial_server_works_one_at_a_time_and_finishes_abandoned_requests(sim):
    sim.configure(serial=True, latency_s=0.2)
    timeout = aiohttp.ClientTimeout(total=0.1)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        results = await asyncio.gather(*(_post(sim, session=s) for _ in range(3)), return_exceptions=True)
    assert all(isinstance(r, TimeoutError) for r in results)  # the client gave up on all three
    # ... the server still works through them, one after the other
    st = wait_until(lambda: (st := sim.stats())["ok"] == 3 and st, what="the three abandoned replies")
    assert st["abandoned"] == 3 and st["ok"] == 3 and st["max_waiting"] == 2 and st["max_in_flight"] == 3
