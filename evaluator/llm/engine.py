"""`LLMEngine`: the async chat client for one model (session, limits, retries, cache, accounting).

Order of a call, cheapest first: cache lookup (no lock, no await), an identical call already in
flight, then the fresh path: 429 gate -> concurrency slot -> RPM/TPM pacing -> HTTP -> classify ->
store in the cache (committed before `chat` returns) or back off and retry.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from .accounting import ModelStats
from .cache import ResponseCache, call_key, key_prefix
from .errors import ConfigError, FatalLLMError, mask, redact
from .limits import RequestPacer, SlowDownGate, TokenBucket
from .profiles import ModelProfile, resolve_api_key
from .retry import Kind, Verdict, backoff_delay, classify_http

log = logging.getLogger("evaluator.llm")


@dataclass
class ChatResult:
    content: str | None
    finish_reason: str | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: bool = False
    error: str | None = None  # set when the call failed for good (non-fatal); such results are never cached


class LLMEngine:
    """One per model. Use as `async with LLMEngine(profile, cache_root=...) as llm: await llm.chat(...)`."""

    def __init__(
        self,
        profile: ModelProfile,
        *,
        cache_root: Path | str | None = None,
        api_key: str | None = None,
        seed: int | None = None,
    ) -> None:
        self.profile = profile
        self._key = api_key if api_key is not None else resolve_api_key(profile)
        self.stats = ModelStats()
        self._cache = ResponseCache(cache_root) if cache_root is not None else None
        sampling = {"temperature": profile.temperature, "max_tokens": profile.max_tokens, "extra_body": profile.extra_body}
        # An auto-started simulator listens on a new port each time; its answers do not depend on it.
        endpoint = f"simulator:{profile.name}" if profile.simulated else profile.base_url
        self._prefix = key_prefix(endpoint, profile.model, sampling)
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
        self._sem = asyncio.Semaphore(profile.concurrency)
        self._inflight: dict[str, asyncio.Future[ChatResult]] = {}
        self._fatal: FatalLLMError | None = None
        self._session: aiohttp.ClientSession | None = None
        self._send_seed = True

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
            timeout=aiohttp.ClientTimeout(total=self.profile.timeout_s),
            connector=aiohttp.TCPConnector(limit=self.profile.concurrency, ttl_dns_cache=300),
            trust_env=not self._loopback(),  # honour HTTP(S)_PROXY for real providers, never for local servers
        )
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._cache is not None:
            self._cache.close()

    def _loopback(self) -> bool:
        return self.profile.simulated or urlsplit(self.profile.base_url).hostname in ("127.0.0.1", "localhost", "::1")

    def cache_key(self, messages: list[dict[str, Any]], *, run: int, prompt_version: str) -> str:
        return call_key(self._prefix, messages, run, prompt_version)

    async def chat(self, messages: list[dict[str, Any]], *, run: int, prompt_version: str) -> ChatResult:
        """The reply to `messages` for run `run` (sent as the seed); durable in the cache on return.

        Raises `FatalLLMError` (bad key, daily quota...) — every later fresh call then raises it too.
        """
        self.stats.calls += 1
        key = call_key(self._prefix, messages, run, prompt_version)
        if self._cache is not None:
            hit = self._cache.get(key)
            if hit is not None:
                self.stats.cache_hits += 1
                return ChatResult(hit["content"], hit["finish_reason"], hit["prompt_tokens"], hit["completion_tokens"], True)
        while (pending := self._inflight.get(key)) is not None:
            try:
                shared = await asyncio.shield(pending)
            except asyncio.CancelledError:
                if pending.cancelled():
                    continue  # the call we were waiting on was cancelled; make it ourselves
                raise
            self.stats.cache_hits += 1
            return dataclasses.replace(shared, cached=shared.error is None)
        if self._fatal is not None:
            raise self._fatal
        fut: asyncio.Future[ChatResult] = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        try:
            result = await self._fetch(key, messages, run)
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

    async def _fetch(self, key: str, messages: list[dict[str, Any]], run: int) -> ChatResult:
        if self._session is None:
            raise RuntimeError("LLMEngine used outside `async with`")
        p = self.profile
        body = self._body(messages, run)
        est_tokens = len(body) // 4 + (p.max_tokens or 0)
        t0 = time.perf_counter()
        failures = 0  # transient errors other than 429
        rate_limited = 0
        truncations = 0
        while True:
            if self._fatal is not None:
                raise self._fatal
            await self._gate.wait()
            status, headers, raw, verdict = 0, None, b"", None
            async with self._sem:
                if self._pacer is not None:
                    await self._pacer.acquire()
                if self._tpm is not None:
                    await self._tpm.acquire(est_tokens)
                if self._gate.closed():
                    # A 429 arrived while we queued: wait it out with everyone, then use the pacing slot
                    # we already hold rather than throwing it away and queueing again.
                    await self._gate.wait()
                self.stats.requests += 1
                try:
                    async with self._session.post(self._url, data=body) as resp:
                        status, headers = resp.status, resp.headers
                        raw = await resp.read()
                except TimeoutError:
                    verdict = Verdict(Kind.RETRY, f"timeout after {p.timeout_s:g}s")
                except aiohttp.ClientConnectorError as e:
                    reason = f"cannot connect to {p.base_url} ({type(e).__name__})"
                    verdict = Verdict(Kind.RETRY, reason, fatal_when_exhausted=True)
                except aiohttp.ClientError as e:
                    verdict = Verdict(Kind.RETRY, f"connection error ({type(e).__name__})")

            if verdict is None and status == 200:
                read = self._read_reply(raw)
                if isinstance(read, Verdict):
                    verdict = read
                elif (reply := read[0]).finish_reason == "length":
                    self.stats.truncated += 1
                    if truncations < p.truncation_retries:
                        truncations += 1
                        self.stats.retries += 1
                        continue
                    self.stats.errors += 1
                    self._took(t0)
                    reply.error = f"truncated: finish_reason=length on {truncations + 1} tries (raise max_tokens)"
                    return reply
                else:
                    if read[1] and self._cache is not None:
                        self._cache.set(key, self._entry(reply), tag=p.name)
                    self._took(t0)
                    return reply
            elif verdict is None:
                if status == 400 and self._send_seed and b"seed" in raw.lower():
                    # Some OpenAI-compatible hosts reject `seed`. Runs stay distinct samples through
                    # the cache key; the provider's own sampling varies them.
                    log.warning("%s: the endpoint rejects `seed`; sending requests without it", p.name)
                    self._send_seed = False
                    body = self._body(messages, run)
                    continue
                verdict = classify_http(status, headers or {}, raw)

            if verdict.is_429:
                self.stats.http_429 += 1
                rate_limited += 1
                if verdict.limit_rpm:
                    self._learn_rpm(verdict.limit_rpm)
            if verdict.kind is Kind.FATAL or (verdict.fatal_when_exhausted and failures >= p.max_retries):
                self._fatal = FatalLLMError(self._fatal_message(status, verdict))
                raise self._fatal
            # 429s have their own, larger budget: a limit that is paced to is not a failing server.
            exhausted = rate_limited > max(20, 3 * p.max_retries) if verdict.is_429 else failures >= p.max_retries
            if verdict.kind is Kind.GIVE_UP or exhausted:
                self.stats.errors += 1
                self._took(t0)
                n = failures + rate_limited + (0 if verdict.is_429 else 1)
                tries = f" (after {n} tries)" if verdict.kind is Kind.RETRY else ""
                return ChatResult(None, None, error=redact(verdict.reason, self._key) + tries)
            delay = verdict.retry_after
            if delay is None:
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

    def _body(self, messages: list[dict[str, Any]], run: int) -> bytes:
        extra = {"seed": run} if self._send_seed else {}
        return orjson.dumps({**self._payload, "messages": messages, **extra})

    def _learn_rpm(self, rpm: float) -> None:
        """Pace to a limit the server announced when we had none or a higher one (blind profiles)."""
        if self._pacer is None or rpm < self._pacer.rpm:
            log.info("%s: server announces %g requests/min; pacing to it", self.profile.name, rpm)
            self._pacer = RequestPacer(rpm)

    def _read_reply(self, raw: bytes) -> tuple[ChatResult, bool] | Verdict:
        """A 200 body -> (result, whether it may be cached), or a verdict to retry."""
        try:
            data = orjson.loads(raw)
            choice = data["choices"][0]
            msg = choice.get("message") or {}
            usage = data.get("usage") or {}
            pt, ct = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError, ValueError):
            return Verdict(Kind.RETRY, "malformed reply (not OpenAI chat JSON)")
        self.stats.prompt_tokens += pt  # billed whether or not the reply is usable
        self.stats.completion_tokens += ct
        content, finish = msg.get("content"), choice.get("finish_reason")
        if finish == "length":
            return ChatResult(content, finish, pt, ct), False
        if content:
            return ChatResult(content, finish, pt, ct), True
        # content null: reasoning models (gpt-oss on vLLM/OpenRouter) put their text here instead.
        reasoning = msg.get("reasoning_content") or msg.get("reasoning")
        if reasoning:
            # Usable, but not the provider's final answer channel: returned, never cached.
            return ChatResult(reasoning, finish, pt, ct), False
        return Verdict(Kind.RETRY, f"empty reply (content null, finish_reason={finish})")

    def _entry(self, r: ChatResult) -> dict[str, Any]:
        return {
            "content": r.content,
            "finish_reason": r.finish_reason,
            "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.completion_tokens,
            "model": self.profile.model,
            "stored_at": time.time(),
        }

    def _took(self, t0: float) -> None:
        self.stats.latencies.append(time.perf_counter() - t0)

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
