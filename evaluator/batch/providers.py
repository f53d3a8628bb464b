"""Clients of the providers' Batch APIs, behind one interface: submit, find, state, results, cancel.

- `OpenAIBatch`: OpenAI-compatible `/v1/files` + `/v1/batches` (OpenAI, Together, Groq, ... and the
  simulator). The request lines are the chat bodies the online engine would POST, unchanged.
- `GeminiBatch`: Gemini's native batch API (resumable file upload, `models/{m}:batchGenerateContent`,
  `batches/{id}`); chat bodies are translated to GenerateContentRequests on the way in and the
  GenerateContentResponses back to chat.completion bodies on the way out, so the engine stores them
  exactly as it stores online replies.
- `AnthropicBatch`: Anthropic's Message Batches (`POST /v1/messages/batches` with the requests inline, each
  `{"custom_id", "params"}` a Messages body made by the online wire's own translation (llm/dialects.py),
  `GET .../{id}`, `.../{id}/cancel`, its `results_url` JSONL): a `succeeded` line's message comes back as
  the chat.completion body the online path stores, `errored` carries Anthropic's error type (mapped to its
  HTTP status: a 4xx is permanent, `api_error` / `overloaded_error` worth another submission), `canceled` and
  `expired` never ran. At most 100,000 requests or 256 MB per batch (split before submitting).

Every submit carries a token (OpenAI: batch metadata; Gemini: display name) so a batch whose id was
lost to a crash can be found again with `find` instead of being created twice. Anthropic's batches carry
no metadata: `find` takes the one batch created since the job was recorded with as many requests (none
when two match: its requests are then submitted again).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp
import orjson

from evaluator.batch.request_format import (
    BatchFailure,
    Request,
    Result,
    error_dict,
    json_lines,
    parse_results,
)
from evaluator.core.errors import ConfigError, FatalLLMError
from evaluator.core.redact import redact
from evaluator.llm.dialects import AnthropicWire, anthropic_base, dialect, from_message
from evaluator.llm.profiles import ModelProfile
from evaluator.llm.retry import backoff_delay, retry_after_from_headers
from evaluator.llm.transport import tls_problem

TOKEN_KEY = "evaluator_token"
# Per-batch limits when the profile names none. OpenAI: 50,000 requests and 200 MB per input file
# (platform.openai.com/docs/api-reference/batch/create; MB = 10^6 bytes). Gemini: an input file of at
# most 2 GB (ai.google.dev/gemini-api/docs/batch-api), taken as 2 * 10^9 bytes, the smaller reading.
# Files are split to fit before upload; a provider with smaller limits rejects the batch and the runner
# splits it again.
# Anthropic: 100,000 requests or 256 MB per Message Batch (docs.anthropic.com/en/docs/build-with-claude/
# batch-processing), 256 * 10^6 bytes.
DEFAULT_LIMITS: dict[str, tuple[int | None, int | None]] = {
    "openai": (50_000, 200_000_000),
    "gemini": (None, 2_000_000_000),
    "anthropic": (100_000, 256_000_000),
}
# The JSONL MIME type of each upload: google-genai's documented call is
# `client.files.upload(..., config=UploadFileConfig(mime_type="jsonl"))`, sent as X-Goog-Upload-Header-Content-Type.
GEMINI_JSONL_MIME = "jsonl"
OPENAI_JSONL_MIME = "application/jsonl"
TERMINAL = ("completed", "failed", "expired", "cancelled")
# google.rpc.Code (googleapis google/rpc/code.proto) of a Gemini batch line's error: its name and the HTTP
# status Google maps it to. The runner treats a 4xx (not 408/409/429) or 501 as permanent, 429/5xx as worth
# another submission; CANCELLED means the request never ran.
GRPC_CODES: dict[int, tuple[str, int]] = {
    1: ("CANCELLED", 499), 2: ("UNKNOWN", 500), 3: ("INVALID_ARGUMENT", 400), 4: ("DEADLINE_EXCEEDED", 504),
    5: ("NOT_FOUND", 404), 6: ("ALREADY_EXISTS", 409), 7: ("PERMISSION_DENIED", 403), 8: ("RESOURCE_EXHAUSTED", 429),
    9: ("FAILED_PRECONDITION", 400), 10: ("ABORTED", 409), 11: ("OUT_OF_RANGE", 400), 12: ("UNIMPLEMENTED", 501),
    13: ("INTERNAL", 500), 14: ("UNAVAILABLE", 503), 15: ("DATA_LOSS", 500), 16: ("UNAUTHENTICATED", 401),
}
_GRPC_BY_NAME = {name: code for code, (name, _) in GRPC_CODES.items()}


class BatchAPIError(FatalLLMError):
    """The provider refused a batch call for a reason a retry will not fix. Fatal for the command (one line);
    every reply imported before it is cached and every submitted batch is recorded, so a rerun resumes."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status, when there was one (404: no such batch or file)


