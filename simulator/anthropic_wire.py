"""Anthropic's wire on the simulator: the Messages API (`POST /v1/messages`) and the Message Batches routes.

The simulator's second reading of Anthropic's protocol (the evaluator's own is evaluator/llm/dialects.py; the
official `anthropic` SDK checks both in tests/integration/conformance/). A Messages request is answered by the OpenAI
chat route itself (the same replies, faults, rate limits and workers): its body is read as the chat body it
stands for (`to_chat`: `system` apart, content blocks joined, a forced tool's `input_schema` as the JSON
schema asked for), and the answer written back in Anthropic's shapes (`to_message`): content blocks (a
`tool_use` block carrying the JSON when a tool was forced), `stop_reason` (end_turn, max_tokens, refusal for
the content filter), usage with `cache_creation_input_tokens` / `cache_read_input_tokens` for a system prompt
marked `cache_control`, and errors as `{"type": "error", "error": {"type", "message"}}` with Anthropic's
statuses: 529 `overloaded_error` for the overloaded fault, 429 `rate_limit_error` with `retry-after`.
With `rpm` set, every answer carries `anthropic-ratelimit-requests-limit / -remaining / -reset`.

Requests need the key (when the simulator has one: `x-api-key`, or `Authorization: Bearer`) and `anthropic-version`, `model`, `max_tokens` and
`messages`, as the API does. The batch routes live in simulator/batch.py (`BatchSim`, style "anthropic").
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

import orjson
from aiohttp import web

if TYPE_CHECKING:
    from simulator.batch import BatchSim
    from simulator.server import Simulator

# Anthropic's error type for each status the chat route answers (docs.anthropic.com/en/api/errors).
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
               500: "api_error", 504: "timeout_error", 529: "overloaded_error"}
_STOP = {"stop": "end_turn", "length": "max_tokens", "content_filter": "refusal", "tool_calls": "tool_use"}
CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    """Anthropic's error body for `status` (503, the simulator's overloaded fault, is Anthropic's 529)."""
    status = 529 if status == 503 else status
    body = {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message},
            "request_id": f"req_sim{int(time.monotonic() * 1e6)}"}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json", headers=headers)


def authorized(request: web.Request, key: str | None) -> bool:
    """The key in `x-api-key` (the documented header) or as a bearer token (what anthropic-python 2.x sends)."""
    return not key or request.headers.get("x-api-key") == key or request.headers.get("Authorization") == f"Bearer {key}"


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(b.get("text") or "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return content if isinstance(content, str) else ""


def check(req: Any) -> str | None:
    """Why a Messages body is not one the API takes, or None."""
    if not isinstance(req, dict):
        return "the request body must be a JSON object"
    if not isinstance(req.get("model"), str):
        return "model: Field required"
    mt = req.get("max_tokens")
    if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
        return "max_tokens: Field required (an integer >= 1)"
    msgs = req.get("messages")
    if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
        return "messages: at least one message is required"
    if msgs[0].get("role") != "user":
        return "messages: first message must use the \"user\" role"
    return None


def to_chat(req: dict[str, Any]) -> tuple[dict[str, Any], str, str | None]:
    """(the chat body a Messages body stands for, how the prompt cache sees it, the forced tool's name or None)."""
    system = req.get("system")
    blocks = [{"type": "text", "text": system}] if isinstance(system, str) else (system or [])
    marked = any(isinstance(b, dict) and b.get("cache_control") for b in blocks)
    messages: list[dict[str, Any]] = []
    if blocks:
        messages.append({"role": "system", "content": _text(blocks)})
    messages += [{"role": m.get("role"), "content": _text(m.get("content"))} for m in req["messages"]]
    chat: dict[str, Any] = {"model": req["model"], "messages": messages, "max_tokens": req["max_tokens"]}
    if "temperature" in req:
        chat["temperature"] = req["temperature"]
    tool = None
    choice = req.get("tool_choice") or {}
    if choice.get("type") == "tool":
        tool = str(choice.get("name"))
        spec: dict[str, Any] = next((t for t in req.get("tools") or [] if t.get("name") == tool), {})
        chat["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": tool, "schema": spec.get("input_schema") or {}}}
    return chat, ("marked" if marked else "unmarked"), tool


