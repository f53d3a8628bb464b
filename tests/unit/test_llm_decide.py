"""`decide` on its own: recorded provider bodies (tests/fixtures/providers/online/, each naming its source)
and the engine's other rules, with no network; plus the long-wait rules end to end against the simulator."""

from __future__ import annotations

import logging
import time

import orjson
import pytest
from helpers import FIXTURES
from helpers import llm as F

from evaluator.core.errors import FatalLLMError
from evaluator.llm import load_profile
from evaluator.llm.decide import (
    AttemptOutcome,
    CallState,
    DowngradeSchema,
    DropFields,
    GiveUp,
    Reply,
    Retry,
    StopRun,
    TransportFailure,
    decide,
    resume_time,
)
from evaluator.llm.retry import jittered_backoff


@pytest.fixture
def sim() -> F.LocalSim:
    """The simulator in this process, behind the engine's in-process transport (no socket)."""
    return F.LocalSim()


ONLINE = FIXTURES / "providers" / "online"
NOW = 1_780_000_000.0  # a fixed clock: decide is pure
SENT = frozenset({"model", "messages", "temperature", "max_tokens", "seed"})
PROFILE = load_profile("sim", base_url="http://127.0.0.1:9/v1", max_retries=4, backoff_base_s=0.5,
                       backoff_max_s=30.0, max_wait_s=120.0, give_up_after_s=3600.0, truncation_retries=1)


def _recorded(name: str) -> tuple[int, dict[str, str], bytes]:
    rec = orjson.loads((ONLINE / f"{name}.json").read_bytes())
    return rec["status"], rec["headers"], orjson.dumps(rec["body"])


def _decide(name: str, *, sent=SENT, state: CallState | None = None, jitter: float = 0.5):
    status, headers, body = _recorded(name)
    outcome = AttemptOutcome.http(status, headers, body, sent=frozenset(sent))
    return decide(outcome, state or CallState(), PROFILE, now=NOW, jitter=jitter)


def _backoff(attempt: int, jitter: float = 0.5) -> float:
    return jittered_backoff(attempt, PROFILE.retries.backoff_base_s, PROFILE.retries.backoff_max_s, jitter)


# name -> (extra fields the request carried, the decision expected)
EXPECTED = {
    "gemini_429_minute_retryinfo": ((), Retry(26.0, "", is_429=True, cause="429", hint_s=26.0)),
    "gemini_429_day_and_minute_retryinfo": ((), Retry(47.0, "", is_429=True, cause="daily_quota", hint_s=47.0)),
    "gemini_429_per_day_no_retryinfo": ((), StopRun("daily quota exhausted; rerun tomorrow", is_429=True)),
    "gemini_429_retry_in_message": ((), StopRun(f"resume after {resume_time(NOW + 37025.723541104, NOW)}", is_429=True)),
    "gemini_429_plain": ((), Retry(_backoff(0), "", is_429=True, cause="429")),
    "gemini_429_list_wrapped": ((), Retry(_backoff(0), "", is_429=True, cause="429")),
    "gemini_compat_400_seed_list": ((), DropFields(frozenset({"seed"}), "")),
    "gemini_400_invalid_argument_list": ((), GiveUp("http_400", "")),
    "gemini_400_api_key_invalid": ((), StopRun("the API key was rejected")),
    "gemini_403_permission_denied_list": ((), StopRun("permission denied")),
    "openai_400_unsupported_parameter_temperature": ((), DropFields(frozenset({"temperature"}), "")),
    "openai_400_unsupported_parameter_max_tokens": ((), DropFields(frozenset({"max_tokens"}), "")),
    "openai_429_tpm_retry_in_message": ((), Retry(0.976, "", is_429=True, cause="429", hint_s=0.976)),
    "openai_429_request_too_large": ((), GiveUp("request_too_large", "")),
    "openai_429_headers": ((), Retry(0.012, "", is_429=True, cause="429", hint_s=0.012, limit_rpm=5000.0)),
    "openai_401_incorrect_key": ((), StopRun("the API key was rejected")),
    "vllm_400_extra_forbidden": (("max_completion_tokens",), DropFields(frozenset({"max_completion_tokens"}), "")),
    "vllm_400_extra_forbidden_stream_options": (("stream_options",), DropFields(frozenset({"stream_options"}), "")),
    "fastapi_422_detail": (("stream_otpions",), DropFields(frozenset({"stream_otpions"}), "")),
    "llama_cpp_python_500_validation": ((), GiveUp("http_500", "")),
    # a prompt longer than the server's context: its own kind, never a field to drop (issue 31)
    "llama_cpp_400_exceeds_context": ((), GiveUp("context_exceeded", "")),
}


