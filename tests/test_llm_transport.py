"""The engine's transport seam (llm/transport.py): the in-process `MockTransport`, the aiohttp transport on a
real socket, and the in-process simulator answering as the simulator's server does, request for request."""

from __future__ import annotations

import asyncio
import socket

import llm_fixtures as F
import orjson
import pytest

from evaluator.llm import LLMEngine
from evaluator.llm.transport import AiohttpTransport, MockTransport, NoReply, Request, Response
from simulator import behaviour

sim_server = F.sim_server  # pytest finds fixtures by module attribute


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


async def test_a_slow_handler_is_a_timeout_and_a_raised_no_reply_passes_through():
    async def slow(request: Request) -> Response:
        await asyncio.sleep(5)
        return Response(200)

    def cut(request: Request) -> Response:
        raise NoReply("connection", "ServerDisconnectedError")

    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(NoReply) as e:
        await MockTransport(slow).send(Request("GET", "http://x.invalid/", timeout_s=0.05))
    assert e.value.error.kind == "timeout" and loop.time() - t0 < 1.0
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


# -- AiohttpTransport: the real socket ------------------------------------------------------------------------
async def test_the_aiohttp_transport_against_the_simulators_server(sim_server):
    sim_server.configure(reset=True, script=["drop", "hang"], hang_s=3.0)
    sim_server.reset_stats()
    url = sim_server.base_url + "/chat/completions"
    body = orjson.dumps({"model": "sim-1", "messages": F.msgs(1), "seed": 0})
    t = AiohttpTransport(limit=4, trust_env=False)
    try:
        with pytest.raises(NoReply) as cut:
            await t.send(Request("POST", url, body, {"Content-Type": "application/json"}))
        with pytest.raises(NoReply) as late:
            await t.send(Request("POST", url, body, {"Content-Type": "application/json"}, timeout_s=0.2))
        ok = await t.send(Request("POST", url, body, {"Content-Type": "application/json"}))
        models = await t.send(Request("GET", sim_server.base_url + "/models"))
    finally:
        await t.aclose()
    assert cut.value.error.kind == "connection" and late.value.error.kind == "timeout"
    assert ok.status == 200 and ok.headers["content-type"].startswith("application/json")
    assert orjson.loads(ok.body)["choices"][0]["message"]["content"] == behaviour.answer(F.msgs(1), seed=0,
                                                                                          temperature=0.0)
    assert models.status == 200 and orjson.loads(models.body)["data"][0]["id"] == "sim-1"


async def test_the_aiohttp_transport_on_a_port_nobody_listens_on():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    t = AiohttpTransport(limit=1, trust_env=False)
    try:
        with pytest.raises(NoReply) as e:
            await t.send(Request("GET", f"http://127.0.0.1:{port}/v1/models"))
    finally:
        await t.aclose()
    assert e.value.error.kind == "connect"


# -- the in-process simulator answers as its server does ---------------------------------------------------
KNOBS = [  # one per answer family: (knobs, method, path, request body)
    ({}, "POST", "/v1/chat/completions", {"model": "sim-1", "messages": F.msgs(2), "seed": 1, "max_tokens": 50}),
    ({"script": ["500"], "list_errors": True}, "POST", "/v1/chat/completions", {"messages": F.msgs(2)}),
    ({"script": ["429"], "retry_headers": "all", "rpm": 60}, "POST", "/v1/chat/completions", {"messages": F.msgs(2)}),
    ({"script": ["429"], "rate_style": "gemini", "rpm": 60}, "POST", "/v1/chat/completions", {"messages": F.msgs(2)}),
    ({"script": ["quota"]}, "POST", "/v1/chat/completions", {"messages": F.msgs(2)}),
    ({"script": ["null"], "null_finish": "length"}, "POST", "/v1/chat/completions", {"messages": F.msgs(2)}),
    ({"content_form": "parts", "usage": False}, "POST", "/v1/chat/completions", {"messages": F.msgs(2)}),
    ({"script": ["malformed"]}, "POST", "/v1/chat/completions", {"messages": F.msgs(2)}),
    ({"script": ["length"]}, "POST", "/v1/chat/completions", {"messages": F.msgs(2), "max_tokens": 8}),
    ({"api_key": "sk-right-0000000000000000"}, "POST", "/v1/chat/completions", {"messages": F.msgs(2)}),
    ({"reject_seed": True, "reject_status": 422}, "POST", "/v1/chat/completions", {"messages": F.msgs(2), "seed": 0}),
    ({"n_ctx": 20}, "POST", "/v1/chat/completions", {"messages": F.msgs(2, "x" * 400)}),
    ({"slots": 3, "n_ctx": 2048}, "GET", "/props", None),
    ({"slots": 2}, "GET", "/slots", None),
    ({}, "GET", "/props", None),
    ({}, "GET", "/v1/models", None),
    ({}, "GET", "/nowhere", None),
]


def _comparable(status: int, headers, body: bytes) -> tuple:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = body  # the malformed reply, byte for byte
    if isinstance(doc, dict):
        doc.pop("created", None)  # the clock
        doc.pop("id", None)  # numbered by the server's request count
    kept = {k.lower(): v for k, v in headers.items() if k.lower().startswith(("retry", "x-ratelimit", "content-type"))}
    return status, kept, doc


@pytest.mark.parametrize(("knobs", "method", "path", "body"), KNOBS, ids=[
    "ok", "500-list", "429-headers", "429-gemini", "daily-quota", "reasoning-only", "parts-no-usage", "malformed", "length", "401", "422-field", "context", "props",
    "slots", "no-props", "models", "404"])
async def test_the_in_process_simulator_answers_as_its_server(sim_server, knobs, method, path, body):
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-wrong-key"}
    raw = orjson.dumps(body) if body is not None else b""
    local = F.LocalSim(**knobs)
    sim_server.configure(reset=True, **knobs)
    sim_server.reset_stats()
    t = AiohttpTransport(limit=1, trust_env=False)
    try:
        real = await t.send(Request(method, sim_server.root + path, raw, headers))
    finally:
        await t.aclose()
    fake = await MockTransport(local.answer).send(Request(method, local.base_url.removesuffix("/v1") + path, raw, headers))
    assert _comparable(fake.status, fake.headers, fake.body) == _comparable(real.status, real.headers, real.body)
    assert local.stats()["by_status"] == sim_server.stats()["by_status"]