@dataclass
class BatchState:
    status: str  # running | completed | failed | expired | cancelled
    total: int = 0
    completed: int = 0
    failed: int = 0
    errors: list[BatchFailure] = field(default_factory=list)  # why a whole batch failed (validation)

    @property
    def done(self) -> bool:
        return self.status in TERMINAL

    def _text(self) -> str:
        return " ".join(f"{e.code or ''} {e.message}" for e in self.errors).lower()

    @property
    def queue_full(self) -> bool:
        """Failed because the account's queue is full (OpenAI `token_limit_exceeded`: "Enqueued token limit
        reached ... try again once some in_progress batches have been completed"): wait, do not split."""
        return self.status == "failed" and ("token_limit_exceeded" in self._text() or "enqueued token" in self._text())

    @property
    def too_large(self) -> bool:
        """Failed validation for its own size: worth splitting and submitting again."""
        text = self._text()
        size_words = ("too large", "too_large", "too many", "larger than", "maximum size", "exceeds the maximum")
        return self.status == "failed" and not self.queue_full and any(w in text for w in size_words)


class BatchAPI(Protocol):
    def line_size(self, request: Request) -> int: ...  # bytes of its line in the uploaded file
    async def submit(self, requests: list[Request], token: str) -> str: ...
    # the batch a job's submit created (its token; its number of requests and the time it was recorded)
    async def find(self, token: str, size: int, since: float) -> str | None: ...
    async def state(self, batch_id: str) -> BatchState: ...
    async def results(self, batch_id: str) -> list[Result]: ...
    async def cancel(self, batch_id: str) -> None: ...
    async def close(self) -> None: ...


class _Http:
    def __init__(self, profile: ModelProfile, api_key: str | None, headers: dict[str, str]) -> None:
        self.profile = profile
        self._key = api_key
        self._rng = random.Random()
        self.session = aiohttp.ClientSession(
            headers=headers, timeout=aiohttp.ClientTimeout(total=max(120.0, profile.connection.timeout_s)),
            trust_env=not profile.loopback,
        )

    async def close(self) -> None:
        await self.session.close()

    async def call(self, method: str, url: str, *, retries: int = 5, **kw: Any) -> tuple[bytes, Any]:
        """Body and headers of a 2xx answer; transient failures (429, 5xx, connection) are retried with the
        engine's backoff, honouring a Retry-After the provider sends."""
        for attempt in range(retries + 1):
            try:
                async with self.session.request(method, url, **kw) as r:
                    raw, headers, status = await r.read(), r.headers, r.status
            except aiohttp.ClientSSLError as e:  # sending again cannot help: said in plain words at once
                raise BatchAPIError(f"{self.profile.name}: {tls_problem(e)} ({url}); give the server a certificate a "
                                    "trusted authority signed, or point SSL_CERT_FILE at the bundle of the authority "
                                    "that signed it") from None
            except (aiohttp.ClientError, TimeoutError) as e:
                if attempt == retries:
                    raise BatchAPIError(f"{self.profile.name}: cannot reach the batch API at {url} ({type(e).__name__})") from None
                await self._pause(attempt, None)
                continue
            if 200 <= status < 300:
                return raw, headers
            text = redact(raw[:300].decode(errors="replace"), self._key)
            if status in (401, 403):
                env = self.profile.connection.api_key_env or "the profile's api_key_env"
                raise FatalLLMError(f"{self.profile.name}: the batch API rejected the key ({status}); check {env} [{text}]")
            if (status == 429 or status >= 500) and attempt < retries:
                await self._pause(attempt, headers)
                continue
            raise BatchAPIError(f"{self.profile.name}: {method} {urlsplit(url).path} answered {status}: {text}", status)
        raise AssertionError("unreachable")

    async def _pause(self, attempt: int, headers: Any) -> None:
        """The engine's wait before a retry: the provider's Retry-After if usable, else its backoff, capped."""
        r = self.profile.retries
        hint = retry_after_from_headers(headers) if headers is not None else None
        delay = hint if hint is not None else backoff_delay(attempt, r.backoff_base_s, r.backoff_max_s, self._rng)
        await asyncio.sleep(min(delay, r.max_wait_s))


