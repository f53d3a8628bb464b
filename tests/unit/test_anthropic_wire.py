"""Anthropic's Messages API on the engine's side: the recorded bodies of Anthropic's documentation
(tests/fixtures/providers/anthropic/, each naming its source) read and decided on, the chat -> Messages
translation, and the engine against the simulator's Messages route in this process (headers, 529s, refusals,
prompt-cache tokens, the rate-limit headers it paces to)."""

from __future__ import annotations

import orjson
import pytest
from helpers import FIXTURES
from helpers import llm as F

from evaluator.batch.providers import anthropic_result, anthropic_state
from evaluator.llm import LLMEngine, load_profile, revised
from evaluator.llm.decide import AttemptOutcome, CallState, GiveUp, Retry, StopRun, decide
from evaluator.llm.dialects import AnthropicWire, to_messages
from evaluator.llm.pacing import announced
from evaluator.llm.reply import MAX_TOKENS, REFUSAL, read_reply
from evaluator.llm.retry import jittered_backoff
from evaluator.llm.transport import MockTransport, Request, Response
from evaluator.study import prompts

DOCS = FIXTURES / "providers" / "anthropic"
NOW = 1_780_000_000.0
PROFILE = load_profile("anthropic/claude-sonnet-4-5", base_url="http://127.0.0.1:9/v1", require_key=False,
                       max_retries=4, backoff_base_s=0.5, backoff_max_s=30.0, max_wait_s=120.0)
SENT = frozenset({"model", "messages", "temperature", "max_tokens"})


def _doc(name: str) -> dict:
    return orjson.loads((DOCS / f"{name}.json").read_bytes())


def _backoff(attempt: int, jitter: float = 0.5) -> float:
    return jittered_backoff(attempt, PROFILE.retries.backoff_base_s, PROFILE.retries.backoff_max_s, jitter)


# name -> the decision the engine takes on it
EXPECTED = {
    "error_400_invalid_request": GiveUp("http_400", ""),
    "error_400_prompt_too_long": GiveUp("context_exceeded", ""),
    "error_401_authentication": StopRun("the API key was rejected; set ANTHROPIC_API_KEY"),
    "error_403_permission": StopRun("permission denied"),
    "error_404_not_found": StopRun("endpoint or model not found"),
    "error_413_request_too_large": GiveUp("http_413", ""),
    "error_429_rate_limit": Retry(12.0, "", is_429=True, cause="429", hint_s=12.0),
    "error_429_spend_limit": StopRun("monthly spend limit", is_429=True),
    "error_500_api_error": Retry(_backoff(0), "", cause="transient"),
    "error_529_overloaded": Retry(_backoff(0), "", cause="transient"),
    "error_529_overloaded_retry_after": Retry(7.0, "", cause="transient", hint_s=7.0),
}


def test_every_recorded_error_names_its_source_and_has_an_expected_decision():
    names = sorted(p.stem for p in DOCS.glob("error_*.json"))
    assert names == sorted(EXPECTED)
    for name in names:
        rec = _doc(name)
        sources = rec["source"] if isinstance(rec["source"], list) else [rec["source"]]
        assert all(s.strip() for s in sources) and {"status", "headers", "body"} <= set(rec), name
        assert rec["body"]["type"] == "error" and rec["body"]["error"]["type"], name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_decision_on_a_documented_error(name):
    rec, want = _doc(name), EXPECTED[name]
    outcome = AttemptOutcome.http(rec["status"], rec["headers"], orjson.dumps(rec["body"]), sent=SENT)
    got = decide(outcome, CallState(), PROFILE, now=NOW, jitter=0.5)
    assert type(got) is type(want), (name, got)
    if isinstance(want, Retry):
        assert (got.after_s, got.is_429, got.cause, got.hint_s) == pytest.approx(
            (want.after_s, want.is_429, want.cause, want.hint_s)), name
    elif isinstance(want, GiveUp):
        assert got.kind == want.kind
    else:
        assert want.message in got.message and got.is_429 == want.is_429, got.message


def _read(name: str, max_tokens: int | None = 2048):
    body = AnthropicWire(cache=True, max_tokens=max_tokens).decode(orjson.dumps(_doc(name)["body"]))
    return read_reply(body, max_tokens=max_tokens, max_tokens_known=True)


