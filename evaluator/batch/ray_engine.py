"""`requests run --engine ray`: a request file through Ray Data LLM, results in the batch-output format.

The driver (this process) keeps what Ray does not: it answers from the response cache whatever is
there (the same keys as the evaluator's own `requests run`, so either engine resumes the other), puts
only the rest in a Ray Dataset, and stores each reply in the cache as its block comes back, so a command
stopped mid-way and started again sends only what has no reply yet. Ray Data LLM sends: its
HTTP processor (`HttpRequestProcessorConfig`: `qps` per actor, `max_retries` with exponential backoff on
429/408/502/503/504 and transport errors) against the profile's endpoint, or, asked for and installed,
its vLLM processor, which runs the model inside Ray. What runs on the workers is `ray_worker`, shipped
by value. Without an address a small local Ray is started (and shut down); with one, the driver joins it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from evaluator.batch import ray_worker
from evaluator.batch.request_files import as_result
from evaluator.batch.request_format import BatchFailure, Request, Result
from evaluator.core.errors import ConfigError, EvaluatorError, FatalLLMError
from evaluator.core.progress import SILENT, Reporter
from evaluator.llm import LLMEngine, ModelProfile
from evaluator.llm.accounting import CallStats

INSTALL = "pip install 'evaluator[ray]'"
PROCESSORS = ("http", "vllm")
# The embedded local Ray, sized for a 2-core machine shared with others (what it holds there: bench/README.md,
# "batch/ray_engine.py").
LOCAL_RAY = {"num_cpus": 2, "object_store_memory": 128 << 20, "include_dashboard": False,
             "_node_ip_address": "127.0.0.1"}  # a local Ray listens on loopback only


@dataclass
class RayRun:
    """How Ray ran the file (the CLI's summary line): where, with what, and the cost of starting it."""

    address: str  # "local" for the embedded local Ray
    processor: str
    actors: int
    batch_size: int
    qps: int | None
    start_s: float | None = None  # starting (or joining) Ray; None when nothing had to be sent


@dataclass(frozen=True)
class RayOptions:
    address: str | None = None  # an existing cluster ("auto", "ray://head:10001", "10.0.0.1:6379"); None: a local Ray
    processor: str = "http"  # "http": the profile's endpoint; "vllm": the model inside Ray (GPU nodes)
    batch_size: int | None = None  # rows per Ray batch = requests in flight per actor (default: concurrency, <= 64)
    actors: int = 1  # HTTP (or vLLM) actors
    qps: int | None = None  # per actor (default: the profile's rpm / 60 / actors; none: no pacing)
    vllm_model: str | None = None  # the vLLM processor's model_source (default: the profile's model)


def _ray() -> tuple[Any, Any]:
    try:
        import ray
        import ray.data.llm as ray_llm
    except ImportError:
        raise ConfigError(f"--engine ray needs Ray Data LLM: {INSTALL} (ray[data]==2.60.0)") from None
    return ray, ray_llm


def check(profile: ModelProfile, opts: RayOptions) -> None:
    """Every mistake in the Ray options as one line, before Ray starts or anything is sent."""
    if profile.connection.wire != "openai":
        raise ConfigError(f"model {profile.name!r} speaks the {profile.connection.wire} wire; Ray's HTTP processor sends OpenAI "
                          "chat requests only: use --engine evaluator")
    _ray()
    if opts.processor not in PROCESSORS:
        raise ConfigError(f"--processor {opts.processor!r}: expected one of {', '.join(PROCESSORS)}")
    if opts.processor == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ConfigError("--processor vllm runs the model inside Ray and needs vLLM here and on the GPU nodes: "
                          "pip install vllm (or use --processor http against a vLLM server)")
    if opts.actors < 1 or (opts.batch_size is not None and opts.batch_size < 1) or (opts.qps is not None and opts.qps < 1):
        raise ConfigError("--actors, --batch-size and --qps must be 1 or more")
    qps_of(profile, opts)


def qps_of(profile: ModelProfile, opts: RayOptions) -> int | None:
    """Ray's pace: whole requests per second per actor. The profile's rpm is split over the actors; one
    below 60 per actor cannot be said in Ray's terms, and is refused rather than exceeded."""
    if opts.qps is not None:
        return opts.qps
    rpm = profile.pacing.rpm
    if not rpm:
        return None
    per_actor = rpm / 60 / opts.actors
    if per_actor < 1:
        raise ConfigError(f"model {profile.name!r} allows {rpm:g} requests per minute; Ray's processor paces "
                          f"whole requests per second per actor ({opts.actors} here): pass --qps 1 with --actors 1 "
                          "only if 60 per minute is allowed, or use --engine evaluator, which paces any rpm")
    return int(per_actor)


@contextlib.contextmanager
def ray_session(ray: Any, address: str | None) -> Iterator[None]:
    """A local Ray (quiet, small, no dashboard, no usage stats) or the cluster at `address`; a Ray
    already running in this process (a bench, a test) is used as it is and left running."""
    if ray.is_initialized():
        yield
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    quiet = {"logging_level": logging.ERROR, "log_to_driver": False}
    if not address:
        ray.init(**LOCAL_RAY, **quiet)
    else:
        try:
            ray.init(address=address, **quiet)
        except (ConnectionError, RuntimeError, ValueError) as e:  # nothing was sent yet
            why = str(e).strip().splitlines()[-1][:200] if str(e).strip() else type(e).__name__
            raise ConfigError(f"--address {address}: cannot join that Ray cluster ({why}); check the address "
                              "(`ray status` on the head) and that its Ray version is this one's") from None
    try:
        yield
    finally:
        ray.shutdown()


def _processor(ray_llm: Any, profile: ModelProfile, opts: RayOptions) -> Any:
    batch = opts.batch_size or min(profile.pacing.concurrency, 64)
    if opts.processor == "vllm":
        cfg = ray_llm.vLLMEngineProcessorConfig(model_source=opts.vllm_model or profile.model,
                                                batch_size=batch, concurrency=opts.actors)
        return ray_llm.build_processor(cfg, preprocess=ray_worker.vllm_preprocess, postprocess=ray_worker.vllm_postprocess)
    c, r = profile.connection, profile.retries
    if not c.base_url:
        raise ConfigError(f"model {profile.name!r} has no base_url (pass --base-url)")
    cfg = ray_llm.HttpRequestProcessorConfig(
        url=c.base_url.rstrip("/") + "/chat/completions", batch_size=batch, concurrency=opts.actors,
        qps=qps_of(profile, opts), max_retries=r.max_retries, base_retry_wait_time_in_s=r.backoff_base_s,
        session_factory=ray_worker.session_factory(c.api_key_env, c.timeout_s, r.max_retries, batch))
    return ray_llm.build_processor(cfg, preprocess=ray_worker.preprocess, postprocess=ray_worker.postprocess)


def row_result(row: dict[str, Any], engine: LLMEngine) -> Result:
    """One output row as a results line; a usable reply is stored in the cache now (that is the resume)."""
    cid = str(row["custom_id"])
    if row["error"]:  # the last attempt never got an answer
        return Result(cid, None, None, BatchFailure(str(row["error"]), str(row["message"])))
    status, text = int(row["status"]), str(row["text"])
    try:
        body = orjson.loads(text)
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict):
        return Result(cid, status, None, BatchFailure("not_json", text[:300]))
    if status == 200:
        engine.store_reply(str(row["key"]), body)  # an unusable reply is not stored: `requests import` counts it
    return Result(cid, status, body)


