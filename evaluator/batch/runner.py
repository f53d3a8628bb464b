"""Submit chat requests through a provider's Batch API and bring the replies into the response cache.

`BatchRunner.run(requests)`: first polls the batches an earlier (killed) run already submitted, then
submits what is still not cached, split at the provider's limits; polls with backoff, showing
requests done per batch and the time waited; stores every reply the moment its batch completes
(`engine.store_reply`, exactly as the online path stores it); re-submits only what failed or expired,
up to `max_attempts` times. A batch the provider rejects as too large is split in two and submitted
again. Request keys (`custom_id`) are the engine's cache keys, so nothing cached is ever submitted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from ..llm.cache import ResponseCache
from ..llm.profiles import ModelProfile
from ..progress import format_eta
from .files import Request, Result, split
from .providers import BatchAPI, BatchAPIError, BatchState, batch_limits, is_loopback
from .store import Job, JobStore

MAX_ERRORS_KEPT = 5


class ReplyStore(Protocol):
    """What the runner needs of the engine: `LLMEngine.store_reply`."""

    def store_reply(self, key: str, response_body: dict[str, Any]) -> Any: ...


@dataclass
class Poll:
    """Polling schedule: starts at `first_s`, grows by `factor` per poll up to `max_s`."""

    first_s: float = 10.0
    max_s: float = 300.0
    factor: float = 1.5

    @classmethod
    def for_profile(cls, p: ModelProfile) -> Poll:
        # The simulator turns batches around in fractions of a second; providers in minutes to hours.
        return cls(0.05, 1.0) if is_loopback(p) else cls()


@dataclass
class BatchStats:
    """Per model; `meta.json` carries `as_dict()`. Tokens are those billed for batch replies."""

    batches: int = 0  # batches created (splits and re-submissions included)
    submitted: int = 0  # requests submitted, re-submissions included
    stored: int = 0  # replies stored in the cache
    failed: int = 0  # requests the provider answered with an error
    not_run: int = 0  # requests of expired or cancelled batches that never ran
    unusable: int = 0  # 200 replies the engine would not cache (cut at max_tokens, empty)
    resubmitted: int = 0
    split: int = 0  # batches split after the provider rejected their size
    resumed: int = 0  # batches of an earlier run picked up again
    cancelled: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    waited_s: float = 0.0
    errors: list[str] = field(default_factory=list)  # the first few reasons, for the report

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


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
    ) -> None:
        self.profile = profile
        self.engine = engine
        self.api = api
        self.store = store
        self.cache = cache
        self.poll = poll or Poll.for_profile(profile)
        self.max_attempts = max_attempts
        self.log = log or (lambda m: None)  # the caller decides where progress lines go
        self.stats = BatchStats()
        self.permanent: dict[str, str] = {}  # key -> why (4xx, unusable): re-submitting would not help
        self._requests: dict[str, list[Request]] = {}  # token -> its requests (jobs of this process)
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
            chunks = split(pending, *batch_limits(self.profile))
            jobs = [await self._submit(chunk, attempt) for chunk in chunks]
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
            if job.batch_id is None:
                # Killed between writing the row and learning the id: the batch may exist anyway.
                found = await self.api.find(job.token)
                if found is None:
                    self.store.mark(job, "lost")  # never created; its requests are simply still missing
                    continue
                self.store.submitted(job, found)
            try:
                await self.api.state(job.batch_id)  # type: ignore[arg-type]
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
            if job.batch_id is None and (found := await self.api.find(job.token)) is not None:
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
        job = self.store.new(self.profile.name, str(self.profile.batch), [r.custom_id for r in chunk], attempt)
        self._requests[job.token] = chunk
        batch_id = await self.api.submit(chunk, job.token)
        self.store.submitted(job, batch_id)
        self.stats.batches += 1
        self.stats.submitted += len(chunk)
        return job

    async def _wait(self, jobs: list[Job]) -> None:
        open_jobs = {j.token: j for j in jobs}
        states: dict[str, BatchState] = {}
        delay = self.poll.first_s
        t0 = time.monotonic()
        while open_jobs:
            for job in list(open_jobs.values()):
                assert job.batch_id is not None
                st = await self.api.state(job.batch_id)
                states[job.token] = st
                if not st.done:
                    continue
                del open_jobs[job.token]
                if st.too_large and job.token in self._requests and len(self._requests[job.token]) > 1:
                    self.store.mark(job, "done")
                    reqs = self._requests.pop(job.token)
                    half = len(reqs) // 2
                    self.stats.split += 1
                    self.log(f"{self.profile.name}: batch {job.batch_id} too large for the provider; split in two")
                    for part in (reqs[:half], reqs[half:]):
                        new = await self._submit(part, job.attempt)
                        open_jobs[new.token] = new
                    continue
                if st.status == "failed" and st.errors:
                    self._error(f"batch {job.batch_id} failed: {st.errors[0].get('message', st.errors[0])}")
                await self._import(job)
            self._show(states, time.monotonic() - t0, final=not open_jobs)
            if open_jobs:
                await asyncio.sleep(delay)
                delay = min(delay * self.poll.factor, self.poll.max_s)
        self.stats.waited_s += time.monotonic() - t0

    async def _import(self, job: Job) -> None:
        assert job.batch_id is not None
        results = await self.api.results(job.batch_id)
        wanted = set(job.keys)
        seen: set[str] = set()
        for r in results:
            if r.custom_id not in wanted or r.custom_id in seen:
                continue
            seen.add(r.custom_id)
            self._take(r)
        not_run = len(wanted - seen)
        self.stats.not_run += not_run
        self.store.mark(job, "done")
        self._requests.pop(job.token, None)

    def _take(self, r: Result) -> None:
        if r.ok:
            assert r.body is not None
            usage = r.body.get("usage") or {}
            self.stats.prompt_tokens += int(usage.get("prompt_tokens") or 0)  # billed, usable or not
            self.stats.completion_tokens += int(usage.get("completion_tokens") or 0)
            if self._cached(r.custom_id):
                return  # answered online meanwhile; keep the first reply
            res = self.engine.store_reply(r.custom_id, r.body)
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
        if 400 <= r.status_code < 500 and r.status_code not in (408, 409, 429):
            self.permanent[r.custom_id] = r.reason()  # the request itself is wrong: same answer next time
        self._error(f"{r.custom_id[:12]}: {r.reason()}")

    def _cached(self, key: str) -> bool:
        return self.cache.get(key) is not None

    def _error(self, msg: str) -> None:
        if len(self.stats.errors) < MAX_ERRORS_KEPT:
            self.stats.errors.append(msg)

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
        self.log(
            f"{self.profile.name}: batches {len(states) - running}/{len(states)} done, requests {done:,}/{total:,} "
            f"[{per}{more}], waited {format_eta(waited)}"
        )