# -- OpenAI-compatible ----------------------------------------------------------------------------------
_OPENAI_STATUS = {"validating": "running", "in_progress": "running", "finalizing": "running", "cancelling": "running",
                  "completed": "completed", "failed": "failed", "expired": "expired", "cancelled": "cancelled"}


def openai_state(b: dict[str, Any]) -> BatchState:
    """An OpenAI batch object as a `BatchState`."""
    counts = b.get("request_counts") or {}
    errors = [e for e in map(error_dict, (b.get("errors") or {}).get("data") or []) if e is not None]
    return BatchState(_OPENAI_STATUS.get(b["status"], "running"), int(counts.get("total") or 0),
                      int(counts.get("completed") or 0), int(counts.get("failed") or 0), errors)


class OpenAIBatch:
    def __init__(self, profile: ModelProfile, api_key: str | None) -> None:
        self.base = profile.connection.base_url.rstrip("/")
        self.http = _Http(profile, api_key, {"Authorization": f"Bearer {api_key}"} if api_key else {})

    async def close(self) -> None:
        await self.http.close()

    @staticmethod
    def line_size(request: Request) -> int:
        return len(request.line())

    async def submit(self, requests: list[Request], token: str) -> str:
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", b"".join(r.line() for r in requests), filename=f"{token}.jsonl",
                       content_type=OPENAI_JSONL_MIME)
        raw, _ = await self.http.call("POST", f"{self.base}/files", data=form, retries=0)
        file_id = orjson.loads(raw)["id"]
        body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h",
                "metadata": {TOKEN_KEY: token}}
        raw, _ = await self.http.call("POST", f"{self.base}/batches", json=body, retries=0)
        return orjson.loads(raw)["id"]

    async def find(self, token: str, size: int = 0, since: float = 0.0) -> str | None:
        after: str | None = None
        for _ in range(20):  # the newest 2,000 batches: a lost one was created minutes ago
            params = {"limit": "100"} | ({"after": after} if after else {})
            raw, _ = await self.http.call("GET", f"{self.base}/batches", params=params)
            page = orjson.loads(raw)
            for b in page.get("data", []):
                if (b.get("metadata") or {}).get(TOKEN_KEY) == token:
                    return b["id"]
            if not page.get("has_more") or not page.get("data"):
                return None
            after = page["data"][-1]["id"]
        return None

    async def state(self, batch_id: str) -> BatchState:
        raw, _ = await self.http.call("GET", f"{self.base}/batches/{batch_id}")
        return openai_state(orjson.loads(raw))

    async def results(self, batch_id: str) -> list[Result]:
        raw, _ = await self.http.call("GET", f"{self.base}/batches/{batch_id}")
        b = orjson.loads(raw)
        out: list[Result] = []
        for fid in (b.get("output_file_id"), b.get("error_file_id")):
            if fid:
                data, _ = await self.http.call("GET", f"{self.base}/files/{fid}/content")
                out += parse_results(data, f"batch {batch_id} file {fid}")
        return out

    async def cancel(self, batch_id: str) -> None:
        await self.http.call("POST", f"{self.base}/batches/{batch_id}/cancel")


# -- Gemini native -----------------------------------------------------------------------------------------
_EFFORT_BUDGET = {"none": 0, "low": 1024, "medium": 8192, "high": 24576}  # Google's OpenAI-compat mapping
_GEMINI_FINISH = {"STOP": "stop", "MAX_TOKENS": "length", "SAFETY": "content_filter", "RECITATION": "content_filter"}
_KNOWN_BODY = {"model", "messages", "temperature", "max_tokens", "max_completion_tokens", "seed", "top_p",
               "reasoning_effort", "stop", "response_format"}


