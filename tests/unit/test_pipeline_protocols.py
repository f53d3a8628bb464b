"""The pipeline with its chat client and stub search passed in (no engine, no embedder, no network):
typed records carry each call's finish reason and error kind, and the report counts them."""

from __future__ import annotations

import asyncio
from pathlib import Path

from helpers.fakes import FixedSearch, ScriptedClient, scripted_study

from evaluator.analysis.main_study import main_study
from evaluator.results.schema import Meta, Record
from evaluator.study.runner import StudyRunner, Unit


def test_clients_and_stub_search_are_passed_in(tmp_path: Path) -> None:
    study = scripted_study(tmp_path)
    client, search = ScriptedClient(study), FixedSearch()
    runner = StudyRunner(study, {"scripted": client}, batcher=search)
    records = asyncio.run(runner.run([Unit("scripted", 0)]))
    assert search.served and len(search.asked) == 3  # the pipeline used what it was handed
    assert all(isinstance(r, Record) for r in records) and len(records) == 3
    by_q = {r.query_id: r for r in records}
    assert by_q[2].rtp.plan.finish_reason == "length" and by_q[2].rtp.plan.truncated
    assert by_q[3].rtp.plan.llm_error_kind == "http_500" and by_q[3].failed_calls.count("http_500") == 2
    assert by_q[1].ptr.discovery_finish_reason == "stop" and by_q[1].ptr.plan.finish_reason == "stop"
    assert by_q[1].to_dict()["archs"]["rtp"]["plan"]["finish_reason"] == "stop"

    result = main_study(records, Meta(k=5, ks=[1, 5], runs=1))
    rtp, ptr = result.scored[("scripted", "rtp")], result.scored[("scripted", "ptr")]
    assert (rtp.planner, ptr.planner) == (2, 2)  # the failed planner calls are not scored
    assert rtp.truncated + ptr.truncated == 2
    row = result.summary.row("scripted", "G1_instruction", "rtp", "planner_truncated")
    assert row is not None and row.values == [1.0]
