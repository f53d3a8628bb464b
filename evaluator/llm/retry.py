"""What a failed HTTP exchange means: retry (and after how long) or stop, and the backoff schedule.

Providers say "retry later" in many dialects: `Retry-After` (seconds or an HTTP-date),
`retry-after-ms`, OpenAI's `x-ratelimit-reset-requests/-tokens` Go-style durations ("6m0s", "20ms"),
and Gemini's `RetryInfo.retryDelay` ("13s") inside a JSON error body that may be a list. A hint of 0,
a negative or an unparsable one is no hint: the caller falls back to exponential backoff with a floor
(a host answering `Retry-After: 0` to every 429 would otherwise be hammered with no wait at all).

A 400 that names a request field (`seed`, `response_format`, ...) is told apart by `rejected_fields`,
so the engine can drop that field for the model instead of failing every call.
"""

from __future__ import annotations

import email.utils
import math
import random
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import orjson

# The error kind of a call whose prompt cannot fit the model's context: refused by the server (`classify_http`), or
# known before sending from the profile's `context_tokens` (llm.budget) and then never sent.
CONTEXT_EXCEEDED = "context_exceeded"

_GO_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PER_DAY = re.compile(r"per[ _-]?day|daily", re.IGNORECASE)


class Kind(Enum):
    RETRY = "retry"  # transient: back off and send again
    FATAL = "fatal"  # the command cannot go on with this model
    GIVE_UP = "give_up"  # this one call cannot succeed (e.g. 400), the others may


@dataclass(frozen=True)
class Verdict:
    kind: Kind
    reason: str  # short, already free of secrets only if the caller redacts it
    retry_after: float | None = None  # seconds the server asked us to wait, if it said
    is_429: bool = False
    limit_rpm: float | None = None  # the requests-per-minute limit the server announced, if any
    fatal_when_exhausted: bool = False  # e.g. nothing listens at the URL: no point in every call failing
    label: str = ""  # error kind for the failure counts (`http_503`, `timeout`, `connection`, ...)


def parse_duration(text: str) -> float | None:
    """Go/proto durations ("1s", "6m0s", "20ms", "1h2m3.5s", "13.5s") or a bare number of seconds."""
    text = text.strip()
    if not text:
        return None
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    parts = _GO_DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _GO_UNITS[u] for n, u in parts)


def parse_retry_after_header(value: str, now: float | None = None) -> float | None:
    """`Retry-After`: delta-seconds or an HTTP-date (RFC 9110)."""
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    now = time.time() if now is None else now
    return max(0.0, when.timestamp() - now)


def _usable(delay: float | None) -> float | None:
    """A hint we can act on: a finite, positive number of seconds (0, negative, NaN are no hint)."""
    return delay if delay is not None and math.isfinite(delay) and delay > 0 else None


def retry_after_from_headers(headers: Mapping[str, str]) -> float | None:
    """The wait the headers ask for, most precise form first; None if they do not say anything usable."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            if (delay := _usable(float(ms) / 1000.0)) is not None:
                return delay
        except ValueError:
            pass
    ra = headers.get("retry-after")
    if ra:
        try:
            raw_delay = float(ra.strip())
        except ValueError:
            raw_delay = None
        # A date in the past parses to 0 (and "-1" to a negative): both mean "no usable hint".
        delay = _usable(raw_delay) if raw_delay is not None else _usable(parse_retry_after_header(ra))
        if delay is not None:
            return delay
    # OpenAI-style resets: prefer the one whose budget is exhausted, else the longest.
    resets = []
    for kind in ("requests", "tokens"):
        reset = headers.get(f"x-ratelimit-reset-{kind}")
        if not reset:
            continue
        delay = _usable(parse_duration(reset))
        if delay is None:
            continue
        if headers.get(f"x-ratelimit-remaining-{kind}", "").strip() == "0":
            return delay
        resets.append(delay)
    return max(resets) if resets else None


def error_object(body: Any) -> dict[str, Any]:
    """The `error` object of an OpenAI- or Gemini-shaped error body (dict, or a list of them)."""
    if isinstance(body, list):
        body = body[0] if body else {}
    if not isinstance(body, dict):
        return {}
    err = body.get("error", body)
    return err if isinstance(err, dict) else {"message": str(err)}


def decode_body(raw: bytes) -> Any:
    try:
        return orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        return raw[:500].decode("utf-8", "replace")


def retry_after_from_body(err: Mapping[str, Any]) -> float | None:
    """Gemini's `details[@type=...RetryInfo].retryDelay`."""
    for d in err.get("details") or ():
        if isinstance(d, dict) and str(d.get("@type", "")).endswith("RetryInfo") and d.get("retryDelay"):
            return _usable(parse_duration(str(d["retryDelay"])))
    return None


