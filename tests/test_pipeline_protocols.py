"""The pipeline with its chat client and stub search passed in (no engine, no embedder, no network):
typed records carry each call's finish reason and error kind, and the report counts them."""

from __future__ import annotations

import asyncio
from pathlib import Path

from data_fixtures import make_data_dir

from evaluator.analysis.main_study import main_study
from evaluator.data import Warnings, find_query_files, load_query_files, load_registry
from evaluator.llm import ChatResult
from evaluator.results.schema import Meta, Record
from evaluator.retrieval.ranking import Retrieved
from evaluator.settings.sections import RetrievalSettings, RunSettings
from evaluator.study import prompts
from evaluator.study.prepare import PreparedStudy
from evaluator.study.runner import StudyRunner, Unit


class ScriptedClient:
    """Answers discovery with one stub and the planner with the first offered API; query 2's planner
    reply is cut at max_tokens and query 3's planner call fails for good."""

    def __init__(self, study: PreparedStudy) -> None:
        self.study = study
        self.calls: list[str] = []

    async def chat(self, messages: list[dict], *, run: int, prompt_version: str, **_kw: object) -> ChatResult:
        user = messages[-1]["content"]
        if prompt_version == prompts.DISCOVERY_VERSION:
            self.calls.append("discovery")
            return ChatResult('{"stubs": [{"name": "get_weather", "reasoning": "forecast"}]}', "stop", 10, 5)
        self.calls.append("planner")
        if "Convert 100 dollars" in user:
            return ChatResult('{"steps": ["convert"], "apis": ["Currency Exchange/convert"]', "length", 10, 50)
        if "transfer history" in user:
            return ChatResult(None, None, error="HTTP 500 after 0 retries", error_kind="http_500")
        return ChatResult('{"steps": ["look it up"], "apis": ["Weather API/get forecast"]}', "stop", 10, 7)


class FixedSearch:
    """A stub search that returns the first registry rows, whatever the stubs say."""

    def __init__(self) -> None:
        self.served = False
        self.asked: list[list[str]] = []

    async def retrieve(self, texts: list[str]) -> Retrieved:
        self.asked.append(texts)
        return Retrieved([0, 1, 2, 3, 4], [0.9, 0.8, 0.7, 0.6, 0.5], [[0, 1, 2, 3, 4]], [[0.9, 0.8, 0.7, 0.6, 0.5]],
                         width={5: 5})

    async def serve(self) -> None:
        self.served = True
        await asyncio.Event().wait()  # runs until the pipeline cancels it


def _study(tmp_path: Path) -> PreparedStudy:
    data = make_data_dir(tmp_path / "data")
    w = Warnings()
    reg = load_registry(data / "registry" / "apis.jsonl.gz", "full", w)
    queries = load_query_files(find_query_files(data), reg, w, subsets=["G1_instruction"])
    rtp = [Retrieved([5, 6, 7, 8, 9], [0.5, 0.4, 0.3, 0.2, 0.1]) for _ in queries]
    return PreparedStudy(RetrievalSettings(ks=(1, 5)), RunSettings(models=("scripted",), runs=1), data, reg, queries, None, None, None, None, rtp, w)  # type: ignore[arg-type]


def test_clients_and_stub_search_are_passed_in(tmp_path: Path) -> None:
    study = _study(tmp_path)
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
