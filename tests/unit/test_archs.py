"""Architectures as units (`evaluator.study.archs`): what a user of hyde, rewrite, fusion, route and a plugin sees.

The runner is driven in-process with a chat client that answers every prompt as the simulator does
(`simulator.behaviour.reply`) and a word-overlap search over the tiny registry, so every list is real and
every call is counted here, not by the code under test.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest
from helpers import FIXTURES, REPO
from helpers.fakes import SimClient, WordSearch, make_study

from evaluator.batch.request_files import offline_profile
from evaluator.cli.main import main
from evaluator.llm import LLMEngine
from evaluator.results import migrate
from evaluator.results.schema import FORMAT_VERSION, OutputDir, PtrBlock, Record, record_line
from evaluator.settings.sections import RunSettings
from evaluator.study import archs, prompts
from evaluator.study.archs.fusion import rrf
from evaluator.study.prepare import PreparedStudy
from evaluator.study.runner import StudyRunner, Unit, probe_archs
from simulator.behaviour import reply

PLUGIN_FILE = "examples/arch_plugin/clauses.py:Clauses"
PLUGIN_MODULE = "examples.arch_plugin.clauses:Clauses"
SEVEN = ["rtp", "ptr", "hyde", "rewrite", "fusion", "route", str(REPO / "examples/arch_plugin/clauses.py") + ":Clauses"]


def with_archs(study: PreparedStudy, *names: str) -> PreparedStudy:
    return dataclasses.replace(study, run=dataclasses.replace(study.run, archs=names))


def run(study: PreparedStudy, search: WordSearch) -> tuple[list[Record], SimClient, StudyRunner]:
    client = SimClient()
    runner = StudyRunner(study, {"sim": client}, batcher=search)
    records = asyncio.run(runner.run([Unit("sim", 0)]))
    return sorted(records, key=lambda r: (r.subset, str(r.query_id))), client, runner


def test_fusion_makes_no_call_of_its_own_but_its_planner(tmp_path: Path) -> None:
    study, search = make_study(tmp_path, ["rtp", "ptr"])
    base, base_client, _ = run(study, search)
    study = with_archs(study, "rtp", "ptr", "fusion")
    recs, client, _ = run(study, search)
    n = len(study.queries)
    disc = [c for c in client.calls if c[0] == prompts.DISCOVERY_VERSION]
    assert len(disc) == n == len([c for c in base_client.calls if c[0] == prompts.DISCOVERY_VERSION])
    assert len(client.calls) == len(base_client.calls) + n  # one planner per query more, nothing else
    for r, b in zip(recs, base, strict=True):
        assert r.arch_names == ["rtp", "ptr", "fusion"]
        assert r.rtp == b.rtp and r.ptr == b.ptr  # the others' blocks are what they were without fusion
        fused = r.arch("fusion")
        assert fused is not None and fused.retrieved == rrf([r.rtp.retrieved, r.ptr.retrieved], study.retrieval.k_max)[0]
        assert fused.tokens["discovery"] == r.ptr.tokens["discovery"]  # the reused call counts in its cost
        assert fused.plan is not None and fused.plan.usable
    # asked alone, fusion still makes PtR's discovery once per query, and keeps RtP's retrieval as every run does
    study = with_archs(study, "fusion")
    alone, client, _ = run(study, search)
    assert len([c for c in client.calls if c[0] == prompts.DISCOVERY_VERSION]) == n
    assert all(r.arch_names == ["rtp", "fusion"] and r.rtp is not None and r.rtp.plan is None for r in alone)
    assert [r.arch("fusion") for r in alone] == [r.arch("fusion") for r in recs]


def test_route_takes_one_side_and_only_its_tokens(tmp_path: Path) -> None:
    study, search = make_study(tmp_path, ["rtp", "ptr", "route"], route_tau=0.3)
    recs, client, runner = run(study, search)
    plain, plain_client, _ = run(make_study(tmp_path / "b", ["rtp", "ptr"])[0], search)
    assert len(client.calls) == len(plain_client.calls)  # route makes no call of its own
    sides = set()
    for r in recs:
        route = r.arch("route")
        assert route is not None and r.rtp is not None and r.ptr is not None
        side = "rtp" if r.rtp.scores[0] >= 0.3 else "ptr"
        sides.add(side)
        assert route.side == side and route.trace == {"side": side, "top1": pytest.approx(r.rtp.scores[0], abs=1e-6),
                                                      "tau": 0.3}
        other = r.rtp if side == "rtp" else r.ptr
        assert route.retrieved == other.retrieved and route.tokens == other.tokens and route.plan == other.plan
        assert isinstance(route, PtrBlock) == (side == "ptr")
    assert sides == {"rtp", "ptr"}  # this τ splits the tiny data set
    assert runner.arch_calls.get(("sim", "route"), 0) == 0
    # unset, τ is the median of RtP's top-1 scores: half the queries each way, up to ties
    study2, _ = make_study(tmp_path / "c", ["route"])
    recs2, client2, _ = run(study2, search)
    top1 = sorted(r.scores[0] for r in study2.rtp)
    tau = top1[len(top1) // 2] if len(top1) % 2 else (top1[len(top1) // 2 - 1] + top1[len(top1) // 2]) / 2
    assert all(r.arch("route").trace["tau"] == pytest.approx(tau) for r in recs2)  # type: ignore[union-attr]
    # asked alone, route calls only what its side needs: RtP's planner, or PtR's discovery and planner
    to_ptr = sum(1 for r in recs2 if r.arch("route").side == "ptr")  # type: ignore[union-attr]
    assert len([c for c in client2.calls if c[0] == prompts.DISCOVERY_VERSION]) == to_ptr


def test_hyde_and_rewrite_search_what_the_model_wrote_under_their_prompt_versions(tmp_path: Path) -> None:
    study, search = make_study(tmp_path, ["rtp", "hyde", "rewrite"])
    recs, client, _ = run(study, search)
    versions = {v for v, _ in client.calls}
    assert versions == {prompts.PLANNER_VERSION, prompts.HYDE_VERSION, prompts.REWRITE_VERSION}
    for r in recs:
        hyde, rw = r.arch("hyde"), r.arch("rewrite")
        assert isinstance(hyde, PtrBlock) and hyde.stubs and len(hyde.stub_hits) == len(hyde.stubs)
        assert set(hyde.tokens) == {"hyde", "planner"} and set(rw.tokens) == {"rewrite", "planner"}  # type: ignore[union-attr]
        query = rw.trace["query"]  # type: ignore[union-attr,index]
        assert query and query != r.query  # the model's query was searched, not the request
        rows, scores = search.hits(query)
        assert rw.scores == [round(x, 6) for x in scores]  # type: ignore[union-attr]
        best = {study.registry.ids[i] for i, x in zip(rows, scores, strict=True) if x == scores[0]}
        assert rw.retrieved[0] in best  # type: ignore[union-attr]
    # the version enters the response-cache key: a new prompt version is a new request, not an old reply
    engine = LLMEngine(offline_profile("sim"), api_key="")
    msgs = prompts.hyde_messages("Find the weather in Paris.")
    key = engine.prepare(msgs, run=0, prompt_version=prompts.HYDE_VERSION, schema=prompts.HYDE_SCHEMA).key
    assert key != engine.prepare(msgs, run=0, prompt_version="hyde-v2", schema=prompts.HYDE_SCHEMA).key
    msgs = prompts.rewrite_messages("Find the weather in Paris.")
    key = engine.prepare(msgs, run=0, prompt_version=prompts.REWRITE_VERSION).key
    assert key != engine.prepare(msgs, run=0, prompt_version="rewrite-v2").key


@pytest.mark.parametrize("spec", [PLUGIN_FILE, PLUGIN_MODULE])
def test_a_plugin_loads_from_a_file_or_a_module_and_runs(tmp_path: Path, spec: str, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(REPO))
    study, search = make_study(tmp_path, ["rtp", spec])
    recs, client, _ = run(study, search)
    for r in recs:
        assert r.arch_names == ["rtp", "clauses"]
        mine = r.arch("clauses")
        assert mine is not None and mine.trace and mine.trace["clauses"]
        merged = {}
        for text in mine.trace["clauses"]:
            rows, scores = search.hits(text)
            for i, sc in zip(rows, scores, strict=True):
                merged[study.registry.ids[i]] = max(merged.get(study.registry.ids[i], -1), sc)
        assert mine.retrieved[0] in {a for a, v in merged.items() if v == max(merged.values())}
        assert mine.plan is not None and set(mine.tokens) == {"planner"}
    assert len(client.calls) == 2 * len(study.queries)  # RtP's planner and the plugin's


BROKEN = {
    "syntax.py": ("class Bad:\n    name = 'bad'\n    async def retrieve(self, ctx) ->\n", "importing", "SyntaxError"),
    "missing.py": ("class Other:\n    pass\n", "has no class named Bad", None),
    "nomethod.py": ("class Bad:\n    name = 'bad'\n", "no method retrieve", None),
    "sync.py": ("class Bad:\n    name = 'bad'\n    def retrieve(self, ctx):\n        return None\n", "coroutine", None),
    "annot.py": ("class Bad:\n    name = 'bad'\n    async def retrieve(self, ctx) -> list:\n        return []\n",
                 "annotated to return list", None),
    "noname.py": ("class Bad:\n    async def retrieve(self, ctx):\n        return None\n", "needs a `name`", None),
}


@pytest.mark.parametrize("file", sorted(BROKEN))
def test_a_broken_plugin_is_one_line_and_exit_2_before_any_work(tmp_path: Path, file: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    source, says, also = BROKEN[file]
    (tmp_path / file).write_text(source, encoding="utf-8")
    spec = f"{tmp_path / file}:Bad"
    code = main(["--model", "sim", "--runs", "1", "--archs", f"rtp,{spec}", "--data", str(tmp_path / "none"),
                 "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "Traceback" not in err, err
    assert f"--archs {spec}" in err and says in err and (also is None or also in err)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_plugin_that_returns_the_wrong_type_stops_at_the_probe(tmp_path: Path) -> None:
    # app.run_study runs this probe after preparing, before any call: every call of it fails unsent
    (tmp_path / "wrong.py").write_text("class Bad:\n    name = 'bad'\n    async def retrieve(self, ctx):\n"
                                       "        await ctx.chat([{'role': 'user', 'content': 'x'}], prompt_version='x')\n"
                                       "        return [('x', 1.0)]\n", encoding="utf-8")
    spec = f"{tmp_path / 'wrong.py'}:Bad"
    study, search = make_study(tmp_path, ["rtp", spec])
    with pytest.raises(archs.ArchError, match=re.escape(f"--archs {spec}: retrieve returned list, not ")):
        asyncio.run(probe_archs(study, archs.resolve(study.run.archs), batcher=search))
    (tmp_path / "raises.py").write_text("class Bad:\n    name = 'bad'\n    async def retrieve(self, ctx):\n"
                                        "        raise KeyError('oops')\n", encoding="utf-8")
    spec = f"{tmp_path / 'raises.py'}:Bad"
    with pytest.raises(archs.ArchError, match=re.escape(f"--archs {spec}: retrieve raised KeyError")):
        asyncio.run(probe_archs(study, archs.resolve(["rtp", spec]), batcher=search))


def test_unknown_and_duplicate_architectures_are_one_line() -> None:
    with pytest.raises(archs.ArchError, match="no such architecture"):
        archs.resolve(["rtp", "nope"])
    with pytest.raises(archs.ArchError, match="a second architecture named 'rtp'"):
        archs.resolve(["rtp", "rtp"])
    with pytest.raises(ValueError, match="plugin path/to/file.py:ClassName"):
        RunSettings(archs=("rtp", "ptr2"))


def test_format_4_holds_the_archs_mapping_in_archs_order_and_migrates_older_lines(tmp_path: Path) -> None:
    assert FORMAT_VERSION == 5  # 5 added `grades` (test_beir.py) and a block's `failure`; a line of 4 reads as it is
    old = {"model": "sim", "run": 0, "subset": "G1", "query_id": 3, "query": "q", "gold": {"api_list": ["a"]},
           "rtp": {"retrieved": ["a", "b"], "scores": [0.9, 0.8], "plan": None, "tokens": {}},
           "ptr": {"retrieved": ["b"], "scores": [0.7], "plan": None, "tokens": {}, "stubs": []}}
    new = migrate.record(old, 3)
    assert list(new["archs"]) == ["rtp", "ptr"] and "rtp" not in new and new["archs"]["ptr"] == old["ptr"]
    assert migrate.record(new, 4) is new and migrate.record(new, 5) is new
    rec = Record.from_dict(new)
    assert rec.arch_names == ["rtp", "ptr"] and isinstance(rec.ptr, PtrBlock) and rec.rtp.retrieved == ["a", "b"]  # type: ignore[union-attr]
    # a run with --archs ptr,rtp,plugin writes and reads them in that order (not sorted), blocks typed by shape
    d = {**{k: v for k, v in old.items() if k not in ("rtp", "ptr")},
         "archs": {"ptr": old["ptr"], "rtp": old["rtp"], "mine": {**old["rtp"], "trace": {"why": 1}}}}
    rec = Record.from_dict(d)
    line = record_line(rec)
    assert line.startswith('{"archs": {"ptr": ') and line.endswith("}\n")
    back = Record.from_dict(json.loads(line))
    assert back == rec and back.arch_names == ["ptr", "rtp", "mine"] and back.arch("mine").trace == {"why": 1}  # type: ignore[union-attr]
    od = OutputDir(tmp_path)
    od.write_meta(__import__("evaluator.results.schema", fromlist=["Meta"]).Meta())
    od.write_records([rec])
    assert od.read_records()[0].arch_names == ["ptr", "rtp", "mine"]


def test_a_format_2_folder_reads_through_the_migration(tmp_path: Path) -> None:
    # commit 2acddc3's folder (format 0): every record's blocks come back under `archs`, rtp then ptr
    src = FIXTURES / "commit-2acddc3"
    shutil.copytree(src, tmp_path / "f")
    lines = [json.loads(x) for x in (src / "queries.jsonl").read_text(encoding="utf-8").splitlines()]
    recs = OutputDir(tmp_path / "f").read_records()
    assert len(recs) == len(lines)
    for r, line in zip(recs, lines, strict=True):
        assert r.arch_names == ["rtp", "ptr"] and r.rtp is not None and r.rtp.retrieved == line["rtp"]["retrieved"]
        assert r.ptr is not None and [s.name for s in r.ptr.stubs] == [s["name"] for s in line["ptr"]["stubs"]]


def test_the_simulator_answers_hyde_and_rewrite_in_both_reply_forms() -> None:
    from evaluator.study.parse import parse_documents, parse_query
    q = "I'm planning a trip to Paris. Find flights from Berlin and also get the weather forecast for next week."
    fmt = {"type": "json_schema", "json_schema": {}}
    for structured in (None, fmt):
        docs, err = parse_documents(reply(prompts.hyde_messages(q), seed=1, temperature=0.0, response_format=structured)[0])
        assert err is None and len(docs) >= 2 and all(d.name and len(d.reasoning.split()) >= 6 for d in docs)
        said = [(d.name + " " + d.reasoning).lower() for d in docs]  # one entry per need, in documentation words
        assert any("flight" in s for s in said) and any("weather" in s for s in said)
        text, err = parse_query(reply(prompts.rewrite_messages(q), seed=1, temperature=0.0, response_format=structured)[0])
        assert err is None and "flights" in text and "weather" in text and "paris" not in text.lower()


def test_a_reply_that_copies_the_prompts_example_is_flagged() -> None:
    from evaluator.study.parse import parse_documents, parse_query
    copied = json.dumps({"query": prompts.REWRITE_EXAMPLE})
    assert parse_query(copied, "What time is it in Tokyo?") == ("", "copied the prompt's example")
    assert parse_query(copied, "Will it rain in Oslo tomorrow?") == (prompts.REWRITE_EXAMPLE, None)  # its own need
    docs, _ = parse_documents(json.dumps([{"name": prompts.HYDE_EXAMPLE, "description": "Forecast."},
                                          {"name": "Time/current time", "description": "Time in a zone."}]),
                              "What time is it in Tokyo?")
    assert [d.example_copy for d in docs] == [True, False]


def test_an_unknown_architecture_on_the_command_line_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", "sim", "--archs", "rtp,ptr2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--archs value 'ptr2' is impossible" in err and "file.py:ClassName" in err
