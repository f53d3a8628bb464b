"""`python -m evaluator requests export|import|run`: request files (OpenAI batch JSONL) in and out.

    requests export OUT.jsonl [study flags]     every chat request the study would send that is not cached
    requests import RESULTS.jsonl               store the successful results in the response cache
    requests run IN.jsonl --model P --out R.jsonl   any request file through the online engine (resumable)

Export works in rounds: the PtR planner requests need the discovery replies, so a second export after
the first results were imported holds them. `custom_id` is the engine's cache key, so imported results
are found by the study exactly as if they had been fetched online, and online and batch results mix.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

from .aio import cancel_all
from .batch.files import Request, Result, read_requests, read_results, write_lines
from .cli import Parser  # one-line usage errors, like every other command
from .llm import ChatResult, ConfigError, FatalLLMError, LLMEngine, ModelProfile, load_profile
from .schema import check_writable

USAGE = __doc__.split("\n\n")[1]


def dispatch(argv: list[str]) -> int:
    """`requests ACTION ...` as `evaluator.cli` runs it (user mistakes raise `ConfigError`: one line, exit 2)."""
    actions = {"export": cmd_export, "import": cmd_import, "run": cmd_run}
    if not argv or argv[0] not in actions:
        print(f"usage: python -m evaluator requests ACTION ...\n{USAGE}", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return actions[argv[0]](argv[1:])


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (`python -m evaluator.requests_cli`); `python -m evaluator requests` is the usual one."""
    try:
        return dispatch(list(sys.argv[1:] if argv is None else argv))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except FatalLLMError as e:
        print(f"error: {e}\nEvery request answered before the stop is cached: rerun the same command to resume.", file=sys.stderr)
        return 1


def _cache_root(cache_dir: str | None, config: Path | None = None) -> Path:
    from .config import load_settings

    s = load_settings(config)
    return Path(s.resolve_path(cache_dir or s.cache_dir))


def _offline_profile(name: str, base_url: str | None = None, **overrides: Any) -> ModelProfile:
    """A profile for building keys and storing replies: no key needed, no endpoint contacted."""
    from .batch.study import offline

    return offline(load_profile(name, base_url=base_url, require_key=False, **overrides))


# -- export ----------------------------------------------------------------------------------------------
def cmd_export(argv: list[str]) -> int:
    from .app import check_inputs, fit_ks_to_registry
    from .batch.store import JobStore
    from .batch.study import collect
    from .cli import run_parser, settings_from
    from .study import load_inputs, prepare

    if not argv or argv[0].startswith("-"):
        raise ConfigError("requests export: name the output file first: `requests export OUT.jsonl [study flags]`")
    out = Path(argv[0])
    args = run_parser().parse_args(argv[1:])
    check_writable(out.parent, "requests export: the output file's folder")
    s = settings_from(args)
    if not s.models:
        raise ConfigError("requests export: name the model(s) with --model PROFILE")
    profiles = {}
    for name in dict.fromkeys(s.models):
        p = _offline_profile(name, **s.overrides.as_kwargs())  # the same keys the study will use
        profiles[p.name] = p
    inputs = load_inputs(s)
    fit_ks_to_registry(s, inputs.registry, lambda m: print(m, file=sys.stderr))
    check_inputs(s, inputs)
    study = prepare(s, not args.no_progress, inputs)
    cache_root = Path(s.resolve_path(s.cache_dir))
    todo = asyncio.run(collect(study, profiles, cache_root))
    store = JobStore(cache_root)
    try:
        for name, reqs in todo.items():
            store.remember_export(name, [r.custom_id for r in reqs])
    finally:
        store.close()
    n = write_lines(out, [r for reqs in todo.values() for r in reqs])
    per = ", ".join(f"{name} {len(r):,}" for name, r in todo.items())
    if n:
        print(f"Wrote {n:,} requests to {out} ({per}). Run them as a batch (or `requests run`), then "
              f"`python -m evaluator requests import RESULTS.jsonl --cache-dir {cache_root}` and export again "
              "for the next round (the PtR planners need the discovery replies).")
    else:
        print(f"Nothing to export: every request of this study is cached in {cache_root}. Run the study.")
    return 0


# -- import ----------------------------------------------------------------------------------------------
def cmd_import(argv: list[str]) -> int:
    from .batch.store import JobStore

    ap = Parser(prog="python -m evaluator requests import",
                                 description="Store a results file's successful replies in the response cache.")
    ap.add_argument("results", type=Path, nargs="+", help="results JSONL (OpenAI batch output/error file, vllm run-batch output)")
    ap.add_argument("--model", help="profile the requests were made for (default: the one `requests export` recorded)")
    ap.add_argument("--cache-dir", help="cache root (default: the config's)")
    ap.add_argument("--base-url", help="the endpoint the profile's cache keys use, if it was overridden at export")
    ap.add_argument("--config", type=Path, help="settings file (for the default cache dir)")
    args = ap.parse_args(argv)
    results = [r for path in args.results for r in read_results(path)]
    root = _cache_root(args.cache_dir, args.config)
    store = JobStore(root)
    try:
        owner: dict[str, str] = {}
        for r in results:
            name = args.model or store.exported_profile(r.custom_id)
            if name is None:
                raise ConfigError(
                    f"custom_id {r.custom_id!r} was not exported from the cache {root}: pass --cache-dir of the "
                    "export, or --model PROFILE for results of requests made with that profile")
            owner[r.custom_id] = name
    finally:
        store.close()
    counts = asyncio.run(_import(results, owner, root, args.base_url))
    stored, had, errors, bad = counts["stored"], counts["already"], counts["errors"], counts["unusable"]
    print(f"Imported {stored:,} replies into {root} ({had:,} were already cached); "
          f"{errors:,} errors and {bad:,} unusable replies were not cached.")
    for line in counts["first_errors"]:
        print(f"  {line}")
    if errors or bad:
        print("Requests without a cached reply are sent again by the next export (or online by the study).")
    return 0


