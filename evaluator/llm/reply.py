"""A chat call's result and the reading of a provider's 200 body into one (no I/O).

Accepted reply shapes (`message` of the first choice), and nothing else:
- `content` a string;
- `content` a list of content parts (`[{"type": "text", "text": ...}, ...]`, as several
  OpenAI-compatible servers send): the text parts joined; parts of other types (images, refusals
  with their own field) carry no text for this evaluator;
- `content` null with `tool_calls`: the calls' `function.arguments` (the answer a tool-calling model
  writes), joined by newlines;
- `content` null (or empty) with `reasoning_content` / `reasoning` (reasoning models): that text,
  marked `reasoning_only`.
Any other shape (content a number or an object, parts that are not objects, a finish_reason or usage
of the wrong type) is one `malformed_reply`, never an exception. A refusal (finish_reason "refusal", as the
Anthropic wire maps Anthropic's stop_reason, or OpenAI's `message.refusal` without content) is a failed
reply of kind `refusal`: never cached, its tokens still billed.

Prompt tokens the provider served from its prompt cache: `usage.prompt_tokens_details.cached_tokens`
(OpenAI, Gemini's OpenAI-compatible endpoint, Groq, vLLM, the Anthropic wire), DeepSeek's
`usage.prompt_cache_hit_tokens`; those written into it: `prompt_tokens_details.cache_write_tokens`
(the Anthropic wire's cache_creation_input_tokens). Both are part of `prompt_tokens`. The text read loses every configured
key (`core.redact.scrub`): a server quoting the key back never gets it into the cache or the results.

Why a reply ended (`cut`): `finish_reason` "stop" (or a tool call) is a whole reply; "length" with all
of the request's `max_tokens` used is `max_tokens` (the model's real output for this request); "length"
with fewer tokens than asked is `context` (the server's context, or a server-side limit, ended it);
"content_filter" is `content_filter`; any other reason is kept as given. The rule is `cut_cause`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from evaluator.core.redact import scrub

# finish_reason values of a whole reply: the model stopped on its own (or called a tool)
WHOLE = frozenset({"stop", "tool_calls", "function_call", "eos", "end_turn", "stop_sequence"})
MAX_TOKENS, CONTEXT, CONTENT_FILTER = "max_tokens", "context", "content_filter"
REFUSAL = "refusal"  # the error kind of a reply the provider refused to give (never worth a retry)
EMPTY_REPLY = "empty_reply"  # a 200 with no text at all (content null or empty, no reasoning, not cut)
# What each cut cause means, for warnings and the report.
CUT_TEXT = {
    MAX_TOKENS: "cut at max_tokens",
    CONTEXT: "cut by the server's context size (finish_reason length before max_tokens)",
    CONTENT_FILTER: "cut by the provider's content filter",
}


def cut_cause(finish_reason: str | None, completion_tokens: int, max_tokens: int | None,
              *, usage_known: bool = True, max_tokens_known: bool = True) -> str | None:
    """Why a reply ended early (see the module doc), or None for a whole reply. Without the request's
    max_tokens (`max_tokens_known` False: an imported result), "length" is taken as max_tokens."""
    if finish_reason is None or finish_reason in WHOLE:
        return None
    if finish_reason == "length":
        if not max_tokens_known:
            return MAX_TOKENS
        if max_tokens is None:
            return CONTEXT  # no limit was asked for: the server's own limit ended it
        if usage_known and 0 <= completion_tokens < max_tokens:
            return CONTEXT
        return MAX_TOKENS
    return finish_reason


def describe_cut(cause: str) -> str:
    return CUT_TEXT.get(cause, f"cut short (finish_reason {cause})")


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
    usage_missing: bool = False  # the body carried no usage: the tokens are estimates (core/tokens.py's rule)
    cut: str | None = None  # why the reply ended early (`cut_cause`), None for a whole reply
    cached_tokens: int = 0  # of prompt_tokens: served from the provider's prompt cache
    cache_write_tokens: int = 0  # of prompt_tokens: written into it (Anthropic's cache writes)

    @property
    def truncated(self) -> bool:
        """Cut at max_tokens: still the model's real output for this request, returned and cached."""
        return self.finish_reason == "length"


_MALFORMED = "malformed reply (not OpenAI chat JSON)"


def _malformed(why: str = "") -> ChatResult:
    return ChatResult(None, None, error=_MALFORMED + (f": {why}" if why else ""), error_kind="malformed_reply")


