"""`arch check FILE.py:Class`: a plugin tried on a small registry against the simulator, in seconds, before a study.

The plugin is loaded and checked as `--archs` loads it, then run through the study's own runner (the same
`Context`, the same seam checks, the planner after it) on the first queries of each subset of a registry:
`examples/mcp` (38 tools of five MCP servers, 32 requests) unless `--data` / `--tools` / `--queries` name
another. The model is the `sim` profile (a simulator started for it, nothing leaves the machine) with its
schemas sent (`structured = json_schema`: the simulator answers a plugin's own structured prompt with JSON valid
against its schema, so the plugin's parser runs); `--model` takes any other profile, whose calls are then real.
Every query's list, trace, own calls (their replies) and planner choice come back, with any failure (`arch_error`,
`contract`, `timeout`, `cycle`) and its one line, as a study would count it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evaluator.app.local_servers import served, start_servers
from evaluator.app.run_study import load_checked, load_profiles, prepare_study
from evaluator.core import aio
from evaluator.core.errors import ConfigError
from evaluator.core.paths import EXAMPLES_DIR, resolve_path
from evaluator.core.progress import SILENT, Reporter
from evaluator.llm import ChatResult, LLMEngine, revised
from evaluator.results.schema import ArchBlock, check_writable
from evaluator.settings.invocation import Invocation
from evaluator.settings.sections import Settings
from evaluator.study import archs, prompts
from evaluator.study.runner import ARCH_OF_CALL, StudyRunner, Unit

EXAMPLE = EXAMPLES_DIR / "mcp"  # the registry and queries tried when none is named
LIMIT = 3  # queries per subset tried when --limit is not given


@dataclass
class CallSeen:
    """One call the plugin's own code made for a query (not the planner), and what came back."""

    version: str
    schema: bool  # it passed a schema (sent as the profile's `structured` says)
    reply: str | None
    error: str | None


@dataclass
class QueryChecked:
    subset: str
    query_id: int | str
    text: str
    block: ArchBlock  # the plugin's block, as a study's record holds it
    calls: list[CallSeen] = field(default_factory=list)


@dataclass
class ArchChecked:
    spec: str
    name: str
    model: str
    simulated: bool
    structured: str
    registry: str  # where it came from
    size: int
    retriever: str
    queries: list[QueryChecked]

    @property
    def failed(self) -> list[QueryChecked]:
        return [q for q in self.queries if q.block.failure is not None]


class _Recorder:
    """The model's engine, with every call of the plugin's own code noted (the planner's are not)."""

    def __init__(self, engine: LLMEngine, name: str) -> None:
        self.engine, self.name = engine, name
        self.seen: list[CallSeen] = []

    async def chat(self, messages: list[dict], *, run: int, prompt_version: str,
                   schema: dict | None = None) -> ChatResult:
        result = await self.engine.chat(messages, run=run, prompt_version=prompt_version, schema=schema)
        if ARCH_OF_CALL.get() == self.name and prompt_version != prompts.PLANNER_VERSION:
            self.seen.append(CallSeen(prompt_version, schema is not None, result.content, result.error))
        return result


def settings_for(s: Settings, spec: str, flags_given: frozenset[str]) -> Settings:
    """The study's settings for the check: the plugin alone, one run, the example registry unless data was named,
    a few queries per subset unless --limit was given."""
    data = s.data
    if not ({"data.dir", "data.tools", "data.queries"} & flags_given):
        data = dataclasses.replace(data, dir=str(EXAMPLE), tools="", queries=())
    if "data.limit" not in flags_given:
        data = dataclasses.replace(data, limit=LIMIT)
    models = s.run.models if "run.models" in flags_given else ("sim",)
    return dataclasses.replace(s, data=data, run=dataclasses.replace(s.run, archs=(spec,), runs=1, models=models))


def check(spec: str, s: Settings, inv: Invocation, reporter: Reporter = SILENT) -> ArchChecked:
    """`spec` run on the settings' data (see `settings_for`) against its one model; the plugin's blocks."""
    if not archs.is_plugin_spec(spec):
        raise ConfigError(f"arch check {spec}: name a plugin as path/to/file.py:ClassName or package.module:ClassName "
                          "(the built-ins are checked by the test suite).")
    lineup = archs.resolve([spec], resolve_path)  # loads and checks it: one line if broken
    name = next(iter(lineup.specs))
    if len(s.run.models) != 1:
        raise ConfigError("arch check tries a plugin against one model: pass one --model.")
    cache_root = resolve_path(s.run.cache_dir)
    check_writable(cache_root, "--cache-dir")
    profiles = load_profiles(s.run, inv)
    model, profile = next(iter(profiles.items()))
    if profile.server.simulated and inv.overrides.structured is None:  # the simulator answers a schema once sent
        profiles = {model: (profile := revised(profile, structured="json_schema"))}
    with contextlib.ExitStack() as stack:
        servers = start_servers(stack, profiles, cache_root)
        loaded = load_checked(s, inv, reporter)
        study = prepare_study(loaded.settings, loaded.inputs, cache_root, reporter, lineup)
        serving = served(profiles, servers)
        queries = aio.run(_run(study, serving[model], cache_root, name, inv.fail_fast))
    registry = s.data.tools or s.data.dir
    return ArchChecked(spec, name, model, profile.server.simulated, profile.sampling.structured, str(registry),
                       len(study.registry), loaded.settings.retrieval.retriever, queries)


async def _run(study: Any, profile: Any, cache_root: Path, name: str, fail_fast: bool) -> list[QueryChecked]:
    out: list[QueryChecked] = []
    async with LLMEngine(profile, cache_root=cache_root) as engine:
        client = _Recorder(engine, name)
        runner = StudyRunner(study, {profile.name: client}, fail_fast=fail_fast)
        for qi, q in enumerate(study.queries):  # one at a time: each query's calls are its own
            client.seen = []
            rec = await runner.run_one(Unit(profile.name, 0), qi)
            block = rec.arch(name)
            assert block is not None
            out.append(QueryChecked(q.subset, q.query_id, q.text, block, client.seen))
    return out
