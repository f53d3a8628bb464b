"""The one token rule: how many tokens a chat request's prompt, or a reply's text, counts for.

No tokenizer is needed (none is installed): characters of each message's text divided by the profile's
`chars_per_token` (4.0: OpenAI's rule of thumb for English), plus `MESSAGE_TOKENS` per message for the
role and separators (OpenAI's cookbook counts 3-4), plus the `response_format` JSON when one is sent
(a provider reads the schema as part of the prompt, so it is counted wherever the prompt is: the dry
run, the budget, TPM pacing, and the simulator's bill). The simulator bills by this rule, so against it
the figures are exact; against a real provider they are an estimate.
"""

from __future__ import annotations

from typing import Any

import orjson

CHARS_PER_TOKEN = 4.0  # the default of a profile's `chars_per_token`, and the simulator's
MESSAGE_TOKENS = 4  # per message: role and separators


def _text_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):  # OpenAI content parts: only the text parts are counted
        return sum(len(p.get("text") or "") for p in content if isinstance(p, dict))
    return 0


def prompt_tokens(body: dict[str, Any], chars_per_token: float = CHARS_PER_TOKEN) -> int:
    """The prompt tokens of one chat-completions request body."""
    messages = body.get("messages") or []
    chars = sum(_text_chars(m.get("content")) for m in messages if isinstance(m, dict))
    n = int(chars / chars_per_token) + MESSAGE_TOKENS * len(messages)
    rf = body.get("response_format")
    if isinstance(rf, dict) and rf.get("type") != "text":
        n += int(len(orjson.dumps(rf)) / chars_per_token)
    return n


def text_tokens(text: str, chars_per_token: float = CHARS_PER_TOKEN) -> int:
    """The tokens of a reply's text (at least 1: a reply is never free)."""
    return max(1, int(len(text) / chars_per_token))