def chat_to_gemini(body: dict[str, Any]) -> dict[str, Any]:
    """A chat request body as a GenerateContentRequest (the same call through Gemini's native API)."""
    unknown = sorted(set(body) - _KNOWN_BODY)
    if unknown:
        raise ConfigError(f"the Gemini batch API cannot carry request field(s) {unknown}; "
                          "remove them from the profile's [extra_body] or submit with batch = \"openai\"")
    system = [m.get("content") or "" for m in body["messages"] if m.get("role") in ("system", "developer")]
    contents = [
        {"role": "model" if m.get("role") == "assistant" else "user", "parts": [{"text": m.get("content") or ""}]}
        for m in body["messages"] if m.get("role") not in ("system", "developer")
    ]
    gen: dict[str, Any] = {}
    if "temperature" in body:
        gen["temperature"] = body["temperature"]
    if body.get("max_tokens") or body.get("max_completion_tokens"):
        gen["maxOutputTokens"] = body.get("max_tokens") or body.get("max_completion_tokens")
    for src, dst in (("seed", "seed"), ("top_p", "topP")):
        if src in body:
            gen[dst] = body[src]
    if "stop" in body:
        gen["stopSequences"] = body["stop"] if isinstance(body["stop"], list) else [body["stop"]]
    rf = body.get("response_format") or {}
    if rf.get("type") in ("json_schema", "json_object"):
        gen["responseMimeType"] = "application/json"
        if rf.get("type") == "json_schema":
            gen["responseJsonSchema"] = (rf.get("json_schema") or {}).get("schema", {})
    if "reasoning_effort" in body:
        gen["thinkingConfig"] = {"thinkingBudget": _EFFORT_BUDGET.get(body["reasoning_effort"], 8192)}
    req: dict[str, Any] = {"contents": contents, "generation_config": gen}
    if system:
        req["system_instruction"] = {"parts": [{"text": "\n\n".join(system)}]}
    return req


def gemini_to_completion(resp: dict[str, Any], model: str) -> dict[str, Any]:
    """A GenerateContentResponse as the chat.completion body Gemini's OpenAI-compatible endpoint returns."""
    cand = (resp.get("candidates") or [{}])[0]
    parts = (cand.get("content") or {}).get("parts") or []
    text = "".join(p.get("text", "") for p in parts if not p.get("thought"))
    usage = resp.get("usageMetadata") or {}
    pt = int(usage.get("promptTokenCount") or 0)
    ct = int(usage.get("candidatesTokenCount") or 0) + int(usage.get("thoughtsTokenCount") or 0)
    finish = _GEMINI_FINISH.get(cand.get("finishReason", "STOP"), str(cand.get("finishReason", "stop")).lower())
    out_usage: dict[str, Any] = {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}
    if usage.get("cachedContentTokenCount"):  # of the prompt: from the context cache (implicit or explicit)
        out_usage["prompt_tokens_details"] = {"cached_tokens": int(usage["cachedContentTokenCount"])}
    return {
        "id": resp.get("responseId", "gemini-batch"), "object": "chat.completion", "created": int(time.time()),
        "model": resp.get("modelVersion", model),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text or None}, "finish_reason": finish}],
        "usage": out_usage,
    }


def grpc_name(status: dict[str, Any]) -> str:
    """The gRPC code name of a google.rpc.Status (`code` is a gRPC code, not HTTP; `status` may name it)."""
    name = status.get("status")
    if isinstance(name, str) and name in _GRPC_BY_NAME:
        return name
    code = status.get("code")
    return GRPC_CODES[code][0] if isinstance(code, int) and code in GRPC_CODES else "UNKNOWN"


def status_result(key: str, status: dict[str, Any]) -> Result:
    """A Gemini batch line's google.rpc.Status as a Result: CANCELLED never ran (no status: submitted
    again), every other code is a failure with the HTTP status Google maps it to (the runner's rule)."""
    name = grpc_name(status)
    message = str(status.get("message") or "")
    if name == "CANCELLED":
        return Result(key, None, None, BatchFailure("cancelled", message))
    http = GRPC_CODES[_GRPC_BY_NAME[name]][1]
    return Result(key, http, {"error": {"code": _GRPC_BY_NAME[name], "status": name, "message": f"{name}: {message}"}})


