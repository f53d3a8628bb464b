"""The study as a pipeline (`app.run_study`): meta.json built by one function from the stages' typed results,
every stage's seconds gathered there, `--archs` resolved once with route's τ bound after prepare, and the local
servers (simulator, llama.cpp) driven through one protocol (`app.local_servers.ModelServer`)."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import sys
from pathlib import Path

from helpers import REPO
from helpers.data import make_data_dir

from evaluator.app.local_servers import ServerStats
from evaluator.app.run_study import Extras, Memory, ModelsRun, Rendered, Results, StudyState, build_meta
from evaluator.data import Warnings, find_query_files, load_query_files, load_registry
from evaluator.llm import load_profile
from evaluator.llm.accounting import CallStats
from evaluator.results.cost import BatchStats
from evaluator.results.schema import LocalServer, Meta, PeakMemory, RegistryInfo, SimulatorStats
from evaluator.retrieval.ranking import Retrieved
from evaluator.settings.sections import RetrievalSettings, RunSettings, Settings
from evaluator.study import archs
from evaluator.study.archs.plugins import plugin_class
from evaluator.study.archs.route import Route
from evaluator.study.prepare import PreparedStudy
from evaluator.study.runner import StudyRunner, probe_archs, route_tau, study_archs

PREPARE_S = {"load_s": 0.5, "embed_s": 1.5, "rtp_search_s": 0.25}


def _state() -> StudyState:
    return StudyState("/data", "minilm", "fp32", "torch", RegistryInfo("full", 12, "apis.jsonl", "jsonl", "abc"),
                      {"G1_instruction": 3}, {"near_duplicate_api": {"count": 1, "examples": ["a"]}}, dict(PREPARE_S),
                      {"requested": 5, "cache_hits": 5}, "torch fp32 (cpu)", "faiss IndexFlatIP (cpu)")


def _results(**changes: object) -> Results:
    profiles = {n: dataclasses.replace(load_profile("sim", require_key=False), name=n) for n in ("sim", "local")}
    stats = {n: CallStats(requests=4, prompt_tokens=1000, completion_tokens=100) for n in profiles}
    servers = {"sim": ServerStats(simulator=SimulatorStats(requests=4, ok=4)),
               "local": ServerStats(llamacpp=LocalServer(model_file="m.gguf", slots=2, threads=1))}
    models = ModelsRun(stats, servers, {"sim": BatchStats(batches=1)}, {"sim": {"rtp": 2, "ptr": 4}}, seconds=3.0)
    base = Results(Settings(run=RunSettings(models=("sim", "local"), runs=2)), {}, "2026-01-01T00:00:00+0000",
                   profiles, _state(), models, Extras(None, {"scaling": "no subset to run it on"}))
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_meta_is_built_from_the_stage_results_and_gathers_every_stage_seconds() -> None:
    early = build_meta(_results())  # as written with the records, before the analyses and the render
    assert early.runtime.timings == {**PREPARE_S, "llm_s": 3.0}
    assert early.runtime.peak_rss_mib is None and early.analysis_notes == {"scaling": "no subset to run it on"}
    # Each server's stats land where meta.json keeps its kind, whatever the server was.
    assert set(early.runtime.simulator_stats or {}) == {"sim"} and set(early.runtime.local_server or {}) == {"local"}
    assert early.runtime.arch_calls == {"sim": {"rtp": 2, "ptr": 4}} and early.batch["sim"].batches == 1
    assert early.cost["sim"].online.prompt_tokens == 1000 and set(early.cost) == {"sim", "local"}
    assert [m.name for m in early.models] == ["sim", "local"] and early.runs == 2 and not early.retrieval_only

    done = _results(extras=Extras(None, {}, {"scaling_s": 1.0, "routing_s": 0.5}),
                    memory=Memory(PeakMemory(400.0, 400.0, 80.0), None), rendered=Rendered(2.0))
    final = build_meta(done)
    assert final.runtime.timings == {**PREPARE_S, "llm_s": 3.0, "scaling_s": 1.0, "routing_s": 0.5, "render_s": 2.0}
    assert final.runtime.peak_rss_mib == PeakMemory(400.0, 400.0, 80.0) and final.runtime.created == early.runtime.created
    assert build_meta(done) == final  # a value of its results: built again, the same
    assert Meta.from_dict(final.to_dict()).to_dict() == final.to_dict()  # and what meta.json reads back


def test_a_retrieval_only_meta_states_no_model_and_no_llm_stage() -> None:
    meta = build_meta(_results(profiles={}, models=None, extras=None, rendered=Rendered(1.0)))
    assert meta.retrieval_only and meta.runs == 1 and meta.models == [] and meta.llm_stats == {} and meta.cost == {}
    assert meta.runtime.timings == {**PREPARE_S, "render_s": 1.0}
    saved = meta.to_dict()["runtime"]
    assert not {"simulator_stats", "local_server", "arch_calls"} & set(saved)


def test_only_bundled_models_add_a_local_server_block() -> None:
    models = _results().models
    assert models is not None
    sims_only = dataclasses.replace(models, servers={"sim": models.servers["sim"]})
    saved = build_meta(_results(models=sims_only)).to_dict()["runtime"]
    assert "local_server" not in saved and set(saved["simulator_stats"]) == {"sim"}
    # a model on a provider's endpoint: no server at all, an empty simulator block as before
    saved = build_meta(_results(models=dataclasses.replace(models, servers={}))).to_dict()["runtime"]
    assert saved["simulator_stats"] == {} and "local_server" not in saved


# ---------------------------------------------------------------- --archs resolved once

COUNTING_PLUGIN = """
from evaluator.study.archs import Discovery

