"""Submit chat requests through a provider's Batch API and bring the replies into the response cache.

`BatchRunner.run(requests)`: first polls the batches an earlier (killed) run already submitted, then
submits what is still not cached, split at the provider's limits; polls with backoff, showing
requests done per batch and the time waited; stores every reply the moment its batch completes
(`LLMEngine.store_reply`, exactly as the online path stores it); re-submits only what failed or expired,
up to `max_attempts` times. A batch the provider rejects as too large is split in two and submitted
again. A batch refused because the account's queue is full (OpenAI's `token_limit_exceeded`, "Enqueued
token limit reached"; Gemini's 429 at create) is not split: it waits until a running batch finishes and is
submitted again unchanged. Request keys (`custom_id`) are the engine's cache keys, so nothing cached is
ever submitted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from evaluator.batch.providers import BatchAPI, BatchAPIError, BatchState, batch_limits
from evaluator.batch.request_format import Request, Result, dedupe, split
from evaluator.batch.store import Job, JobStore
from evaluator.core.progress import format_eta
from evaluator.core.redact import redact
from evaluator.llm.cache import ResponseCache
from evaluator.llm.profiles import ModelProfile
from evaluator.results.cost import BatchStats  # the meta.json contract, beside the cost it feeds

MAX_ERRORS_KEPT = 5
# Polls in a row with the queue still full and no batch of ours finishing before deferred chunks are given up
# for this attempt (their requests stay missing: the next attempt, or a rerun, submits them again).
MAX_QUEUE_ROUNDS = 20


class ReplyStore(Protocol):
    """What the runner needs of the engine: `LLMEngine.store_reply`."""

    def store_reply(self, key: str, response_body: dict[str, Any], request: dict[str, Any] | None = None) -> Any: ...


@dataclass
class Poll:
    """Polling schedule: starts at `first_s`, grows by `factor` per poll up to `max_s`."""

    first_s: float = 10.0
    max_s: float = 300.0
    factor: float = 1.5

    @classmethod
    def for_profile(cls, p: ModelProfile) -> Poll:
        # The simulator turns batches around in fractions of a second; providers in minutes to hours.
        return cls(0.05, 1.0) if p.loopback else cls()


class BatchRunner:
    def __init__(
        self,
        profile: ModelProfile,
        engine: ReplyStore,
        api: BatchAPI,
        store: JobStore,
        cache: ResponseCache,
        *,
        poll: Poll | None = None,
        max_attempts: int = 3,
        log: Callable[[str], None] | None = None,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.profile = profile
        self.engine = engine
        self.api = api
        self.store = store
        self.cache = cache
        self.poll = poll or Poll.for_profile(profile)
        self.max_attempts = max_attempts
        self.log = log or (lambda m: None)  # the caller decides where progress lines go
        self.warn = warn or self.log  # what the user must see at once (a batch refused or failed)
        self.stats = BatchStats()
        self.permanent: dict[str, str] = {}  # key -> why (4xx, unusable): re-submitting would not help
        self._requests: dict[str, list[Request]] = {}  # token -> its requests (jobs of this process)
        self._deferred: list[tuple[list[Request], int]] = []  # (chunk, attempt) refused for a full queue
        self._last_line = 0.0

    # -- public ---------------------------------------------------------------------------------------
    def missing(self, requests: list[Request]) -> list[Request]:
        return [r for r in requests if not self._cached(r.custom_id) and r.custom_id not in self.permanent]

    async def run(self, requests: list[Request]) -> BatchStats:
        await self.resume()
        pending = self.missing(requests)
        attempt = 1
        while pending and attempt <= self.max_attempts:
            if attempt > 1:
                self.stats.resubmitted += len(pending)
                self.log(f"{self.profile.name}: re-submitting {len(pending):,} failed or expired requests (attempt {attempt})")
            chunks = split(pending, *batch_limits(self.profile), getattr(self.api, "line_size", None))
            jobs = [job for chunk in chunks for job in await self._submit_or_defer(chunk, attempt)]
            await self._wait(jobs)
            pending = self.missing(pending)
            attempt += 1
        if pending:
            self.log(f"{self.profile.name}: {len(pending):,} requests still unanswered after {self.max_attempts} batch submissions")
        return self.stats

    async def resume(self) -> None:
        """Poll (never re-submit) every batch an earlier run submitted and did not finish importing."""
        jobs = []
        for job in self.store.open_jobs(self.profile.name):
            batch_id = job.batch_id
            if batch_id is None:
                # Killed between writing the row and learning the id: the batch may exist anyway.
                batch_id = await self.api.find(job.token, len(job.keys), job.created)
                if batch_id is None:
                    self.store.mark(job, "lost")  # never created; its requests are simply still missing
                    continue
                self.store.submitted(job, batch_id)
            try:
                await self.api.state(batch_id)
            except BatchAPIError as e:
                if e.status != 404:
                    raise
                # Unknown to this endpoint (deleted, or an earlier auto-started simulator's): its requests
                # are still missing and are submitted again below.
                self.log(f"{self.profile.name}: batch {job.batch_id} of an earlier run is unknown here; its requests are re-submitted")
                self.store.mark(job, "lost")
                continue
            jobs.append(job)
        if jobs:
            self.stats.resumed += len(jobs)
            self.log(f"{self.profile.name}: resuming {len(jobs)} batch(es) submitted earlier (polling, not re-submitting)")
            await self._wait(jobs)

    async def cancel_open(self) -> int:
        """Cancel every batch still open for this model; import what they finished. Returns how many."""
        jobs = []
        for job in self.store.open_jobs(self.profile.name):
            if job.batch_id is None and (found := await self.api.find(job.token, len(job.keys), job.created)) is not None:
                self.store.submitted(job, found)
            if job.batch_id is None:
                self.store.mark(job, "lost")
                continue
            try:
                await self.api.cancel(job.batch_id)
            except BatchAPIError as e:
                if e.status == 404:  # unknown here (an earlier auto-started simulator's): nothing to cancel
                    self.store.mark(job, "lost")
                    continue
                if e.status not in (400, 409):  # 400/409: already finished; import what it has
                    raise
            jobs.append(job)
        await self._wait(jobs)
        for job in jobs:
            self.store.mark(job, "cancelled")
        self.stats.cancelled += len(jobs)
        return len(jobs)

    # -- internals ------------------------------------------------------------------------------------
    async def _submit(self, chunk: list[Request], attempt: int) -> Job:
        job = self.store.new(self.profile.name, str(self.profile.batch.api), [r.custom_id for r in chunk], attempt)
        self._requests[job.token] = chunk
        batch_id = await self.api.submit(chunk, job.token)
        self.store.submitted(job, batch_id)
        self.stats.batches += 1
        self.stats.submitted += len(chunk)
        return job

    async def _submit_or_defer(self, chunk: list[Request], attempt: int) -> list[Job]:
        """`_submit`, or None when the provider refuses the create for a full queue (HTTP 429): the chunk
        waits in `_deferred` for a running batch to finish. A create refused as too large (HTTP 413, Anthropic's
        `request_too_large`: a limit below the one we split at) is split in two and each half submitted."""
        try:
            return [await self._submit(chunk, attempt)]
        except BatchAPIError as e:
            if e.status not in (413, 429) or (e.status == 413 and len(chunk) < 2):
                raise
            for job in self.store.open_jobs(self.profile.name):
                if job.batch_id is None and self._requests.get(job.token) is chunk:
                    self.store.mark(job, "lost")  # never created
                    self._requests.pop(job.token, None)
            if e.status == 413:
                self.stats.split += 1
                self.log(f"{self.profile.name}: a batch of {len(chunk):,} requests is too large for the provider; split in two")
                half = len(chunk) // 2
                return (await self._submit_or_defer(chunk[:half], attempt)
                        + await self._submit_or_defer(chunk[half:], attempt))
            self._defer(chunk, attempt, str(e))
            return []

    def _defer(self, chunk: list[Request], attempt: int, why: str) -> None:
        self.stats.queue_waits += 1
        self._deferred.append((chunk, attempt))
        self.log(f"{self.profile.name}: the provider's batch queue is full ({why[:160]}); {len(chunk):,} requests "
                 "wait for a running batch to finish")

    async def _wait(self, jobs: list[Job]) -> None:
        open_jobs = {j.token: j for j in jobs}
        states: dict[str, BatchState] = {}
        delay = self.poll.first_s
        t0 = time.monotonic()
        idle_rounds = 0  # polls with chunks deferred and none of our batches finishing
        while open_jobs or self._deferred:
            finished = 0
            for job in list(open_jobs.values()):
                assert job.batch_id is not None
                st = await self.api.state(job.batch_id)
                states[job.token] = st
                if not st.done:
                    continue
                del open_jobs[job.token]
                if st.queue_full and job.token in self._requests:
                    self.store.mark(job, "done")
                    del states[job.token]  # refused, not run: not a batch of the progress line
                    self._defer(self._requests.pop(job.token), job.attempt, st.errors[0].message or "queue full")
                    continue
                finished += 1
                if st.too_large and job.token in self._requests and len(self._requests[job.token]) > 1:
                    self.store.mark(job, "done")
                    reqs = self._requests.pop(job.token)
                    half = len(reqs) // 2
                    self.stats.split += 1
                    self.log(f"{self.profile.name}: batch {job.batch_id} too large for the provider; split in two")
                    for part in (reqs[:half], reqs[half:]):
                        for new in await self._submit_or_defer(part, job.attempt):
                            open_jobs[new.token] = new
                    continue
                if st.status == "failed" and st.errors:
                    why = f"batch {job.batch_id} failed: {st.errors[0].message or st.errors[0].code}"
                    self._error(why)
                    self.warn(redact(f"{self.profile.name}: {why}"))
                await self._import(job)
            if self._deferred and (finished or not open_jobs):
                # A batch of ours finished (its tokens left the queue), or none is left to wait for.
                idle_rounds = 0 if finished else idle_rounds + 1
                deferred, self._deferred = self._deferred, []
                if idle_rounds > MAX_QUEUE_ROUNDS:
                    n = sum(len(c) for c, _ in deferred)
                    self.log(f"{self.profile.name}: the batch queue stayed full; {n:,} requests left for the next attempt")
                    self._error(f"batch queue full: {n} requests not submitted")
                else:
                    for chunk, attempt in deferred:
                        for new in await self._submit_or_defer(chunk, attempt):
                            open_jobs[new.token] = new
            self._show(states, time.monotonic() - t0, final=not open_jobs and not self._deferred)
            if open_jobs or self._deferred:
                await asyncio.sleep(delay)
                delay = min(delay * self.poll.factor, self.poll.max_s)
        self.stats.waited_s += time.monotonic() - t0

    async def _import(self, job: Job) -> None:
        assert job.batch_id is not None
        results, conflicts = dedupe(await self.api.results(job.batch_id))
        wanted = set(job.keys)
        seen: set[str] = set()
        bodies = {q.custom_id: q.body for q in self._requests.get(job.token, [])}  # jobs of this process
        if conflicts:
            self.log(f"{self.profile.name}: batch {job.batch_id} answered {len(conflicts)} request(s) twice with different "
                     "replies; neither is used, they are sent again")
        for cid in conflicts:  # neither copy is used: the request stays missing and is submitted again
            if cid in wanted:
                seen.add(cid)
                self.stats.conflicting += 1
                self._error(f"{cid[:12]}: the batch output holds different replies for this custom_id; none is used, "
                            "the request is sent again")
        for r in results:
            if r.custom_id not in wanted or r.custom_id in seen:
                continue
            seen.add(r.custom_id)
            self._take(r, bodies.get(r.custom_id))
        not_run = len(wanted - seen)
        self.stats.not_run += not_run
        refused = [self.permanent[k] for k in wanted if k in self.permanent]
        if refused and len(refused) == len(wanted):  # the provider answered no request of this batch
            self.warn(redact(f"{self.profile.name}: the provider refused all {len(wanted):,} requests of batch "
                             f"{job.batch_id} [{refused[0][:200]}]"))
        self.store.mark(job, "done")
        self._requests.pop(job.token, None)

    def _take(self, r: Result, request: dict[str, Any] | None = None) -> None:
        if r.ok:
            assert r.body is not None
            usage = r.body.get("usage")
            usage = usage if isinstance(usage, dict) else {}
            if self._cached(r.custom_id):
                self._bill(usage, None)
                return  # answered online meanwhile; keep the first reply
            res = self.engine.store_reply(r.custom_id, r.body, request)
            self._bill(usage, res)
            if getattr(res, "error", None):
                self.stats.unusable += 1
                self.permanent[r.custom_id] = str(res.error)
                self._error(f"{r.custom_id[:12]}: {res.error}")
            else:
                self.stats.stored += 1
            return
        if r.status_code is None:
            self.stats.not_run += 1  # expired / cancelled: worth another submission
            return
        self.stats.failed += 1
        if (400 <= r.status_code < 500 and r.status_code not in (408, 409, 429)) or r.status_code == 501:
            self.permanent[r.custom_id] = r.reason()  # the request itself is wrong: same answer next time
        self._error(f"{r.custom_id[:12]}: {r.reason()}")

    def _bill(self, usage: dict[str, Any], res: Any) -> None:
        """Tokens billed for a reply, usable or not; a body without usage: the engine's estimates, counted."""
        if not usage and res is not None and getattr(res, "usage_missing", False):
            self.stats.usage_estimated += 1
            self.stats.prompt_tokens += res.prompt_tokens
            self.stats.completion_tokens += res.completion_tokens
            return
        for name in ("prompt_tokens", "completion_tokens"):
            v = usage.get(name)
            if isinstance(v, int | float) and not isinstance(v, bool):
                setattr(self.stats, name, getattr(self.stats, name) + max(0, int(v)))
        if res is not None:  # the reply's reading of its usage (llm/reply.py): cache reads and writes
            self.stats.cached_prompt_tokens += getattr(res, "cached_tokens", 0)
            self.stats.cache_write_tokens += getattr(res, "cache_write_tokens", 0)

    def _cached(self, key: str) -> bool:
        return self.cache.get(key) is not None

    def _error(self, msg: str) -> None:
        if len(self.stats.errors) < MAX_ERRORS_KEPT:
            self.stats.errors.append(redact(msg))  # meta.json and the report: a server may echo the key

    def _show(self, states: dict[str, BatchState], waited: float, final: bool) -> None:
        now = time.monotonic()
        if not final and now - self._last_line < 5.0:
            return
        self._last_line = now
        total = sum(s.total for s in states.values())
        done = sum(s.completed + s.failed for s in states.values())
        running = sum(1 for s in states.values() if not s.done)
        per = ", ".join(f"{s.completed + s.failed}/{s.total}" for s in list(states.values())[:6])
        more = "" if len(states) <= 6 else f", +{len(states) - 6} more"
        failed = sum(s.failed for s in states.values())
        self.log(
            f"{self.profile.name}: batches {len(states) - running}/{len(states)} done, requests {done:,}/{total:,} "
            + (f"({failed:,} failed) " if failed else "") + f"[{per}{more}], waited {format_eta(waited)}"
        )
