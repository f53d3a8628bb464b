"""The engine's transport seam (llm/transport.py), in this process: `MockTransport` runs a handler function in
place of the network (the aiohttp transport on a real socket: tests/integration/test_llm_transport.py)."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from helpers import llm as F

from evaluator.llm import LLMEngine
from evaluator.llm.transport import MockTransport, NoReply, Request, Response


def _chat_body(text: str) -> bytes:
    return orjson.dumps({"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 5, "completion_tokens": 2}})


# -- MockTransport: a handler function, no socket -----------------------------------------------------------
async def test_a_handler_sees_the_request_the_engine_prepared(tmp_path):
    seen: list[Request] = []

    def handler(request: Request) -> Response:  # a plain function will do
        seen.append(request)
        return Response(200, _chat_body("hello"), {"content-type": "application/json"})

    prof = F.sim_profile(F.LocalSim(), temperature=0.5)
    async with LLMEngine(prof, transport=MockTransport(handler), api_key=F.FAKE_KEY, cache_root=tmp_path) as llm:
        r = await llm.chat(F.msgs(1), run=3, prompt_version="v1")
        again = await llm.chat(F.msgs(1), run=3, prompt_version="v1")
    assert (r.content, r.prompt_tokens, r.completion_tokens, r.cached) == ("hello", 5, 2, False)
    assert again.cached and again.content == "hello" and len(seen) == 1  # the second came from the cache
    req = seen[0]
    assert (req.method, req.url) == ("POST", prof.connection.base_url + "/chat/completions")
    assert req.headers["Authorization"] == f"Bearer {F.FAKE_KEY}" and req.timeout_s == prof.connection.timeout_s
    body = orjson.loads(req.body)
    assert body["messages"] == F.msgs(1) and body["seed"] == 3 and body["temperature"] == 0.5
    assert F.FAKE_KEY not in repr(req)  # headers are left out of the request's repr


async def test_a_deterministic_server_is_asked_once_for_every_run(tmp_path):
    # at temperature 0 a local llama.cpp server gives run 3 what it gave run 0: one call, not four copies
    seen: list[Request] = []

    def handler(request: Request) -> Response:
        seen.append(request)
        return Response(200, _chat_body("same"), {"content-type": "application/json"})

    prof = F.sim_profile(F.LocalSim(), temperature=0.0, deterministic=True)
    async with LLMEngine(prof, transport=MockTransport(handler), api_key=F.FAKE_KEY, cache_root=tmp_path) as llm:
        got = await asyncio.gather(*(llm.chat(F.msgs(1), run=r, prompt_version="v1") for r in range(4)))
    assert [g.content for g in got] == ["same"] * 4 and len(seen) == 1
    assert orjson.loads(seen[0].body)["seed"] == 0
    sampled = F.sim_profile(F.LocalSim(), temperature=0.7, deterministic=True)  # each run its own sample
    seen.clear()
    async with LLMEngine(sampled, transport=MockTransport(handler), api_key=F.FAKE_KEY, cache_root=tmp_path) as llm:
        await asyncio.gather(*(llm.chat(F.msgs(1), run=r, prompt_version="v1") for r in range(4)))
    assert sorted(orjson.loads(r.body)["seed"] for r in seen) == [0, 1, 2, 3]


async def test_an_async_handler_and_case_insensitive_headers():
    async def handler(request: Request) -> Response:
        await asyncio.sleep(0)
        return Response(429, b"{}", {"Retry-After": "1"})

    got = await MockTransport(handler).send(Request("POST", "http://x.invalid/v1/chat/completions"))
    assert got.status == 429 and got.headers.get("retry-after") == "1" and got.headers["RETRY-AFTER"] == "1"


async def test_a_slow_handler_is_a_timeout_and_a_raised_no_reply_passes_through(clock):
    async def slow(request: Request) -> Response:
        await asyncio.sleep(5)
        return Response(200)

    def cut(request: Request) -> Response:
        raise NoReply("connection", "ServerDisconnectedError")

    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(NoReply) as e:
        await MockTransport(slow).send(Request("GET", "http://x.invalid/", timeout_s=0.05))
    assert e.value.error.kind == "timeout" and loop.time() - t0 == pytest.approx(0.05)  # not the handler's 5 s
    with pytest.raises(NoReply) as e:
        await MockTransport(cut).send(Request("GET", "http://x.invalid/"))
    assert (e.value.error.kind, e.value.error.detail) == ("connection", "ServerDisconnectedError")
    t = MockTransport(cut)
    await t.aclose()
    with pytest.raises(RuntimeError):
        await t.send(Request("GET", "http://x.invalid/"))


async def test_the_engine_leaves_a_transport_it_was_given_open():
    sim = F.LocalSim()
    t = MockTransport(sim.answer)
    for i in range(2):  # one transport, two engines in turn (a resume in one test)
        async with LLMEngine(F.sim_profile(sim), transport=t) as llm:
            assert (await llm.chat(F.msgs(i), run=0, prompt_version="v1")).error is None
    assert not t.closed and sim.stats()["by_status"] == {"200": 2}
