"""OpenAI-compatible chat server that misbehaves on request: the test bed for the LLM engine.

Serves `POST /v1/chat/completions`, Anthropic's `POST /v1/messages` (simulator/anthropic_wire.py: the same replies
and faults in Anthropic's wire), `GET /v1/models`, `GET /stats`, `POST /stats/reset` and
`POST /admin/config`. Answers come from `behaviour.reply` (a heuristic, not a language model).
Prompt caching: a system prompt seen before is reported as cached prompt tokens (`prompt_cache`, on by
default, from `cache_min_tokens` tokens up): automatically on the OpenAI wire
(`usage.prompt_tokens_details.cached_tokens`, as OpenAI does), and on the Anthropic wire only where the
request marks it with `cache_control` (a first sight is a cache write, later ones reads).
Faults are drawn per request from `SimConfig`'s rates with a seeded RNG, or taken in order from
`SimConfig.script` for deterministic tests. Host quirks: fields it rejects with a 400
(`reject_params`, from the `reject_after`-th reply on), the raw wait text of its 429s (`retry_value`:
"0", "-3", "soon"), and a `serial` server that answers one request at a time and keeps working on
requests whose client hung up (like a CPU llama.cpp server). Kept lean (orjson, no per-request allocations beyond the
reply) so a zero-latency config serves thousands of requests per second.
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from evaluator.core.tokens import prompt_tokens, text_tokens
from simulator import anthropic_wire, batch, behaviour

FAULTS = ("500", "503", "429", "401", "quota", "hang", "drop", "malformed", "null", "length", "filter", "empty")
CONTENT_FORMS = ("string", "parts", "tool_call", "number", "object")
RETRY_HEADER_FORMS = ("all", "seconds", "date", "ms", "reset", "none")


@dataclass
class SimConfig:
    """Simulator knobs; each is also a `python -m simulator` flag (`--latency-s 0.2`)."""

    latency: str = "fixed"  # "fixed" or "lognormal"
    latency_s: float = 0.0  # the fixed latency, or the lognormal's median
    latency_sigma: float = 0.5  # lognormal shape (sigma of log latency)
    latency_scale: float = 1.0  # multiplies every latency (benchmarks shrink time with it)
    latency_per_token_s: float = 0.0  # added per completion token: a generating server (long replies take long)
    rpm: float | None = None  # requests per minute, enforced with 429s (token bucket)
    tpm: float | None = None  # tokens per minute (prompt estimate + max_tokens), enforced with 429s
    burst_s: float = 1.0  # bucket capacity in seconds of rate: how bursty a client may be
    rate_style: str = "openai"  # 429 dialect: "openai" (headers) or "gemini" (RetryInfo in a list body)
    retry_headers: str = "all"  # openai style: all|seconds|date|ms|reset|none
    p_500: float = 0.0  # injection rates, each per request
    p_503: float = 0.0
    p_hang: float = 0.0  # no reply for hang_s (past the client's timeout)
    p_drop: float = 0.0  # connection closed without a reply
    p_malformed: float = 0.0  # 200 with a truncated JSON body
    p_null: float = 0.0  # 200 with content null and the text in reasoning_content
    p_empty: float = 0.0  # 200 with content null and no text anywhere (finish_reason stop): billed, says nothing
    p_length: float = 0.0  # 200 with finish_reason "length" (content cut short)
    null_finish: str = "stop"  # finish_reason of the null-content replies: "stop" or "length"
    hang_s: float = 120.0
    list_errors: bool = False  # 5xx error bodies as a JSON list `[{"error": ...}]` (Gemini does)
    api_key: str | None = None  # when set, requests need `Authorization: Bearer <api_key>` (else 401)
    daily_quota: int | None = None  # after this many 200s, a Gemini-style per-day 429 (fatal)
    reject_seed: bool = False  # answer 400 to requests that carry `seed` (hosts that do not implement it)
    reject_params: list[str] = field(default_factory=list)  # request fields answered with a 400 naming them
    reject_after: int = 0  # rejections (reject_seed / reject_params) start after this many 200s
    reject_json_schema: bool = False  # response_format may only be text/json_object (llama-cpp-python)
    reject_status: int = 400  # 400 (Gemini's wording), 422 (FastAPI's pydantic list) or 500 (llama-cpp-python)
    retry_value: str = ""  # when set, the raw wait every 429 announces (each header form / retryDelay)
    serial: bool = False  # one request at a time; abandoned requests are still worked on to the end
    # llama.cpp's --parallel: at most this many requests are worked on at once, the others wait (abandoned
    # ones are still worked on, as with `serial`); `GET /props` then announces it as `total_slots`.
    slots: int | None = None
    # llama.cpp's --ctx-size: a prompt longer than this is a 400 (llama.cpp's body); a reply is cut where
    # prompt + completion fill it (finish_reason length, fewer tokens than max_tokens). Announced by /props.
    n_ctx: int | None = None
    p_filter: float = 0.0  # 200 with finish_reason "content_filter" and part of the content
    content_form: str = "string"  # message.content as: string | parts (list of text parts) | tool_call
    #                               (content null, the text as a tool call's arguments) | number | object
    usage: bool = True  # False: bodies carry no `usage` (some servers leave it out)
    prompt_cache: bool = True  # a system prompt seen before is billed as cached prompt tokens (module doc)
    cache_min_tokens: int = 0  # the shortest system prompt cached (OpenAI and Anthropic: 1,024)
    # 200 replies quote the server's `api_key` in their text (every string of a JSON answer, else appended), as a
    # server echoing the request's headers would: online and batch replies alike (redaction tests)
    quote_key: bool = False
    # Reply content (behaviour.reply): stray lists in prose, runaway replies, cuts at max_tokens.
    p_stray: float = 0.0  # replies whose answer sits in prose/code holding stray lists
    p_runaway: float = 0.0  # replies that keep writing list items until a token limit ends them
    cut_at_max_tokens: bool = False  # cut content beyond max_tokens (4 chars a token), finish "length"
    seed: int = 0  # seeds fault injection and latency draws (answers are seeded by the request)
    script: list[str] = field(default_factory=list)  # faults for the next requests, in order (FAULTS)

    def validate(self) -> None:
        if self.latency not in ("fixed", "lognormal"):
            raise ValueError("latency must be 'fixed' or 'lognormal'")
        if self.rate_style not in ("openai", "gemini"):
            raise ValueError("rate_style must be 'openai' or 'gemini'")
        if self.retry_headers not in RETRY_HEADER_FORMS:
            raise ValueError(f"retry_headers must be one of {RETRY_HEADER_FORMS}")
        if self.reject_status not in (400, 422, 500):
            raise ValueError("reject_status must be 400, 422 or 500")
        if self.content_form not in CONTENT_FORMS:
            raise ValueError(f"content_form must be one of {CONTENT_FORMS}")
        if self.slots is not None and self.slots < 1:
            raise ValueError("slots must be 1 or more")
        if self.quote_key and not self.api_key:
            raise ValueError("quote_key needs api_key: the key it quotes")
        bad = [f for f in self.script if f not in FAULTS]
        if bad:
            raise ValueError(f"unknown fault(s) {bad}; known: {FAULTS}")


def config_from(base: SimConfig | None = None, **knobs: Any) -> SimConfig:
    cfg = dataclasses.replace(base or SimConfig(), **knobs)
    cfg.script = list(cfg.script)
    cfg.validate()
    return cfg


class _Bucket:
    """Token bucket refilled continuously; `take` returns 0 or the seconds until `n` are available."""

    def __init__(self, per_min: float, burst_s: float) -> None:
        self.rate = per_min / 60.0
        self.capacity = max(1.0, self.rate * burst_s)
        self.tokens = self.capacity
        self.stamp = time.monotonic()

    def take(self, n: float) -> float:
        n = min(n, self.capacity)
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= n:
            self.tokens -= n
            return 0.0
        return (n - self.tokens) / self.rate


class _Stats:
    def __init__(self, in_flight: int = 0) -> None:
        self.requests = 0
        self.by_status: dict[str, int] = {}
        self.in_flight = in_flight
        self.max_in_flight = in_flight
        self.faults: dict[str, int] = {}
        self.ok = 0
        self.ok_bodies: dict[int, int] = {}  # hash(request body) -> times answered 200
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.abandoned = 0  # requests whose client hung up before the reply (serial: worked on anyway)
        self.cached_prompt_tokens = 0  # of prompt_tokens: reported as served from the prompt cache
        self.max_waiting = 0  # serial: most requests waiting for the one worker at once

    def as_dict(self) -> dict[str, Any]:
        counts = self.ok_bodies.values()
        return {
            "requests": self.requests,
            "by_status": dict(self.by_status),
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "ok": self.ok,
            "distinct_ok": len(self.ok_bodies),
            "repeated_ok": sum(1 for c in counts if c > 1),  # bodies answered 200 more than once
            "faults": dict(self.faults),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "abandoned": self.abandoned,
            "max_waiting": self.max_waiting,
        }


def _duration(seconds: float) -> str:
    """OpenAI's x-ratelimit-reset style: "20ms", "1.5s", "6m0s"."""
    if seconds < 1:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    minutes, secs = divmod(seconds, 60)
    return f"{int(minutes)}m{secs:.3g}s" if minutes else f"{secs:.3g}s"


