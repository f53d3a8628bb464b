"""`LLMEngine`: the async chat client for one model (session, limits, retries, cache, accounting).

A call is prepared (`prepare`: its cache key and JSON body), then sent (`send`). Order of a send,
cheapest first: cache lookup (no lock, no await), an identical call already in flight in this
process, then the fresh path: 429 gate -> concurrency slot -> the call's cross-process claim (another
process already sending it: wait for its reply instead) -> RPM/TPM pacing -> HTTP -> classify ->
store in the cache (committed before `send` returns) or back off and retry.

A host that rejects a request field (a 400 or 422 naming `seed`, `response_format`, or any other optional
field) gets it dropped for every later attempt of this model — calls already queued or in flight
included, each retried once without it — with a warning; cache keys stay those of the logical
request (see cache.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from .accounting import ModelStats
from .cache import ResponseCache, body_key, call_key, key_prefix, new_owner
from .errors import ConfigError, FatalLLMError, mask, redact
from .limits import ConcurrencyLimit, RequestPacer, SlowDownGate, TokenBucket
from .profiles import ModelProfile, resolve_api_key
from .retry import Kind, Verdict, backoff_delay, classify_http, is_validation_error, rejected_fields

log = logging.getLogger("evaluator.llm")

# Fields a host may reject and the request still means the same thing without; `model` and
# `messages` are the request itself.
_REQUIRED_FIELDS = frozenset({"model", "messages"})
CLAIM_LEASE_S = 30.0  # a claim not renewed for this long is free for another process to take


@dataclass
class ChatResult:
    content: str | None
    finish_reason: str | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: bool = False
    error: str | None = None  # set when the call failed for good (non-fatal); such results are never cached
    error_kind: str | None = None  # with `error`: `http_400`, `timeout`, `connection`, `http_503`, ...
    reasoning_only: bool = False  # the text came from reasoning_content / reasoning (content was null)
    raw: dict[str, Any] | None = field(default=None, repr=False)  # the provider's body, with `keep_raw`

    @property
    def truncated(self) -> bool:
        """Cut at max_tokens: still the model's real output for this request, returned and cached."""
        return self.finish_reason == "length"


@dataclass(frozen=True)
class Prepared:
    """One request: its cache key and the JSON body the online path sends (no secrets in either).

    `body` leaves out the fields this host had rejected when it was prepared; `logical` is the whole
    request (what the key stands for). A field rejected later is left out at send time.
    """

    key: str
    body: dict[str, Any]
    logical: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def _is_json_schema(rf: Any) -> bool:
    return isinstance(rf, dict) and rf.get("type") == "json_schema" and isinstance(rf.get("json_schema"), dict)


