"""Pipeline stage: runs the study and writes `meta.json` and `queries.jsonl`, then the report."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from . import __version__, prompts, retrieve
from .config import Settings
from .llm import ChatResult, ConfigError, FatalLLMError, LLMEngine, ModelProfile, load_profile
from .parse import Plan, parse_plan, parse_stubs, stub_text
from .progress import Progress
from .records import base_record, ptr_retrieval_block, retrieval_block, write_records
from .retrieve import Retrieved
from .sim.harness import start_simulator
from .study import Study, prepare


def study_meta(study: Study, models: list[dict] | None = None) -> dict:
    s = study.settings
    settings = asdict(s)
    settings.pop("data_from_cli", None)
    return {
        "version": __version__,
        "settings": settings,
        "data_dir": str(study.data_dir),
        "embedder": study.embedder.cache_name,
        "precision": study.embedder.precision,
        "registry": {"choice": s.registry, "size": len(study.registry), "source": study.registry.source},
        "subsets": study.subsets,
        "k": s.k,
        "ks": sorted(set(s.ks)),
        "runs": s.runs if models else 1,
        "models": models or [],
        "simulated": any(m.get("simulated") for m in models or []),
        "retrieval_only": not models,
        "warnings": study.warnings.as_dict(),
        # Everything that changes from one invocation to the next lives here and stays out of summary.json.
        "runtime": {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "timings": study.timings, "embed": asdict(study.embedder.stats)},
    }


def write_meta(out: Path, meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "meta.json.tmp"
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True, default=str), encoding="utf-8")
    tmp.replace(out / "meta.json")


def run_retrieval_only(s, out: Path, progress: bool = True) -> Study:
    study = prepare(s, progress)
    records = []
    for q, r in zip(study.queries, study.rtp, strict=True):
        rec = base_record(q, None, 0)
        rec["rtp"] = retrieval_block(r, study.registry) | {"plan": None, "tokens": {}}
        records.append(rec)
    write_meta(out, study_meta(study))
    write_records(out / "queries.jsonl", records)
    _render(out)
    return study


def _render(out: Path) -> None:
    from .report import render

    render(out)


# ---------------------------------------------------------------- the full study (LLM calls)


_LINGER_S = 0.02


@dataclass
class Unit:
    """One (model, run): its engine is shared by every run of the model, so one limiter spans them."""

    model: str
    run: int


class StubBatcher:
    """Embeds and searches PtR stubs in micro-batches as discovery replies arrive.

    Waiting for the slowest discovery reply before embedding would leave the planner idle; embedding
    each reply alone would pay one model call and one FAISS call per query. Instead every reply that
    arrives while a batch is being processed joins the next batch.
    """

    def __init__(self, study: Study) -> None:
        self.study = study
        self.queue: asyncio.Queue[tuple[list[str], asyncio.Future[Retrieved]]] = asyncio.Queue()
        self.batches = 0

    async def retrieve(self, texts: list[str]) -> Retrieved:
        fut: asyncio.Future[Retrieved] = asyncio.get_running_loop().create_future()
        await self.queue.put((texts, fut))
        return await fut

    async def serve(self) -> None:
        while True:
            items = [await self.queue.get()]
            # Let replies that arrive together share one embedding call and one batched FAISS search
            # (FAISS's one-query path costs ~10x more per query); negligible next to LLM latency.
            await asyncio.sleep(_LINGER_S)
            while not self.queue.empty():
                items.append(self.queue.get_nowait())
            try:
                results = await asyncio.to_thread(self._search, [t for t, _ in items])
            except Exception as e:  # a failing batch must not leave its planners waiting forever
                for _, fut in items:
                    if not fut.done():
                        fut.set_exception(e)
                continue
            for (_, fut), r in zip(items, results, strict=True):
                if not fut.done():
                    fut.set_result(r)

    def _search(self, per_query: list[list[str]]) -> list[Retrieved]:
        self.batches += 1
        s = self.study.settings
        texts = [t for ts in per_query for t in ts]
        owners = [q for q, ts in enumerate(per_query) for _ in ts]
        vecs = self.study.embedder.encode(texts, progress=False) if texts else np.zeros((0, self.study.api_vecs.shape[1]), np.float32)
        return retrieve.ptr(self.study.index, vecs, owners, len(per_query), s.k_max, sorted(set(s.ks)))


def _plan_block(result: ChatResult | None, plan: Plan | None) -> dict:
    if result is None or plan is None:
        return {"steps": [], "selected": [], "refused": False, "parse_error": None, "llm_error": result.error if result else None}
    return {
        "steps": plan.steps,
        "selected": plan.selected,
        "refused": not plan.selected and plan.parse_error is None,
        "parse_error": plan.parse_error,
        "llm_error": None,
    }


def _tokens(result: ChatResult | None) -> dict:
    return {"prompt": result.prompt_tokens if result else 0, "completion": result.completion_tokens if result else 0}


class StudyRunner:
    def __init__(self, study: Study, engines: dict[str, LLMEngine], progress: Progress) -> None:
        self.study = study
        self.engines = engines
        self.progress = progress
        self.batcher = StubBatcher(study)
        self.display = study.registry.lookup_display()
        self.reg = study.registry
        self.records: list[dict] = []

    async def _chat(self, model: str, messages: list[dict], run: int, version: str) -> ChatResult:
        engine = self.engines[model]
        result = await engine.chat(messages, run=run, prompt_version=version)
        self.progress.advance(model)
        return result

    async def _plan(self, model: str, run: int, query: str, rows: list[int]) -> tuple[ChatResult, Plan | None]:
        apis = [self.reg.apis[i] for i in rows[: self.study.settings.k]]
        msgs = prompts.planner_messages(query, [(a.tool_name, a.api_name, a.description) for a in apis])
        result = await self._chat(model, msgs, run, prompts.PLANNER_VERSION)
        if result.error is not None:
            return result, None
        plan = parse_plan(result.content, [(a.id, a.display) for a in apis], lambda n: self.display.get(n.casefold()))
        return result, plan

    async def _rtp(self, unit: Unit, qi: int) -> dict:
        q, r = self.study.queries[qi], self.study.rtp[qi]
        result, plan = await self._plan(unit.model, unit.run, q.text, r.rows)
        return retrieval_block(r, self.reg) | {"plan": _plan_block(result, plan), "tokens": {"planner": _tokens(result)}}

    async def _ptr(self, unit: Unit, qi: int) -> dict:
        q = self.study.queries[qi]
        disc = await self._chat(unit.model, prompts.discovery_messages(q.text), unit.run, prompts.DISCOVERY_VERSION)
        stubs, perr = parse_stubs(disc.content) if disc.error is None else ([], None)
        texts = [stub_text(st) for st in stubs]
        fallback = not texts and self.study.settings.fallback_to_query
        if fallback:
            texts = [q.text]
        block = {
            "stubs": [{"name": st.name, "reasoning": st.reasoning} for st in stubs],
            "discovery_parse_error": perr,
            "discovery_llm_error": disc.error,
            "fallback": fallback,
        }
        if not texts:
            # No stub, no retrieval, no planner call: counted in Gen%, scored as retrieving nothing.
            self.progress.advance(unit.model)
            empty = Retrieved([], [], width={k: 0 for k in self.study.settings.ks})
            return block | ptr_retrieval_block(empty, self.reg) | {
                "plan": _plan_block(None, None),
                "tokens": {"discovery": _tokens(disc), "planner": _tokens(None)},
            }
        r = await self.batcher.retrieve(texts)
        result, plan = await self._plan(unit.model, unit.run, q.text, r.rows)
        return block | ptr_retrieval_block(r, self.reg) | {
            "plan": _plan_block(result, plan),
            "tokens": {"discovery": _tokens(disc), "planner": _tokens(result)},
        }

    async def _query(self, unit: Unit, qi: int) -> None:
        archs = self.study.settings.archs
        parts = await asyncio.gather(
            self._rtp(unit, qi) if "rtp" in archs else _none(),
            self._ptr(unit, qi) if "ptr" in archs else _none(),
        )
        rec = base_record(self.study.queries[qi], unit.model, unit.run)
        if "rtp" in archs:
            rec["rtp"] = parts[0]
        else:
            rec["rtp"] = retrieval_block(self.study.rtp[qi], self.reg) | {"plan": None, "tokens": {}}
        if "ptr" in archs:
            rec["ptr"] = parts[1]
        self.records.append(rec)

    async def run(self, units: list[Unit]) -> None:
        server = asyncio.create_task(self.batcher.serve())
        try:
            tasks: list[asyncio.Task] = []
            try:
                for u in units:
                    for qi in range(len(self.study.queries)):
                        tasks.append(asyncio.create_task(self._query(u, qi)))
                        if len(tasks) % 64 == 0:
                            # Let these start (cache lookups, first requests) before creating more:
                            # thousands of ready tasks would otherwise hold every request back.
                            await asyncio.sleep(0)
                await asyncio.gather(*tasks)
            except BaseException:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise
        finally:
            server.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await server


async def _none() -> None:
    return None


def load_profiles(s: Settings, args) -> dict[str, ModelProfile]:
    """Every profile resolved and checked (keys present) before any work starts."""
    profiles = {}
    for name in dict.fromkeys(s.models):
        p = load_profile(
            name,
            base_url=getattr(args, "base_url", None),
            concurrency=getattr(args, "concurrency", None),
            rpm=getattr(args, "rpm", None),
            tpm=getattr(args, "tpm", None),
        )
        if p.name in profiles:
            raise ConfigError(f"two models are both named {p.name!r}; give each profile its own name")
        profiles[p.name] = p
    return profiles


async def _run_async(study: Study, profiles: dict[str, ModelProfile], progress: Progress) -> tuple[list[dict], dict]:
    s = study.settings
    cache_root = s.resolve_path(s.cache_dir)
    async with contextlib.AsyncExitStack() as stack:
        engines = {n: await stack.enter_async_context(LLMEngine(p, cache_root=cache_root)) for n, p in profiles.items()}
        for n, e in engines.items():
            progress.attach(n, e.stats)
        runner = StudyRunner(study, engines, progress)
        units = [Unit(m, r) for m in profiles for r in range(s.runs)]
        try:
            await runner.run(units)
        finally:
            stats = {n: e.stats.as_dict() for n, e in engines.items()}
    return runner.records, stats


def run_study(s: Settings, out: Path, args=None, progress: bool = True) -> Study:
    profiles = load_profiles(s, args)
    study = prepare(s, progress)
    sims = {}
    with contextlib.ExitStack() as stack:
        for name, p in list(profiles.items()):
            if p.simulated and not p.base_url:
                sims[name] = stack.enter_context(start_simulator())
                profiles[name] = dataclasses.replace(p, base_url=sims[name].base_url)
        per_unit = (("rtp" in s.archs) + 2 * ("ptr" in s.archs)) * len(study.queries) * s.runs
        bar = Progress({n: per_unit for n in profiles}, enabled=progress)
        t = time.perf_counter()
        try:
            with bar:
                records, llm_stats = asyncio.run(_run_async(study, profiles, bar))
        except FatalLLMError as e:
            raise SystemExit(f"error: {e}\nEvery call finished before the stop is cached: rerun the same command to resume.") from None
        study.timings["llm_s"] = time.perf_counter() - t
        # The simulator's own count of what it answered: a rerun from the cache shows zero requests.
        sim_stats = {n: sim.stats() for n, sim in sims.items()}
    models = [{"name": n, "model": p.model, "simulated": p.simulated} for n, p in profiles.items()]
    meta = study_meta(study, models)
    meta["llm_stats"] = llm_stats
    meta["runtime"]["simulator_stats"] = sim_stats
    write_meta(out, meta)
    write_records(out / "queries.jsonl", records)
    if set(s.archs) == {"rtp", "ptr"} and not getattr(args, "no_extras", False):
        run_extras(study, out, progress)
    _render(out)
    return study


def run_extras(study: Study, out: Path, progress: bool) -> None:
    """The scaling study and adaptive routing: no LLM call, reusing this run's embeddings and records."""
    from .routing import Options, run_routing
    from .scaling import run_scaling

    subsets = set(study.subsets)
    say = lambda m: print(m, file=sys.stderr)  # noqa: E731
    wanted = [p for p in ("G1", "G2") if any(x.startswith(p) for x in subsets)]
    if wanted:
        run_scaling(out, subsets=wanted, encode=lambda texts: study.embedder.encode(texts, progress=False),
                    progress=progress, log=say if progress else lambda m: None)
    else:
        say("scaling study skipped: it needs the G1 or G2 subset")
    test = [p for p in ("G3",) if any(x.startswith(p) for x in subsets)]
    train = [p for p in ("G1", "G2") if any(x.startswith(p) for x in subsets)]
    if test and train:
        run_routing(out, Options(k=study.settings.k, train=train, test=test), log=lambda m: None)
    else:
        say("routing study skipped: its held-out split needs G1 or G2 and G3 (run `python -m evaluator routing` with --train/--test)")
