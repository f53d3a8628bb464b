"""The wire dialects: how a chat request goes to the host and how its 200 body comes back.

The engine prepares, keys and caches every call as an OpenAI chat-completions request, and reads every reply
as a chat.completion body (llm/reply.py, one rule). A dialect sits between that and the host:

- `OpenAIWire`: the body as it is, POSTed to `/chat/completions` with `Authorization: Bearer KEY` (OpenAI and
  every OpenAI-compatible host: Gemini's endpoint, vLLM, SGLang, Ollama, llama.cpp, Together, Groq, ...).
- `AnthropicWire`: Anthropic's Messages API, POSTed to `/messages` with `x-api-key` and `anthropic-version`.
  `to_messages`: the system messages go apart into `system` (one text block, marked `cache_control` when
  the profile's prompt cache is "explicit", so the shared instructions are cached), `max_tokens` is always
  sent (the API requires it), `seed` is dropped (the API has none), `stop` becomes `stop_sequences`, and a
  `json_schema` response_format becomes a forced tool whose `input_schema` is the schema (Anthropic's way to
  constrain JSON); other extra fields (`top_k`, `thinking`, `metadata`) pass through. `from_message`: the
  Messages reply as a chat.completion: text blocks joined as the content, tool_use blocks as tool calls
  (their `input` as the JSON arguments), thinking blocks as reasoning; `stop_reason` end_turn / stop_sequence
  -> "stop", max_tokens -> "length" (a cut reply), model_context_window_exceeded -> "length" (cut by the
  context), tool_use -> "tool_calls", refusal -> "refusal" (a failed reply, llm/reply.py); usage's
  input_tokens + cache_creation_input_tokens + cache_read_input_tokens as the prompt tokens (Anthropic counts
  cached ones apart), the cache reads as `prompt_tokens_details.cached_tokens` and the writes as
  `prompt_tokens_details.cache_write_tokens`. Recorded bodies of Anthropic's documentation:
  tests/fixtures/providers/anthropic/.

Error bodies need no translation: Anthropic's `{"type": "error", "error": {"type", "message"}}` is read by
llm/retry.py as OpenAI's is (its 529 `overloaded_error` is a server error honouring `retry-after`).
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from evaluator.llm.profiles import ModelProfile

ANTHROPIC_VERSION = "2023-06-01"  # the Messages API version every request names (the current one)
# Anthropic requires max_tokens; a profile that sets none gets this.
ANTHROPIC_DEFAULT_MAX_TOKENS = 4096
_CACHE_MARK = {"type": "ephemeral"}  # Anthropic's 5-minute prompt cache
_STOP = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
         "model_context_window_exceeded": "length", "refusal": "refusal"}
# Chat fields the translation reads; every other field of the body is Anthropic's own (extra_body) and passes.
_CHAT_FIELDS = {"model", "messages", "temperature", "max_tokens", "max_completion_tokens", "seed", "top_p", "stop",
                "response_format"}


class Dialect(Protocol):
    """How one host takes a chat request and answers it (see the module doc)."""

    def url(self, base_url: str) -> str: ...  # where a chat request is POSTed

    def headers(self, api_key: str | None) -> dict[str, str]: ...

    def encode(self, body: dict[str, Any]) -> bytes: ...

    def decode(self, raw: bytes) -> bytes:
        """A 200 body as chat.completion JSON (a body it cannot read is returned as it came: malformed)."""
        ...


class OpenAIWire:
    def url(self, base_url: str) -> str:
        return base_url.rstrip("/") + "/chat/completions"

    def headers(self, api_key: str | None) -> dict[str, str]:
        return {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {api_key}"} if api_key else {})

    def encode(self, body: dict[str, Any]) -> bytes:
        return orjson.dumps(body)

    def decode(self, raw: bytes) -> bytes:
        return raw


def _text(content: Any) -> str:
    if isinstance(content, list):  # OpenAI content parts
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def to_messages(body: dict[str, Any], *, cache: bool = False,
                default_max_tokens: int = ANTHROPIC_DEFAULT_MAX_TOKENS) -> dict[str, Any]:
    """A chat-completions body as a Messages API body (see the module doc); `cache` marks the system prompt."""
    system = [_text(m.get("content")) for m in body.get("messages") or [] if m.get("role") in ("system", "developer")]
    messages = [{"role": "assistant" if m.get("role") == "assistant" else "user", "content": _text(m.get("content"))}
                for m in body.get("messages") or [] if m.get("role") not in ("system", "developer")]
    out: dict[str, Any] = {"model": body.get("model"), "messages": messages,
                           "max_tokens": body.get("max_tokens") or body.get("max_completion_tokens") or default_max_tokens}
    if system:
        block: dict[str, Any] = {"type": "text", "text": "\n\n".join(system)}
        if cache:
            block["cache_control"] = _CACHE_MARK
        out["system"] = [block]
    if "temperature" in body:
        out["temperature"] = body["temperature"]
    if "top_p" in body:
        out["top_p"] = body["top_p"]
    if body.get("stop"):
        out["stop_sequences"] = body["stop"] if isinstance(body["stop"], list) else [body["stop"]]
    rf = body.get("response_format")
    if isinstance(rf, dict) and rf.get("type") == "json_schema" and isinstance(rf.get("json_schema"), dict):
        spec = rf["json_schema"]
        name = str(spec.get("name") or "answer")
        out["tools"] = [{"name": name, "description": "Give the answer in this shape.",
                         "input_schema": spec.get("schema") or {"type": "object"}}]
        out["tool_choice"] = {"type": "tool", "name": name}
    out.update({k: v for k, v in body.items() if k not in _CHAT_FIELDS})
    return out


def _count(usage: dict[str, Any], name: str) -> int:
    v = usage.get(name)
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) and v > 0 else 0


def from_message(msg: dict[str, Any]) -> dict[str, Any]:
    """A Messages API reply as the chat.completion body the engine reads (see the module doc)."""
    blocks = msg.get("content")
    if not isinstance(blocks, list):
        raise ValueError("content is not a list of blocks")
    text = "".join(str(b.get("text") or "") for b in blocks if isinstance(b, dict) and b.get("type") == "text")
    thinking = "".join(str(b.get("thinking") or "") for b in blocks if isinstance(b, dict) and b.get("type") == "thinking")
    calls = [{"id": b.get("id", ""), "type": "function",
              "function": {"name": b.get("name", ""), "arguments": orjson.dumps(b.get("input", {})).decode()}}
             for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["reasoning_content"] = thinking
    stop = msg.get("stop_reason")
    body: dict[str, Any] = {
        "id": msg.get("id", ""), "object": "chat.completion", "model": msg.get("model", ""),
        "choices": [{"index": 0, "message": message, "finish_reason": _STOP.get(stop, stop) if isinstance(stop, str) else None}],
    }
    usage = msg.get("usage")
    if isinstance(usage, dict):
        read, write = _count(usage, "cache_read_input_tokens"), _count(usage, "cache_creation_input_tokens")
        prompt, completion = _count(usage, "input_tokens") + read + write, _count(usage, "output_tokens")
        body["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                         "prompt_tokens_details": {"cached_tokens": read, "cache_write_tokens": write}}
    return body


def anthropic_base(base_url: str) -> str:
    """The API root ending in /v1: the table's `https://api.anthropic.com/v1`, or a root without it as the
    `anthropic` SDK takes one (its ANTHROPIC_BASE_URL, e.g. a gateway's `https://gw.example/anthropic`)."""
    base = base_url.rstrip("/")
    return base if base.endswith("/v1") else base + "/v1"


class AnthropicWire:
    def url(self, base_url: str) -> str:
        return anthropic_base(base_url) + "/messages"

    def __init__(self, *, cache: bool, max_tokens: int | None) -> None:
        self._cache = cache
        self._max_tokens = max_tokens or ANTHROPIC_DEFAULT_MAX_TOKENS

    def headers(self, api_key: str | None) -> dict[str, str]:
        return {"Content-Type": "application/json", "anthropic-version": ANTHROPIC_VERSION} | (
            {"x-api-key": api_key} if api_key else {})

    def params(self, body: dict[str, Any]) -> dict[str, Any]:
        """The Messages body of one chat body (a Message Batches request's `params` too)."""
        return to_messages(body, cache=self._cache, default_max_tokens=self._max_tokens)

    def encode(self, body: dict[str, Any]) -> bytes:
        return orjson.dumps(self.params(body))

    def decode(self, raw: bytes) -> bytes:
        try:
            msg = orjson.loads(raw)
            return orjson.dumps(from_message(msg)) if isinstance(msg, dict) else raw
        except (orjson.JSONDecodeError, ValueError, TypeError, AttributeError):
            return raw  # read_reply calls it malformed


def dialect(profile: ModelProfile) -> OpenAIWire | AnthropicWire:
    """The profile's wire dialect."""
    if profile.connection.wire == "anthropic":
        return AnthropicWire(cache=profile.prompt.cache == "explicit", max_tokens=profile.sampling.max_tokens)
    return OpenAIWire()