# "Please retry in 10h17m5.7s." (Gemini's message), "Please try again in 976ms." (OpenAI's): the only hint
# some bodies carry.
_RETRY_IN_TEXT = re.compile(r"(?:retry|try again) in ((?:\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m|h))+)", re.IGNORECASE)


def retry_after_from_message(message: str) -> float | None:
    """The wait a 429's message text names, when neither headers nor RetryInfo do."""
    m = _RETRY_IN_TEXT.search(message)
    return _usable(parse_duration(m.group(1))) if m else None


def _api_key_invalid(err: Mapping[str, Any]) -> bool:
    """Gemini answers a key it does not accept with 400 INVALID_ARGUMENT, ErrorInfo reason API_KEY_INVALID."""
    return any(isinstance(d, dict) and d.get("reason") == "API_KEY_INVALID" for d in err.get("details") or ())


def rpm_from_reply(headers: Mapping[str, str], err: Mapping[str, Any]) -> float | None:
    """The RPM limit a 429 announces: OpenAI's `x-ratelimit-limit-requests`, Gemini's per-minute quotaValue.

    (Some hosts put a per-day figure in that header; pacing to it is then merely ineffective, not harmful.)
    """
    value = headers.get("x-ratelimit-limit-requests")
    if value:
        try:
            return float(value) if float(value) > 0 else None
        except ValueError:
            pass
    for d in err.get("details") or ():
        if isinstance(d, dict):
            for v in d.get("violations") or ():
                if isinstance(v, dict) and "PerMinute" in str(v.get("quotaId", "")) and "Request" in str(v.get("quotaId", "")):
                    try:
                        return float(v.get("quotaValue", "")) or None
                    except ValueError:
                        return None
    return None


def _quota_ids(err: Mapping[str, Any]) -> list[str]:
    ids = []
    for d in err.get("details") or ():
        if isinstance(d, dict):
            for v in d.get("violations") or ():
                if isinstance(v, dict):
                    ids.append(str(v.get("quotaId", "")) + " " + str(v.get("quotaMetric", "")))
    return ids


def is_daily_quota(err: Mapping[str, Any]) -> bool:
    """A quota that will not come back within the command: Gemini per-day ids/messages, OpenAI billing."""
    if any("PerDay" in q or _PER_DAY.search(q) for q in _quota_ids(err)):
        return True
    msg = str(err.get("message", ""))
    if "quota" in msg.lower() and _PER_DAY.search(msg):
        return True
    return err.get("code") == "insufficient_quota" or err.get("type") == "insufficient_quota"


def _spend_limit(err: Mapping[str, Any]) -> bool:
    """Anthropic's 429 for an organisation past its monthly spend limit (`error.details.error_code`)."""
    details = err.get("details")
    return isinstance(details, dict) and details.get("error_code") == "enforced_spend_limit_reached"


# How servers say a request does not fit the model's context: llama.cpp ("request (810 tokens) exceeds the
# available context size (256 tokens)", type exceed_context_size_error: tests/fixtures/providers/online/
# llama_cpp_400_exceeds_context.json), OpenAI (code context_length_exceeded), vLLM ("This model's maximum
# context length is 2048 tokens"), Gemini ("input token count ... exceeds the maximum"), Anthropic ("prompt is too
# long: 210000 tokens > 200000 maximum").
_CONTEXT_RE = re.compile(
    r"exceeds? the available context size|context[_ ]length[_ ]exceeded|maximum context length|"
    r"exceed_context_size|context window|input token count .{0,40}exceeds|prompt is too long", re.IGNORECASE)


def exceeds_context(err: Mapping[str, Any], message: str) -> bool:
    """The error says the request is longer than the model's (or server's) context."""
    text = " ".join([message, str(err.get("type") or ""), str(err.get("code") or "")])
    return bool(_CONTEXT_RE.search(text))