def test_documented_messages_read_as_replies():
    r = _read("message_end_turn")
    assert (r.content, r.finish_reason, r.prompt_tokens, r.completion_tokens, r.cut, r.error) == (
        "Hi! My name is Claude.", "stop", 2095, 503, None, None)
    cut = _read("message_max_tokens", max_tokens=64)  # stop_reason max_tokens: a cut reply, kept
    assert cut.cut == MAX_TOKENS and cut.truncated and cut.content.startswith('[{"name"') and cut.error is None
    refused = _read("message_refusal")  # stop_reason refusal: a failed reply, its tokens billed
    assert refused.error_kind == REFUSAL and refused.content is None and refused.prompt_tokens == 120
    tool = _read("message_tool_use")  # a forced tool: its input is the JSON answer
    assert orjson.loads(tool.content) == {"steps": ["Look up the forecast"], "selected_apis": ["Weather/forecast"]}
    assert tool.finish_reason == "tool_calls" and tool.cut is None
    cached = _read("message_cache_usage")  # Anthropic counts cached prompt tokens apart from input_tokens
    assert (cached.prompt_tokens, cached.cached_tokens, cached.cache_write_tokens) == (1821, 1800, 0)


def test_a_refusal_is_given_up_not_retried():
    body = AnthropicWire(cache=False, max_tokens=None).decode(orjson.dumps(_doc("message_refusal")["body"]))
    got = decide(AttemptOutcome.http(200, {}, body, sent=SENT), CallState(), PROFILE, now=NOW, jitter=0.5)
    assert isinstance(got, GiveUp) and got.kind == REFUSAL


def test_a_body_that_is_not_a_message_is_malformed():
    for raw in (b'{"type": "message", "content": "text"}', b"{\"id\": \"msg_x\", \"type\": \"mess"):
        r = read_reply(AnthropicWire(cache=False, max_tokens=None).decode(raw))
        assert r.error_kind == "malformed_reply"