def _text_of(content: Any) -> str | None:
    """The text of a `content` field; raises ValueError for a shape that is not documented."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict):
                raise ValueError("a content part that is not an object")
            text = part.get("text")
            if part.get("type", "text") in ("text", "output_text") and text is not None:
                if not isinstance(text, str):
                    raise ValueError("a text part whose text is not a string")
                texts.append(text)
        return "".join(texts)
    raise ValueError(f"content of type {type(content).__name__}")


def _tool_text(calls: Any) -> str | None:
    if not isinstance(calls, list) or not calls:
        return None
    args = []
    for c in calls:
        fn = c.get("function") if isinstance(c, dict) else None
        a = fn.get("arguments") if isinstance(fn, dict) else None
        if isinstance(a, dict | list):
            a = orjson.dumps(a).decode()
        if not isinstance(a, str):
            raise ValueError("a tool call without string arguments")
        args.append(a)
    return "\n".join(args)


def _tokens(usage: Any, name: str) -> int:
    v = usage.get(name)
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
        raise ValueError(f"usage.{name} is not a count")
    return int(v)


def _cache_tokens(usage: dict[str, Any], prompt: int) -> tuple[int, int]:
    """(cache reads, cache writes) of a usage object (see the module doc), at most the prompt's tokens."""
    details = usage.get("prompt_tokens_details")
    details = details if isinstance(details, dict) else {}
    read = _tokens(details, "cached_tokens") or _tokens(usage, "prompt_cache_hit_tokens")
    write = _tokens(details, "cache_write_tokens")
    return min(read, prompt), min(write, max(0, prompt - read))


def read_reply(raw: bytes | dict[str, Any], keep_raw: bool = False, *, max_tokens: int | None = None,
               max_tokens_known: bool = False) -> ChatResult:
    """A 200 body (bytes, or already decoded) -> its result.

    An unusable body comes back with `error` set (`malformed_reply`: not OpenAI chat JSON or a shape
    the module doc does not list; `empty_reply`: no text at all), keeping the tokens its usage
    reports: those are billed anyway. `max_tokens` (of the request) tells a cut at max_tokens from
    one by the server's context.
    """
    try:
        data = orjson.loads(raw) if isinstance(raw, bytes | bytearray) else raw
        choice = data["choices"][0]
        msg = choice.get("message") or {}
        if not isinstance(msg, dict):
            raise ValueError("message is not an object")
        usage = data.get("usage")
        if usage is not None and not isinstance(usage, dict):
            raise ValueError("usage is not an object")
        pt = _tokens(usage or {}, "prompt_tokens")
        ct = _tokens(usage or {}, "completion_tokens")
        finish = choice.get("finish_reason")
        if finish is not None and not isinstance(finish, str):
            raise ValueError("finish_reason is not a string")
        content = _text_of(msg.get("content"))
        if not content:
            content = _tool_text(msg.get("tool_calls")) or content
        reasoning = msg.get("reasoning_content") or msg.get("reasoning")
        if reasoning is not None and not isinstance(reasoning, str):
            reasoning = _text_of(reasoning)
        cached, written = _cache_tokens(usage or {}, pt)
        refused = msg.get("refusal") if not content and isinstance(msg.get("refusal"), str) else None
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError) as e:
        return _malformed(type(e).__name__)
    except ValueError as e:
        return _malformed(str(e)[:120])
    # A server may quote the key back in a 200 reply: redacted here, before anything caches, records or shows it.
    content = scrub(content) if content else content
    reasoning = scrub(reasoning) if reasoning else reasoning
    no_usage = not usage or ("prompt_tokens" not in usage and "completion_tokens" not in usage)
    result = ChatResult(content, finish, pt, ct, raw=data if keep_raw else None, usage_missing=no_usage,
                        cached_tokens=cached, cache_write_tokens=written)
    if finish == REFUSAL or refused:
        result.content, result.error, result.error_kind = None, (
            "the provider refused to answer" + (f": {refused[:200]}" if refused else " (stop_reason refusal)")), REFUSAL
        return result
    result.cut = cut_cause(finish, ct, max_tokens, usage_known=not no_usage, max_tokens_known=max_tokens_known)
    if not content:
        # content null: reasoning models (gpt-oss on vLLM/OpenRouter) put their text here instead.
        if reasoning:
            result.content, result.reasoning_only = reasoning, True
        elif result.cut is not None:  # cut before any text: still a real (empty) output
            result.content = ""
        else:
            result.content = None
            result.error = f"empty reply (content null, finish_reason={finish})"
            result.error_kind = EMPTY_REPLY
    return result
