"""Parsing of every retry-time dialect, error classification, backoff and accounting (no network)."""

from __future__ import annotations

import email.utils
import random
import time

import orjson
import pytest

from evaluator.llm.accounting import ModelStats, percentile
from evaluator.llm.errors import redact
from evaluator.llm.retry import Kind, backoff_delay, classify_http, parse_duration, retry_after_from_headers


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


def test_full_jitter_backoff_bounds():
    rng = random.Random(0)
    draws = [backoff_delay(a, 0.5, 8.0, rng) for a in range(10) for _ in range(50)]
    assert min(draws) >= 0 and max(draws) <= 8.0
    assert max(backoff_delay(0, 0.5, 8.0, rng) for _ in range(200)) <= 0.5


def test_redact():
    key = "sk-test-FAKEKEY-0123456789abcdef"
    assert key not in redact(f"Incorrect API key provided: {key}", key)
    assert "AIza" not in redact("key AIzaSyA1234567890abcdefghijklmnopqrstu invalid", None)


def test_accounting_percentiles():
    assert percentile([], 50) is None
    s = ModelStats(latencies=[float(i) for i in range(1, 101)])
    d = s.as_dict()["latency_s"]
    assert d["p50"] == pytest.approx(50.5) and d["p99"] == pytest.approx(99.01) and d["n"] == 100