def test_every_recorded_body_names_its_source_and_has_an_expected_decision():
    names = sorted(p.stem for p in ONLINE.glob("*.json"))
    assert names == sorted(EXPECTED)
    for name in names:
        rec = orjson.loads((ONLINE / f"{name}.json").read_bytes())
        sources = rec["source"] if isinstance(rec["source"], list) else [rec["source"]]
        assert sources and all(s.strip() for s in sources), name
        assert {"status", "headers", "body"} <= set(rec), name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_decision_on_a_recorded_body(name):
    extra, want = EXPECTED[name]
    got = _decide(name, sent=SENT | set(extra))
    assert type(got) is type(want), (name, got)
    if isinstance(want, Retry):
        assert (got.after_s, got.is_429, got.cause, got.hint_s, got.limit_rpm) == pytest.approx(
            (want.after_s, want.is_429, want.cause, want.hint_s, want.limit_rpm))
    elif isinstance(want, DropFields):
        assert got.names == want.names
    elif isinstance(want, GiveUp):
        assert got.kind == want.kind
    else:
        assert want.message in got.message and got.is_429 == want.is_429, got.message


def test_gemini_compat_body_drops_every_named_field_that_was_sent():
    got = _decide("gemini_compat_400_seed_list", sent=SENT | {"frequency_penalty"})
    assert isinstance(got, DropFields) and got.names == {"seed", "frequency_penalty"}
    # Already retried without seed (a call in flight when it was dropped): nothing left to drop, the call fails.
    again = _decide("gemini_compat_400_seed_list", state=CallState(retried_without=frozenset({"seed"})))
    assert isinstance(again, GiveUp) and again.kind == "http_400"


def test_a_second_per_day_429_stops_the_run_with_the_servers_time():
    got = _decide("gemini_429_day_and_minute_retryinfo", state=CallState(daily_quota=1, rate_limited=1))
    assert isinstance(got, StopRun)
    assert f"daily quota exhausted; resume after {resume_time(NOW + 47, NOW)} with the same command" in got.message


def test_429_budget_is_larger_than_the_retry_budget():
    # max(20, 3 * max_retries) 429s are retried; the 21st ends the call (max_retries is 4).
    assert isinstance(_decide("gemini_429_plain", state=CallState(rate_limited=19)), Retry)
    spent = _decide("gemini_429_plain", state=CallState(rate_limited=20))
    assert isinstance(spent, GiveUp) and spent.kind == "http_429" and "(after 21 tries)" in spent.reason


# -- the engine's other rules, no recorded body needed ------------------------------------------------
def _reply(finish: str = "stop", content: str | None = "ok") -> bytes:
    return orjson.dumps({"choices": [{"message": {"content": content}, "finish_reason": finish}],
                         "usage": {"prompt_tokens": 3, "completion_tokens": 2}})


def test_a_usable_reply_is_returned_and_a_cut_one_retried_once():
    ok = decide(AttemptOutcome.http(200, {}, _reply()), CallState(), PROFILE, now=NOW, jitter=0.0)
    assert isinstance(ok, Reply) and ok.result.content == "ok" and ok.result.prompt_tokens == 3
    cut = AttemptOutcome.http(200, {}, _reply("length"))
    first = decide(cut, CallState(), PROFILE, now=NOW, jitter=0.0)
    assert isinstance(first, Retry) and first.cause == "truncated" and first.after_s == 0
    last = decide(cut, CallState(truncations=1), PROFILE, now=NOW, jitter=0.0)
    assert isinstance(last, Reply) and last.result.truncated


def test_malformed_replies_are_transient_and_an_empty_one_is_sent_once_more():
    body = b'{"choices": ['
    got = decide(AttemptOutcome.http(200, {}, body), CallState(), PROFILE, now=NOW, jitter=0.0)
    assert isinstance(got, Retry) and "malformed" in got.reason and got.after_s == _backoff(0, 0.0)
    spent = decide(AttemptOutcome.http(200, {}, body), CallState(failures=4), PROFILE, now=NOW, jitter=0.0)
    assert isinstance(spent, GiveUp) and "(after 5 tries)" in spent.reason
    # an empty 200 is billed each time and tends to come again: one more try, whatever max_retries says
    empty = AttemptOutcome.http(200, {}, _reply(content=None))
    again = decide(empty, CallState(), PROFILE, now=NOW, jitter=0.0)
    assert isinstance(again, Retry) and again.cause == "empty" and "empty reply" in again.reason
    done = decide(empty, CallState(empty=1), PROFILE, now=NOW, jitter=0.0)
    assert isinstance(done, GiveUp) and done.kind == "empty_reply" and "not sent again" in done.reason


