"""One attempt's outcome -> what the engine does next: a pure function, tested on recorded bodies.

`decide(outcome, state, profile, now=..., jitter=...)` reads what came back (an HTTP status, headers
and body, or a transport error) together with what this call already went through (`CallState`) and
the profile's retry rules, and returns one typed decision:

- `Reply`: a usable 200 (a cut one too, once its truncation retries are spent) - store and return it.
  A 200 with no text at all (`empty_reply`, billed) is sent once more (`EMPTY_RETRIES`), then given up:
  a server that answers a prompt with nothing tends to do it again, and each try is paid.
- `Retry(after_s, reason, is_429)`: send again after `after_s`; a 429 closes the model's shared gate.
- `DropFields(names)`: the host rejects these optional request fields - never send them again, retry now.
- `DowngradeSchema(also_drop)`: the host rejects `json_schema` - send the schema as json_object form.
- `GiveUp(kind, reason)`: this call cannot succeed (or its retries are spent); the others may.
- `StopRun(message)`: the command cannot go on with this model (bad key, daily quota, a wait past
  `give_up_after_s`); the message says what to do.

No I/O, no clock, no randomness: `now` (epoch seconds) and `jitter` (in [0, 1), the backoff's random
draw) come from the caller, so the same inputs always give the same decision.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from evaluator.llm.profiles import ModelProfile
from evaluator.llm.reply import EMPTY_REPLY, MAX_TOKENS, REFUSAL, ChatResult, read_reply
from evaluator.llm.retry import (
    CONTEXT_EXCEEDED,
    Kind,
    Verdict,
    classify_http,
    is_validation_error,
    jittered_backoff,
    rejected_fields,
)

# Fields a host may reject and the request still means the same thing without; `model` and
# `messages` are the request itself.
REQUIRED_FIELDS = frozenset({"model", "messages"})
EMPTY_RETRIES = 1  # an empty 200 is sent again this many times (each one billed), then the call is given up


@dataclass(frozen=True)
class TransportFailure:
    """No HTTP answer: `timeout` (after timeout_s), `connect` (nothing listens), `connection` (cut), `tls` (the
    server's certificate is not trusted, or the handshake failed: sending again cannot help)."""

    kind: Literal["timeout", "connect", "connection", "tls"]
    detail: str = ""  # the exception's type name; for tls, what failed in words ("certificate not trusted: ...")


@dataclass(frozen=True)
class AttemptOutcome:
    """What one send got back. `reply` is the parsed body of a 200 (parsed once, here)."""

    status: int = 0  # 0: no HTTP answer (see `error`)
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    error: TransportFailure | None = None
    latency_s: float = 0.0
    sent: frozenset[str] = frozenset()  # the request fields this attempt carried
    sent_json_schema: bool = False  # its response_format was the json_schema form
    reply: ChatResult | None = None

    @classmethod
    def http(
        cls, status: int, headers: Mapping[str, str], body: bytes, *, latency_s: float = 0.0,
        sent: frozenset[str] = frozenset(), sent_json_schema: bool = False, keep_raw: bool = False,
        max_tokens: int | None = None, max_tokens_known: bool | None = None,
    ) -> AttemptOutcome:
        """`max_tokens`: what the request asked for (with `max_tokens_known`, None is no limit), which tells
        a cut at max_tokens from one by the server's context (reply.cut_cause)."""
        known = max_tokens is not None if max_tokens_known is None else max_tokens_known
        reply = read_reply(body, keep_raw, max_tokens=max_tokens, max_tokens_known=known) if status == 200 else None
        return cls(status, headers, body, None, latency_s, sent, sent_json_schema, reply)


@dataclass
class CallState:
    """What one call went through so far (updated by the engine after each decision)."""

    failures: int = 0  # transient errors other than 429 that were retried
    rate_limited: int = 0  # 429s received
    truncations: int = 0  # cut replies retried
    daily_quota: int = 0  # per-day quota 429s with a short hint, retried once after it
    empty: int = 0  # empty 200 replies retried
    retried_without: frozenset[str] = frozenset()  # fields this call was already retried without


@dataclass(frozen=True)
class Reply:
    result: ChatResult


@dataclass(frozen=True)
class Retry:
    after_s: float
    reason: str
    is_429: bool = False
    cause: Literal["transient", "429", "truncated", "daily_quota", "empty"] = "transient"
    hint_s: float | None = None  # what the server asked for (before the max_wait_s cap)
    limit_rpm: float | None = None  # a requests-per-minute limit the server announced


@dataclass(frozen=True)
class DropFields:
    names: frozenset[str]
    reason: str


@dataclass(frozen=True)
class DowngradeSchema:
    reason: str
    also_drop: frozenset[str] = frozenset()


@dataclass(frozen=True)
class GiveUp:
    kind: str  # failure count label: `http_400`, `timeout`, `connection`, `http_503`, ...
    reason: str


@dataclass(frozen=True)
class StopRun:
    message: str
    is_429: bool = False


Decision = Reply | Retry | DropFields | DowngradeSchema | GiveUp | StopRun


def decide(outcome: AttemptOutcome, state: CallState, p: ModelProfile, *, now: float, jitter: float) -> Decision:
    """The next step for a call after `outcome` (see the module doc)."""
    if outcome.error is not None:
        return _on_verdict(_transport_verdict(outcome.error, p), outcome, state, p, now, jitter)
    if outcome.status == 200:
        r = outcome.reply if outcome.reply is not None else read_reply(outcome.body)
        if r.error_kind == EMPTY_REPLY:
            if state.empty >= EMPTY_RETRIES:
                return GiveUp(EMPTY_REPLY, f"{r.error}, again after {state.empty} more try: not sent again")
            return Retry(0.0, r.error or EMPTY_REPLY, cause="empty")
        if r.error is not None:  # a refusal is the model's answer to this prompt: asking again cannot change it
            kind = Kind.GIVE_UP if r.error_kind == REFUSAL else Kind.RETRY
            return _on_verdict(Verdict(kind, r.error, label=r.error_kind or "error"), outcome, state, p, now, jitter)
        # Only a cut at max_tokens may come out whole when sampled again; the server's context or a filter
        # would cut the same request the same way.
        if r.cut == MAX_TOKENS and state.truncations < p.retries.truncation_retries:
            return Retry(0.0, "cut at max_tokens", cause="truncated")
        return Reply(r)  # the last reply, cut or not, is the model's real output for this request
    status, body = outcome.status, outcome.body
    verdict = classify_http(status, outcome.headers, body)
    if verdict.label == CONTEXT_EXCEEDED:  # before blaming a field: its text may name `messages`, `max_tokens`
        return GiveUp(CONTEXT_EXCEEDED, verdict.reason)
    # 422: FastAPI servers validating the body; a 5xx carrying a validation report: llama-cpp-python,
    # whose error handler answers 500 to a body it cannot validate.
    if status in (400, 422) or (status >= 500 and is_validation_error(body)):
        names = rejected_fields(body, outcome.sent - REQUIRED_FIELDS - state.retried_without)  # only what was sent
        reason = classify_http(status, {}, body).reason
        if "response_format" in names and outcome.sent_json_schema:
            names.discard("response_format")  # first try the other form of the same schema
            return DowngradeSchema(reason, frozenset(names))
        if names:
            return DropFields(frozenset(names), reason)
        if status >= 500:  # a request the server cannot validate: sending it again cannot help
            return GiveUp(f"http_{status}", reason + " (the server rejects the request as invalid)")
    return _on_verdict(verdict, outcome, state, p, now, jitter)


def _transport_verdict(e: TransportFailure, p: ModelProfile) -> Verdict:
    if e.kind == "timeout":
        return Verdict(Kind.RETRY, f"timeout after {p.connection.timeout_s:g}s", label="timeout")
    if e.kind == "connect":
        return Verdict(Kind.RETRY, f"cannot connect to {p.connection.base_url} ({e.detail})", fatal_when_exhausted=True, label="connection")
    if e.kind == "tls":
        return Verdict(Kind.FATAL, e.detail or "TLS handshake failed", label="tls")
    return Verdict(Kind.RETRY, f"connection error ({e.detail})", label="connection")


def _on_verdict(v: Verdict, o: AttemptOutcome, state: CallState, p: ModelProfile, now: float, jitter: float) -> Decision:
    failures = state.failures
    rate_limited = state.rate_limited + (1 if v.is_429 else 0)
    give_up_after = p.retries.give_up_after_s
    hint = v.retry_after
    if v.label == "daily_quota" and hint is not None and state.daily_quota == 0 and (
            give_up_after is None or hint <= give_up_after):
        # Gemini lists every quota a 429 touched, the per-day one too, with a retryDelay of seconds when
        # only the per-minute one is spent: take the server at its word once; a second one stops the command.
        return Retry(min(hint, p.retries.max_wait_s), v.reason, is_429=True, cause="daily_quota", hint_s=hint)
    if v.kind is Kind.FATAL or (v.fatal_when_exhausted and failures >= p.retries.max_retries):
        return StopRun(fatal_message(o.status, v, p, now), is_429=v.is_429)
    # 429s have their own, larger budget: a limit that is paced to is not a failing server.
    exhausted = rate_limited > max(20, 3 * p.retries.max_retries) if v.is_429 else failures >= p.retries.max_retries
    if v.kind is Kind.GIVE_UP or exhausted:
        n = failures + rate_limited + (0 if v.is_429 else 1)
        tries = f" (after {n} tries)" if v.kind is Kind.RETRY else ""
        return GiveUp(v.label or "error", v.reason + tries)
    if hint is not None and give_up_after is not None and hint > give_up_after:
        return StopRun(
            f"{p.name}: the server asks to wait {_duration(hint)} before the next request, more than "
            f"give_up_after_s ({_duration(give_up_after)}); resume after {resume_time(now + hint, now)} "
            f"with the same command [{v.reason[:200]}]",
            is_429=v.is_429,
        )
    if hint is None:  # no usable hint (none, 0, negative, garbage): backoff with a floor
        attempt = rate_limited - 1 if v.is_429 else failures
        delay = jittered_backoff(attempt, p.retries.backoff_base_s, p.retries.backoff_max_s, jitter)
    else:
        delay = hint
    return Retry(
        min(delay, p.retries.max_wait_s), v.reason, is_429=v.is_429, cause="429" if v.is_429 else "transient",
        hint_s=hint, limit_rpm=v.limit_rpm,
    )


def resume_time(at: float, now: float) -> str:
    """`at` (epoch seconds) as "14:05 UTC", rounded up to the minute; with the date when not today."""
    when = datetime.fromtimestamp(math.ceil(at / 60.0) * 60.0, tz=UTC)
    today = datetime.fromtimestamp(now, tz=UTC).date()
    return when.strftime("%H:%M UTC" if when.date() == today else "%Y-%m-%d %H:%M UTC")


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:g} s"
    if s < 2 * 3600:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def fatal_message(status: int, v: Verdict, p: ModelProfile, now: float) -> str:
    """What to do when the command cannot go on with this model (not yet redacted)."""
    env = p.connection.api_key_env or "the profile's api_key_env"
    if v.label == "spend_limit":
        what = ("the organisation's monthly spend limit is reached; raise it in the provider's console (or wait for "
                "the next month) and rerun the same command (finished calls are cached and will not be re-sent)")
    elif v.is_429:
        when = f"resume after {resume_time(now + v.retry_after, now)}" if v.retry_after else "rerun tomorrow"
        what = (f"daily quota exhausted; {when} with the same command or raise the quota "
                "(finished calls are cached and will not be re-sent)")
    elif status == 401 or v.label == "api_key_invalid":
        what = f"the API key was rejected; set {env} to a valid key"
    elif status == 403:
        what = f"permission denied; check that the key in {env} may use model {p.model!r} (API enabled, billing, region)"
    elif status == 404:
        what = f"endpoint or model not found; check base_url {p.connection.base_url!r} and model id {p.model!r}"
    elif v.label == "tls":  # said first, in plain words: no request reached the server
        return (f"{p.name}: {v.reason} ({p.connection.base_url}); give the server a certificate a trusted authority signed, "
                "or point SSL_CERT_FILE at the bundle of the authority that signed it")
    else:
        what = f"the endpoint does not answer; check that the server is up and base_url/--base-url ({p.connection.base_url!r})"
    return f"{p.name}: {what} [{v.reason}]"