def test_chat_body_as_messages_body():
    chat = {"model": "claude-sonnet-4-5", "temperature": 0.0, "seed": 3, "stop": "END", "top_k": 5,
            "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                         {"role": "assistant", "content": "A"}, {"role": "user", "content": [{"type": "text", "text": "U2"}]}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "plan", "schema": {"type": "object"}}}}
    m = to_messages(chat, cache=True, default_max_tokens=321)
    assert m["system"] == [{"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}}]
    assert m["messages"] == [{"role": "user", "content": "U"}, {"role": "assistant", "content": "A"},
                             {"role": "user", "content": "U2"}]
    assert m["max_tokens"] == 321 and m["stop_sequences"] == ["END"] and "seed" not in m and m["top_k"] == 5
    assert m["tools"] == [{"name": "plan", "description": "Give the answer in this shape.", "input_schema": {"type": "object"}}]
    assert m["tool_choice"] == {"type": "tool", "name": "plan"} and "response_format" not in m
    wire = AnthropicWire(cache=False, max_tokens=None)  # the table's root, or one as the SDK's ANTHROPIC_BASE_URL
    assert wire.url("https://api.anthropic.com/v1") == wire.url("https://api.anthropic.com/") == \
        "https://api.anthropic.com/v1/messages"
    plain = to_messages({"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "U"}]})
    assert plain == {"model": "m", "messages": [{"role": "user", "content": "U"}], "max_tokens": 9}


def test_documented_batch_objects_and_result_lines():
    doc = _doc("message_batch")
    assert anthropic_state(doc["in_progress"]).status == "running"
    ended = anthropic_state(doc["ended"])
    assert (ended.status, ended.total, ended.completed, ended.failed) == ("completed", 4, 1, 3)
    assert anthropic_state({**doc["ended"], "cancel_initiated_at": "2024-09-24T19:00:00Z"}).status == "cancelled"
    ok, errored, canceled, expired = (anthropic_result(x) for x in doc["results"])
    assert ok.ok and read_reply(ok.body).content.startswith("Hello again!")
    assert errored.status_code == 400 and "max_tokens" in errored.reason()  # a 4xx: never worth a resubmission
    assert canceled.status_code is None and canceled.error.code == "batch_cancelled"
    assert expired.status_code is None and expired.error.code == "batch_expired"


def test_rate_limit_headers_announce_limits_and_spent_budgets():
    a = announced({"anthropic-ratelimit-requests-limit": "4000", "anthropic-ratelimit-requests-remaining": "0",
                   "anthropic-ratelimit-requests-reset": "2026-05-28T21:20:12Z"}, now=1_780_003_200.0)
    assert a.rpm == 4000 and a.spent_for_s == pytest.approx(12.0)
    o = announced({"x-ratelimit-limit-requests": "500", "x-ratelimit-limit-tokens": "200000",
                   "x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "6m0s"})
    assert (o.rpm, o.tpm, o.spent_for_s) == (500, 200000, 360.0)
    assert announced({}) == announced({"anthropic-ratelimit-requests-limit": "garbage"})


# -- the engine against the simulator's Messages route, in this process -----------------------------------------
def anthropic_profile(sim, **kw):
    p = load_profile("anthropic/claude-sonnet-4-5", base_url=sim.base_url, require_key=False)
    return revised(p, backoff_base_s=0.01, backoff_max_s=0.05, **kw)


def recording(sim: F.LocalSim, seen: list[Request]) -> MockTransport:
    async def handler(req: Request) -> Response:
        seen.append(req)
        return await sim.answer(req)
    return MockTransport(handler)


async def test_engine_speaks_the_messages_api_and_counts_cache_tokens(clock):
    sim, seen = F.LocalSim(), []
    async with LLMEngine(anthropic_profile(sim), transport=recording(sim, seen), api_key="sk-ant-0123456789") as e:
        first = await e.chat(prompts.discovery_messages("find the weather in Paris"), run=0, prompt_version="d")
        second = await e.chat(prompts.discovery_messages("book a flight to Rome"), run=0, prompt_version="d")
    req = seen[0]
    assert req.url.endswith("/v1/messages") and req.headers["x-api-key"] == "sk-ant-0123456789"
    assert req.headers["anthropic-version"] == "2023-06-01" and "Authorization" not in req.headers
    body = orjson.loads(req.body)
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"} and body["max_tokens"] == 2048
    assert "seed" not in body and all(m["role"] != "system" for m in body["messages"])
    assert first.content and second.content and first.error is None
    # the marked system prompt: written into the cache by the first call, read from it by the second
    assert first.cache_write_tokens > 0 and first.cached_tokens == 0
    assert second.cached_tokens == first.cache_write_tokens and second.cache_write_tokens == 0
    assert e.stats.cached_prompt_tokens == second.cached_tokens and e.stats.cache_write_tokens == first.cache_write_tokens


async def test_overloaded_529_is_retried_and_a_refusal_is_a_failed_call_sent_once(clock):
    sim = F.LocalSim(script=["503", "503"])  # the simulator's overloaded fault is Anthropic's 529
    async with sim.engine(anthropic_profile(sim), api_key="k") as e:
        ok = await e.chat(prompts.discovery_messages("find the weather"), run=0, prompt_version="d")
        assert ok.error is None and e.stats.retries == 2 and sim.stats()["by_status"]["503"] == 2
        sim.configure(script=["filter"])  # answered as stop_reason refusal
        before = sim.stats()["requests"]
        refused = await e.chat(prompts.discovery_messages("something else"), run=0, prompt_version="d")
    assert refused.error_kind == REFUSAL and sim.stats()["requests"] == before + 1
    assert e.stats.failed == {REFUSAL: 1}


async def test_structured_output_is_a_forced_tool_and_its_input_is_the_answer():
    sim, seen = F.LocalSim(), []
    p = anthropic_profile(sim, structured="json_schema")
    async with LLMEngine(p, transport=recording(sim, seen), api_key="k") as e:
        r = await e.chat(prompts.planner_messages("find the weather", [("Weather/forecast", "the forecast")]),
                         run=0, prompt_version="p", schema=prompts.PLANNER_SCHEMA)
    body = orjson.loads(seen[0].body)
    assert body["tool_choice"] == {"type": "tool", "name": "planner_plan"}
    assert body["tools"][0]["input_schema"] == prompts.PLANNER_SCHEMA["schema"]
    assert set(orjson.loads(r.content)) == {"steps", "selected_apis"} and r.finish_reason == "tool_calls"


async def test_engine_paces_to_the_rpm_the_headers_announce():
    sim = F.LocalSim(rpm=6000, burst_s=60)  # the simulator announces anthropic-ratelimit-requests-limit: 6000
    p = anthropic_profile(sim)
    assert p.pacing.rpm == 50 and p.pacing.follow_rate_headers
    async with sim.engine(p, api_key="k") as e:
        await e.chat(prompts.discovery_messages("find the weather"), run=0, prompt_version="d")
        assert e._pacing._pacer.rpm == 6000  # up from the provider's conservative default
    fixed = revised(p, follow_rate_headers=False)  # --rpm given: kept whatever the headers say
    async with sim.engine(fixed, api_key="k") as e:
        await e.chat(prompts.discovery_messages("find the rain"), run=0, prompt_version="d")
        assert e._pacing._pacer.rpm == 50


async def test_reasoning_models_take_max_completion_tokens_and_no_temperature():
    sim, seen = F.LocalSim(), []
    p = load_profile("openai/gpt-5-mini", base_url=sim.base_url, require_key=False)
    assert p.sampling.reasoning_params and p.sampling.temperature == 1.0 and p.sampling.max_tokens == 8192
    async with LLMEngine(p, transport=recording(sim, seen), api_key="k") as e:
        r = await e.chat(prompts.discovery_messages("find the weather"), run=1, prompt_version="d")
    body = orjson.loads(seen[0].body)
    assert body["max_completion_tokens"] == 8192 and "max_tokens" not in body and "temperature" not in body
    assert r.content and r.error is None
    normal = load_profile("openai/gpt-4o-mini", base_url=sim.base_url, require_key=False)
    assert not normal.sampling.reasoning_params and normal.sampling.temperature == 0.0
