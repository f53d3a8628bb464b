"""The simulator's provider Batch APIs: OpenAI-style files + batches, and Gemini's native batch API.

OpenAI style (`/v1/files`, `/v1/files/{id}`, `/v1/files/{id}/content`, `/v1/batches`,
`/v1/batches/{id}`, `/v1/batches/{id}/cancel`, list with `GET /v1/batches`): an uploaded JSONL of chat
requests becomes a batch whose output and error files follow OpenAI's result format, with every status
of the batch object (validating, in_progress, finalizing, completed, failed, expired, cancelling,
cancelled). Gemini style under `v1beta` and `v1` (google-genai 3.x uses v1): resumable upload at
`/upload/{v}/files` (start, then `upload`/`upload, finalize` chunks answered with `X-Goog-Upload-Status`),
`GET /{v}/files/{id}`, `POST /{v}/models/{m}:batchGenerateContent`, `GET /{v}/batches[/{id}]`, `:cancel`,
download at `[/download]/{v}/files/{id}:download`: GenerateContentRequest lines keyed by `key`, results as
`{"key", "response" | "error": google.rpc.Status}` lines. `GET /v1/batches[/{id}]` is both APIs' path:
the Gemini client is told apart by its `x-goog-api-key` header, a batch by its own style.
Anthropic style (`/v1/messages/batches`, registered by simulator/anthropic_wire.py): the requests come inline with
the create (`{"custom_id", "params"}`, each a Messages body read by anthropic_wire.py's `to_chat`), the batch object
has Anthropic's `processing_status` (in_progress, canceling, ended) and `request_counts` (processing,
succeeded, errored, canceled, expired), and its `results_url` serves `{"custom_id", "result": {"type":
succeeded | errored | canceled | expired}}` lines. A create over the size knobs is refused with 413
`request_too_large` (Anthropic's limits are checked at create), a full queue with 429.
The official SDKs (openai, google-genai, anthropic) drive these routes in tests/integration/conformance/.

Replies come from the online endpoint's own `Simulator.reply_body`, so a batch study and an online
study agree. Time is lazy: a batch's state is worked out from its age each
time it is read. Knobs (`BatchConfig`, set at runtime with `POST /admin/batch`): turnaround, a share of
failed requests (server errors or invalid requests), batches that expire or stay in progress, per-batch
size limits that fail oversized batches, and an account-wide enqueued-token limit (OpenAI's
`token_limit_exceeded`, Gemini's 429 RESOURCE_EXHAUSTED at create). `GET /batch/stats` counts batch creations and every request answered (and answered twice).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import itertools
import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson
from aiohttp import web

from evaluator.core.tokens import prompt_tokens
from simulator import anthropic_wire


class _Keyed(Protocol):
    @property
    def api_key(self) -> str | None: ...


class ReplySource(Protocol):
    """What the batch routes need of the online simulator (`server.Simulator`): its key and its replies."""

    @property
    def cfg(self) -> _Keyed: ...  # server.SimConfig

    def reply_body(self, req: dict[str, Any], *, fault: str | None = None, reply_id: str = ...,
                   cache: str = ...) -> dict[str, Any]: ...


@dataclass
class BatchConfig:
    turnaround_s: float = 0.2  # from create to completed (progress grows linearly in between)
    p_fail: float = 0.0  # share of requests answered with an error line
    fail_kind: str = "server"  # "server": HTTP 500 / gRPC 13 INTERNAL; "invalid": HTTP 400 / gRPC 3 INVALID_ARGUMENT;
    #                            "denied": HTTP 403 / gRPC 7 PERMISSION_DENIED
    refuse_create: int | None = None  # answer every batch create with this HTTP status (403: batches not allowed)
    expire_next: int = 0  # the next N batches created expire at turnaround with only part done
    expire_done_share: float = 0.5  # share of an expiring batch's requests answered before it expires
    stuck_next: int = 0  # the next N batches created stay in_progress until cancelled
    max_requests: int | None = None  # per-batch limits: an oversized batch fails validation
    max_bytes: int | None = None
    # Account-wide queue: a batch whose prompt tokens would take the unfinished batches' total past this
    # fails (OpenAI: status failed, errors code token_limit_exceeded; Gemini: create answers 429).
    max_enqueued_tokens: int | None = None
    seed: int = 0
    echo_key: bool = False  # failed lines' messages quote the server's key, as some providers do (redaction tests)


@dataclass
class _Stats:
    batches_created: int = 0
    files_uploaded: int = 0
    rejected_oversized: int = 0
    rejected_queue_full: int = 0
    cancelled: int = 0
    expired: int = 0
    requests_ok: int = 0
    requests_failed: int = 0
    requests_expired: int = 0
    ok_by_request: dict[str, int] = field(default_factory=dict)  # request body digest -> times answered

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        counts = d.pop("ok_by_request").values()
        d["distinct_ok"] = len(self.ok_by_request)
        d["repeated_ok"] = sum(1 for c in counts if c > 1)  # the same request answered (billed) twice
        return d


@dataclass
class _Batch:
    id: str
    style: str  # "openai" | "gemini"
    lines: list[tuple[str, dict[str, Any]]]  # (custom_id or key, chat request body: the client's JSON)
    created: float
    input_file_id: str
    metadata: dict[str, Any]  # the client's batch metadata, echoed as given (any JSON object)
    model: str = ""
    fate: str = "complete"  # complete | expire | stuck | oversized | queue_full
    tokens: int = 0  # prompt tokens enqueued (the account-wide limit counts unfinished batches')
    status: str = "validating"
    cancelled_at: float | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    counts: tuple[int, int] = (0, 0)  # completed, failed (final)
    errors: list[dict[str, Any]] = field(default_factory=list)  # the provider's error objects, as it writes them
    created_wall: float = field(default_factory=time.time)
    ended: float | None = None  # monotonic time the batch reached a final status
    # Anthropic style: how the prompt cache sees each line and the tool each forces (anthropic_wire.to_chat)
    cache: list[str] = field(default_factory=list)
    tools: list[str | None] = field(default_factory=list)
    done: int = 0  # requests that ran before the batch ended (the rest expired or were cancelled)


# -- Gemini <-> chat translation (the simulator answers chat messages either way) ----------------------
def gemini_to_chat(request: dict[str, Any]) -> dict[str, Any]:
    """A GenerateContentRequest as the chat body the same call would be online."""
    messages: list[dict[str, Any]] = []
    sys_inst = request.get("system_instruction") or request.get("systemInstruction")
    if sys_inst:
        messages.append({"role": "system", "content": "".join(p.get("text", "") for p in sys_inst.get("parts", []))})
    for c in request.get("contents", []):
        role = "assistant" if c.get("role") == "model" else "user"
        messages.append({"role": role, "content": "".join(p.get("text", "") for p in c.get("parts", []))})
    gen = request.get("generation_config") or request.get("generationConfig") or {}
    body: dict[str, Any] = {"messages": messages, "temperature": gen.get("temperature", 0.0)}
    if "seed" in gen:
        body["seed"] = gen["seed"]
    if "maxOutputTokens" in gen:
        body["max_tokens"] = gen["maxOutputTokens"]
    if gen.get("responseMimeType") == "application/json":
        schema = gen.get("responseJsonSchema")
        body["response_format"] = (
            {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}} if schema is not None else {"type": "json_object"}
        )
    return body


def chat_to_gemini_response(completion: dict[str, Any]) -> dict[str, Any]:
    choice = completion["choices"][0]
    usage = completion.get("usage") or {"prompt_tokens": 0, "completion_tokens": 0}
    return {
        "candidates": [{
            "content": {"role": "model", "parts": [{"text": choice["message"]["content"]}]},
            "finishReason": "MAX_TOKENS" if choice["finish_reason"] == "length" else "STOP",
            "index": 0,
        }],
        "usageMetadata": {
            "promptTokenCount": usage["prompt_tokens"],
            "candidatesTokenCount": usage["completion_tokens"],
            "totalTokenCount": usage["total_tokens"],
            **({"cachedContentTokenCount": cached} if (cached := (usage.get("prompt_tokens_details") or {}).get("cached_tokens")) else {}),
        },
        "modelVersion": completion["model"],
    }


_GEMINI_STATE = {
    "validating": "BATCH_STATE_PENDING", "in_progress": "BATCH_STATE_RUNNING", "finalizing": "BATCH_STATE_RUNNING",
    "completed": "BATCH_STATE_SUCCEEDED", "failed": "BATCH_STATE_FAILED", "expired": "BATCH_STATE_EXPIRED",
    "cancelling": "BATCH_STATE_RUNNING", "cancelled": "BATCH_STATE_CANCELLED",
}
_FINAL = ("completed", "failed", "expired", "cancelled")
# Share of the turnaround spent validating, then in progress; the rest is finalizing.
_VALIDATING, _FINALIZING = 0.1, 0.8
# google.rpc.Code values (googleapis google/rpc/code.proto): Gemini's per-line errors carry these, not HTTP.
_GRPC_CANCELLED, _GRPC_INVALID_ARGUMENT, _GRPC_PERMISSION_DENIED, _GRPC_INTERNAL = 1, 3, 7, 13
# OpenAI's per-request codes for requests that never ran (BatchRequestOutput.error.code in its API spec).
_NOT_RUN = {
    "expired": ("batch_expired", "The request could not be executed before the completion window ended."),
    "cancelled": ("batch_cancelled", "The batch was cancelled before this request executed."),
}
_FAILED_LINE: dict[str, tuple[int, dict[str, Any], int, str]] = {  # fail_kind -> (HTTP status, OpenAI error body, gRPC code, Gemini message)
    "server": (500, {"message": "The server had an error while processing your request.", "type": "server_error",
                     "param": None, "code": None}, _GRPC_INTERNAL, "Internal error encountered."),
    "invalid": (400, {"message": "Invalid value for 'messages': the request is malformed.",
                      "type": "invalid_request_error", "param": "messages", "code": "invalid_value"},
                _GRPC_INVALID_ARGUMENT, "Request contains an invalid argument."),
    # the account or key may not use this model through the batch API (every line answered so)
    "denied": (403, {"message": "You are not allowed to sample from this model.", "type": "invalid_request_error",
                     "param": None, "code": "model_not_allowed"},
               _GRPC_PERMISSION_DENIED, "Permission denied on resource project."),
}


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json", headers=headers)


def _error(status: int, message: str) -> web.Response:
    return _json({"error": {"code": status, "message": message, "type": "invalid_request_error"}}, status)


def _g_error(status: int, message: str, grpc_status: str) -> web.Response:
    """Google's HTTP error body: the HTTP code, its message and the gRPC status name."""
    return _json({"error": {"code": status, "message": message, "status": grpc_status}}, status)