def test_transport_errors():
    timeout = decide(AttemptOutcome(error=TransportFailure("timeout")), CallState(), PROFILE, now=NOW, jitter=1.0)
    assert isinstance(timeout, Retry) and timeout.reason == f"timeout after {PROFILE.connection.timeout_s:g}s" and timeout.after_s == _backoff(0, 1.0)
    down = AttemptOutcome(error=TransportFailure("connect", "ClientConnectorError"))
    assert isinstance(decide(down, CallState(failures=3), PROFILE, now=NOW, jitter=0.0), Retry)
    stop = decide(down, CallState(failures=4), PROFILE, now=NOW, jitter=0.0)
    assert isinstance(stop, StopRun) and "the endpoint does not answer" in stop.message


def test_rejected_json_schema_is_downgraded_before_it_is_dropped():
    body = orjson.dumps({"error": {"message": "'response_format' of type json_schema is not supported", "param": "response_format"}})
    sent = SENT | {"response_format"}
    down = decide(AttemptOutcome.http(400, {}, body, sent=sent, sent_json_schema=True), CallState(), PROFILE, now=NOW, jitter=0)
    assert isinstance(down, DowngradeSchema) and not down.also_drop
    drop = decide(AttemptOutcome.http(400, {}, body, sent=sent, sent_json_schema=False), CallState(), PROFILE, now=NOW, jitter=0)
    assert isinstance(drop, DropFields) and drop.names == {"response_format"}


def test_a_hint_past_max_wait_is_capped_and_one_past_give_up_after_stops_the_run():
    body = orjson.dumps({"error": {"message": "Rate limit reached for requests"}})
    capped = decide(AttemptOutcome.http(429, {"retry-after": "600"}, body), CallState(), PROFILE, now=NOW, jitter=0)
    assert isinstance(capped, Retry) and capped.after_s == 120.0 and capped.hint_s == 600.0
    stop = decide(AttemptOutcome.http(429, {"retry-after": "86400"}, body), CallState(), PROFILE, now=NOW, jitter=0)
    assert isinstance(stop, StopRun)
    assert f"resume after {resume_time(NOW + 86400, NOW)} with the same command" in stop.message
    assert "24.0 h" in stop.message


def test_decide_is_pure():
    status, headers, body = _recorded("gemini_429_plain")
    o = AttemptOutcome.http(status, headers, body, sent=SENT)
    runs = {repr(decide(o, CallState(rate_limited=2), PROFILE, now=NOW, jitter=0.25)) for _ in range(5)}
    assert len(runs) == 1


def test_resume_time_is_rounded_up_and_dated_when_not_today():
    assert resume_time(NOW, NOW).endswith(" UTC")
    assert resume_time(NOW + 86400 * 2, NOW).count("-") == 2


# -- long waits, end to end against the simulator ------------------------------------------------------
async def test_a_wait_past_max_wait_is_told_once_and_the_calls_still_finish(sim, caplog, clock):
    sim.configure(script=["429", "429", "429"], retry_value="200", retry_headers="seconds")
    caplog.set_level(logging.WARNING, logger="evaluator.llm")
    async with sim.engine(F.sim_profile(sim, max_wait_s=0.05, give_up_after_s=3600.0)) as llm:
        rs = [await llm.chat(F.msgs(i), run=0, prompt_version="v1") for i in range(2)]
    assert all(r.error is None for r in rs) and llm.stats.http_429 == 3
    told = [r.getMessage() for r in caplog.records if "asks to wait" in r.getMessage()]
    assert len(told) == 1 and "200 s" in told[0] and "requests again after" in told[0]


async def test_a_wait_past_give_up_after_stops_the_run_with_the_time(sim, tmp_path, clock):
    sim.configure(script=["429"], retry_value="86400", retry_headers="seconds")
    async with sim.engine(F.sim_profile(sim), cache_root=tmp_path) as llm:
        t0 = time.time()  # the virtual clock's: the same instant as the 429's arrival
        with pytest.raises(FatalLLMError) as e:
            await llm.chat(F.msgs(1), run=0, prompt_version="v1")
        with pytest.raises(FatalLLMError):  # every later fresh call stops too
            await llm.chat(F.msgs(2), run=0, prompt_version="v1")
    assert sim.stats()["requests"] == 1
    msg = str(e.value)
    assert f"resume after {resume_time(t0 + 86400, t0)} with the same command" in msg
