"""A chat call's result and the reading of a provider's 200 body into one (no I/O)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson


@dataclass
class ChatResult:
    content: str | None
    finish_reason: str | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: bool = False
    error: str | None = None  # set when the call failed for good (non-fatal); such results are never cached
    error_kind: str | None = None  # with `error`: `http_400`, `timeout`, `connection`, `http_503`, ...
    reasoning_only: bool = False  # the text came from reasoning_content / reasoning (content was null)
    # The provider's reply body as it came, with `keep_raw` (a deliberate dict[str, Any]: a provider's JSON).
    raw: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def truncated(self) -> bool:
        """Cut at max_tokens: still the model's real output for this request, returned and cached."""
        return self.finish_reason == "length"


def read_reply(raw: bytes | dict[str, Any], keep_raw: bool = False) -> ChatResult:
    """A 200 body (bytes, or already decoded) -> its result.

    An unusable body comes back with `error` set (`malformed_reply`: not OpenAI chat JSON;
    `empty_reply`: no text at all), keeping the tokens its usage reports: those are billed anyway.
    """
    try:
        data = orjson.loads(raw) if isinstance(raw, bytes | bytearray) else raw
        choice = data["choices"][0]
        msg = choice.get("message") or {}
        usage = data.get("usage") or {}
        pt, ct = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        content, finish = msg.get("content"), choice.get("finish_reason")
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError, ValueError):
        return ChatResult(None, None, error="malformed reply (not OpenAI chat JSON)", error_kind="malformed_reply")
    result = ChatResult(content, finish, pt, ct, raw=data if keep_raw else None)
    if not content:
        # content null: reasoning models (gpt-oss on vLLM/OpenRouter) put their text here instead.
        reasoning = msg.get("reasoning_content") or msg.get("reasoning")
        if reasoning:
            result.content, result.reasoning_only = reasoning, True
        elif finish == "length":  # cut before any text: still a real (empty) output
            result.content = ""
        else:
            result.content = None
            result.error = f"empty reply (content null, finish_reason={finish})"
            result.error_kind = "empty_reply"
    return result