def _iso(t: float) -> str:
    """RFC 3339 UTC, as Google's JSON writes a Timestamp."""
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _is_gemini(request: web.Request) -> bool:
    """`/v1/batches` and `/v1/files/{id}` are both APIs' paths; google-genai sends its key as x-goog-api-key."""
    return "x-goog-api-key" in request.headers


class BatchSim:
    def __init__(self, sim: ReplySource) -> None:
        self.sim = sim
        self.cfg = BatchConfig()
        self.stats = _Stats()
        self.rng = random.Random(0)
        self.files: dict[str, bytes] = {}
        self.file_meta: dict[str, dict[str, Any]] = {}  # id -> filename, purpose, mime, created, source
        self.batches: dict[str, _Batch] = {}
        self.uploads: dict[str, dict[str, Any]] = {}  # Gemini resumable upload sessions
        self._ids = itertools.count(1)
        self._answered = 0

    # -- helpers ---------------------------------------------------------------------------------------
    def _new_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids):06d}"

    def _authorized(self, request: web.Request) -> bool:
        key = self.sim.cfg.api_key
        if not key:
            return True
        return request.headers.get("Authorization") == f"Bearer {key}" or request.headers.get("x-goog-api-key") == key

    def _enqueued_tokens(self) -> int:
        total = 0
        for b in self.batches.values():
            self._advance(b)
            if b.status not in _FINAL:
                total += b.tokens
        return total

    def _queue_full(self, tokens: int) -> bool:
        limit = self.cfg.max_enqueued_tokens
        return limit is not None and self._enqueued_tokens() + tokens > limit

    def _create(self, style: str, file_id: str, lines: list[tuple[str, dict]], metadata: dict, model: str = "") -> _Batch:
        cfg = self.cfg
        tokens = sum(prompt_tokens(body) for _, body in lines)  # as `Simulator.reply_body` bills
        queue_full = self._queue_full(tokens)  # before this batch counts itself
        prefix = "msgbatch_" if style == "anthropic" else "batch_"
        b = _Batch(self._new_id(prefix), style, lines, time.monotonic(), file_id, metadata, model, tokens=tokens)
        self.stats.batches_created += 1
        size = len(self.files.get(file_id, b""))
        if (cfg.max_requests is not None and len(lines) > cfg.max_requests) or (cfg.max_bytes is not None and size > cfg.max_bytes):
            b.fate, b.status, b.ended = "oversized", "failed", b.created
            self.stats.rejected_oversized += 1
            what = f"{len(lines)} requests, {size} bytes; limits {cfg.max_requests} requests, {cfg.max_bytes} bytes"
            b.errors = [{"code": "batch_too_large", "message": f"The batch input is too large ({what}).", "param": None, "line": None}]
        elif queue_full:
            b.fate, b.status, b.ended = "queue_full", "failed", b.created
            self.stats.rejected_queue_full += 1
            model = model or str(lines[0][1].get("model", "sim-1")) if lines else "sim-1"
            b.errors = [{"code": "token_limit_exceeded", "param": None, "line": None, "message": (
                f"Enqueued token limit reached for {model} in organization org-sim. Limit: {cfg.max_enqueued_tokens:,} "
                "enqueued tokens. Please try again once some in_progress batches have been completed.")}]
        elif cfg.stuck_next > 0:
            cfg.stuck_next -= 1
            b.fate = "stuck"
        elif cfg.expire_next > 0:
            cfg.expire_next -= 1
            b.fate = "expire"
        self.batches[b.id] = b
        return b

    def _advance(self, b: _Batch) -> None:
        """Bring `b` up to date with the clock: its phase by age, finished when its time has come."""
        if b.status in _FINAL:
            return
        age = time.monotonic() - b.created
        if b.cancelled_at is not None:
            self._finish(b, "cancelled", self._progress(b, b.cancelled_at - b.created))
            self.stats.cancelled += 1
            return
        turnaround = self.cfg.turnaround_s
        if b.fate == "stuck" or age < turnaround:
            phase = 0.5 if b.fate == "stuck" or turnaround <= 0 else age / turnaround
            b.status = "validating" if phase < _VALIDATING else "in_progress" if phase < _FINALIZING else "finalizing"
            return
        if b.fate == "expire":
            # Gemini: an expired job has no results at all; OpenAI: the part done before the window closed.
            share = 0.0 if b.style == "gemini" else self.cfg.expire_done_share
            self._finish(b, "expired", int(len(b.lines) * share))
            self.stats.expired += 1
        else:
            self._finish(b, "completed", len(b.lines))

    def _progress(self, b: _Batch, age: float) -> int:
        if b.fate == "stuck" or self.cfg.turnaround_s <= 0:
            return 0 if b.fate == "stuck" else len(b.lines)
        return min(len(b.lines), int(len(b.lines) * age / self.cfg.turnaround_s))

    def _finish(self, b: _Batch, status: str, n_done: int) -> None:
        out, err = [], []
        failed = 0
        for i, (cid, req) in enumerate(b.lines):
            if i >= n_done:
                self.stats.requests_expired += 1
                if b.style == "anthropic":
                    err.append({"custom_id": cid, "result": {"type": "canceled" if status == "cancelled" else "expired"}})
                elif b.style == "openai":
                    code, message = _NOT_RUN[status]
                    err.append(self._line(b, cid, None, {"code": code, "message": message}))
                elif status == "cancelled":  # Gemini: an expired job writes no results at all
                    err.append({"key": cid, "error": {"code": _GRPC_CANCELLED, "message": "The batch was cancelled before this request ran."}})
                continue
            if self.cfg.p_fail > 0 and self.rng.random() < self.cfg.p_fail:
                failed += 1
                self.stats.requests_failed += 1
                http, body, grpc, gmsg = _FAILED_LINE[self.cfg.fail_kind]
                if self.cfg.echo_key and self.sim.cfg.api_key:
                    echo = f" Request made with API key {self.sim.cfg.api_key}."
                    body, gmsg = {**body, "message": body["message"] + echo}, gmsg + echo
                if b.style == "gemini":
                    err.append({"key": cid, "error": {"code": grpc, "message": gmsg}})  # google.rpc.Status
                elif b.style == "anthropic":
                    kind = anthropic_wire.ERROR_TYPES.get(http, "api_error")
                    err.append({"custom_id": cid, "result": {"type": "errored", "error": {
                        "type": "error", "error": {"type": kind, "message": body["message"]}}}})
                else:
                    err.append(self._line(b, cid, (http, {"error": body}), None))
                continue
            self._answered += 1
            body = self.sim.reply_body(req, reply_id=f"chatcmpl-simbatch-{self._answered}",  # exactly the online reply
                                       cache=b.cache[i] if b.cache else "auto")
            digest = hashlib.sha256(orjson.dumps(req, option=orjson.OPT_SORT_KEYS)).hexdigest()
            self.stats.ok_by_request[digest] = self.stats.ok_by_request.get(digest, 0) + 1
            self.stats.requests_ok += 1
            out.append(self._line(b, cid, (200, body), None, b.tools[i] if b.tools else None))
        if b.style in ("gemini", "anthropic"):
            lines = out + err  # Gemini and Anthropic write one results file, errors inline
            b.output_file_id = self._store_file(lines, "batch_output") if lines else None
        else:
            b.output_file_id = self._store_file(out, "batch_output") if out else None
            b.error_file_id = self._store_file(err, "batch_error") if err else None
        b.counts = (n_done - failed, failed + len(b.lines) - n_done)
        b.done = n_done
        b.status = status
        b.ended = time.monotonic()

    def _line(self, b: _Batch, cid: str, response: tuple[int, dict] | None, error: dict | None,
              tool: str | None = None) -> dict[str, Any]:
        if b.style == "anthropic":  # only successful replies come here
            assert response is not None
            return {"custom_id": cid, "result": {"type": "succeeded", "message": anthropic_wire.to_message(response[1], tool)}}
        if b.style == "gemini":  # only successful replies come here
            assert response is not None
            return {"key": cid, "response": chat_to_gemini_response(response[1])}
        resp = None if response is None else {"status_code": response[0], "request_id": self._new_id("req_"), "body": response[1]}
        return {"id": self._new_id("batch_req_"), "custom_id": cid, "response": resp, "error": error}

    def _store_file(self, lines: list[dict], purpose: str) -> str:
        data = b"".join(orjson.dumps(x) + b"\n" for x in lines)
        return self._add_file(data, f"{purpose}.jsonl", purpose, "application/jsonl", source="GENERATED")

    def _add_file(self, data: bytes, filename: str, purpose: str, mime: str, source: str = "UPLOADED") -> str:
        fid = self._new_id("file-")
        self.files[fid] = data
        self.file_meta[fid] = {"filename": filename, "purpose": purpose, "mime": mime, "created": time.time(), "source": source}
        return fid

    def _wall(self, b: _Batch, mono: float) -> int:
        return int(b.created_wall + (mono - b.created))

    # -- OpenAI style ----------------------------------------------------------------------------------
    def _file_object(self, fid: str) -> dict[str, Any]:
        m = self.file_meta[fid]
        return {"id": fid, "object": "file", "bytes": len(self.files[fid]), "created_at": int(m["created"]),
                "filename": m["filename"], "purpose": m["purpose"], "status": "processed", "expires_at": None,
                "status_details": None}

    async def upload(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _error(401, "Incorrect API key provided.")
        form = await request.post()
        f = form.get("file")
        if form.get("purpose") != "batch" or not isinstance(f, web.FileField):
            return _error(400, "expected multipart fields purpose=batch and file")
        fid = self._add_file(f.file.read(), f.filename, "batch", f.content_type)
        self.stats.files_uploaded += 1
        return _json(self._file_object(fid))

    def _file(self, request: web.Request, denied: str) -> web.Response:
        # Both APIs serve a stored file the same way; only their wording of a bad key differs.
        if not self._authorized(request):
            return _error(401, denied)
        data = self.files.get(request.match_info["file_id"])
        if data is None:
            return _error(404, "No such file")
        return web.Response(body=data, content_type="application/octet-stream")

    async def file_content(self, request: web.Request) -> web.Response:
        return self._file(request, "Incorrect API key provided.")

    async def file_get(self, request: web.Request) -> web.Response:
        if _is_gemini(request):
            return await self.g_file_get(request)
        if not self._authorized(request):
            return _error(401, "Incorrect API key provided.")
        fid = request.match_info["file_id"]
        return _json(self._file_object(fid)) if fid in self.files else _error(404, "No such file")

    async def create(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _error(401, "Incorrect API key provided.")
        req = orjson.loads(await request.read())
        data = self.files.get(req.get("input_file_id", ""))
        if data is None:
            return _error(404, f"No such file: {req.get('input_file_id')!r}")
        if req.get("endpoint") != "/v1/chat/completions":
            return _error(400, "endpoint must be /v1/chat/completions")
        if self.cfg.refuse_create:
            return _error(self.cfg.refuse_create, "This key is not allowed to create batches.")
        try:
            lines = [(x["custom_id"], x["body"]) for x in map(orjson.loads, data.splitlines()) if x]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return _error(400, "input file is not batch JSONL (custom_id, method, url, body)")
        if len({c for c, _ in lines}) != len(lines):
            return _error(400, "custom_id values must be unique within a batch")
        b = self._create("openai", req["input_file_id"], lines, req.get("metadata") or {})
        return _json(self._openai_view(b))

    def _openai_view(self, b: _Batch, advance: bool = True) -> dict[str, Any]:
        if advance:
            self._advance(b)
        done, failed = b.counts
        if b.status not in _FINAL:
            done = self._progress(b, time.monotonic() - b.created)
        t = self.cfg.turnaround_s
        started = b.created + _VALIDATING * t if b.status != "validating" and b.fate not in ("oversized", "queue_full") else None
        ended = self._wall(b, b.ended) if b.ended is not None else None
        return {
            "id": b.id, "object": "batch", "endpoint": "/v1/chat/completions",
            "errors": {"object": "list", "data": b.errors} if b.errors else None,
            "input_file_id": b.input_file_id, "completion_window": "24h", "status": b.status,
            "output_file_id": b.output_file_id, "error_file_id": b.error_file_id,
            "created_at": int(b.created_wall), "expires_at": int(b.created_wall) + 24 * 3600,
            "in_progress_at": self._wall(b, started) if started is not None else None,
            "finalizing_at": ended if b.status == "completed" else None,
            "completed_at": ended if b.status == "completed" else None,
            "failed_at": ended if b.status == "failed" else None,
            "expired_at": ended if b.status == "expired" else None,
            "cancelling_at": self._wall(b, b.cancelled_at) if b.cancelled_at is not None else None,
            "cancelled_at": ended if b.status == "cancelled" else None,
            "request_counts": {"total": len(b.lines), "completed": done, "failed": failed},
            "metadata": b.metadata,
        }

    def _batch(self, request: web.Request, style: str) -> _Batch | web.Response:
        """The batch a request names, or the error response each API gives for a bad key or an unknown id."""
        if not self._authorized(request):
            return _error(401, "Incorrect API key provided." if style == "openai" else "API key not valid.")
        b = self.batches.get(request.match_info["batch_id"])
        if b is None or b.style != style:
            return _error(404, "No such batch") if style == "openai" else _g_error(404, "Requested entity was not found.", "NOT_FOUND")
        return b

    async def retrieve(self, request: web.Request) -> web.Response:
        found = self.batches.get(request.match_info["batch_id"])
        if found is not None and found.style == "gemini":  # GET /v1/batches/{id} is google-genai's get too
            return await self.g_get(request)
        b = self._batch(request, "openai")
        return b if isinstance(b, web.Response) else _json(self._openai_view(b))

    async def list(self, request: web.Request) -> web.Response:
        if _is_gemini(request):
            return await self.g_list(request)
        if not self._authorized(request):
            return _error(401, "Incorrect API key provided.")
        ids = [b.id for b in reversed(self.batches.values()) if b.style == "openai"]  # newest first
        after = request.query.get("after")
        start = ids.index(after) + 1 if after in ids else 0
        limit = max(1, min(100, int(request.query.get("limit", "20"))))
        page = [self._openai_view(self.batches[i]) for i in ids[start:start + limit]]
        return _json({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                      "last_id": page[-1]["id"] if page else None, "has_more": start + limit < len(ids)})

    async def cancel(self, request: web.Request) -> web.Response:
        b = self._batch(request, "openai")
        if isinstance(b, web.Response):
            return b
        self._cancel(b)
        return _json(self._openai_view(b, advance=False))  # "cancelling" until the next read

    def _cancel(self, b: _Batch) -> None:
        self._advance(b)
        if b.status not in _FINAL:
            b.cancelled_at = time.monotonic()
            b.status = "cancelling"

    # -- Gemini style ----------------------------------------------------------------------------------
    def _g_file(self, fid: str, root: str, version: str) -> dict[str, Any]:
        m = self.file_meta[fid]
        data = self.files[fid]
        view = {"name": f"files/{fid}", "displayName": m["filename"], "mimeType": m["mime"], "sizeBytes": str(len(data)),
                "createTime": _iso(m["created"]), "updateTime": _iso(m["created"]),
                "expirationTime": _iso(m["created"] + 48 * 3600),
                "sha256Hash": base64.b64encode(hashlib.sha256(data).hexdigest().encode()).decode(),
                "uri": f"{root}/{version}/files/{fid}", "state": "ACTIVE", "source": m["source"]}
        if m["source"] == "GENERATED":
            view["downloadUri"] = f"{root}/download/{version}/files/{fid}:download?alt=media"
        return view

    async def g_upload_start(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _g_error(401, "API key not valid.", "UNAUTHENTICATED")
        h = request.headers
        if h.get("X-Goog-Upload-Protocol") != "resumable" or h.get("X-Goog-Upload-Command") != "start":
            return _g_error(400, "only the resumable upload protocol is supported", "INVALID_ARGUMENT")
        meta = orjson.loads(await request.read() or b"{}")
        sid = self._new_id("upload-")
        self.uploads[sid] = {"file": meta.get("file") or {}, "data": bytearray(), "version": request.match_info["v"],
                             "mime": h.get("X-Goog-Upload-Header-Content-Type", "application/octet-stream")}
        url = f"{request.scheme}://{request.host}/upload/{request.match_info['v']}/files/session/{sid}"
        return _json({}, headers={"X-Goog-Upload-URL": url, "X-Goog-Upload-Status": "active"})

    async def g_upload_chunk(self, request: web.Request) -> web.Response:
        """One `upload` chunk at `X-Goog-Upload-Offset`; `upload, finalize` ends the session with the File."""
        session = self.uploads.get(request.match_info["sid"])
        commands = {c.strip() for c in request.headers.get("X-Goog-Upload-Command", "").split(",")}
        if session is None:
            return _g_error(404, "unknown upload session", "NOT_FOUND")
        if "upload" not in commands:
            return _g_error(400, "X-Goog-Upload-Command must be upload or 'upload, finalize'", "INVALID_ARGUMENT")
        offset = request.headers.get("X-Goog-Upload-Offset", "")
        if offset != str(len(session["data"])):
            return _g_error(400, f"X-Goog-Upload-Offset {offset!r} is not the {len(session['data'])} bytes received", "INVALID_ARGUMENT")
        session["data"] += await request.read()
        if "finalize" not in commands:
            return web.Response(status=200, headers={"X-Goog-Upload-Status": "active"})
        del self.uploads[request.match_info["sid"]]
        info = session["file"]
        name = info.get("displayName") or info.get("display_name") or ""
        fid = self._add_file(bytes(session["data"]), name, "batch", info.get("mimeType") or session["mime"])
        self.stats.files_uploaded += 1
        root = f"{request.scheme}://{request.host}"
        return _json({"file": self._g_file(fid, root, session["version"])}, headers={"X-Goog-Upload-Status": "final"})

    async def g_file_get(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _g_error(401, "API key not valid.", "UNAUTHENTICATED")
        fid = request.match_info["file_id"]
        if fid not in self.files:
            return _g_error(404, f"File {fid} does not exist.", "NOT_FOUND")
        return _json(self._g_file(fid, f"{request.scheme}://{request.host}", request.match_info.get("v", "v1beta")))

    async def g_download(self, request: web.Request) -> web.Response:
        return self._file(request, "API key not valid.")

    async def g_create(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _g_error(401, "API key not valid.", "UNAUTHENTICATED")
        req = orjson.loads(await request.read())
        batch = req.get("batch") or {}
        src = (batch.get("input_config") or batch.get("inputConfig") or {})
        fname = (src.get("file_name") or src.get("fileName") or "").removeprefix("files/")
        data = self.files.get(fname)
        if data is None:
            return _g_error(400, f"input_config.file_name {fname!r} is not an uploaded file", "INVALID_ARGUMENT")
        if self.cfg.refuse_create:
            return _g_error(self.cfg.refuse_create, "Batch mode is not enabled for this project.", "PERMISSION_DENIED")
        try:
            lines = [(x["key"], gemini_to_chat(x["request"])) for x in map(orjson.loads, data.splitlines()) if x]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return _g_error(400, "input file is not Gemini batch JSONL (key, request)", "INVALID_ARGUMENT")
        model = request.match_info["model"]
        for _, body in lines:
            body["model"] = model
        if self._queue_full(sum(prompt_tokens(body) for _, body in lines)):
            self.stats.rejected_queue_full += 1
            return _g_error(429, "You exceeded your current quota, please check your plan and billing details. "
                                 "Enqueued tokens of unfinished batches exceed the limit.", "RESOURCE_EXHAUSTED")
        meta = {"display_name": batch.get("display_name") or batch.get("displayName") or ""}
        b = self._create("gemini", fname, lines, meta, model)
        return _json(self._gemini_view(b))

    def _gemini_view(self, b: _Batch) -> dict[str, Any]:
        self._advance(b)
        done, failed = b.counts
        if b.status not in _FINAL:
            done = self._progress(b, time.monotonic() - b.created)
        total = len(b.lines)
        meta: dict[str, Any] = {
            "@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch",
            "name": f"batches/{b.id}", "model": f"models/{b.model}", "displayName": b.metadata.get("display_name", ""),
            "inputConfig": {"fileName": f"files/{b.input_file_id}"},
            "createTime": _iso(b.created_wall), "updateTime": _iso(time.time()),
            "state": _GEMINI_STATE[b.status],
            "batchStats": {"requestCount": str(total), "successfulRequestCount": str(done),
                           "failedRequestCount": str(failed), "pendingRequestCount": str(total - done - failed)},
        }
        if b.ended is not None:
            meta["endTime"] = _iso(self._wall(b, b.ended))
        view: dict[str, Any] = {"name": f"batches/{b.id}", "metadata": meta, "done": b.status in _FINAL}
        if b.output_file_id:
            meta["output"] = {"responsesFile": f"files/{b.output_file_id}"}
            view["response"] = {"@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatchOutput",
                                "responsesFile": f"files/{b.output_file_id}"}
        if b.errors:  # a failed long-running operation carries a google.rpc.Status
            view["error"] = {"code": _GRPC_INVALID_ARGUMENT, "message": b.errors[0]["message"]}
        return view

    async def g_get(self, request: web.Request) -> web.Response:
        b = self._batch(request, "gemini")
        return b if isinstance(b, web.Response) else _json(self._gemini_view(b))

    async def g_list(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _g_error(401, "API key not valid.", "UNAUTHENTICATED")
        ids = [b.id for b in reversed(self.batches.values()) if b.style == "gemini"]
        start = int(request.query.get("pageToken") or 0)
        size = max(1, min(100, int(request.query.get("pageSize") or 50)))
        body: dict[str, Any] = {"operations": [self._gemini_view(self.batches[i]) for i in ids[start:start + size]]}
        if start + size < len(ids):
            body["nextPageToken"] = str(start + size)
        return _json(body)

    async def g_cancel(self, request: web.Request) -> web.Response:
        b = self._batch(request, "gemini")
        if isinstance(b, web.Response):
            return b
        self._cancel(b)
        return _json({})


    # -- Anthropic style (routes registered by simulator/anthropic_wire.py) ------------------------------------
    def _a_view(self, b: _Batch, request: web.Request, advance: bool = True) -> dict[str, Any]:
        if advance:
            self._advance(b)
        n = len(b.lines)
        ended = b.status in _FINAL
        counts = {"processing": 0 if ended else n, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        if ended:
            done, failed = b.counts
            not_run = n - b.done
            counts |= {"succeeded": done, "errored": failed - not_run,
                       ("canceled" if b.status == "cancelled" else "expired"): not_run}
        status = "ended" if ended else ("canceling" if b.cancelled_at is not None else "in_progress")
        root = f"{request.scheme}://{request.host}"
        return {
            "id": b.id, "type": "message_batch", "processing_status": status, "request_counts": counts,
            "created_at": _iso(b.created_wall), "expires_at": _iso(b.created_wall + 24 * 3600),
            "ended_at": _iso(self._wall(b, b.ended)) if b.ended is not None else None,
            "cancel_initiated_at": _iso(self._wall(b, b.cancelled_at)) if b.cancelled_at is not None else None,
            "archived_at": None,
            "results_url": f"{root}/v1/messages/batches/{b.id}/results" if ended else None,
        }

    def _a_batch(self, request: web.Request) -> _Batch | web.Response:
        if not self._a_authorized(request):
            return anthropic_wire.error(401, "invalid x-api-key")
        b = self.batches.get(request.match_info["batch_id"])
        if b is None or b.style != "anthropic":
            return anthropic_wire.error(404, "batch not found")
        return b

    def _a_authorized(self, request: web.Request) -> bool:
        return anthropic_wire.authorized(request, self.sim.cfg.api_key)

    async def a_create(self, request: web.Request) -> web.Response:
        if not self._a_authorized(request):
            return anthropic_wire.error(401, "invalid x-api-key")
        raw = await request.read()
        try:
            req = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return anthropic_wire.error(400, "the request body is not valid JSON")
        reqs = req.get("requests") if isinstance(req, dict) else None
        if not isinstance(reqs, list) or not reqs:
            return anthropic_wire.error(400, "requests: at least one request is required")
        cfg = self.cfg
        if (cfg.max_requests is not None and len(reqs) > cfg.max_requests) or (cfg.max_bytes is not None and len(raw) > cfg.max_bytes):
            self.stats.rejected_oversized += 1
            return anthropic_wire.error(413, f"Request exceeds the maximum allowed number of requests or bytes "
                                             f"({len(reqs)} requests, {len(raw)} bytes)")
        if cfg.refuse_create:
            return anthropic_wire.error(cfg.refuse_create, "Message Batches are not enabled for this organization.")
        lines, caches, tools, seen = [], [], [], set()
        for i, item in enumerate(reqs):
            cid = item.get("custom_id") if isinstance(item, dict) else None
            if not isinstance(cid, str) or not anthropic_wire.CUSTOM_ID.match(cid):
                return anthropic_wire.error(400, f"requests.{i}.custom_id: must match ^[a-zA-Z0-9_-]{{1,64}}$")
            if cid in seen:
                return anthropic_wire.error(400, f"requests.{i}.custom_id: {cid!r} is not unique in this batch")
            seen.add(cid)
            params = item.get("params")
            why = anthropic_wire.check(params)
            if why is not None:
                return anthropic_wire.error(400, f"requests.{i}.params.{why}")
            chat, cache, tool = anthropic_wire.to_chat(params)
            lines.append((cid, chat))
            caches.append(cache)
            tools.append(tool)
        if self._queue_full(sum(prompt_tokens(body) for _, body in lines)):
            self.stats.rejected_queue_full += 1
            return anthropic_wire.error(429, "Enqueued requests of unfinished batches exceed this organization's limit.",
                                        {"retry-after": "1"})
        b = self._create("anthropic", "", lines, {}, str(lines[0][1].get("model", "")))
        b.cache, b.tools = caches, tools
        return _json(self._a_view(b, request))

    async def a_get(self, request: web.Request) -> web.Response:
        b = self._a_batch(request)
        return b if isinstance(b, web.Response) else _json(self._a_view(b, request))

    async def a_list(self, request: web.Request) -> web.Response:
        if not self._a_authorized(request):
            return anthropic_wire.error(401, "invalid x-api-key")
        ids = [b.id for b in reversed(self.batches.values()) if b.style == "anthropic"]  # newest first
        after = request.query.get("after_id")
        start = ids.index(after) + 1 if after in ids else 0
        limit = max(1, min(1000, int(request.query.get("limit", "20"))))
        page = [self._a_view(self.batches[i], request) for i in ids[start:start + limit]]
        return _json({"data": page, "has_more": start + limit < len(ids),
                      "first_id": page[0]["id"] if page else None, "last_id": page[-1]["id"] if page else None})

    async def a_cancel(self, request: web.Request) -> web.Response:
        b = self._a_batch(request)
        if isinstance(b, web.Response):
            return b
        self._cancel(b)
        return _json(self._a_view(b, request, advance=False))  # "canceling" until the next read

    async def a_results(self, request: web.Request) -> web.Response:
        b = self._a_batch(request)
        if isinstance(b, web.Response):
            return b
        self._advance(b)
        if b.status not in _FINAL or b.output_file_id is None:
            return anthropic_wire.error(400, f"batch {b.id} is still in progress; its results are not available yet")
        return web.Response(body=self.files[b.output_file_id], content_type="application/binary")

    # -- admin -----------------------------------------------------------------------------------------
    async def admin(self, request: web.Request) -> web.Response:
        knobs = orjson.loads(await request.read() or b"{}")
        base = BatchConfig() if knobs.pop("reset", False) else self.cfg
        try:
            cfg = dataclasses.replace(base, **knobs)
        except TypeError as e:
            return _json({"error": str(e)}, 400)
        if cfg.fail_kind not in _FAILED_LINE:
            return _json({"error": f"fail_kind must be one of {sorted(_FAILED_LINE)}"}, 400)
        self.cfg = cfg
        self.rng = random.Random(self.cfg.seed)
        return _json(dataclasses.asdict(self.cfg))

    async def get_stats(self, request: web.Request) -> web.Response:
        return _json(self.stats.as_dict())

    async def reset_stats(self, request: web.Request) -> web.Response:
        self.stats = _Stats()
        return _json(self.stats.as_dict())


def register(app: web.Application, sim: ReplySource) -> BatchSim:
    """Add both batch APIs and their admin routes to the simulator's app."""
    b = BatchSim(sim)
    r = app.router
    r.add_post("/v1/files", b.upload)
    r.add_get("/v1/files/{file_id:[^/:]+}", b.file_get)  # google-genai's client.files.get under v1 too
    r.add_get("/v1/files/{file_id}/content", b.file_content)
    r.add_post("/v1/batches", b.create)
    r.add_get("/v1/batches", b.list)  # and google-genai's list under v1
    r.add_get("/v1/batches/{batch_id:[^/:]+}", b.retrieve)  # and google-genai's get under v1
    r.add_post("/v1/batches/{batch_id}/cancel", b.cancel)
    v = "{v:v1beta|v1}"
    r.add_post(f"/upload/{v}/files", b.g_upload_start)
    r.add_post(f"/upload/{v}/files/session/{{sid}}", b.g_upload_chunk)
    r.add_get("/v1beta/files/{file_id:[^/:]+}", b.g_file_get)
    r.add_get(f"/download/{v}/files/{{file_id:[^/:]+}}:download", b.g_download)
    r.add_get(f"/{v}/files/{{file_id:[^/:]+}}:download", b.g_download)  # google-genai's client.files.download
    r.add_post(f"/{v}/models/{{model:[^/:]+}}:batchGenerateContent", b.g_create)
    r.add_get("/v1beta/batches", b.g_list)
    r.add_get("/v1beta/batches/{batch_id:[^/:]+}", b.g_get)
    r.add_post(f"/{v}/batches/{{batch_id:[^/:]+}}:cancel", b.g_cancel)
    r.add_post("/admin/batch", b.admin)
    r.add_get("/batch/stats", b.get_stats)
    r.add_post("/batch/stats/reset", b.reset_stats)
    return b
