"""anthropic-python drives the simulator's Messages API and Message Batches routes; every body is validated
against the SDK's own types (`Message`, `MessageBatch`, `MessageBatchIndividualResponse`) with pydantic
validation, and its errors are the SDK's error classes for Anthropic's statuses (429, 529, 401, 400). The
project's own batch client and the SDK read each other's batches."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest
from helpers.sdk import chat_body

anthropic = pytest.importorskip("anthropic")
from anthropic.types import Message  # noqa: E402
from anthropic.types.messages import MessageBatch, MessageBatchIndividualResponse  # noqa: E402

from evaluator.batch.providers import AnthropicBatch, anthropic_result  # noqa: E402
from evaluator.batch.request_format import Request  # noqa: E402
from evaluator.llm import load_profile  # noqa: E402
from evaluator.llm.reply import read_reply  # noqa: E402
from simulator.harness import batch_stats, configure_batch  # noqa: E402

MODEL = "claude-sonnet-4-5"
SYSTEM = [{"type": "text", "text": "You are the planning step of an LLM agent.", "cache_control": {"type": "ephemeral"}}]


def client(sim, key: str = "x") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=sim.root, api_key=key, max_retries=0)


def params(i: int) -> dict:
    return {"model": MODEL, "max_tokens": 256, "system": SYSTEM,
            "messages": [{"role": "user", "content": f"User request:\nfind the weather in city #{i}"}]}


def create(c, i: int) -> Message:
    raw = c.messages.with_raw_response.create(**params(i))
    return Message.model_validate(orjson.loads(raw.read()))  # strict: a stop_reason outside the SDK's Literal fails


def test_messages_create_parses_as_the_sdk_type_and_reports_cache_tokens(sim):
    c = client(sim)
    first, second = create(c, 1), create(c, 2)
    assert first.content[0].type == "text" and first.content[0].text and first.stop_reason == "end_turn"
    assert first.role == "assistant" and first.usage.output_tokens > 0
    # the system prompt marked cache_control: written by the first request (or an earlier test's), read by the second
    assert second.usage.cache_read_input_tokens and second.usage.cache_read_input_tokens > 0
    assert second.usage.cache_creation_input_tokens == 0
    sdk = c.messages.create(**params(3))  # the SDK's own parsing
    assert isinstance(sdk, Message) and sdk.content[0].text


def test_a_forced_tool_answers_with_a_tool_use_block(sim):
    tool = {"name": "planner_plan", "description": "the plan",
            "input_schema": {"type": "object", "properties": {"steps": {"type": "array", "items": {"type": "string"}},
                                                               "selected_apis": {"type": "array", "items": {"type": "string"}}},
                             "required": ["steps", "selected_apis"]}}
    msg = client(sim).messages.create(
        model=MODEL, max_tokens=512, tools=[tool], tool_choice={"type": "tool", "name": "planner_plan"},
        system="You are the planning step of an LLM agent.",
        messages=[{"role": "user", "content": "User request:\nfind the weather\n\nAvailable APIs:\n- Weather/forecast: x"}])
    assert msg.stop_reason == "tool_use" and msg.content[0].type == "tool_use"
    assert set(msg.content[0].input) == {"steps", "selected_apis"}


def test_errors_are_the_sdk_classes_of_anthropics_statuses(sim):
    c = client(sim)
    sim.configure(script=["429"])
    with pytest.raises(anthropic.RateLimitError) as e429:
        c.messages.create(**params(4))
    assert e429.value.status_code == 429 and e429.value.body["error"]["type"] == "rate_limit_error"
    assert float(e429.value.response.headers["retry-after"]) > 0
    sim.configure(script=["503"])
    with pytest.raises(anthropic.APIStatusError) as e529:
        c.messages.create(**params(5))
    assert e529.value.status_code == 529 and e529.value.body["error"]["type"] == "overloaded_error"
    assert isinstance(e529.value, anthropic.InternalServerError)  # the SDK's class for every 5xx
    sim.configure(script=[])
    with pytest.raises(anthropic.BadRequestError) as e400:
        c.messages.create(model=MODEL, max_tokens=0, messages=[{"role": "user", "content": "hi"}])
    assert e400.value.body["error"]["type"] == "invalid_request_error"
    sim.configure(api_key="sk-ant-real-0123456789")
    try:
        with pytest.raises(anthropic.AuthenticationError) as e401:
            client(sim, "sk-ant-wrong-0123456789").messages.create(**params(6))
        assert e401.value.body["error"]["type"] == "authentication_error"
        assert client(sim, "sk-ant-real-0123456789").messages.create(**params(6)).content
    finally:
        sim.configure(reset=True)


def until_ended(c, batch_id: str, timeout_s: float = 300.0) -> MessageBatch:
    deadline = time.monotonic() + timeout_s
    while True:
        raw = c.messages.batches.with_raw_response.retrieve(batch_id)
        b = MessageBatch.model_validate(orjson.loads(raw.read()))
        if b.processing_status == "ended":
            return b
        assert time.monotonic() < deadline, f"batch stuck in {b.processing_status}"
        time.sleep(0.05)


def test_message_batch_round_trip(sim):
    configure_batch(sim.base_url, p_fail=0.25, fail_kind="server", seed=4)
    c = client(sim)
    b = c.messages.batches.create(requests=[{"custom_id": f"req-{i}", "params": params(i)} for i in range(8)])
    assert isinstance(b, MessageBatch) and b.processing_status == "in_progress" and b.request_counts.processing == 8
    assert b.results_url is None and b.id in [x.id for x in c.messages.batches.list(limit=20)]
    done = until_ended(c, b.id)
    n = done.request_counts
    assert n.succeeded + n.errored == 8 and n.errored > 0 and done.results_url and done.ended_at
    results = list(c.messages.batches.results(b.id))
    assert sorted(r.custom_id for r in results) == [f"req-{i}" for i in range(8)]
    for r in results:
        MessageBatchIndividualResponse.model_validate(r.model_dump())
        assert r.result.type in ("succeeded", "errored")
        if r.result.type == "succeeded":
            assert r.result.message.content[0].text
        else:
            assert r.result.error.error.type == "api_error"
    assert sum(r.result.type == "errored" for r in results) == n.errored


def test_cancel_and_the_canceled_results(sim):
    configure_batch(sim.base_url, stuck_next=1)
    c = client(sim)
    b = c.messages.batches.create(requests=[{"custom_id": f"c-{i}", "params": params(i)} for i in range(3)])
    cancelling = c.messages.batches.cancel(b.id)
    assert cancelling.processing_status == "canceling" and cancelling.cancel_initiated_at is not None
    done = until_ended(c, b.id)
    assert done.request_counts.canceled == 3
    assert {r.result.type for r in c.messages.batches.results(b.id)} == {"canceled"}
    with pytest.raises(anthropic.BadRequestError):  # custom ids must match ^[a-zA-Z0-9_-]{1,64}$
        c.messages.batches.create(requests=[{"custom_id": "not ok!", "params": params(0)}])


def test_the_project_client_and_the_sdk_read_each_others_batches(sim):
    p = load_profile("anthropic/claude-sonnet-4-5", base_url=sim.base_url, require_key=False)

    async def ours(batch_id: str | None) -> tuple[str, list]:
        api = AnthropicBatch(p, "x")
        try:
            if batch_id is None:
                return await api.submit([Request(f"key-{i}", chat_body(i, MODEL)) for i in range(4)], "t"), []
            while not (await api.state(batch_id)).done:
                await asyncio.sleep(0.05)
            return batch_id, await api.results(batch_id)
        finally:
            await api.close()

    batch_id, _ = asyncio.run(ours(None))  # submitted by the project's client, read by the SDK
    c = client(sim)
    until_ended(c, batch_id)
    sdk_read = {r.custom_id: r.result.message.content[0].text for r in c.messages.batches.results(batch_id)}
    assert sorted(sdk_read) == [f"key-{i}" for i in range(4)] and all(sdk_read.values())
    sdk_batch = c.messages.batches.create(requests=[{"custom_id": f"s-{i}", "params": params(i)} for i in range(3)])
    _, results = asyncio.run(ours(sdk_batch.id))  # submitted by the SDK, read by the project's client
    assert sorted(r.custom_id for r in results) == ["s-0", "s-1", "s-2"]
    assert all(r.ok and read_reply(r.body).content for r in results)
    assert batch_stats(sim.base_url)["repeated_ok"] == 0
    assert anthropic_result({"custom_id": "x", "result": {"type": "expired"}}).status_code is None
