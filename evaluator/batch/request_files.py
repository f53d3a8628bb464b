"""Request files through the engine: run any file online (resumable), import a results file into the cache.

`custom_id` of an exported request is the engine's cache key, so imported results are found by the study
exactly as if they had been fetched online, and online and batch results mix. The commands that use this
(`requests run|import`) are parsed in `cli`; `requests export` is a stage order of `app`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evaluator.batch.collect import offline
from evaluator.batch.request_format import (
    BatchFailure,
    Request,
    Result,
    dedupe,
    failure_kinds,
    read_results_salvaged,
)
from evaluator.batch.store import JobStore
from evaluator.core import aio
from evaluator.core.aio import cancel_all
from evaluator.core.errors import ConfigError
from evaluator.core.progress import SILENT, Reporter
from evaluator.llm import ChatResult, LLMEngine, ModelProfile, ResponseCache, load_profile
from evaluator.llm.accounting import CallStats
from evaluator.llm.engine import STOP_GRACE_S
from evaluator.llm.limiters import SharedRates, rate_folder


@dataclass
class ImportCounts:
    stored: int = 0
    already: int = 0  # were cached before this import
    errors: int = 0  # results that carry an error, not a reply
    unusable: int = 0  # replies the engine could not use (no content, cut, ...)
    first_errors: list[str] = field(default_factory=list)  # "custom_id: why", the first five
    error_kinds: dict[str, int] = field(default_factory=dict)  # errors by kind ("HTTP 400": 2, "batch_expired": 1)
    bad_lines: int = 0  # lines of a damaged file that are no result (cut mid-line, written over): skipped
    first_bad: list[str] = field(default_factory=list)  # "FILE:N: why", the first five


def offline_profile(name: str, base_url: str | None = None, **overrides: Any) -> ModelProfile:
    """A profile for building keys and storing replies: no key needed, no endpoint contacted."""
    return offline(load_profile(name, base_url=base_url, require_key=False, **overrides))


def import_files(paths: list[Path], cache_root: Path, *, model: str | None = None,
                 base_url: str | None = None) -> ImportCounts:
    """Every successful reply of these results files into the response cache; a damaged file's good lines too
    (its bad lines are counted and named, `ImportCounts.bad_lines`).

    Each result's profile is `model`, else the one `requests export` recorded for its custom_id; a
    custom_id of neither is one `ConfigError` line before anything is stored."""
    # Every good line of a damaged file is taken; the bad ones are named (their requests are made again).
    read: list[Result] = []
    bad: list[str] = []
    n_bad = 0
    for path in paths:
        got, first_bad, n = read_results_salvaged(path)
        read += got
        bad += first_bad
        n_bad += n
    # A custom_id answered twice with different replies is imported from neither (the next export asks again).
    results, conflicts = dedupe(read)
    store = JobStore(cache_root)
    try:
        owner: dict[str, str] = {}
        for r in results:
            name = model or store.exported_profile(r.custom_id)
            if name is None:
                raise ConfigError(
                    f"custom_id {r.custom_id!r} was not exported from the cache {cache_root}: pass --cache-dir of the "
                    "export, or --model PROFILE for results of requests made with that profile")
            owner[r.custom_id] = name
    finally:
        store.close()
    counts = aio.run(_import(results, owner, cache_root, base_url))
    counts.error_kinds = failure_kinds(results)
    counts.errors += len(conflicts)
    counts.bad_lines, counts.first_bad = n_bad, bad[:5]
    counts.first_errors[:0] = [f"{c}: different replies for this custom_id; neither is imported" for c in conflicts[:5]]
    del counts.first_errors[5:]
    return counts


async def _import(results: list[Result], owner: dict[str, str], root: Path, base_url: str | None) -> ImportCounts:
    counts = ImportCounts()
    cache = ResponseCache(root)
    try:
        async with contextlib.AsyncExitStack() as stack:
            engines: dict[str, LLMEngine] = {}
            for name in dict.fromkeys(owner.values()):
                engines[name] = await stack.enter_async_context(
                    LLMEngine(offline_profile(name, base_url), cache_root=root, api_key=""))
            for r in results:
                why = None
                if not r.ok:
                    counts.errors += 1
                    why = r.reason()
                elif cache.get(r.custom_id) is not None:
                    counts.already += 1
                else:
                    assert r.body is not None
                    res = engines[owner[r.custom_id]].store_reply(r.custom_id, r.body)
                    if res.error:
                        counts.unusable += 1
                        why = res.error
                    else:
                        counts.stored += 1
                if why and len(counts.first_errors) < 5:
                    counts.first_errors.append(f"{r.custom_id}: {why}")
    finally:
        cache.close()
    return counts


async def run_requests(
    requests: list[Request], profile: ModelProfile, cache_root: Path, *, reporter: Reporter = SILENT,
    grace_s: float = STOP_GRACE_S, locate: Callable[[], str] | None = None,
) -> tuple[list[Result], CallStats]:
    """Every request through one engine, results in input order; finished ones come from the cache. `locate`:
    where the server listens now (a bundled server restarted on another port)."""
    bar = reporter.calls({profile.name: len(requests)})
    results: list[Result | None] = [None] * len(requests)
    # Processes on one cache folder share each key's RPM and TPM (llm/limiters.py `SharedRates`).
    rates = SharedRates(rate_folder(None, cache_root))
    async with LLMEngine(profile, cache_root=cache_root, pacer_factory=rates, token_pacer_factory=rates.tpm,
                         grace_s=grace_s, locate=locate) as engine:
        bar.attach(profile.name, engine.stats)
        # A window of tasks, not one per line: a million-line file must not hold a million coroutines.
        window = asyncio.Semaphore(max(64, 4 * profile.pacing.concurrency))

        async def one(i: int, req: Request) -> None:
            try:
                # A file without a model runs on the profile's; one that names it keeps it (vLLM files do).
                prepared = engine.prepare_body({"model": profile.model, **req.body})
                res = await engine.send(prepared, keep_raw=True)
                results[i] = as_result(req.custom_id, res, profile)
                bar.advance(profile.name)
            finally:
                window.release()

        tasks = []
        with bar:
            try:
                for i, req in enumerate(requests):
                    await window.acquire()
                    tasks.append(asyncio.create_task(one(i, req)))
                await asyncio.gather(*tasks)
            except BaseException:
                await cancel_all(tasks)
                raise
        stats = engine.stats.summary()
    return [r for r in results if r is not None], stats


def as_result(custom_id: str, res: ChatResult, profile: ModelProfile) -> Result:
    """One engine reply as a line of a provider's batch output (an error line when it failed for good)."""
    if res.error is not None:
        return Result(custom_id, None, None, BatchFailure("request_failed", res.error))
    raw = getattr(res, "raw", None)
    if raw is None:  # answered from the cache: the stored reply, in chat.completion form
        raw = {
            "id": f"cached-{custom_id[:24]}", "object": "chat.completion", "model": profile.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": res.content},
                         "finish_reason": res.finish_reason}],
            "usage": {"prompt_tokens": res.prompt_tokens, "completion_tokens": res.completion_tokens,
                      "total_tokens": res.prompt_tokens + res.completion_tokens},
        }
    return Result(custom_id, 200, raw)