class RayResults(NamedTuple):
    results: list[Result]  # in input order
    stats: CallStats  # the engine's accounting
    ray: RayRun  # where and how Ray ran


def run_requests_ray(requests: list[Request], profile: ModelProfile, cache_root: Path, opts: RayOptions, *,
                     reporter: Reporter = SILENT) -> RayResults:
    """Every request through Ray Data LLM, results in input order; cached ones are not sent."""
    check(profile, opts)
    ray, ray_llm = _ray()
    ray.cloudpickle.register_pickle_by_value(ray_worker)  # the workers need nothing of the evaluator
    engine = LLMEngine(profile, cache_root=cache_root, api_key="")  # keys and the cache only: it sends nothing
    results: dict[str, Result] = {}
    todo: list[dict[str, str]] = []
    info = RayRun(opts.address or "local", opts.processor, opts.actors, opts.batch_size or min(profile.pacing.concurrency, 64),
                  qps_of(profile, opts) if opts.processor == "http" else None)
    try:
        bar = reporter.calls({profile.name: len(requests)})
        bar.attach(profile.name, engine.stats)
        with bar:
            for req in requests:
                engine.stats.calls += 1
                prepared = engine.prepare_body({"model": profile.model, **req.body})
                hit = engine.lookup(prepared.key)
                if hit is not None:
                    engine.stats.cache_hits += 1
                    results[req.custom_id] = as_result(req.custom_id, hit, profile)
                    bar.advance(profile.name)
                else:
                    todo.append({"custom_id": req.custom_id, "key": prepared.key,
                                 "body": orjson.dumps(prepared.body).decode()})
            if todo:
                t = time.perf_counter()
                with ray_session(ray, opts.address):
                    info.start_s = round(time.perf_counter() - t, 2)
                    logging.getLogger("ray.data").setLevel(logging.ERROR)  # before: it warns of the bars turned off
                    ctx = ray.data.DataContext.get_current()
                    ctx.enable_progress_bars = False  # the evaluator's own bar counts the rows
                    ctx.print_on_execution_start = False
                    # One block per batch: a Ray task hands back its output block when its input block is
                    # done, so the block is the unit that reaches the cache (Ray's default blocks held paid
                    # replies back: bench/README.md, "batch/ray_engine.py").
                    blocks = -(-len(todo) // info.batch_size)
                    ds = ray.data.from_items(todo, override_num_blocks=blocks)
                    out = _processor(ray_llm, profile, opts)(ds)
                    for row in out.iter_rows():  # streamed: rows arrive as their blocks finish
                        res = row_result(row, engine)
                        results[res.custom_id] = res
                        engine.stats.requests += 1  # rows sent; Ray does not count its retries
                        if not res.ok:
                            engine.stats.fail(res.kind())
                        if res.status_code in (401, 403):  # as the evaluator's engine does: stop, keep what came back
                            raise FatalLLMError(f"model {profile.name!r}: the endpoint answered HTTP {res.status_code} "
                                                f"(key or permission): check {profile.connection.api_key_env or 'its API key'}.")
                        bar.advance(profile.name)
        stats = engine.stats.summary()
    finally:
        engine.close_cache()
    missing = [r.custom_id for r in requests if r.custom_id not in results]
    if missing:  # Ray returned fewer rows than it was given: said, never written as if complete
        raise EvaluatorError(f"Ray returned no row for {len(missing)} of the requests (first: {missing[0]!r}); "
                             "the replies received are cached: rerun the same command")
    return RayResults([results[r.custom_id] for r in requests], stats, info)