def classify_http(status: int, headers: Mapping[str, str], raw: bytes) -> Verdict:
    """Decide what a non-200 reply means."""
    err = error_object(decode_body(raw)) if status >= 400 else {}
    msg = str(err.get("message", "") or raw[:200].decode("utf-8", "replace")).strip()
    reason = f"HTTP {status}" + (f": {msg[:300]}" if msg else "")
    label = f"http_{status}"
    if status == 429:
        if "request too large" in msg.lower():  # OpenAI: bigger than the whole TPM budget; no wait helps
            return Verdict(Kind.GIVE_UP, reason, is_429=True, label="request_too_large")
        delay = retry_after_from_headers(headers)
        if delay is None:
            delay = retry_after_from_body(err)
        if delay is None:
            delay = retry_after_from_message(msg)
        if _spend_limit(err):  # no wait helps before the month ends or the limit is raised
            return Verdict(Kind.FATAL, reason, is_429=True, label="spend_limit")
        if is_daily_quota(err):  # the hint, if any, says when to resume
            return Verdict(Kind.FATAL, reason, delay, is_429=True, label="daily_quota")
        return Verdict(Kind.RETRY, reason, delay, is_429=True, limit_rpm=rpm_from_reply(headers, err), label=label)
    if status in (401, 403, 404):
        return Verdict(Kind.FATAL, reason, label=label)
    if status == 400 and _api_key_invalid(err):
        return Verdict(Kind.FATAL, reason, label="api_key_invalid")
    if status in (400, 413, 422) and exceeds_context(err, msg):
        return Verdict(Kind.GIVE_UP, reason, label=CONTEXT_EXCEEDED)
    if status >= 500 or status in (408, 409, 425):
        # 503 (unavailable) and Anthropic's 529 (overloaded) may say when to come back
        delay = retry_after_from_headers(headers) if status in (503, 529) else None
        return Verdict(Kind.RETRY, reason, delay, label=label)
    return Verdict(Kind.GIVE_UP, reason, label=label)


def rejected_fields(raw: bytes, candidates: Iterable[str]) -> set[str]:
    """The request fields among `candidates` that a 400 body blames, by its `param` or its message.

    Hosts say it in many ways (`Unknown name "seed"`, `Unrecognized request argument supplied: seed`,
    `'response_format' is not supported`, `{"param": "seed"}`); a field counts when its name appears as
    a whole word, so `seed` is not found in `seeded` and a message naming no field blames none.
    """
    err = error_object(decode_body(raw))
    param = str(err.get("param") or "")
    message = " ".join(str(err.get(k) or "") for k in ("message", "code", "type")).strip()
    found = {n for n in candidates if param == n or param.startswith((n + ".", n + "["))}
    # The message first; only when it blames nothing, the whole body (e.g. vLLM's pydantic
    # `{"detail": [{"loc": ["body", "seed"], "msg": "Extra inputs are not permitted"}]}`).
    for text in (message, raw[:4000].decode("utf-8", "replace")):
        found |= {n for n in candidates if re.search(rf"(?<![A-Za-z0-9_]){re.escape(n)}(?![A-Za-z0-9_])", text)}
        if found:
            break
    return found


# A request-validation failure reported as a server error: llama-cpp-python's error handler turns
# pydantic's ValidationError (a bad request) into a 500 whose message is the validation report.
_VALIDATION_5XX = re.compile(r"validation errors? for|\d+ validation errors?|'loc': \('body'|\"loc\": \[\"body\"", re.IGNORECASE)


def is_validation_error(raw: bytes) -> bool:
    """A 5xx body that is really a request-validation report (so: a field the host does not accept)."""
    return bool(_VALIDATION_5XX.search(raw[:8000].decode("utf-8", "replace")))


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random) -> float:
    """Exponential backoff with "equal jitter": U(d/2, d) with d = min(cap, base·2^attempt).

    Half of each wait is guaranteed, so even the first retry waits at least base/2: full jitter
    (U(0, d)) can draw ~0 and, when every answer is a 429 with no usable hint, would resend at once.
    """
    return jittered_backoff(attempt, base, cap, rng.random())


def jittered_backoff(attempt: int, base: float, cap: float, jitter: float) -> float:
    """`backoff_delay` with its random draw `jitter` in [0, 1) given (a pure function)."""
    d = min(cap, base * (2.0**attempt))
    return d / 2.0 + (d / 2.0) * jitter
