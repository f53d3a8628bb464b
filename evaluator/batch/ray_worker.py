"""What runs on Ray's workers for `requests run --engine ray`: Ray Data LLM's preprocess, postprocess and
the HTTP session its processor sends with. Standard library and aiohttp only (both on every Ray node):
`ray_engine` ships this module by value (cloudpickle), so a cluster needs nothing of the evaluator.

Ray 2.60's `HttpRequestUDF` (ray/llm/_internal/batch/stages/http_request_stage.py) is used as it is;
the session it is handed (`HttpRequestProcessorConfig.session_factory`) changes four things:
- **Concurrency.** The UDF creates every `session.post(...)` of a batch first (paced by `qps`), then
  awaits them one by one; an aiohttp request does not start until awaited, so a batch went out one
  request at a time (bench/README.md, "batch/ray_worker.py"). Here `post` starts the request at once: a
  batch is in flight together, as the UDF's comments intend.
- **Errors per row.** After its last retry the UDF raises, which fails the whole block (every paid reply
  of the batch lost) and the Dataset. Here the last attempt always hands the UDF a 200 whose JSON says
  what happened (the real status and body, or the transport error), so the row comes back as an error.
- **Status and body.** The UDF keeps only `response.json()`, losing the status (a 400's error body
  would read as a reply) and raising on a body that is not JSON; here `json()` is the envelope
  `{"status", "text", "error", "message"}`: flat strings, whatever the provider sent.
- **The key.** It is read here from the worker's environment (`key_env`), never passed through `headers`
  (Ray 2.60 keeps a stage's constructor arguments in the object store), and its value is cut out of
  every reply before the reply enters Ray (a provider may quote the key in an error).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from typing import Any

import aiohttp

# HttpRequestUDF.RETRYABLE_STATUS_CODES in Ray 2.60: the UDF retries these, and transport errors.
RETRYABLE = frozenset({408, 429, 502, 503, 504})
TRANSPORT = (asyncio.TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)


def preprocess(row: dict[str, Any]) -> dict[str, Any]:
    """The request as the evaluator prepared it, as one string (`KeyedSession` sends it byte for byte):
    Arrow blocks then hold plain strings, not each provider's nested schemas."""
    return {"payload": {"body": row["body"]}}


def postprocess(row: dict[str, Any]) -> dict[str, Any]:
    reply = row["http_response"]
    return {"custom_id": row["custom_id"], "key": row["key"], "status": int(reply["status"]),
            "text": reply["text"], "error": reply["error"], "message": reply["message"]}


def vllm_preprocess(row: dict[str, Any]) -> dict[str, Any]:
    """A chat request for Ray Data LLM's vLLM processor (chat template applied by its own stage)."""
    body = json.loads(row["body"])
    sampling = {k: body[k] for k in ("temperature", "max_tokens", "seed", "top_p") if body.get(k) is not None}
    return {"messages": body["messages"], "sampling_params": sampling}


def vllm_postprocess(row: dict[str, Any]) -> dict[str, Any]:
    """vLLM's generated text as the chat.completion an OpenAI-compatible server would have sent."""
    prompt, completion = int(row.get("num_input_tokens") or 0), int(row.get("num_generated_tokens") or 0)
    body = {"id": f"ray-vllm-{row['custom_id'][:24]}", "object": "chat.completion", "model": row.get("model", ""),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": row.get("generated_text", "")},
                         "finish_reason": "length" if row.get("finish_reason") == "length" else "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}
    return {"custom_id": row["custom_id"], "key": row["key"], "status": 200, "text": json.dumps(body),
            "error": "", "message": ""}


class _Reply:
    """What `HttpRequestUDF` reads of a response: `status`, `reason`, `json()`, `async with`."""

    def __init__(self, status: int, envelope: dict[str, Any]) -> None:
        self.status = status
        self.reason = f"HTTP {envelope['status']}"
        self._envelope = envelope

    async def __aenter__(self) -> _Reply:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def json(self) -> dict[str, Any]:
        return self._envelope


class KeyedSession:
    """The session `HttpRequestUDF` opens per batch (see the module docstring)."""

    def __init__(self, key_env: str | None, timeout_s: float, max_retries: int, connections: int) -> None:
        self._key = os.environ.get(key_env, "").strip() if key_env else ""
        self._mark = f"[REDACTED:{key_env}]"
        headers = {"Authorization": f"Bearer {self._key}"} if self._key else {}
        self._session = aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s),
                                              connector=aiohttp.TCPConnector(limit=max(1, connections)))
        self._max_retries = max_retries
        self._attempts: dict[str, int] = {}

    async def __aenter__(self) -> KeyedSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._session.close()

    def post(self, url: str, *, headers: dict[str, Any] | None = None, data: Any = None) -> asyncio.Future[_Reply]:
        return asyncio.ensure_future(self._send(url, dict(headers or {}), data))

    def _clean(self, text: str) -> str:
        return text.replace(self._key, self._mark) if len(self._key) >= 6 else text

    async def _send(self, url: str, headers: dict[str, Any], data: Any) -> _Reply:
        body = json.loads(data)["body"]  # the UDF wraps our payload in JSON: unwrap the prepared request
        n = self._attempts[body] = self._attempts.get(body, 0) + 1
        last = n > self._max_retries
        try:
            async with self._session.post(url, data=body.encode(), headers=headers) as resp:
                status, text = resp.status, await resp.text(errors="replace")
        except TRANSPORT as e:
            if not last:
                raise  # the UDF backs off and asks again
            kind = "timeout" if isinstance(e, asyncio.TimeoutError) else "connection"
            return _Reply(200, {"status": 0, "text": "", "error": kind, "message": self._clean(type(e).__name__)})
        envelope = {"status": status, "text": self._clean(text), "error": "", "message": ""}
        # A retryable status before the last attempt goes to the UDF as it is (it retries); after, as a row.
        return _Reply(status if status in RETRYABLE and not last else 200, envelope)


def session_factory(key_env: str | None, timeout_s: float, max_retries: int,
                    connections: int) -> Callable[[], KeyedSession]:
    """`HttpRequestProcessorConfig.session_factory`: carries the key's variable name, never its value."""
    return lambda: KeyedSession(key_env, timeout_s, max_retries, connections)
