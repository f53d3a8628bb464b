"""Parsing of every retry-time dialect, error classification, backoff and accounting (no network)."""

from __future__ import annotations

import email.utils
import random
import time

import orjson
import pytest

from evaluator.core.redact import redact
from evaluator.llm.accounting import ModelStats, percentile
from evaluator.llm.retry import (
    Kind,
    backoff_delay,
    classify_http,
    is_validation_error,
    parse_duration,
    rejected_fields,
    retry_after_from_headers,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("6m0s", 360.0), ("20ms", 0.02), ("1h2m3.5s", 3723.5), ("13s", 13.0), ("0.25s", 0.25), ("7", 7.0)],
)
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "5 s", "1x"])
def test_bad_durations(text):
    assert parse_duration(text) is None


def test_retry_after_headers_each_form():
    assert retry_after_from_headers({"retry-after": "3"}) == 3.0
    date = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 28 <= retry_after_from_headers({"retry-after": date}) <= 30
    assert retry_after_from_headers({"retry-after-ms": "250", "retry-after": "1"}) == 0.25
    resets = {"x-ratelimit-reset-requests": "1s", "x-ratelimit-reset-tokens": "6m0s"}
    assert retry_after_from_headers(resets) == 360.0
    assert retry_after_from_headers({**resets, "x-ratelimit-remaining-requests": "0"}) == 1.0
    assert retry_after_from_headers({}) is None


def _gemini(quota_id: str, delay: str = "13s", message: str = "quota exceeded") -> bytes:
    return orjson.dumps([{"error": {"code": 429, "message": message, "status": "RESOURCE_EXHAUSTED", "details": [
        {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{"quotaId": quota_id}]},
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay},
    ]}}])


def test_gemini_list_body_retry_delay():
    v = classify_http(429, {}, _gemini("GenerateRequestsPerMinutePerProjectPerModel"))
    assert v.kind is Kind.RETRY and v.retry_after == 13.0 and v.is_429


@pytest.mark.parametrize(
    "body",
    [
        _gemini("GenerateRequestsPerDayPerProjectPerModel-FreeTier"),
        _gemini("", message="Quota exceeded for metric: requests per day"),
        orjson.dumps({"error": {"message": "You exceeded your current quota", "code": "insufficient_quota"}}),
    ],
    ids=["gemini-per-day-id", "per-day-message", "openai-billing"],
)
def test_daily_quota_is_fatal(body):
    assert classify_http(429, {}, body).kind is Kind.FATAL


@pytest.mark.parametrize(
    ("status", "kind"),
    [(401, Kind.FATAL), (403, Kind.FATAL), (404, Kind.FATAL), (400, Kind.GIVE_UP), (422, Kind.GIVE_UP),
     (408, Kind.RETRY), (500, Kind.RETRY), (502, Kind.RETRY), (503, Kind.RETRY), (529, Kind.RETRY)],
)
def test_status_classes(status, kind):
    assert classify_http(status, {}, b'{"error": {"message": "x"}}').kind is kind


def test_non_json_error_body():
    v = classify_http(502, {}, b"<html>Bad gateway</html>")
    assert v.kind is Kind.RETRY and "Bad gateway" in v.reason


def test_backoff_grows_and_never_waits_less_than_its_floor():
    rng = random.Random(0)
    for attempt in range(10):
        d = min(8.0, 0.5 * 2**attempt)
        draws = [backoff_delay(attempt, 0.5, 8.0, rng) for _ in range(50)]
        assert d / 2 <= min(draws) and max(draws) <= d  # half of each wait is guaranteed


@pytest.mark.parametrize("value", ["0", "-3", "soon", "nan", "inf", "", "0ms", "-1s"])
@pytest.mark.parametrize("header", ["retry-after", "retry-after-ms", "x-ratelimit-reset-requests"])
def test_useless_retry_hints_are_no_hint(header, value):
    assert retry_after_from_headers({header: value, "x-ratelimit-remaining-requests": "0"}) is None
    # ... and a useless precise form does not hide a usable coarser one
    usable = {"retry-after": "2"} if header != "retry-after" else {"x-ratelimit-reset-tokens": "2s"}
    assert retry_after_from_headers({header: value, **usable}) == 2.0


@pytest.mark.parametrize("delay", ["0s", "-5s", "later"])
def test_useless_gemini_retry_delay_is_no_hint(delay):
    assert classify_http(429, {}, _gemini("GenerateRequestsPerMinutePerProjectPerModel", delay)).retry_after is None


def test_past_http_date_is_no_hint():
    assert retry_after_from_headers({"retry-after": email.utils.formatdate(time.time() - 60, usegmt=True)}) is None


FIELDS = {"seed", "response_format", "temperature", "max_tokens", "top_p"}


@pytest.mark.parametrize(
    ("body", "blamed"),
    [
        ({"error": {"message": 'Invalid JSON payload received. Unknown name "seed": Cannot find field.'}}, {"seed"}),
        ({"error": {"message": "Unrecognized request argument supplied: seed"}}, {"seed"}),
        ({"error": {"message": "'response_format.type' must be 'text'", "param": "response_format.type"}}, {"response_format"}),
        ({"error": {"message": "unsupported", "param": "top_p"}}, {"top_p"}),
        ([{"error": {"message": "response_format is not supported by this model"}}], {"response_format"}),
        ({"detail": [{"loc": ["body", "seed"], "msg": "Extra inputs are not permitted"}]}, {"seed"}),  # vLLM
        ({"error": {"message": "messages must not be empty"}}, set()),  # names no optional field
        ({"error": {"message": "the seeded sampler failed"}}, set()),  # a word containing a name is not it
    ],
)
def test_rejected_fields(body, blamed):
    assert rejected_fields(orjson.dumps(body), FIELDS) == blamed


def test_redact():
    key = "sk-test-FAKEKEY-0123456789abcdef"
    assert key not in redact(f"Incorrect API key provided: {key}", key)
    assert "AIza" not in redact("key AIzaSyA1234567890abcdefghijklmnopqrstu invalid", None)


def test_accounting_percentiles():
    assert percentile([], 50) is None
    s = ModelStats(latencies=[float(i) for i in range(1, 101)])
    d = s.as_dict()["latency_s"]
    assert d["p50"] == pytest.approx(50.5) and d["p99"] == pytest.approx(99.01) and d["n"] == 100


def test_failed_calls_are_counted_by_kind():
    s = ModelStats()
    for kind in ("timeout", "http_400", "timeout"):
        s.fail(kind)
    assert s.as_dict()["failed"] == {"http_400": 1, "timeout": 2} and s.errors == 3


def test_llama_cpp_python_validation_500_is_told_apart():
    # Measured on llama-cpp-python 0.3.36: a response_format it cannot validate comes back as a 500.
    msg = ("1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), "
           "'msg': \"Input should be 'text' or 'json_object'\", 'input': 'json_schema'}\n\n  File \"app.py\"")
    raw = orjson.dumps({"error": {"message": msg, "type": "internal_server_error", "param": None, "code": None}})
    assert is_validation_error(raw) and rejected_fields(raw, FIELDS) == {"response_format"}
    assert not is_validation_error(b'{"error": {"message": "The server had an error while processing your request."}}')
