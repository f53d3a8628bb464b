"""Parse results in the records and the metrics: only offered APIs pass, copied example stubs are not matched,
and every parsed field carries its rule into queries.jsonl."""

from __future__ import annotations

from helpers.records import plan, ptr_block, record

from evaluator.analysis.metrics import record_obs
from evaluator.results.schema import Record, plain
from evaluator.study.parse import parse_plan, parse_stubs
from evaluator.study.runner import plan_block

OFFERED = [("Weather API::get forecast", "Weather API/get forecast")]


class _Result:  # the ChatResult fields plan_block reads
    finish_reason = "stop"
    error = None
    error_kind = None


def _obs(rtp_plan: dict, ptr: dict | None = None) -> dict:
    rec = record("m", 0, "G1", 1, api_list=["Weather API::get forecast"], relevant=["Weather API::get forecast"],
                 rtp_retrieved=["Weather API::get forecast", "Other::x"], rtp_plan=rtp_plan, ptr=ptr)
    return record_obs(Record.from_dict(rec), ks=(1, 5), k=5)


def test_a_plan_naming_only_unoffered_apis_does_not_pass() -> None:
    parsed = parse_plan('{"steps": ["a"], "selected_apis": ["Made Up/api"]}', OFFERED)
    block = plain(plan_block(_Result(), parsed))  # type: ignore[arg-type]
    assert block["selected"] == ["Made Up/api"] and block["selected_offered"] == []
    obs = _obs(block)
    assert obs[("rtp", "pass", 5, None)] == (0.0, 1.0)
    assert obs[("rtp", "fidelity", 5, None)] == (0.0, 1.0)  # the made-up name still lowers fidelity
    ok = plan_block(_Result(), parse_plan('{"steps": [], "selected_apis": ["weather api/get forecast"]}', OFFERED))  # type: ignore[arg-type]
    assert _obs(plain(ok))[("rtp", "pass", 5, None)] == (1.0, 1.0)


def test_old_records_without_the_offered_field_still_pass_on_selected() -> None:
    assert _obs(plan(["Weather API::get forecast"]))[("rtp", "pass", 5, None)] == (1.0, 1.0)


def test_plan_provenance_lands_in_the_record() -> None:
    parsed = parse_plan('Sure:\n```json\n{"steps": ["a"], "selected_apis": ["Weather API / get forecast"]}\n```', OFFERED)
    audit = plain(plan_block(_Result(), parsed))["parse_audit"]  # type: ignore[arg-type]
    assert audit["source"] == "fence" and audit["selected_rule"] == "key:selected_apis"
    assert audit["names"] == [["Weather API / get forecast", "Weather API::get forecast", "case/space", True]]


def test_copied_example_stubs_are_left_out_of_match() -> None:
    stubs, _ = parse_stubs(
        '[{"name": "search_flights", "reasoning": "Find flights between two cities on a date."},'
        ' {"name": "get_forecast", "reasoning": "Forecast."}]',
        query="Weather in Paris?",
    )
    assert [s.example_copy for s in stubs] == [True, False]
    gold = "Weather API::get forecast"
    ptr = ptr_block([s.name for s in stubs], [["Flights::search", gold], [gold]], [gold], plan([gold]))
    for d, s in zip(ptr["stubs"], stubs, strict=True):
        d.update(plain(s))
    rec = Record.from_dict(record("m", 0, "G1", 1, api_list=[gold], relevant=[gold], rtp_retrieved=[gold],
                                  rtp_plan=plan([gold]), ptr=ptr))
    assert rec.ptr.stubs[0].example_copy and plain(rec.ptr)["stubs"][0]["rule"] == "reply:list:name+reasoning"
    obs = record_obs(rec, ks=(1, 5), k=5)
    assert obs[("ptr", "stub_match", None, "api_list")] == (1.0, 1.0)  # 1 of 1 counted stubs, not 1 of 2
    assert obs[("ptr", "stubs_per_query", None, None)] == (2.0, 1.0)  # still generated
