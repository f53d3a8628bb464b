"""What a failed HTTP exchange means: retry (and after how long) or stop, and the backoff schedule.

Providers say "retry later" in many dialects: `Retry-After` (seconds or an HTTP-date),
`retry-after-ms`, OpenAI's `x-ratelimit-reset-requests/-tokens` Go-style durations ("6m0s", "20ms"),
and Gemini's `RetryInfo.retryDelay` ("13s") inside a JSON error body that may be a list.
"""

from __future__ import annotations

import email.utils
import random
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import orjson

_GO_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PER_DAY = re.compile(r"per[ _-]?day|daily", re.IGNORECASE)


class Kind(Enum):
    RETRY = "retry"  # transient: back off and send again
    FATAL = "fatal"  # the run cannot go on with this model
    GIVE_UP = "give_up"  # this one call cannot succeed (e.g. 400), the others may


@dataclass(frozen=True)
class Verdict:
    kind: Kind
    reason: str  # short, already free of secrets only if the caller redacts it
    retry_after: float | None = None  # seconds the server asked us to wait, if it said
    is_429: bool = False
    limit_rpm: float | None = None  # the requests-per-minute limit the server announced, if any
    fatal_when_exhausted: bool = False  # e.g. nothing listens at the URL: no point in every call failing


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


def retry_after_from_headers(headers: Mapping[str, str]) -> float | None:
    """The wait the headers ask for, most precise form first; None if they do not say."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    ra = headers.get("retry-after")
    if ra:
        delay = parse_retry_after_header(ra)
        if delay is not None:
            return delay
    # OpenAI-style resets: prefer the one whose budget is exhausted, else the longest.
    resets = []
    for kind in ("requests", "tokens"):
        reset = headers.get(f"x-ratelimit-reset-{kind}")
        if not reset:
            continue
        delay = parse_duration(reset)
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
            return parse_duration(str(d["retryDelay"]))
    return None


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
    """A quota that will not come back within the run: Gemini per-day ids/messages, OpenAI billing."""
    if any("PerDay" in q or _PER_DAY.search(q) for q in _quota_ids(err)):
        return True
    msg = str(err.get("message", ""))
    if "quota" in msg.lower() and _PER_DAY.search(msg):
        return True
    return err.get("code") == "insufficient_quota" or err.get("type") == "insufficient_quota"


def classify_http(status: int, headers: Mapping[str, str], raw: bytes) -> Verdict:
    """Decide what a non-200 reply means."""
    err = error_object(decode_body(raw)) if status >= 400 else {}
    msg = str(err.get("message", "") or raw[:200].decode("utf-8", "replace")).strip()
    reason = f"HTTP {status}" + (f": {msg[:300]}" if msg else "")
    if status == 429:
        if is_daily_quota(err):
            return Verdict(Kind.FATAL, reason, is_429=True)
        delay = retry_after_from_headers(headers)
        if delay is None:
            delay = retry_after_from_body(err)
        return Verdict(Kind.RETRY, reason, delay, is_429=True, limit_rpm=rpm_from_reply(headers, err))
    if status in (401, 403, 404):
        return Verdict(Kind.FATAL, reason)
    if status >= 500 or status in (408, 409, 425):
        delay = retry_after_from_headers(headers) if status == 503 else None
        return Verdict(Kind.RETRY, reason, delay)
    return Verdict(Kind.GIVE_UP, reason)


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random) -> float:
    """Exponential backoff with full jitter (AWS architecture blog): U(0, min(cap, base·2^attempt))."""
    return rng.uniform(0.0, min(cap, base * (2.0**attempt)))