def _gemini_status(state: str) -> str:
    s = state.removeprefix("BATCH_STATE_").removeprefix("JOB_STATE_")
    return {"SUCCEEDED": "completed", "FAILED": "failed", "CANCELLED": "cancelled", "EXPIRED": "expired"}.get(s, "running")


def gemini_state(op: dict[str, Any]) -> BatchState:
    """A Gemini batch operation (`batches.get`) as a `BatchState`."""
    meta = op.get("metadata") or {}
    st = meta.get("batchStats") or {}
    err = op.get("error") or {}  # a failed operation's google.rpc.Status
    errors = [BatchFailure(grpc_name(err), str(err.get("message", "")))] if err else []
    return BatchState(_gemini_status(meta.get("state", "")), int(st.get("requestCount") or 0),
                      int(st.get("successfulRequestCount") or 0), int(st.get("failedRequestCount") or 0), errors)


def gemini_lines(op: dict[str, Any]) -> tuple[str | None, list[dict[str, Any]]]:
    """Where a finished operation's results are: (responses file name, None) or (None, its inlined lines)."""
    resp = op.get("response") or (op.get("metadata") or {}).get("output") or {}
    if resp.get("responsesFile"):
        return resp["responsesFile"], []
    return None, [{"key": (x.get("metadata") or {}).get("key"), **x}
                  for x in (resp.get("inlinedResponses") or {}).get("inlinedResponses", [])]


def gemini_result(x: dict[str, Any], model: str) -> Result | None:
    """One results line (`{"key", "response" | "error"}`) as a Result; None without a key."""
    key = x.get("key")
    if not isinstance(key, str):
        return None
    if x.get("response") is not None:
        return Result(key, 200, gemini_to_completion(x["response"], model))
    return status_result(key, x.get("error") or x.get("status") or {})


class GeminiBatch:
    def __init__(self, profile: ModelProfile, api_key: str | None) -> None:
        u = urlsplit(profile.connection.base_url)
        self.root = f"{u.scheme}://{u.netloc}"  # native paths start at the host, whatever the OpenAI-compat path
        self.model = profile.model.removeprefix("models/")
        self.http = _Http(profile, api_key, {"x-goog-api-key": api_key} if api_key else {})

    async def close(self) -> None:
        await self.http.close()

    @staticmethod
    def _line(request: Request) -> bytes:
        return orjson.dumps({"key": request.custom_id, "request": chat_to_gemini(request.body)}) + b"\n"

    @staticmethod
    def line_size(request: Request) -> int:
        return len(GeminiBatch._line(request))

    async def submit(self, requests: list[Request], token: str) -> str:
        data = b"".join(self._line(r) for r in requests)
        start = {"X-Goog-Upload-Protocol": "resumable", "X-Goog-Upload-Command": "start",
                 "X-Goog-Upload-Header-Content-Length": str(len(data)),
                 "X-Goog-Upload-Header-Content-Type": GEMINI_JSONL_MIME}
        _, headers = await self.http.call("POST", f"{self.root}/upload/v1beta/files", headers=start,
                                          json={"file": {"display_name": token}}, retries=0)
        upload_url = headers.get("X-Goog-Upload-URL")
        if not upload_url:
            raise BatchAPIError(f"{self.http.profile.name}: the file upload did not return an upload URL")
        fin = {"X-Goog-Upload-Command": "upload, finalize", "X-Goog-Upload-Offset": "0"}
        raw, _ = await self.http.call("POST", upload_url, headers=fin, data=data, retries=0)
        file_name = orjson.loads(raw)["file"]["name"]
        body = {"batch": {"display_name": token, "input_config": {"file_name": file_name}}}
        raw, _ = await self.http.call("POST", f"{self.root}/v1beta/models/{self.model}:batchGenerateContent",
                                      json=body, retries=0)
        return orjson.loads(raw)["name"]

    async def find(self, token: str, size: int = 0, since: float = 0.0) -> str | None:
        page_token = None
        for _ in range(20):
            params = {"pageSize": "100"} | ({"pageToken": page_token} if page_token else {})
            raw, _ = await self.http.call("GET", f"{self.root}/v1beta/batches", params=params)
            page = orjson.loads(raw)
            for op in page.get("operations", []):
                meta = op.get("metadata") or {}
                if meta.get("displayName") == token or meta.get("display_name") == token:
                    return op["name"]
            page_token = page.get("nextPageToken")
            if not page_token:
                return None
        return None

    async def _get(self, batch_id: str) -> dict[str, Any]:
        raw, _ = await self.http.call("GET", f"{self.root}/v1beta/{batch_id}")
        return orjson.loads(raw)

    async def state(self, batch_id: str) -> BatchState:
        return gemini_state(await self._get(batch_id))

    async def results(self, batch_id: str) -> list[Result]:
        responses_file, lines = gemini_lines(await self._get(batch_id))
        if responses_file:
            data, _ = await self.http.call("GET", f"{self.root}/download/v1beta/{responses_file}:download",
                                           params={"alt": "media"})
            lines = [orjson.loads(x) for x in data.splitlines() if x.strip()]
        return [r for x in lines if (r := gemini_result(x, self.model)) is not None]

    async def cancel(self, batch_id: str) -> None:
        await self.http.call("POST", f"{self.root}/v1beta/{batch_id}:cancel")


