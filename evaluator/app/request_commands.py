"""Request files: `requests export` (a study's calls as a file any batch tool runs) and `requests run`
(a file sent through the engine, the batch API or Ray)."""


from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evaluator.app.dry_run import plan_requests, write_plan
from evaluator.app.run_study import (
    check_archs,
    checked_inputs,
    load_profiles,
    prepare_study,
    start_servers,
    use_servers,
)
from evaluator.batch import collect, ray_engine
from evaluator.batch.ray_engine import RayOptions, RayRun, run_requests_ray
from evaluator.batch.request_files import offline_profile, run_requests
from evaluator.batch.request_format import Result, read_requests, write_lines
from evaluator.batch.store import JobStore
from evaluator.core import aio
from evaluator.core.errors import ConfigError
from evaluator.core.paths import resolve_path
from evaluator.core.progress import SILENT, Reporter
from evaluator.llm import load_profile
from evaluator.llm.accounting import CallStats
from evaluator.llm.engine import STOP_GRACE_S
from evaluator.results.schema import (
    check_writable,
)
from evaluator.settings.invocation import Invocation
from evaluator.settings.sections import Settings


@dataclass
class Exported:
    out: Path
    per_model: dict[str, int]  # requests written per model
    cache_root: Path


def export_requests(s: Settings, inv: Invocation, out: Path, reporter: Reporter = SILENT) -> Exported:
    """`requests export`: every chat request the study would send now that is not cached, into `out`.

    The run's checks and order with offline profiles (the same cache keys, no key needed): inputs
    checked, the study prepared, then one collect pass instead of the models' runs. The PtR planners
    need the discovery replies, so a second export after the first results were imported holds them."""
    cache_root = resolve_path(s.run.cache_dir)
    check_writable(out.parent, "requests export: the output file's folder")
    check_writable(cache_root, "--cache-dir")
    if not s.run.models:
        raise ConfigError("requests export: name the model(s) with --model PROFILE")
    profiles = load_profiles(s, inv, offline=True)
    check_archs(s)
    checked = checked_inputs(s, inv, reporter)
    study = prepare_study(checked.settings, checked.inputs, cache_root, reporter)
    todo = aio.run(collect.collect(study, profiles, cache_root))
    store = JobStore(cache_root)
    try:
        for name, reqs in todo.items():
            store.remember_export(name, [r.custom_id for r in reqs])  # so `requests import` needs no --model
    finally:
        store.close()
    write_lines(out, [r for reqs in todo.values() for r in reqs])
    return Exported(out, {n: len(r) for n, r in todo.items()}, cache_root)


@dataclass
class RanFile:
    results: list[Result]
    stats: CallStats  # the engine's accounting (requests sent, cache hits, ...)
    seconds: float
    ray: RayRun | None = None  # --engine ray: where and how Ray ran it


def plan_request_file(path: Path, model: str, out: Path, cache_root: Path, **overrides: Any) -> str:
    """`requests run --dry-run`: the plan of a request file, as JSON beside `out`; nothing is sent."""
    requests = read_requests(path)
    plan = plan_requests(requests, offline_profile(model, **overrides), cache_root)
    return write_plan(plan, out.with_name(out.stem + ".plan.json"))


def run_request_file(path: Path, model: str, out: Path, cache_root: Path, *, reporter: Reporter = SILENT,
                     ray: RayOptions | None = None, grace_s: float = STOP_GRACE_S, **overrides: Any) -> RanFile:
    """`requests run`: any request file through the online engine (limits, retries, cache, resume) into a
    results file, or with `ray` through Ray Data LLM (`batch.ray_engine`: the same cache, the same
    results). The whole file is checked, and `out` writable, before anything is sent."""
    if out.resolve() == path.resolve():
        raise ConfigError("requests run: --out must not be the input file")
    requests = read_requests(path)
    check_writable(out.parent, "--out")  # one line now, not a traceback after every request was sent
    profile = load_profile(model, **overrides)
    if ray is not None:
        ray_engine.check(profile, ray)  # Ray missing, vLLM missing, a pace Ray cannot keep: one line, before any start
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        servers = start_servers(stack, {profile.name: profile}, cache_root)
        profiles = use_servers({profile.name: profile}, servers)
        server = servers.get(profile.name)
        ran: RayRun | None = None
        if ray is not None:
            results, stats, ran = run_requests_ray(requests, profiles[profile.name], cache_root, ray, reporter=reporter)
        else:
            results, stats = aio.run(run_requests(requests, profiles[profile.name], cache_root, reporter=reporter,
                                                  grace_s=grace_s, locate=getattr(server, "locate", None)))
    write_lines(out, results)
    return RanFile(results, stats, time.perf_counter() - t0, ran)