MADE = []

class Counted:
    name = "counted"

    def __init__(self):
        MADE.append(self)

    async def retrieve(self, ctx) -> Discovery:
        return Discovery([], plan=False)
"""


def _study(tmp_path: Path, specs: tuple[str, ...], lineup: archs.Lineup | None, tau: float | None = None) -> PreparedStudy:
    data = make_data_dir(tmp_path / "data")
    w = Warnings()
    reg = load_registry(data / "registry" / "apis.jsonl.gz", "full", w)
    queries = load_query_files(find_query_files(data), reg, w)
    rtp = [Retrieved(list(range(5)), [0.9 - 0.1 * i - 0.01 * qi for i in range(5)]) for qi in range(len(queries))]
    run = RunSettings(models=("sim",), runs=1, archs=specs, route_tau=tau)
    return PreparedStudy(RetrievalSettings(ks=(1, 5)), run, data, reg, queries, None, None, None, None, rtp, w,  # type: ignore[arg-type]
                         lineup=lineup)


def test_archs_are_resolved_once_and_route_gets_the_studys_tau(tmp_path: Path) -> None:
    (tmp_path / "counted.py").write_text(COUNTING_PLUGIN, encoding="utf-8")
    spec = f"{tmp_path / 'counted.py'}:Counted"
    lineup = archs.resolve(["rtp", "route", spec])  # before any work: the plugin imported, made once, checked
    assert lineup.specs == {"rtp": "rtp", "route": "route", "counted": spec}
    made_once = sys.modules[plugin_class(spec).__module__].MADE
    assert len(made_once) == 1
    study = _study(tmp_path, ("rtp", "route", spec), lineup)
    tau = route_tau(study)  # the median of RtP's top-1 scores: known after prepare, never a stand-in
    assert tau > 0.8
    made = study_archs(study)
    route = made["route"][1]
    assert isinstance(route, Route) and route.tau == tau
    # Every runner makes its own architectures from the one lineup: no second import, no state shared.
    runner = StudyRunner(study, {})
    assert runner.archs["counted"][1] is not made["counted"][1] and len(made_once) == 3
    asyncio.run(probe_archs(study, lineup))  # the probe too: its plugin is one of its own
    assert len(made_once) == 4 and len({id(a) for a in made_once}) == 4


def test_the_set_tau_is_the_one_route_runs_with(tmp_path: Path) -> None:
    study = _study(tmp_path, ("rtp", "ptr", "route"), archs.resolve(["rtp", "ptr", "route"]), tau=0.42)
    route = study_archs(study)["route"][1]
    assert isinstance(route, Route) and route.tau == 0.42


# ---------------------------------------------------------------- local servers behind one protocol

# ---------------------------------------------------------------- Meta made in one place



def meta_offences(source: str, where: str = "") -> list[str]:
    """`Meta(...)` made outside `build_meta`, and a field of a `meta` changed after it was made (`meta.x = ...`,
    `meta.runtime.timings = ...`)."""
    tree = ast.parse(source)
    bad = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Meta" \
                    and fn.name != "build_meta":
                bad.append(f"{where}:{node.lineno}: Meta(...) in {fn.name}")
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
            for t in targets:
                base = t
                while isinstance(base, ast.Attribute | ast.Subscript):
                    base = base.value
                if base is not t and isinstance(base, ast.Name) and base.id == "meta":
                    bad.append(f"{where}:{node.lineno}: {ast.unparse(t)} changed in {fn.name}")
    return sorted(set(bad))


def test_a_studys_meta_is_made_in_one_place_and_never_changed() -> None:
    bad = [b for p in sorted((REPO / "evaluator" / "app").rglob("*.py"))
           for b in meta_offences(p.read_text(encoding="utf-8"), str(p.relative_to(REPO)))]
    assert not bad, "meta.json is built by app.run_study.build_meta from the stages' results:\n" + "\n".join(bad)
    planted = ("def run(s):\n    meta = Meta(s)\n    meta.llm_stats = {}\n    meta.runtime.timings['x'] = 1\n"
               "def build_meta(r):\n    return Meta(r)\n")
    assert meta_offences(planted, "p") == ["p:2: Meta(...) in run", "p:3: meta.llm_stats changed in run",
                                           "p:4: meta.runtime.timings['x'] changed in run"]


def test_only_local_servers_knows_which_kind_of_server_it_started() -> None:
    """The use cases drive a server through `ModelServer` alone: no other app module names a kind of handle."""
    kinds = {"SimHandle", "LlamaHandle", "start_simulator", "start_llamacpp", "Simulator", "LlamaCpp"}
    bad = [f"{p.relative_to(REPO)}:{node.lineno}: {name}" for p in sorted((REPO / "evaluator" / "app").rglob("*.py"))
           if p.name != "local_servers.py" for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
           for name in ([node.id] if isinstance(node, ast.Name) else [node.attr] if isinstance(node, ast.Attribute)
                        else [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []) if name in kinds]
    assert not bad, "app modules telling the servers apart (use app.local_servers.ModelServer):\n" + "\n".join(bad)