def _max_tokens(req: dict[str, Any]) -> int | None:
    """The completion cap a request asks for (`max_completion_tokens`: OpenAI's reasoning models)."""
    v = req.get("max_tokens", req.get("max_completion_tokens"))
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _quoting(text: str, key: str) -> str:
    """`text` with `key` quoted in it: in every string of a JSON answer (so it reaches parsed stubs, steps and
    names), else appended to the prose."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return f"{text}\n(request made with API key {key})"

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            return f"{v} [key {key}]"
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        return v

    return orjson.dumps(walk(value)).decode()


def _err_body(code: int, message: str, status: str, *, as_list: bool, details: list | None = None) -> bytes:
    err: dict[str, Any] = {"code": code, "message": message, "status": status}
    if details:
        err["details"] = details
    return orjson.dumps([{"error": err}] if as_list else {"error": err})


class Simulator:
    def __init__(self, config: SimConfig | None = None) -> None:
        self.stats = _Stats()
        self._waiting = 0
        self._workers_n = 0
        self._worker: asyncio.Semaphore | None = None
        self._prefixes: set[str] = set()  # system prompts seen: the prompt cache
        self.apply(config or SimConfig())

    def apply(self, cfg: SimConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        self._prefixes = set()  # a reconfigured server starts with an empty prompt cache
        self.rng = random.Random(cfg.seed)
        self.req_bucket = _Bucket(cfg.rpm, cfg.burst_s) if cfg.rpm else None
        self.tok_bucket = _Bucket(cfg.tpm, cfg.burst_s) if cfg.tpm else None
        self.fault_table = [
            (p, name)
            for p, name in (
                (cfg.p_500, "500"), (cfg.p_503, "503"), (cfg.p_hang, "hang"), (cfg.p_drop, "drop"),
                (cfg.p_malformed, "malformed"), (cfg.p_null, "null"), (cfg.p_empty, "empty"), (cfg.p_length, "length"),
                (cfg.p_filter, "filter"),
            )
            if p > 0
        ]
        self.auth = f"Bearer {cfg.api_key}" if cfg.api_key else None
        n = cfg.slots or (1 if cfg.serial else 0)
        if n != self._workers_n:  # the workers of a `serial` / `slots` server
            self._workers_n = n
            self._worker = asyncio.Semaphore(n) if n else None
        self.rejected = set(cfg.reject_params) | ({"seed"} if cfg.reject_seed else set())

    def app(self) -> web.Application:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/stats", self.get_stats)
        app.router.add_post("/stats/reset", self.reset_stats)
        app.router.add_post("/admin/config", self.admin_config)
        app.router.add_get("/props", self.props)
        app.router.add_get("/slots", self.slots)
        # -- more routes register here (one line each, their handlers in their own modules) --
        batches = batch.register(app, self)  # provider Batch APIs (simulator/batch.py)
        anthropic_wire.register(app, self, batches)  # Anthropic's Messages API and Message Batches (simulator/anthropic_wire.py)
        return app

    # -- admin -----------------------------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        body = {"object": "list", "data": [{"id": "sim-1", "object": "model", "owned_by": "evaluator-sim"}]}
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    def _llama(self) -> bool:
        """Announce slots and context as llama.cpp's server does (only when a knob says what they are)."""
        return self.cfg.slots is not None or self.cfg.n_ctx is not None

    async def props(self, request: web.Request) -> web.Response:
        if not self._llama():
            return self._json(404, _err_body(404, "File Not Found", "NOT_FOUND", as_list=False))
        body = {"default_generation_settings": {"n_ctx": self.cfg.n_ctx or 4096, "params": {"n_predict": -1}},
                "total_slots": self._workers_n or 1, "model_alias": "sim-1"}
        return self._json(200, orjson.dumps(body))

    async def slots(self, request: web.Request) -> web.Response:
        if not self._llama():
            return self._json(404, _err_body(404, "File Not Found", "NOT_FOUND", as_list=False))
        n = self._workers_n or 1
        return self._json(200, orjson.dumps([{"id": i, "n_ctx": self.cfg.n_ctx or 4096, "is_processing": False}
                                             for i in range(n)]))

    async def get_stats(self, request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(self.stats.as_dict()), content_type="application/json")

    async def reset_stats(self, request: web.Request) -> web.Response:
        self.stats = _Stats(in_flight=self.stats.in_flight)
        return web.Response(body=orjson.dumps(self.stats.as_dict()), content_type="application/json")

    async def admin_config(self, request: web.Request) -> web.Response:
        knobs = orjson.loads(await request.read() or b"{}")
        base = SimConfig() if knobs.pop("reset", False) else self.cfg
        try:
            self.apply(config_from(base, **knobs))
        except (TypeError, ValueError) as e:
            return web.Response(status=400, body=orjson.dumps({"error": str(e)}), content_type="application/json")
        return web.Response(body=orjson.dumps(dataclasses.asdict(self.cfg)), content_type="application/json")

    # -- chat --------------------------------------------------------------------------------------
    async def chat(self, request: web.Request, cache: str = "auto") -> web.StreamResponse:
        """`POST /v1/chat/completions`; `cache` says how the prompt cache sees the request (`prefix_cache`)."""
        st = self.stats
        st.requests += 1
        st.in_flight += 1
        if st.in_flight > st.max_in_flight:
            st.max_in_flight = st.in_flight
        try:
            resp = await self._chat(request, cache)
        except ConnectionResetError:
            st.by_status["drop"] = st.by_status.get("drop", 0) + 1
            raise
        finally:
            st.in_flight -= 1
        key = str(resp.status)
        st.by_status[key] = st.by_status.get(key, 0) + 1
        return resp

    def _fault(self, name: str) -> None:
        self.stats.faults[name] = self.stats.faults.get(name, 0) + 1

    def _json(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> web.Response:
        return web.Response(status=status, body=body, content_type="application/json", headers=headers)

    async def _chat(self, request: web.Request, cache: str) -> web.StreamResponse:
        cfg = self.cfg
        if self.auth is not None and request.headers.get("Authorization") != self.auth:
            got = request.headers.get("Authorization", "")
            # Real providers echo (part of) the key; echo all of it so tests prove the client redacts.
            msg = f"Incorrect API key provided: {got.removeprefix('Bearer ')!r}."
            return self._json(401, _err_body(401, msg, "UNAUTHENTICATED", as_list=cfg.list_errors))
        raw = await request.read()
        try:
            req = orjson.loads(raw)
            req["messages"]  # noqa: B018 - a chat body without messages is a 400
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return self._json(400, _err_body(400, "invalid request body", "INVALID_ARGUMENT", as_list=False))
        refused = sorted(self.rejected.intersection(req)) if self.stats.ok >= cfg.reject_after else []
        rf = req.get("response_format")
        if cfg.reject_json_schema and isinstance(rf, dict) and rf.get("type") not in ("text", "json_object"):
            refused = refused or ["response_format"]
        if refused:
            # Some OpenAI-compatible hosts reject parameters they do not implement.
            if cfg.reject_status == 422:  # FastAPI request validation
                detail = [{"type": "extra_forbidden", "loc": ["body", refused[0]], "msg": "Extra inputs are not permitted"}]
                return self._json(422, orjson.dumps({"detail": detail}))
            if cfg.reject_status == 500:  # llama-cpp-python: the validation report, as a server error
                msg = (f"1 validation error:\n  {{'type': 'extra_forbidden', 'loc': ('body', '{refused[0]}'), "
                       "'msg': 'Extra inputs are not permitted'}\n\n  File \"app.py\", in create_chat_completion")
                err = {"message": msg, "type": "internal_server_error", "param": None, "code": None}
                return self._json(500, orjson.dumps({"error": err}))
            msg = f'Invalid JSON payload received. Unknown name "{refused[0]}": Cannot find field.'  # Gemini's wording
            return self._json(400, _err_body(400, msg, "INVALID_ARGUMENT", as_list=cfg.list_errors))

        fault = cfg.script.pop(0) if cfg.script else None
        if fault is None and cfg.daily_quota is not None and self.stats.ok >= cfg.daily_quota:
            fault = "quota"
        if cfg.n_ctx is not None and (n_prompt := prompt_tokens(req)) > cfg.n_ctx:
            ctx_err: dict[str, Any] = {"code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": n_prompt, "n_ctx": cfg.n_ctx,
                   "message": f"request ({n_prompt} tokens) exceeds the available context size ({cfg.n_ctx} tokens), "
                              "try increasing it"}
            return self._json(400, orjson.dumps({"error": ctx_err}))  # llama.cpp's body, word for word
        if fault is None:
            prompt_est = prompt_tokens(req)
            delay = self.req_bucket.take(1) if self.req_bucket else 0.0
            if not delay and self.tok_bucket:
                delay = self.tok_bucket.take(prompt_est + int(_max_tokens(req) or 0))
            if delay:
                return self._rate_limited(delay)
            if self.fault_table:
                u = self.rng.random()
                for p, name in self.fault_table:
                    if u < p:
                        fault = name
                        break
                    u -= p
        if fault is not None:
            self._fault(fault)
            early = await self._inject(fault, request)
            if early is not None:
                return early

        if self._worker is None:
            return await self._generate(req, raw, fault, cache)
        # One worker: requests wait their turn, and one whose client hangs up is still worked on to
        # the end (shielded), holding the worker as a real single-slot server does.
        work = asyncio.ensure_future(self._serially(req, raw, fault, cache))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            self.stats.abandoned += 1
            raise

    async def _serially(self, req: dict[str, Any], raw: bytes, fault: str | None, cache: str) -> web.Response:
        assert self._worker is not None
        queued = self._worker.locked()  # every worker is busy: this one waits its turn
        if queued:
            self._waiting += 1
            self.stats.max_waiting = max(self.stats.max_waiting, self._waiting)
        async with self._worker:
            if queued:
                self._waiting -= 1
            return await self._generate(req, raw, fault, cache)

    async def _generate(self, req: dict[str, Any], raw: bytes, fault: str | None, cache: str) -> web.Response:
        body = self.reply_body(req, fault=fault, reply_id=f"chatcmpl-sim-{self.stats.requests}", cache=cache)
        usage = body.get("usage") or {"prompt_tokens": 0, "completion_tokens": 0}
        latency = self._latency() + self.cfg.latency_per_token_s * self.cfg.latency_scale * usage["completion_tokens"]
        if latency > 0:
            await asyncio.sleep(latency)
        self.stats.prompt_tokens += usage["prompt_tokens"]
        self.stats.completion_tokens += usage["completion_tokens"]
        self.stats.cached_prompt_tokens += (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        h = hash(raw)
        self.stats.ok += 1
        self.stats.ok_bodies[h] = self.stats.ok_bodies.get(h, 0) + 1
        return self._json(200, orjson.dumps(body))

    def prefix_cache(self, req: dict[str, Any], cache: str) -> tuple[int, int]:
        """(prompt tokens read from the prompt cache, written into it) for `req`'s system prompt: `cache` "auto"
        is OpenAI's automatic caching (reads only), "marked" a prompt marked cacheable (Anthropic's
        cache_control: a first sight is written), "unmarked" no caching."""
        system = next((m for m in req["messages"] if m.get("role") == "system"), None)
        if cache == "unmarked" or not self.cfg.prompt_cache or system is None:
            return 0, 0
        n = prompt_tokens({"messages": [system]})
        if n < self.cfg.cache_min_tokens:
            return 0, 0
        text = orjson.dumps(system.get("content")).decode()
        if text in self._prefixes:
            return n, 0
        self._prefixes.add(text)
        return 0, (n if cache == "marked" else 0)

    def reply_body(self, req: dict[str, Any], *, fault: str | None = None, reply_id: str = "chatcmpl-sim",
                   cache: str = "auto") -> dict[str, Any]:
        """The chat.completion body (usage included) answering the request body `req` under the current
        knobs — the one place replies are made, so the batch routes answer exactly as the online one.
        `fault` "null", "empty" or "length" shapes it as those faults; `cache`: how the prompt cache sees it
        (`prefix_cache`); no stats are touched."""
        cfg = self.cfg
        messages = req["messages"]
        max_tokens = _max_tokens(req)
        text, finish = behaviour.reply(
            messages, seed=int(req.get("seed") or 0), temperature=float(req.get("temperature") or 0.0),
            max_tokens=max_tokens, response_format=req.get("response_format"),
            p_stray=cfg.p_stray, p_runaway=cfg.p_runaway, cut_at_max_tokens=cfg.cut_at_max_tokens,
        )
        if cfg.quote_key and cfg.api_key:
            text = _quoting(text, cfg.api_key)
        pt, ct = prompt_tokens(req), text_tokens(text)  # the engine's token rule: its estimates are exact here
        if fault == "length":  # cut at max_tokens: all of them used
            text, finish = text[: max(1, len(text) // 2)], "length"
            ct = max_tokens or text_tokens(text)
        elif fault == "filter":
            text, finish = text[: max(1, len(text) // 3)], "content_filter"
            ct = text_tokens(text)
        if cfg.n_ctx is not None and pt + ct > cfg.n_ctx:  # the context is full: generation stops there
            ct = max(0, cfg.n_ctx - pt)
            text, finish = text[: 4 * ct], "length"
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if fault == "null":
            message = {"role": "assistant", "content": None, "reasoning_content": text}
            finish = cfg.null_finish
        elif fault == "empty":
            message, finish = {"role": "assistant", "content": None}, "stop"
        elif cfg.content_form == "parts":
            message["content"] = [{"type": "text", "text": text[: len(text) // 2]}, {"type": "text", "text": text[len(text) // 2:]}]
        elif cfg.content_form == "tool_call":
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_sim", "type": "function", "function": {"name": "answer", "arguments": text}}]}
            finish = "tool_calls" if finish == "stop" else finish
        elif cfg.content_form == "number":
            message["content"] = 42
        elif cfg.content_form == "object":
            message["content"] = {"text": text}
        body: dict[str, Any] = {
            "id": reply_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.get("model", "sim-1"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        }
        if cfg.usage:
            read, write = self.prefix_cache(req, cache)
            details = {"cached_tokens": read} | ({"cache_write_tokens": write} if write else {})
            body["usage"] = {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct,
                             "prompt_tokens_details": details}
        return body

    def _latency(self) -> float:
        cfg = self.cfg
        if cfg.latency_s <= 0:
            return 0.0
        if cfg.latency == "fixed":
            return cfg.latency_s * cfg.latency_scale
        return self.rng.lognormvariate(math.log(cfg.latency_s), cfg.latency_sigma) * cfg.latency_scale

    async def _inject(self, fault: str, request: web.Request) -> web.StreamResponse | None:
        """Serve `fault`; None for faults that shape a 200 reply instead (null, empty, length)."""
        cfg = self.cfg
        if fault in ("500", "503"):
            code = int(fault)
            status = "INTERNAL" if code == 500 else "UNAVAILABLE"
            msg = "The server had an error while processing your request." if code == 500 else "The model is overloaded."
            return self._json(code, _err_body(code, msg, status, as_list=cfg.list_errors))
        if fault == "429":
            return self._rate_limited(0.05)
        if fault == "401":
            return self._json(401, _err_body(401, "API key not valid.", "UNAUTHENTICATED", as_list=cfg.list_errors))
        if fault == "quota":
            details = [
                {
                    "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [
                        {
                            "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                            "quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
                            "quotaValue": str(cfg.daily_quota or 0),
                        }
                    ],
                },
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "43200s"},
            ]
            msg = "You exceeded your current quota. Quota exceeded for metric: requests per day."
            return self._json(429, _err_body(429, msg, "RESOURCE_EXHAUSTED", as_list=True, details=details))
        if fault == "hang":
            await asyncio.sleep(cfg.hang_s)
            return self._json(504, _err_body(504, "deadline exceeded", "DEADLINE_EXCEEDED", as_list=False))
        if fault == "drop":
            if request.transport is not None:
                request.transport.abort()
            raise ConnectionResetError("simulated connection drop")
        if fault == "malformed":
            return self._json(200, b'{"id": "chatcmpl-sim", "choices": [{"index": 0, "message": {"role": "assist')
        return None

    def _rate_limited(self, delay: float) -> web.Response:
        cfg = self.cfg
        if cfg.rate_style == "gemini":
            details = [
                {
                    "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [
                        {
                            "quotaMetric": "generativelanguage.googleapis.com/generate_content_requests",
                            "quotaId": "GenerateRequestsPerMinutePerProjectPerModel",
                            "quotaValue": str(int(cfg.rpm or 0)),
                        }
                    ],
                },
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": cfg.retry_value or f"{delay:.3f}s"},
            ]
            msg = "You exceeded your current quota, please check your plan and billing details."
            return self._json(429, _err_body(429, msg, "RESOURCE_EXHAUSTED", as_list=True, details=details))
        form = cfg.retry_headers
        headers: dict[str, str] = {}
        given = cfg.retry_value or None  # a host's own (possibly useless) wait text, sent verbatim
        if form in ("all", "seconds"):
            headers["Retry-After"] = given or str(max(1, math.ceil(delay)))
        if form == "date":
            headers["Retry-After"] = given or email.utils.formatdate(time.time() + max(1.0, delay), usegmt=True)
        if form in ("all", "ms"):
            headers["retry-after-ms"] = given or str(math.ceil(delay * 1000))
        if form in ("all", "reset"):
            headers["x-ratelimit-reset-requests"] = given or _duration(delay)
            headers["x-ratelimit-remaining-requests"] = "0"
        if cfg.rpm:
            headers["x-ratelimit-limit-requests"] = str(int(cfg.rpm))
        body = orjson.dumps(
            {"error": {"message": "Rate limit reached for requests", "type": "requests", "code": "rate_limit_exceeded"}}
        )
        return self._json(429, body, headers)


async def serve(config: SimConfig, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start serving; returns the runner (for cleanup) and the bound port (useful with port 0)."""
    runner = web.AppRunner(Simulator(config).app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096, reuse_address=True)
    await site.start()
    sockets = runner.addresses
    bound = sockets[0][1] if sockets else port
    return runner, bound