# -- Anthropic Message Batches --------------------------------------------------------------------------
# Anthropic's error types and the HTTP status each stands for (docs.anthropic.com/en/api/errors).
ANTHROPIC_ERRORS: dict[str, int] = {
    "invalid_request_error": 400, "authentication_error": 401, "billing_error": 402, "permission_error": 403,
    "not_found_error": 404, "request_too_large": 413, "rate_limit_error": 429, "api_error": 500,
    "timeout_error": 504, "overloaded_error": 529,
}
_NOT_RAN = {"canceled": ("batch_cancelled", "the batch was cancelled before this request ran"),
            "expired": ("batch_expired", "the batch expired before this request ran")}


def anthropic_state(b: dict[str, Any]) -> BatchState:
    """A Message Batch object as a `BatchState`: ended is completed (or cancelled, when a cancel ended it)."""
    counts = b.get("request_counts") or {}
    n = {k: int(counts.get(k) or 0) for k in ("processing", "succeeded", "errored", "canceled", "expired")}
    if b.get("processing_status") != "ended":
        status = "running"
    else:
        status = "cancelled" if b.get("cancel_initiated_at") else "completed"
    return BatchState(status, sum(n.values()), n["succeeded"], n["errored"] + n["canceled"] + n["expired"])


def anthropic_result(x: dict[str, Any]) -> Result | None:
    """One results line (`{"custom_id", "result": {"type": succeeded | errored | canceled | expired, ...}}`) as
    a Result; None without a custom_id."""
    cid, res = x.get("custom_id"), x.get("result")
    if not isinstance(cid, str) or not isinstance(res, dict):
        return None
    kind = res.get("type")
    if kind == "succeeded" and isinstance(res.get("message"), dict):
        try:
            return Result(cid, 200, from_message(res["message"]))
        except ValueError as e:
            return Result(cid, None, None, BatchFailure("malformed_reply", str(e)))
    if kind in _NOT_RAN:
        return Result(cid, None, None, BatchFailure(*_NOT_RAN[kind]))
    outer = res.get("error")
    outer = outer if isinstance(outer, dict) else {}
    inner = outer.get("error")
    err: dict[str, Any] = inner if isinstance(inner, dict) else outer
    etype = str(err.get("type") or "api_error")
    return Result(cid, ANTHROPIC_ERRORS.get(etype, 500), {"error": {"type": etype, "message": str(err.get("message") or "")}})


CLOCK_SKEW_S = 2.0  # how far the provider's clock may lag ours (both NTP-synced)


def _epoch(stamp: Any) -> float:
    try:
        return datetime.fromisoformat(str(stamp)).timestamp()
    except ValueError:
        return 0.0