def _as_json_object(rf: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_object", "schema": rf["json_schema"].get("schema", {})}


class LLMEngine:
    """One per model. Use as `async with LLMEngine(profile, cache_root=...) as llm: await llm.chat(...)`.

    Without `async with`, the engine is usable for what needs no HTTP: `prepare`, `prepare_body`,
    `lookup` and `store_reply` (batch import); call `close_cache()` afterwards.
    """

    def __init__(
        self,
        profile: ModelProfile,
        *,
        cache_root: Path | str | None = None,
        api_key: str | None = None,
        seed: int | None = None,
        claim_lease_s: float = CLAIM_LEASE_S,
    ) -> None:
        self.profile = profile
        self._key = api_key if api_key is not None else resolve_api_key(profile)
        self.stats = ModelStats()
        self._cache = ResponseCache(cache_root) if cache_root is not None else None
        sampling = {"temperature": profile.temperature, "max_tokens": profile.max_tokens, "extra_body": profile.extra_body}
        # An auto-started simulator listens on a new port each time; its answers do not depend on it.
        self._endpoint = f"simulator:{profile.name}" if profile.simulated else profile.base_url
        self._prefix = key_prefix(self._endpoint, profile.model, sampling)
        payload: dict[str, Any] = {"model": profile.model, "temperature": profile.temperature}
        if profile.max_tokens is not None:
            payload["max_tokens"] = profile.max_tokens
        payload.update(profile.extra_body)
        self._payload = payload
        self._url = profile.base_url.rstrip("/") + "/chat/completions"
        self._rng = random.Random(seed)
        self._gate = SlowDownGate(self._rng)
        self._pacer = RequestPacer(profile.rpm) if profile.rpm else None
        self._tpm = TokenBucket(profile.tpm) if profile.tpm else None
        self._limit = ConcurrencyLimit(profile.concurrency, adaptive=profile.adaptive_concurrency)
        self._inflight: dict[str, asyncio.Future[ChatResult]] = {}
        self._fatal: FatalLLMError | None = None
        self._session: aiohttp.ClientSession | None = None
        self._dropped: set[str] = set()  # fields this host rejected; never sent again
        self._schema_as_object = False  # json_schema rejected: send the schema in json_object form
        self._owner = new_owner()
        self._lease = claim_lease_s
        self._claimed: set[str] = set()
        self._renewer: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        p = self.profile
        return f"LLMEngine(name={p.name!r}, model={p.model!r}, base_url={p.base_url!r}, api_key={mask(self._key)})"

    async def __aenter__(self) -> LLMEngine:
        if not self.profile.base_url:
            raise ConfigError(f"model {self.profile.name!r} has no base_url (start the simulator or pass --base-url)")
        headers = {"Content-Type": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        self._session = aiohttp.ClientSession(
            headers=headers,
            # Per attempt: the clock starts when the request is sent (after the slot and pacing).
            timeout=aiohttp.ClientTimeout(total=self.profile.timeout_s),
            connector=aiohttp.TCPConnector(limit=self.profile.concurrency, ttl_dns_cache=300),
            trust_env=not self._loopback(),  # honour HTTP(S)_PROXY for real providers, never for local servers
        )
        if self._cache is not None:
            self._renewer = asyncio.create_task(self._renew_claims())
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
            self._renewer = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        self.close_cache()

    def close_cache(self) -> None:
        if self._cache is not None:
            if self._claimed:  # cancelled calls: let other processes take them at once
                self._cache.release(list(self._claimed), self._owner)
                self._claimed.clear()
            self._cache.close()

    def _loopback(self) -> bool:
        return self.profile.simulated or urlsplit(self.profile.base_url).hostname in ("127.0.0.1", "localhost", "::1")

    # -- preparing requests ----------------------------------------------------------------------
    def response_format(self, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        """`schema` ({"name", "schema"[, "strict"]}) as the profile's `structured` mode sends it.

        "json_object_schema" is the form llama-cpp-python (and Together, Anyscale) constrain with:
        `{"type": "json_object", "schema": ...}`.
        """
        mode = self.profile.structured
        if schema is None or mode == "none":
            return None
        if mode == "json_object":
            return {"type": "json_object"}
        if mode == "json_object_schema":
            return {"type": "json_object", "schema": schema["schema"]}
        spec: dict[str, Any] = {"name": schema.get("name") or "response", "schema": schema["schema"]}
        if "strict" in schema:
            spec["strict"] = schema["strict"]
        return {"type": "json_schema", "json_schema": spec}

    def prepare(
        self, messages: list[dict[str, Any]], *, run: int, prompt_version: str, schema: dict[str, Any] | None = None
    ) -> Prepared:
        """The cache key and body of one chat call (run `run` is sent as the seed)."""
        rf = self.response_format(schema)
        key = call_key(self._prefix, messages, run, prompt_version, rf)
        body = {**self._payload, "messages": messages, "seed": run}
        if rf is not None:
            body["response_format"] = rf
        return Prepared(key, self._wire(body), body)

    def prepare_body(self, body: dict[str, Any]) -> Prepared:
        """An arbitrary OpenAI chat-completions body (request files), keyed on endpoint + body."""
        return Prepared(body_key(self._endpoint, body), self._wire(body), body)

    def _wire(self, body: dict[str, Any]) -> dict[str, Any]:
        """`body` without the fields this host rejected (and with a schema it can take, see `_downgrade`)."""
        if self._schema_as_object and _is_json_schema(body.get("response_format")):
            body = {**body, "response_format": _as_json_object(body["response_format"])}
        if not self._dropped:
            return body
        return {k: v for k, v in body.items() if k not in self._dropped}

    # -- cache access without HTTP -----------------------------------------------------------------
    def lookup(self, key: str) -> ChatResult | None:
        """The cached reply for `key`, or None (no accounting)."""
        if self._cache is None:
            return None
        hit = self._cache.get(key)
        if hit is None:
            return None
        return ChatResult(
            hit["content"], hit["finish_reason"], hit["prompt_tokens"], hit["completion_tokens"], True,
            reasoning_only=bool(hit.get("reasoning_only")),
        )

    def store_reply(self, key: str, response_body: dict[str, Any]) -> ChatResult:
        """Parse a chat.completion body (e.g. from a batch output) and cache it as the online path would.

        An unusable body (malformed, empty) comes back with `.error` set and is not stored. Its tokens
        are not added to `stats` (they were billed by the batch API, which accounts for them).
        """
        read = self._read_reply(response_body, stats=None)  # already decoded; billed by the batch, not here
        if isinstance(read, Verdict):
            return ChatResult(None, None, error=read.reason, error_kind=read.label)
        self._store(key, read, dropped=())
        return read

    # -- calling -----------------------------------------------------------------------------------
    async def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        run: int,
        prompt_version: str,
        schema: dict[str, Any] | None = None,
    ) -> ChatResult:
        """The reply to `messages` for run `run` (sent as the seed); durable in the cache on return.

        Raises `FatalLLMError` (bad key, daily quota...) — every later fresh call then raises it too.
        """
        return await self.send(self.prepare(messages, run=run, prompt_version=prompt_version, schema=schema))

    async def send(self, prepared: Prepared, *, keep_raw: bool = False) -> ChatResult:
        """Send a prepared request through cache, claims, limits and retries (see the module doc)."""
        self.stats.calls += 1
        key = prepared.key
        hit = self.lookup(key)
        if hit is not None:
            self.stats.cache_hits += 1
            return hit
        while (pending := self._inflight.get(key)) is not None:
            try:
                shared = await asyncio.shield(pending)
            except asyncio.CancelledError:
                if pending.cancelled():
                    continue  # the call we were waiting on was cancelled; make it ourselves
                raise
            self.stats.cache_hits += 1
            return dataclasses.replace(shared, cached=shared.error is None, raw=None)
        if self._fatal is not None:
            raise self._fatal
        fut: asyncio.Future[ChatResult] = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        try:
            result = await self._fetch(prepared, keep_raw)
        except FatalLLMError as e:
            fut.set_exception(e)
            fut.exception()  # mark retrieved: nobody may be waiting on it
            raise
        except BaseException:
            fut.cancel()
            raise
        else:
            fut.set_result(result)
            return result
        finally:
            del self._inflight[key]

    async def _fetch(self, prepared: Prepared, keep_raw: bool) -> ChatResult:
        try:
            return await self._attempts(prepared, keep_raw)
        finally:
            if prepared.key in self._claimed and self._cache is not None:
                self._claimed.discard(prepared.key)
                self._cache.release([prepared.key], self._owner)

    async def _attempts(self, prepared: Prepared, keep_raw: bool) -> ChatResult:
        if self._session is None:
            raise RuntimeError("LLMEngine used outside `async with`")
        p = self.profile
        key = prepared.key
        logical = prepared.logical or prepared.body
        # Only a TPM budget needs the estimate: no extra JSON encoding per call otherwise.
        est_tokens = len(orjson.dumps(logical)) // 4 + (p.max_tokens or 0) if self._tpm is not None else 0
        t_call = time.perf_counter()
        queued = True  # until the first send
        failures = 0  # transient errors other than 429
        rate_limited = 0
        truncations = 0
        retried_without: set[str] = set()  # fields this call was already retried without
        while True:
            if self._fatal is not None:
                raise self._fatal
            await self._gate.wait()
            status, headers, raw, verdict = 0, None, b"", None
            sent: dict[str, Any] = {}
            waits_elsewhere = False
            hold = 0.0
            epoch = await self._limit.acquire()
            try:
                if self._cache is not None and key not in self._claimed:
                    if not self._cache.claim(key, self._owner, self._lease):
                        waits_elsewhere = True
                    else:
                        self._claimed.add(key)
                        if (hit := self.lookup(key)) is not None:  # stored just before we claimed it
                            self.stats.cache_hits += 1
                            self.stats.shared_elsewhere += 1
                            return hit
                if not waits_elsewhere:
                    if self._pacer is not None:
                        await self._pacer.acquire()
                    if self._tpm is not None:
                        await self._tpm.acquire(est_tokens)
                    if self._gate.closed():
                        # A 429 arrived while we queued: wait it out with everyone, then use the pacing slot
                        # we already hold rather than throwing it away and queueing again.
                        await self._gate.wait()
                    sent = self._wire(logical)
                    body = orjson.dumps(sent)
                    if queued:
                        queued = False
                        self.stats.queue_waits.append(time.perf_counter() - t_call)
                    self.stats.requests += 1
                    self.stats.max_in_flight = max(self.stats.max_in_flight, self._limit.in_use)
                    t_send = time.perf_counter()
                    try:
                        async with self._session.post(self._url, data=body) as resp:
                            status, headers = resp.status, resp.headers
                            raw = await resp.read()
                    except TimeoutError:
                        verdict = Verdict(Kind.RETRY, f"timeout after {p.timeout_s:g}s", label="timeout")
                        self.stats.timeouts += 1
                        self._limit.congested(epoch)
                        # The server is most likely still working on it: keep its slot taken a while.
                        hold = p.timeout_s
                    except aiohttp.ClientConnectorError as e:
                        reason = f"cannot connect to {p.base_url} ({type(e).__name__})"
                        verdict = Verdict(Kind.RETRY, reason, fatal_when_exhausted=True, label="connection")
                    except aiohttp.ClientError as e:
                        verdict = Verdict(Kind.RETRY, f"connection error ({type(e).__name__})", label="connection")
                    latency = time.perf_counter() - t_send
                    if status == 200:
                        self.stats.latencies.append(latency)
                    if status == 200 or (status >= 500 and not is_validation_error(raw)):
                        self._limit.answered(epoch, latency, server_error=status >= 500)
            finally:
                self._limit.release(hold)
                self.stats.concurrency_limit = self._limit.limit

            if waits_elsewhere:
                shared = await self._await_other(key)
                if shared is not None:
                    return shared
                continue  # the other process gave the call up (or died): make it ourselves

            if verdict is None and status == 200:
                read = self._read_reply(raw, keep_raw, stats=self.stats)
                if isinstance(read, Verdict):
                    verdict = read
                else:
                    if read.truncated:
                        self.stats.truncated += 1
                        if truncations < p.truncation_retries:
                            truncations += 1
                            self.stats.retries += 1
                            continue
                    # The last reply, cut or not, is the model's real output for this request.
                    self._store(key, read, dropped=sorted(self._dropped & set(logical)))
                    return read
            elif verdict is None:
                # 422: FastAPI servers validating the body; a 5xx carrying a validation report:
                # llama-cpp-python, whose error handler answers 500 to a body it cannot validate.
                if status in (400, 422) or (status >= 500 and is_validation_error(raw)):
                    names = rejected_fields(raw, set(sent) - _REQUIRED_FIELDS - retried_without)  # only what was sent
                    if "response_format" in names and _is_json_schema(sent.get("response_format")):
                        names.discard("response_format")  # first try the other form of the same schema
                        self._downgrade(status, raw)
                        if not names:
                            self.stats.retries += 1
                            continue
                    if names:
                        self._drop(names, status, raw)
                        retried_without |= names
                        self.stats.retries += 1
                        continue  # at once, without them; not a failure of this call
                verdict = classify_http(status, headers or {}, raw)

            if verdict.is_429:
                self.stats.http_429 += 1
                rate_limited += 1
                self._limit.congested(epoch)
                if verdict.limit_rpm:
                    self._learn_rpm(verdict.limit_rpm)
            if verdict.kind is Kind.FATAL or (verdict.fatal_when_exhausted and failures >= p.max_retries):
                self._fatal = FatalLLMError(self._fatal_message(status, verdict))
                raise self._fatal
            # 429s have their own, larger budget: a limit that is paced to is not a failing server.
            exhausted = rate_limited > max(20, 3 * p.max_retries) if verdict.is_429 else failures >= p.max_retries
            if verdict.kind is Kind.GIVE_UP or exhausted:
                kind = verdict.label or "error"
                self.stats.fail(kind)
                n = failures + rate_limited + (0 if verdict.is_429 else 1)
                tries = f" (after {n} tries)" if verdict.kind is Kind.RETRY else ""
                return ChatResult(None, None, error=redact(verdict.reason, self._key) + tries, error_kind=kind)
            delay = verdict.retry_after
            if delay is None:  # no usable hint (none, 0, negative, garbage): backoff with a floor
                attempt = rate_limited - 1 if verdict.is_429 else failures
                delay = backoff_delay(attempt, p.backoff_base_s, p.backoff_max_s, self._rng)
            delay = min(delay, p.max_wait_s)
            if not verdict.is_429:
                failures += 1
            self.stats.retries += 1
            log.debug("%s: retry in %.2fs: %s", p.name, delay, redact(verdict.reason, self._key))
            if verdict.is_429:
                self._gate.close_for(delay)  # everyone waits, this call included (at the gate)
            else:
                await asyncio.sleep(delay)

    async def _await_other(self, key: str) -> ChatResult | None:
        """Another process holds `key`'s claim: poll for its reply; None once the claim is free."""
        delay = 0.02
        while True:
            if self._fatal is not None:
                raise self._fatal
            await asyncio.sleep(delay)
            delay = min(1.0, delay * 1.5)
            if (hit := self.lookup(key)) is not None:
                self.stats.cache_hits += 1
                self.stats.shared_elsewhere += 1
                return hit
            assert self._cache is not None
            if not self._cache.held_elsewhere(key, self._owner):
                return None

    async def _renew_claims(self) -> None:
        assert self._cache is not None
        while True:
            await asyncio.sleep(self._lease / 3)
            if self._claimed:
                try:
                    self._cache.renew(list(self._claimed), self._owner, self._lease)
                except Exception as e:  # noqa: BLE001 - a lost renewal costs at most a duplicate request
                    log.warning("%s: cannot renew in-flight claims in the cache (%s)", self.profile.name, e)

    def _downgrade(self, status: int, raw: bytes) -> None:
        """The host rejects `{"type": "json_schema", ...}`: send `{"type": "json_object", "schema": ...}`.

        That is the form llama-cpp-python (and Together, Anyscale) constrain output with; a host that
        rejects that too gets free text (`_drop`). The cache key stays that of the requested schema.
        """
        if self._schema_as_object:
            return
        self._schema_as_object = True
        self.stats.dropped_params.append("response_format:json_schema")
        why = redact(classify_http(status, {}, raw).reason, self._key)[:200]
        log.warning(
            "%s: the endpoint rejects response_format json_schema; sending each schema as "
            '{"type": "json_object", "schema": ...} instead (llama-cpp-python\'s form) [%s]',
            self.profile.name, why,
        )

    def _drop(self, names: set[str], status: int, raw: bytes) -> None:
        new = sorted(names - self._dropped)
        if not new:
            return  # already dropped by another call: this one was in flight with it
        self._dropped.update(new)
        self.stats.dropped_params.extend(new)
        why = redact(classify_http(status, {}, raw).reason, self._key)[:200]
        what = ", ".join(f"`{n}`" for n in new)
        extra = " (structured output off: free text for this model)" if "response_format" in new else ""
        log.warning(
            "%s: the endpoint rejects %s; sending every request of this model without it from now on%s [%s]",
            self.profile.name, what, extra, why,
        )

    def _learn_rpm(self, rpm: float) -> None:
        """Pace to a limit the server announced when we had none or a higher one (blind profiles)."""
        if self._pacer is None or rpm < self._pacer.rpm:
            log.info("%s: server announces %g requests/min; pacing to it", self.profile.name, rpm)
            self._pacer = RequestPacer(rpm)

    def _read_reply(
        self, raw: bytes | dict[str, Any], keep_raw: bool = False, *, stats: ModelStats | None
    ) -> ChatResult | Verdict:
        """A 200 body (bytes, or already decoded) -> the result, or a verdict to retry (malformed or
        empty); counts into `stats`."""
        try:
            data = orjson.loads(raw) if isinstance(raw, bytes | bytearray) else raw
            choice = data["choices"][0]
            msg = choice.get("message") or {}
            usage = data.get("usage") or {}
            pt, ct = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
            content, finish = msg.get("content"), choice.get("finish_reason")
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError, ValueError):
            return Verdict(Kind.RETRY, "malformed reply (not OpenAI chat JSON)", label="malformed_reply")
        if stats is not None:
            stats.prompt_tokens += pt  # billed whether or not the reply is usable
            stats.completion_tokens += ct
        result = ChatResult(content, finish, pt, ct, raw=data if keep_raw else None)
        if not content:
            # content null: reasoning models (gpt-oss on vLLM/OpenRouter) put their text here instead.
            reasoning = msg.get("reasoning_content") or msg.get("reasoning")
            if reasoning:
                result.content, result.reasoning_only = reasoning, True
                if stats is not None:
                    stats.reasoning_only += 1
            elif finish == "length":  # cut before any text: still a real (empty) output
                result.content = ""
            else:
                return Verdict(Kind.RETRY, f"empty reply (content null, finish_reason={finish})", label="empty_reply")
        return result

    def _store(self, key: str, r: ChatResult, *, dropped: list[str] | tuple[()]) -> None:
        if self._cache is None:
            return
        entry: dict[str, Any] = {
            "content": r.content,
            "finish_reason": r.finish_reason,
            "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.completion_tokens,
            "model": self.profile.model,
            "stored_at": time.time(),
        }
        if r.reasoning_only:
            entry["reasoning_only"] = True
        if dropped:
            entry["dropped"] = list(dropped)  # fields the logical request had that the host refused
        self._cache.set(key, entry, tag=self.profile.name)

    def _fatal_message(self, status: int, v: Verdict) -> str:
        p = self.profile
        why = redact(v.reason, self._key)
        env = p.api_key_env or "the profile's api_key_env"
        if v.is_429:
            what = "daily quota exhausted; rerun tomorrow or raise the quota (finished calls are cached and will not be re-sent)"
        elif status == 401:
            what = f"the API key was rejected; set {env} to a valid key"
        elif status == 403:
            what = f"permission denied; check that the key in {env} may use model {p.model!r} (API enabled, billing, region)"
        elif status == 404:
            what = f"endpoint or model not found; check base_url {p.base_url!r} and model id {p.model!r}"
        else:
            what = f"the endpoint does not answer; check that the server is up and base_url/--base-url ({p.base_url!r})"
        return f"{p.name}: {what} [{why}]"
