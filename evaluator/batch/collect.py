"""The study's calls through Batch APIs and request files: collect, `--batch` rounds, export, import.

A *collect pass* runs the study's own request building (`StudyRunner`) with stand-in engines that
answer from the response cache and record every other call instead of sending it; a branch whose
call was deferred stops there (a deferred discovery yields no stubs, hence no planner call yet). So
the first pass yields every RtP planner and PtR discovery request, and once the discovery replies are
cached the next pass yields the PtR planners built from their stubs. `batch_rounds` repeats
collect -> submit -> import until nothing new comes back; the study then runs from the cache.

Batch work never turns into online calls without a word: a batch refused or failed is told at once
(`warn`), and when requests are still unanswered after the rounds (refused lines, failed or expired
batches, unusable replies) the study stops before any online call (`BatchIncomplete`, one line saying how
many, why and what to do) unless `--batch-fallback online` lets them go online at the online price, with
a warning saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from evaluator.batch.batch_budget import BudgetedBatches
from evaluator.batch.batch_submit import BatchRunner, BatchStats
from evaluator.batch.providers import batch_api, batch_kind, chat_to_gemini
from evaluator.batch.request_format import Request
from evaluator.batch.store import JobStore
from evaluator.core import aio
from evaluator.core.errors import ConfigError, FatalLLMError
from evaluator.llm import (
    ChatResult,
    LLMEngine,
    ModelProfile,
    Prepared,
    resolve_api_key,
    revised,
)
from evaluator.llm.budget import Budget, context_overflow
from evaluator.llm.cache import ResponseCache
from evaluator.study.archs import DEFERRED_KIND
from evaluator.study.runner import OnDeferred, StudyRunner, Unit  # the study's own request building

DEFERRED = "deferred: sent through the batch API / request file"
_PLACEHOLDER_URL = "http://127.0.0.1:9/v1"  # a simulated profile's key never depends on its URL


# Set in the task of a study branch once one of its calls was deferred. A later call of the same branch
# is built on that missing reply and must not be collected: it is not a request the study will make. Each
# branch (an architecture's retrieval, its planner, of one query) runs in a task of its own started from the
# query's context, so the flag never leaks into another branch; the runner itself plans nothing on an
# outcome whose calls were deferred (`DEFERRED_KIND`), another architecture's reused ones included.
_BRANCH_DEFERRED: ContextVar[bool] = ContextVar("batch_branch_deferred", default=False)
OnCall = Callable[[str, Prepared, str, ChatResult | None], None]


class BatchIncomplete(FatalLLMError):
    """Requests the batch API did not answer, and `--batch-fallback stop`: the study stops before any online call."""


class _Collector:
    """Stands in for an `LLMEngine` in a collect pass: cached calls are answered, the rest recorded."""

    def __init__(self, engine: LLMEngine, on_call: OnCall | None = None, keep: bool = True) -> None:
        self.engine = engine
        self.stats = engine.stats
        self.calls: dict[str, Any] = {}  # cache key -> Prepared, in the order the study made them
        self.on_call = on_call
        self.keep = keep  # False: the calls are only seen by `on_call` (a dry run sums them), not held

    async def chat(self, messages: list[dict[str, Any]], *, run: int, prompt_version: str, **kw: Any) -> ChatResult:
        if _BRANCH_DEFERRED.get():
            return ChatResult(None, None, error=DEFERRED, error_kind=DEFERRED_KIND)
        prepared = self.engine.prepare(messages, run=run, prompt_version=prompt_version, **kw)
        if self.engine.lookup(prepared.key) is not None:
            hit = await self.engine.send(prepared)  # a cache hit: no network
            if self.on_call is not None:
                self.on_call(self.engine.profile.name, prepared, prompt_version, hit)
            return hit
        if context_overflow(self.engine.profile, prepared.logical or prepared.body) is not None:
            return await self.engine.send(prepared)  # never collected nor sent: a counted context_exceeded
        if self.on_call is not None:
            self.on_call(self.engine.profile.name, prepared, prompt_version, None)
        if self.keep:
            self.calls.setdefault(prepared.key, prepared)
        _BRANCH_DEFERRED.set(True)
        return ChatResult(None, None, error=DEFERRED, error_kind=DEFERRED_KIND)

    def __getattr__(self, name: str) -> Any:  # anything else the runner asks of an engine
        return getattr(self.engine, name)


def offline(p: ModelProfile) -> ModelProfile:
    """`p` for building keys and storing replies only: a placeholder endpoint if it has none (never contacted)."""
    return p if p.connection.base_url else revised(p, base_url=_PLACEHOLDER_URL)


async def collect(study: Any, profiles: dict[str, ModelProfile], cache_root: Path, batcher: Any = None,
                  on_call: OnCall | None = None, on_deferred: OnDeferred | None = None,
                  keep: bool = True) -> dict[str, list[Request]]:
    """Every chat request the study would send now that is not cached, per model (no network).

    `batcher`: the stub search to use (default: the pipeline's own), as `StudyRunner` takes it.
    `on_call(model, prepared, prompt_version, cached reply or None)` sees every call the study makes (dry run);
    `on_deferred(model, run, query index, architecture)` each planner that waits on a deferred reply.
    `keep` False: nothing is held or returned (the dry run sums what `on_call` sees; bounded memory)."""
    async with contextlib.AsyncExitStack() as stack:
        collectors = {}
        for n, p in profiles.items():
            engine = await stack.enter_async_context(LLMEngine(offline(p), cache_root=cache_root, api_key=""))
            collectors[n] = _Collector(engine, on_call, keep)
        # the records of a collect pass are not kept: only the calls it would make are
        runner = StudyRunner(study, collectors, None, batcher, on_deferred=on_deferred, sink=_Dropped())
        await runner.run([Unit(m, r) for m in profiles for r in range(study.run.runs)])
    return {n: [Request(k, p.body) for k, p in c.calls.items()] for n, c in collectors.items()}


class _Dropped:
    def append(self, rec: Any, /) -> None:
        pass


async def batch_rounds(
    study: Any,
    profiles: dict[str, ModelProfile],
    cache_root: Path,
    *,
    cancel: bool = False,
    max_rounds: int = 4,
    log: Callable[[str], None] | None = None,
    batcher: Callable[[], Any] | None = None,
    budget: Budget | None = None,
    warn: Callable[[str], None] | None = None,
    fallback: str = "stop",
) -> dict[str, BatchStats]:
    """Bring the study's replies into the cache through each model's batch API; stats per model.
    `budget`: each batch's worst case is reserved before it is submitted (batch/batch_budget.py).
    `fallback` "stop": requests still unanswered stop the study (`BatchIncomplete`); "online": they go online."""
    say = log or (lambda m: None)
    tell = warn or say
    check(profiles)
    store = JobStore(cache_root)
    cache = ResponseCache(cache_root)
    try:
        async with contextlib.AsyncExitStack() as stack:
            runners: dict[str, BatchRunner] = {}
            for n, p in profiles.items():
                engine = await stack.enter_async_context(LLMEngine(p, cache_root=cache_root))
                api = batch_api(p, resolve_api_key(p))
                if budget is not None:
                    api = BudgetedBatches(api, budget, p)
                stack.push_async_callback(api.close)
                runners[n] = BatchRunner(p, engine, api, store, cache, log=say, warn=tell)
            if cancel:
                await asyncio.gather(*(r.cancel_open() for r in runners.values()))
                return {n: r.stats for n, r in runners.items()}
            await asyncio.gather(*(r.resume() for r in runners.values()))
            for rnd in range(1, max_rounds + 1):
                todo = await collect(study, profiles, cache_root, batcher() if batcher else None)
                todo = {n: runners[n].missing(reqs) for n, reqs in todo.items()}
                if not any(todo.values()):
                    break
                say(f"batch round {rnd}: " + ", ".join(f"{n} {len(r):,} requests" for n, r in todo.items()))
                before = {n: r.stats.stored for n, r in runners.items()}
                await asyncio.gather(*(runners[n].run(reqs) for n, reqs in todo.items() if reqs))
                if all(r.stats.stored == before[n] for n, r in runners.items()):
                    break  # nothing new came back
            left = await collect(study, profiles, cache_root, batcher() if batcher else None)
            for n, r in runners.items():
                if r.stats.usage_estimated:
                    tell(f"{n}: {r.stats.usage_estimated:,} batch replies carried no token usage; their tokens and cost "
                         "are estimates (characters / chars_per_token), counted as usage_estimated in meta.json")
            unanswered(runners, {n: len(reqs) for n, reqs in left.items() if reqs}, fallback, tell)
            return {n: r.stats for n, r in runners.items()}
    finally:
        store.close()
        cache.close()


def unanswered(runners: dict[str, BatchRunner], left: dict[str, int], fallback: str,
               warn: Callable[[str], None]) -> None:
    """Requests the batch rounds left unanswered (`left`, per model): stop the study, or say they go online."""
    if not left:
        return
    def why(n: str) -> str:
        st = runners[n].stats
        first = f": {st.errors[0][:160]}" if st.errors else ""
        return (f"{n} {left[n]:,} (of {st.submitted:,} submitted: {st.failed:,} refused or failed, {st.not_run:,} "
                f"not run, {st.unusable:,} unusable{first})")
    what = "; ".join(why(n) for n in left)
    if fallback == "online":
        for n, k in left.items():
            runners[n].stats.online = k
        warn(f"--batch-fallback online: requests the batch API did not answer go online at the online price: {what}")
        return
    raise BatchIncomplete(
        f"--batch: requests the batch API did not answer: {what}. Nothing was sent online. Fix the cause and rerun "
        "the same command (replies the batches returned are cached and not paid again), or add "
        "--batch-fallback online to send the rest online at the online price.")


def empty_stats() -> BatchStats:
    return BatchStats()


def run_batch(study: Any, profiles: dict[str, ModelProfile], cache_root: Path,
              log: Callable[[str], None] | None = None, budget: Budget | None = None,
              warn: Callable[[str], None] | None = None, fallback: str = "stop") -> dict[str, BatchStats]:
    """`--batch`: the study's replies into the cache through the batch APIs (stats per model)."""
    return aio.run(batch_rounds(study, profiles, Path(cache_root), log=log, budget=budget, warn=warn,
                                fallback=fallback))


def cancel(profiles: dict[str, ModelProfile], cache_root: Path,
           log: Callable[[str], None] | None = None) -> dict[str, BatchStats]:
    """`--batch-cancel`: cancel every open batch of these models, import what they finished."""
    # An auto-started simulator is new each run: it holds no batch of an earlier one.
    reachable = {n: p for n, p in profiles.items() if p.connection.base_url}
    return aio.run(batch_rounds(None, reachable, Path(cache_root), cancel=True, log=log))


def cancel_message(stats: Mapping[str, BatchStats]) -> str:
    n = sum(s.cancelled for s in stats.values())
    stored = sum(s.stored for s in stats.values())
    return (f"cancelled {n} open batch(es); {stored:,} replies they had finished are in the cache. "
            "Rerun without --batch-cancel to finish the study (with --batch to submit the rest again).")


def check(profiles: dict[str, ModelProfile]) -> None:
    """Before any work: every model declares a batch API its requests fit (else one `ConfigError` line)."""
    for p in profiles.values():
        kind = batch_kind(p)
        if kind == "gemini":
            chat_to_gemini({"model": p.model, "messages": [], **p.sampling.extra_body})  # fields Gemini cannot carry
        if kind == "anthropic" and p.connection.wire != "anthropic":
            raise ConfigError(f"model {p.name!r}: [batch] api = \"anthropic\" (Message Batches) needs [connection] "
                              "wire = \"anthropic\" (the Messages API) in its profile")