def to_message(completion: dict[str, Any], tool: str | None) -> dict[str, Any]:
    """A chat.completion of the simulator as Anthropic's Message."""
    choice = completion["choices"][0]
    text = choice["message"].get("content") or choice["message"].get("reasoning_content") or ""
    if not isinstance(text, str):
        text = str(text)
    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    if tool is not None:
        with contextlib.suppress(orjson.JSONDecodeError):  # not JSON: the model wrote text instead of the tool call
            content = [{"type": "tool_use", "id": "toolu_sim", "name": tool, "input": orjson.loads(text)}]
    finish = choice.get("finish_reason") or "stop"
    stop = _STOP.get(finish, "end_turn")
    if stop == "tool_use" or (stop == "end_turn" and content[0]["type"] == "tool_use"):
        stop = "tool_use"
    msg: dict[str, Any] = {"id": f"msg_{completion.get('id', 'sim')}", "type": "message", "role": "assistant",
                           "model": completion.get("model", ""), "content": content, "stop_reason": stop,
                           "stop_sequence": None}
    u = completion.get("usage")
    if u is not None:
        details = u.get("prompt_tokens_details") or {}
        read, write = int(details.get("cached_tokens") or 0), int(details.get("cache_write_tokens") or 0)
        msg["usage"] = {"input_tokens": u["prompt_tokens"] - read - write, "output_tokens": u["completion_tokens"],
                        "cache_creation_input_tokens": write, "cache_read_input_tokens": read}
    else:  # the `usage` knob off: the API always reports usage, zeros are the nearest this server can say
        msg["usage"] = {"input_tokens": 0, "output_tokens": 0}
    return msg


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Inner:
    """The chat route's view of a Messages request: the chat body, the caller's key as a bearer token, and
    the real connection (its `drop` fault cuts it)."""

    def __init__(self, outer: web.Request, body: bytes, auth: str | None) -> None:
        self.headers = {"Authorization": auth} if auth else {}
        self.transport = outer.transport
        self._body = body

    async def read(self) -> bytes:
        return self._body


class MessagesRoutes:
    def __init__(self, sim: Simulator, batches: BatchSim) -> None:
        self.sim = sim
        self.batches = batches

    def authorized(self, request: web.Request) -> bool:
        return authorized(request, self.sim.cfg.api_key)

    def _rate_headers(self) -> dict[str, str]:
        bucket, rpm = self.sim.req_bucket, self.sim.cfg.rpm
        if bucket is None or not rpm:
            return {}
        left = max(0, math.floor(bucket.tokens))
        full_in = (bucket.capacity - bucket.tokens) / bucket.rate if bucket.rate else 0.0
        return {"anthropic-ratelimit-requests-limit": str(int(rpm)),
                "anthropic-ratelimit-requests-remaining": str(left),
                "anthropic-ratelimit-requests-reset": _iso(time.time() + max(0.0, full_in))}

    async def messages(self, request: web.Request) -> web.StreamResponse:
        if not self.authorized(request):
            return error(401, "invalid x-api-key")
        if not request.headers.get("anthropic-version"):
            return error(400, "anthropic-version: header is required")
        try:
            req = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return error(400, "the request body is not valid JSON")
        why = check(req)
        if why is not None:
            return error(400, why)
        chat, cache, tool = to_chat(req)
        key = self.sim.cfg.api_key
        inner = _Inner(request, orjson.dumps(chat), f"Bearer {key}" if key else None)
        resp = await self.sim.chat(cast(web.Request, inner), cache=cache)  # what the chat route reads of one
        assert isinstance(resp, web.Response)
        headers = self._rate_headers()
        if resp.status != 200:
            raw = resp.body if isinstance(resp.body, bytes) else b""
            retry = resp.headers.get("Retry-After")
            if resp.status == 429 and not retry:  # the Gemini dialect's wait is in its body: Anthropic sends a header
                retry = "1"
            if retry:
                headers["retry-after"] = retry
            err = orjson.loads(raw) if raw.startswith((b"{", b"[")) else {}
            err = err[0] if isinstance(err, list) and err else err
            message = str(((err or {}).get("error") or {}).get("message") or raw[:200].decode(errors="replace"))
            return error(resp.status, message, headers)
        raw = resp.body if isinstance(resp.body, bytes) else b""
        try:
            completion = orjson.loads(raw)
        except orjson.JSONDecodeError:  # the malformed fault: a body cut short, in either wire
            return web.Response(status=200, body=raw, content_type="application/json", headers=headers)
        body = to_message(completion, tool)
        return web.Response(status=200, body=orjson.dumps(body), content_type="application/json", headers=headers)


def register(app: web.Application, sim: Simulator, batches: BatchSim) -> MessagesRoutes:
    """Add `POST /v1/messages` and the Message Batches routes (their handlers in simulator/batch.py)."""
    routes = MessagesRoutes(sim, batches)
    r = app.router
    r.add_post("/v1/messages", routes.messages)
    r.add_post("/v1/messages/batches", batches.a_create)
    r.add_get("/v1/messages/batches", batches.a_list)
    r.add_get("/v1/messages/batches/{batch_id}", batches.a_get)
    r.add_post("/v1/messages/batches/{batch_id}/cancel", batches.a_cancel)
    r.add_get("/v1/messages/batches/{batch_id}/results", batches.a_results)
    return routes