class AnthropicBatch:
    def __init__(self, profile: ModelProfile, api_key: str | None) -> None:
        self.base = anthropic_base(profile.connection.base_url)
        wire = dialect(profile)
        if not isinstance(wire, AnthropicWire):
            raise ConfigError(f"model {profile.name!r}: [batch] api = \"anthropic\" needs [connection] wire = \"anthropic\" "
                              "(the Messages API)")
        self.wire = wire
        self.http = _Http(profile, api_key, {k: v for k, v in wire.headers(api_key).items() if k != "Content-Type"})

    async def close(self) -> None:
        await self.http.close()

    def _entry(self, request: Request) -> dict[str, Any]:
        return {"custom_id": request.custom_id, "params": self.wire.params(request.body)}

    def line_size(self, request: Request) -> int:
        return len(orjson.dumps(self._entry(request))) + 1  # its place in the create body's list, comma included

    async def submit(self, requests: list[Request], token: str) -> str:
        body = orjson.dumps({"requests": [self._entry(r) for r in requests]})
        raw, _ = await self.http.call("POST", f"{self.base}/messages/batches", data=body,
                                      headers={"Content-Type": "application/json"}, retries=0)
        return orjson.loads(raw)["id"]

    async def find(self, token: str, size: int = 0, since: float = 0.0) -> str | None:
        """The one batch of `size` requests created since `since` (the job's record, written just before the
        create; less `CLOCK_SKEW_S`), newest first; None when none or several match."""
        found: list[str] = []
        after: str | None = None
        for _ in range(20):
            params = {"limit": "100"} | ({"after_id": after} if after else {})
            raw, _ = await self.http.call("GET", f"{self.base}/messages/batches", params=params)
            page = orjson.loads(raw)
            data = page.get("data") or []
            for b in data:
                if _epoch(b.get("created_at")) < since - CLOCK_SKEW_S:
                    return found[0] if len(found) == 1 else None
                if anthropic_state(b).total == size:
                    found.append(b["id"])
            if not page.get("has_more") or not data:
                break
            after = page.get("last_id") or data[-1]["id"]
        return found[0] if len(found) == 1 else None

    async def _get(self, batch_id: str) -> dict[str, Any]:
        raw, _ = await self.http.call("GET", f"{self.base}/messages/batches/{batch_id}")
        return orjson.loads(raw)

    async def state(self, batch_id: str) -> BatchState:
        return anthropic_state(await self._get(batch_id))

    async def results(self, batch_id: str) -> list[Result]:
        b = await self._get(batch_id)
        url = b.get("results_url") or f"{self.base}/messages/batches/{batch_id}/results"
        data, _ = await self.http.call("GET", url)
        lines = json_lines(data.splitlines(), f"batch {batch_id} results")
        return [r for _, x in lines if (r := anthropic_result(x)) is not None]

    async def cancel(self, batch_id: str) -> None:
        await self.http.call("POST", f"{self.base}/messages/batches/{batch_id}/cancel")


def batch_kind(profile: ModelProfile) -> str:
    """The profile's batch API, or one `ConfigError` line saying how to declare one."""
    kind = profile.batch.api
    if kind in DEFAULT_LIMITS:
        return kind
    if profile.connection.provider and "/" in profile.name:  # --model PROVIDER/MODEL: no file to add it to
        raise ConfigError(f"model {profile.name!r}: {profile.connection.provider} has no batch API this evaluator can use "
                          "(`python -m evaluator models` lists which do); run without --batch")
    raise ConfigError(
        f"model {profile.name!r} declares no batch API: add [batch] api = \"openai\" (OpenAI-compatible /v1/batches), "
        f"api = \"gemini\" or api = \"anthropic\" to its profile (configs/models/{profile.name}.toml or the .toml "
        "you passed), or run without --batch"
    )


def batch_api(profile: ModelProfile, api_key: str | None) -> BatchAPI:
    kind = batch_kind(profile)
    if kind == "anthropic":
        return AnthropicBatch(profile, api_key)
    return OpenAIBatch(profile, api_key) if kind == "openai" else GeminiBatch(profile, api_key)


def batch_limits(profile: ModelProfile) -> tuple[int | None, int | None]:
    """(requests, bytes) per batch: the profile's [batch] `max_requests` / `max_bytes`, else the provider's."""
    req, size = DEFAULT_LIMITS[batch_kind(profile)]
    return profile.batch.max_requests or req, profile.batch.max_bytes or size
