"""Benchmark 2: engine overhead, with the LLM taking no time at all.

The paper-scale call pattern (500 queries x 4 runs x 2 models; RtP planner and discovery together,
the PtR planner once its discovery reply is parsed) is driven through `LLMEngine` directly, against
one simulator with no latency and no limits. StudyRunner is not used here: its FAISS search of the
stubs (~2 ms of CPU per stub on this machine) would be what is measured, not the engine. The PtR
planner is offered the RtP list shifted by the stub count, so its prompt differs from the RtP one.

Measured: calls/s fresh (every call an HTTP request plus a committed cache write), calls/s of a
replay answered fully from the cache (a resumed run), and the client process's CPU time per call.
If a goal is missed, a cProfile of that phase says where the time goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import io
import pstats
import statistics
import time
from pathlib import Path
from typing import Any

import psutil

from evaluator.llm import LLMEngine, load_profile
from evaluator.study import prompts
from evaluator.study.parse import parse_stubs
from evaluator.study.prepare import PreparedStudy
from simulator.harness import start_simulator

from .common import Goal, Result, temp_dir
from .workload import MODELS, RUNS, load_study

NAME = "overhead"
# The code whose speed this measures (`python -m bench --check`: a result older than its last change is stale).
MEASURES = ("evaluator/llm", "evaluator/study/parse.py", "evaluator/study/prompts.py", "simulator", "bench/overhead.py",
            "bench/workload.py")
# `--check` re-runs it (~10 s) and compares each goal's value with the recorded one: calls/s of one process on 2 cores
# move by up to a quarter from run to run beside other work (the simulator shares the cores).
CHECK: dict[str, object] = {}
NOISE = {"fresh calls/s": ("rel", 0.25), "cached calls/s": ("rel", 0.25)}
TITLE = "2. Engine overhead: calls/s fresh and from cache, CPU per call (zero-latency simulator)"
REPLAYS = 3
GOAL_FRESH, GOAL_CACHED = 1_000.0, 10_000.0

Offered = list[list[tuple[str, str | None]]]


async def _pattern(study: PreparedStudy, offered: Offered, base_url: str, cache_root: Path) -> dict[str, Any]:
    async with contextlib.AsyncExitStack() as stack:
        engines = [
            await stack.enter_async_context(LLMEngine(load_profile(m, base_url=base_url), cache_root=cache_root, seed=0))
            for m in MODELS
        ]

        async def one(eng: LLMEngine, run: int, qi: int) -> None:
            text = study.queries[qi].text

            async def rtp() -> None:
                await eng.chat(prompts.planner_messages(text, offered[qi][:5]), run=run, prompt_version=prompts.PLANNER_VERSION)

            async def ptr() -> None:
                disc = await eng.chat(prompts.discovery_messages(text), run=run, prompt_version=prompts.DISCOVERY_VERSION)
                n = len(parse_stubs(disc.content)[0])
                await eng.chat(prompts.planner_messages(text, offered[qi][n : n + 5]), run=run,
                               prompt_version=prompts.PLANNER_VERSION)

            await asyncio.gather(rtp(), ptr())

        t0, c0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one(e, r, qi) for e in engines for r in range(RUNS) for qi in range(len(study.queries))))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        calls = sum(e.stats.calls for e in engines)
        return {"wall_s": wall, "cpu_s": cpu, "calls": calls, "calls_per_s": calls / wall, "cpu_ms_per_call": 1e3 * cpu / calls,
                "requests": sum(e.stats.requests for e in engines), "cache_hits": sum(e.stats.cache_hits for e in engines),
                "errors": sum(e.stats.errors for e in engines)}


def _profiled(fn: Any, top: int = 12) -> tuple[Any, list[list[Any]]]:
    prof = cProfile.Profile()
    out = prof.runcall(fn)
    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    total = st.total_tt  # type: ignore[attr-defined]
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _callers) in sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:top]:  # type: ignore[attr-defined]
        where = f"{Path(file).name}:{line}({func})" if line else func
        rows.append([where, nc, round(tt, 3), round(100 * tt / total, 1), round(ct, 3)])
    return out, rows


def run() -> Result:
    study = load_study()
    reg = study.registry
    offered = [[(reg.apis[i].display, reg.apis[i].description) for i in r.rows[:10]] for r in study.rtp]
    with start_simulator() as sim, temp_dir("overhead-llm") as root:
        sim_proc = psutil.Process(sim.proc.pid)
        s0 = sum(sim_proc.cpu_times()[:2])
        fresh = asyncio.run(_pattern(study, offered, sim.base_url, root))
        fresh["sim_cpu_ms_per_request"] = 1e3 * (sum(sim_proc.cpu_times()[:2]) - s0) / max(1, fresh["requests"])
        replays = [asyncio.run(_pattern(study, offered, sim.base_url, root)) for _ in range(REPLAYS)]
        cached = sorted(replays, key=lambda r: r["calls_per_s"])[len(replays) // 2]  # the median replay
        profiles: dict[str, list[list[Any]]] = {}
        if fresh["calls_per_s"] < GOAL_FRESH:
            with temp_dir("overhead-prof") as proot:
                _, profiles["fresh"] = _profiled(lambda: asyncio.run(_pattern(study, offered, sim.base_url, proot)))
        if cached["calls_per_s"] < GOAL_CACHED:
            _, profiles["cached"] = _profiled(lambda: asyncio.run(_pattern(study, offered, sim.base_url, root)))
        server = sim.stats()

    rates = ", ".join(f"{r['calls_per_s']:,.0f}" for r in replays)
    spread = statistics.pstdev(r["calls_per_s"] for r in replays) / cached["calls_per_s"]
    rows = [
        ["fresh (HTTP + cache write)", fresh["calls"], round(fresh["wall_s"], 2), round(fresh["calls_per_s"]),
         round(fresh["cpu_ms_per_call"], 3), fresh["requests"], f">= {GOAL_FRESH:,.0f}/s"],
        ["replay from cache (median of 3)", cached["calls"], round(cached["wall_s"], 2), round(cached["calls_per_s"]),
         round(cached["cpu_ms_per_call"], 3), cached["requests"], f">= {GOAL_CACHED:,.0f}/s"],
    ]
    extra = [{"title": f"cProfile of the {k} phase (top functions by own time)",
              "columns": ["function", "calls", "own s", "own %", "cumulative s"], "rows": v} for k, v in profiles.items()]
    return Result(
        name=NAME, title=TITLE,
        columns=["phase", "calls", "wall s", "calls/s", "client CPU ms/call", "HTTP requests", "goal"],
        rows=rows, extra_tables=extra,
        goals=[Goal("fresh calls/s", fresh["calls_per_s"], f">= {GOAL_FRESH:,.0f}", fresh["calls_per_s"] >= GOAL_FRESH),
               Goal("cached calls/s", cached["calls_per_s"], f">= {GOAL_CACHED:,.0f}", cached["calls_per_s"] >= GOAL_CACHED)],
        notes=[
            f"the simulator (another process on the same 2 cores) spent {fresh['sim_cpu_ms_per_request']:.2f} ms CPU "
            "per request; fresh calls/s is bounded by client + simulator CPU together",
            f"replays: {rates} calls/s (spread {spread:.0%})",
            "client CPU = this process's CPU time (all threads) / calls; cache writes are SQLite commits (WAL)",
        ],
        data={"fresh": fresh, "replays": replays, "server": server, "profiles": profiles},
    )
