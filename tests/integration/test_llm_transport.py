"""The engine's aiohttp transport on a real socket (the simulator's server, a port nobody listens on), and the
in-process simulator answering as the simulator's server does, request for request."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import orjson
import pytest
from helpers import llm as F

from evaluator.core.errors import FatalLLMError
from evaluator.llm import LLMEngine
from evaluator.llm.transport import AiohttpTransport, MockTransport, NoReply, Request
from simulator import behaviour


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


async def test_unreachable_endpoint_is_fatal_after_retries(tmp_path):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    prof = F.sim_profile(SimpleNamespace(base_url=f"http://127.0.0.1:{port}/v1"), max_retries=1)
    async with LLMEngine(prof, cache_root=tmp_path) as llm:  # the aiohttp transport: a refused connection
        with pytest.raises(FatalLLMError, match="does not answer"):
            await llm.chat(F.msgs(0), run=0, prompt_version="v1")
    assert llm.stats.requests == 2