async def _import(results: list[Result], owner: dict[str, str], root: Path, base_url: str | None) -> dict[str, Any]:
    from .llm.cache import ResponseCache

    counts: dict[str, Any] = {"stored": 0, "already": 0, "errors": 0, "unusable": 0, "first_errors": []}
    cache = ResponseCache(root)
    try:
        async with contextlib.AsyncExitStack() as stack:
            engines: dict[str, LLMEngine] = {}
            for name in dict.fromkeys(owner.values()):
                engines[name] = await stack.enter_async_context(
                    LLMEngine(_offline_profile(name, base_url), cache_root=root, api_key=""))
            for r in results:
                why = None
                if not r.ok:
                    counts["errors"] += 1
                    why = r.reason()
                elif cache.get(r.custom_id) is not None:
                    counts["already"] += 1
                else:
                    assert r.body is not None
                    res = engines[owner[r.custom_id]].store_reply(r.custom_id, r.body)
                    if res.error:
                        counts["unusable"] += 1
                        why = res.error
                    else:
                        counts["stored"] += 1
                if why and len(counts["first_errors"]) < 5:
                    counts["first_errors"].append(f"{r.custom_id}: {why}")
    finally:
        cache.close()
    return counts


# -- run ---------------------------------------------------------------------------------------------------
def cmd_run(argv: list[str]) -> int:
    ap = Parser(
        prog="python -m evaluator requests run",
        description="Send a request file (OpenAI batch JSONL) through the online engine: limits, retries, "
                    "cache, resume. Results in the same format as a provider's batch output.")
    ap.add_argument("requests", type=Path, help="request JSONL: custom_id, method, url, body")
    ap.add_argument("--model", required=True, help="model profile: sim, gemini, gpt-oss-120b, or a .toml path")
    ap.add_argument("--out", type=Path, required=True, help="results JSONL to write")
    ap.add_argument("--cache-dir", help="cache root (default: the config's); a rerun answers finished requests from it")
    ap.add_argument("--base-url", help="override the profile's endpoint")
    ap.add_argument("--concurrency", type=int, help="override the profile's concurrent requests")
    ap.add_argument("--rpm", type=float, help="override the profile's requests per minute")
    ap.add_argument("--tpm", type=float, help="override the profile's tokens per minute")
    ap.add_argument("--config", type=Path, help="settings file (for the default cache dir)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    if args.out.resolve() == args.requests.resolve():
        raise ConfigError("requests run: --out must not be the input file")
    requests = read_requests(args.requests)  # the whole file is checked before anything is sent
    check_writable(args.out.parent, "--out")  # one line now, not a traceback after every request was sent
    profile = load_profile(args.model, base_url=args.base_url, concurrency=args.concurrency, rpm=args.rpm, tpm=args.tpm)
    root = _cache_root(args.cache_dir, args.config)
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if profile.simulated and not profile.base_url:
            from .sim.harness import start_simulator

            profile = dataclasses.replace(profile, base_url=stack.enter_context(start_simulator()).base_url)
        results, stats = asyncio.run(run_requests(requests, profile, root, progress=not args.no_progress))
    n = write_lines(args.out, results)
    bad = sum(1 for r in results if not r.ok)
    print(f"Wrote {n:,} results to {args.out} in {time.perf_counter() - t0:.1f} s: {n - bad:,} ok, {bad:,} errors; "
          f"{stats['requests']:,} HTTP requests sent, {stats['cache_hits']:,} answered from the cache.")
    return 0


async def run_requests(
    requests: list[Request], profile: ModelProfile, cache_root: Path, *, progress: bool = True
) -> tuple[list[Result], dict[str, Any]]:
    """Every request through one engine, results in input order; finished ones come from the cache."""
    from .progress import Progress

    bar = Progress({profile.name: len(requests)}, enabled=progress)
    results: list[Result | None] = [None] * len(requests)
    async with LLMEngine(profile, cache_root=cache_root) as engine:
        bar.attach(profile.name, engine.stats)
        # A window of tasks, not one per line: a million-line file must not hold a million coroutines.
        window = asyncio.Semaphore(max(64, 4 * profile.concurrency))

        async def one(i: int, req: Request) -> None:
            try:
                # A file without a model runs on the profile's; one that names it keeps it (vLLM files do).
                prepared = engine.prepare_body({"model": profile.model, **req.body})
                res = await engine.send(prepared, keep_raw=True)
                results[i] = _result(req.custom_id, res, profile)
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
        stats = engine.stats.as_dict()
    return [r for r in results if r is not None], stats


def _result(custom_id: str, res: ChatResult, profile: ModelProfile) -> Result:
    if res.error is not None:
        return Result(custom_id, None, None, {"code": "request_failed", "message": res.error})
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


if __name__ == "__main__":
    sys.exit(main())
