"""`LLMEngine`: the async chat client for one model; it puts the engine's parts together in order.

A call is prepared (`prepare`: its cache key and JSON body), then sent (`send`). Order of a send,
cheapest first: cache lookup (no lock, no await), an identical call already in flight in this
process, then the fresh path, one attempt at a time in named steps:

1. `_attempt`: 429 gate -> concurrency slot -> the call's cross-process claim (claims.py: another process
   already sending it: wait for its reply instead; stored meanwhile: a hit) -> RPM/TPM pacing (pacing.py)
   -> budget -> `_send_once` (one HTTP exchange through the `Transport`, transport.py; returns a typed
   `AttemptOutcome` and gives the limits their signals).
2. `decide` (decide.py, a pure function): outcome + the call's state + profile -> one decision.
3. `Decisions.apply` (carry_out.py): store and return the reply, retry (a 429 closes the model's gate),
   drop fields or send the schema in another form (wire.py), give up on this call, or stop the command.

The transport is aiohttp's unless one is passed (`transport=`, e.g. transport.MockTransport in tests). The URL
is the profile's, or asked of `locate=` at every request (the bundled llama.cpp server, restarted on a free port
after a crash: `llamacpp.llama_server.LlamaHandle.locate`).

A call cancelled while its request is on the wire (Ctrl-C, SIGTERM, a command stopping) gets `grace_s`
to receive its reply and store it, so the rerun does not pay for it again. A reply the cache cannot
store (disk full) is kept in memory and in a spill file the next invocation imports (cache.py); the command stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from evaluator.core.errors import BudgetExhausted, ConfigError, FatalLLMError
from evaluator.core.money import capped_usd
from evaluator.core.redact import mask
from evaluator.core.tokens import prompt_tokens, text_tokens
from evaluator.llm.accounting import ModelStats
from evaluator.llm.budget import context_overflow, worst_case_usd
from evaluator.llm.cache import (
    CacheEntry,
    ResponseCache,
    StoreError,
    body_key,
    call_key,
    invocation_id,
    key_prefix,
    profile_shaped,
    reusable,
)
from evaluator.llm.carry_out import Call, Decisions
from evaluator.llm.claims import CLAIM_LEASE_S, Claims
from evaluator.llm.decide import AttemptOutcome, Reply, Retry, TransportFailure, decide
from evaluator.llm.dialects import dialect
from evaluator.llm.limiters import ConcurrencyLimit, ServerFacts, ask_server_facts
from evaluator.llm.pacing import PacerFactory, Pacing, TokenPacerFactory, local_pacer, local_token_pacer
from evaluator.llm.profiles import ModelProfile, resolve_api_key
from evaluator.llm.reply import CONTEXT, ChatResult, cut_cause, read_reply
from evaluator.llm.retry import CONTEXT_EXCEEDED
from evaluator.llm.tally import Tally
from evaluator.llm.transport import AiohttpTransport, NoReply, Request, Response, Transport
from evaluator.llm.wire import WireShape, is_json_schema

__all__ = ["ChatResult", "LLMEngine", "Prepared", "SpendingCap"]

log = logging.getLogger("evaluator.llm")

# A cancelled call whose request is on the wire gets this long to receive and store its reply (`--stop-grace`):
# under the 10 s a container runtime (docker stop) waits between SIGTERM and SIGKILL; Slurm and Kubernetes
# wait 30 s. Long enough for the 4-8 s a CPU server takes to reply (issue 31).
STOP_GRACE_S = 8.0


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    """The completion limit a request asked for (tells a cut at max_tokens from one by the server)."""
    v = body.get("max_tokens", body.get("max_completion_tokens"))
    return v if isinstance(v, int) and not isinstance(v, bool) else None


class SpendingCap(Protocol):
    """A spending cap across calls (`llm.budget.Budget` is the one in use). The engine reserves an attempt's worst case
    before sending it and settles it with what the reply cost once it is back (0 without a reply)."""

    async def admit(self, usd: float) -> bool:
        """Hold `usd` (waiting for open reservations to settle); False: sending could pass the budget."""
        ...

    def settle(self, reserved_usd: float, spent_usd: float) -> None: ...

    def stop_message(self) -> str:
        """One line for the stop: what was spent, what remains, how to continue."""
        ...


@dataclass(frozen=True)
class Prepared:
    """One request: its cache key and the JSON body the online path sends (no secrets in either).

    `body` leaves out the fields this host had rejected when it was prepared; `logical` is the whole
    request (what the key stands for). A field rejected later is left out at send time.
    """

    key: str
    # Provider request bodies: a deliberate dict[str, Any] (the chat request as the provider takes it,
    # `extra_body` fields included; the engine reads only the fields it shapes).
    body: dict[str, Any]
    logical: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


class LLMEngine:
    """One per model. Use as `async with LLMEngine(profile, cache_root=...) as client: await client.chat(...)`.

    Without `async with`, the engine is usable for what needs no HTTP: `prepare`, `prepare_body`,
    `lookup` and `store_reply` (batch import); call `close_cache()` afterwards. `transport`: how requests
    reach the server (transport.py); by default aiohttp's, made on entry and closed on exit; one passed in
    stays the caller's to close.
    """

    def __init__(
        self,
        profile: ModelProfile,
        *,
        cache_root: Path | str | None = None,
        api_key: str | None = None,
        seed: int | None = None,
        claim_lease_s: float = CLAIM_LEASE_S,
        grace_s: float = STOP_GRACE_S,
        budget: SpendingCap | None = None,
        pacer_factory: PacerFactory = local_pacer,
        token_pacer_factory: TokenPacerFactory = local_token_pacer,
        transport: Transport | None = None,
        locate: Callable[[], str] | None = None,
    ) -> None:
        self.profile = profile
        # Where the server listens now, asked at each request (a bundled server restarted on another port); it
        # raises NoReply while that server is down, so nothing is sent to whatever listens on its old port.
        self._locate = locate
        self._key = api_key if api_key is not None else resolve_api_key(profile)
        self.stats = ModelStats()
        self._cache = ResponseCache(cache_root) if cache_root is not None else None
        # The key's sampling part: these names and values, whatever the profile's layout (a renamed field must
        # not make every cached reply cold: tests/unit/test_profile_sections.py pins the keys).
        sp = profile.sampling
        sampling = {"temperature": sp.temperature, "max_tokens": sp.max_tokens, "extra_body": sp.extra_body}
        if not sp.send_seed:  # the key describes what is sent: no seed (keys of seed-sending profiles unchanged)
            sampling["send_seed"] = False
        self._endpoint = profile.key_endpoint  # an auto-started server's port is not part of the key
        self._prefix = key_prefix(self._endpoint, profile.model, sampling)
        # OpenAI's reasoning models take max_completion_tokens and only their default temperature (none sent).
        payload: dict[str, Any] = {"model": profile.model}
        if not sp.reasoning_params:
            payload["temperature"] = sp.temperature
        if sp.max_tokens is not None:
            payload["max_completion_tokens" if sp.reasoning_params else "max_tokens"] = sp.max_tokens
        payload.update(sp.extra_body)
        self._payload = payload
        self._wire = dialect(profile)  # how the chat body goes on the wire and its reply comes back (dialects.py)
        self._url = self._wire.url(profile.connection.base_url)
        self._headers = self._wire.headers(self._key)
        self._rng = random.Random(seed)
        self._pacing = Pacing(profile, self._rng, pacer_factory, token_pacer_factory)
        self._limit = ConcurrencyLimit(profile.pacing.concurrency, adaptive=profile.pacing.adaptive_concurrency)
        self._inflight: dict[str, asyncio.Future[ChatResult]] = {}
        self._fatal: FatalLLMError | None = None
        self._given = transport  # a transport passed in is the caller's to close
        self._transport: Transport | None = None  # set while open (`async with`)
        self._shape = WireShape(profile.name, self.stats, self._key)
        self._claims = Claims(self._cache, profile.name, claim_lease_s) if self._cache is not None else None
        self._tally = Tally(profile, self.stats, self._limit)
        self._decisions = Decisions(profile, self.stats, self._pacing, self._shape, self._key, self._keep,
                                    self._tally.tell_once)
        self._grace_s = grace_s
        self._budget = budget
        self._unstored: dict[str, tuple[str, CacheEntry]] = {}  # replies the cache could not store
        self._damage_told = False
        self._facts: ServerFacts | None = None  # what the server says of its slots and context (asked once)
        self._probe: asyncio.Future[ServerFacts] | None = None
        self._stale: set[str] = set()  # cached replies cut short that the server could now answer in full

    def __repr__(self) -> str:
        p = self.profile
        return (f"LLMEngine(name={p.name!r}, model={p.model!r}, base_url={p.connection.base_url!r}, "
                f"api_key={mask(self._key)})")

    async def __aenter__(self) -> LLMEngine:
        if not self.profile.connection.base_url:
            raise ConfigError(f"model {self.profile.name!r} has no base_url (start the simulator or pass --base-url)")
        self._transport = self._given or AiohttpTransport(
            limit=self.profile.pacing.concurrency,
            trust_env=not self.profile.loopback,  # honour HTTP(S)_PROXY for real providers, never for local servers
        )
        if self._claims is not None:
            self._claims.start()
        if self.profile.pacing.adaptive_concurrency:
            facts = await self.server_facts()
            if facts.slots is not None and facts.slots < self._limit.maximum:
                self._limit.cap_at(facts.slots)
                log.info("%s: the server has %d parallel slot(s); at most %d requests in flight",
                         self.profile.name, facts.slots, facts.slots)
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._claims is not None:
            await self._claims.stop()
        if self._transport is not None:
            if self._transport is not self._given:
                await self._transport.aclose()
            self._transport = None
        self.close_cache()

    def close_cache(self) -> None:
        if self._cache is not None:
            if self._claims is not None:
                self._claims.release_all()  # cancelled calls: let other processes take them at once
            self._cache.close()
            if self.stats.cache_damaged and not self._damage_told:
                self._damage_told = True
                log.warning(
                    "%s: %d cached replies were damaged (checksum, JSON or fields did not hold); they were "
                    "not used and were requested again", self.profile.name, self.stats.cache_damaged,
                )

    # -- preparing requests ----------------------------------------------------------------------
    def response_format(self, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        """`schema` ({"name", "schema"[, "strict"]}) as the profile's `structured` mode sends it.

        "json_object_schema" is the form llama-cpp-python (and Together, Anyscale) constrain with:
        `{"type": "json_object", "schema": ...}`.
        """
        mode = self.profile.sampling.structured
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
        """The cache key and body of one chat call (run `run` is sent as the seed). A deterministic server at
        temperature 0 (`repeats_runs`) answers every run alike, so every run is keyed and sent as run 0:
        `--runs 4` costs one call per prompt, not four copies of it."""
        rf = self.response_format(schema)
        run = 0 if self.profile.repeats_runs else run
        key = call_key(self._prefix, messages, run, prompt_version, rf)
        body = {**self._payload, "messages": messages, **({"seed": run} if self.profile.sampling.send_seed else {})}
        if rf is not None:
            body["response_format"] = rf
        return Prepared(key, self._shape.wire(body), body)

    def prepare_body(self, body: dict[str, Any]) -> Prepared:
        """An arbitrary OpenAI chat-completions body (request files), keyed on endpoint + body."""
        return Prepared(body_key(self._endpoint, body), self._shape.wire(body), body)

    # -- cache access without HTTP -----------------------------------------------------------------
    def lookup(self, key: str) -> ChatResult | None:
        """The cached reply for `key`, or None (no accounting). A damaged entry is a miss."""
        if self._cache is None:
            return None
        kept = self._unstored.get(key)
        entry = kept[1] if kept is not None else self._cache.get(key)
        if entry is None:
            if self._cache.damaged:
                self.stats.cache_damaged = len(self._cache.damaged)
            return None
        # Entries stored before causes were kept: derived from what they hold and this profile's max_tokens.
        cut = entry.cut if entry.cut is not None else cut_cause(
            entry.finish_reason, entry.completion_tokens, self.profile.sampling.max_tokens,
            max_tokens_known=profile_shaped(key))
        if not reusable(entry, cut, self._facts.n_ctx if self._facts is not None else None):
            self._stale.add(key)
            self.stats.cut_resent = len(self._stale)
            return None
        return ChatResult(
            entry.content, entry.finish_reason, entry.prompt_tokens, entry.completion_tokens, True,
            reasoning_only=entry.reasoning_only, cut=cut,
        )

    async def server_facts(self) -> ServerFacts:
        """The server's slots and context size, asked once (llama.cpp `/props`, `/slots`; `/v1/models`).

        Hosted providers answer 404 to these (nothing is billed); their facts are simply unknown.
        """
        if self._facts is not None:
            return self._facts
        if self._probe is None:  # one probe for all the calls that ask at once
            self._probe = asyncio.ensure_future(self._ask_server())
        facts = await asyncio.shield(self._probe)
        self._facts = facts
        return facts

    async def _ask_server(self) -> ServerFacts:
        if self._transport is None or not self.profile.connection.base_url:
            return ServerFacts()
        try:
            base = self.profile.connection.base_url if self._locate is None else self._locate()
        except NoReply:
            return ServerFacts()  # the server is being restarted: its facts are asked again by nobody, unknown
        return await ask_server_facts(self._transport, base, self._headers)

    def store_reply(self, key: str, response_body: dict[str, Any], request: dict[str, Any] | None = None) -> ChatResult:
        """Parse a chat.completion body (e.g. from a batch output) and cache it as the online path would.

        An unusable body (malformed, empty) comes back with `.error` set and is not stored. Its tokens
        are not added to `stats` (they were billed by the batch API, which accounts for them). A body
        without usage gets the token rule's estimates (the prompt's from `request`, when given).
        """
        read = read_reply(response_body, max_tokens=self.profile.sampling.max_tokens, max_tokens_known=profile_shaped(key))
        if read.error is not None:
            return ChatResult(None, None, error=read.error, error_kind=read.error_kind)
        if read.usage_missing:
            cpt = self.profile.prompt.chars_per_token
            read.completion_tokens = text_tokens(read.content or "", cpt)
            read.prompt_tokens = prompt_tokens(request, cpt) if request else 0
        self._tally.cut(read)
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
        if hit is None and key in self._stale and self._facts is None:
            await self.server_facts()  # a reply cut by the server's context: is the context still the same?
            self._stale.discard(key)
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
        if (too_long := context_overflow(self.profile, prepared.logical or prepared.body)) is not None:
            return self._not_sent(too_long)
        fut: asyncio.Future[ChatResult] = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        try:
            result = await self._fetch(prepared, keep_raw)
        except FatalLLMError as e:
            if self._fatal is None:
                self._fatal = e  # e.g. a claim the cache could not write: every later call stops too
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

    def _not_sent(self, why: str) -> ChatResult:
        """A call whose prompt cannot fit the model's context: a counted failure, no request (one warning)."""
        if not self.stats.failed.get(CONTEXT_EXCEEDED):
            log.warning("%s: %s (further such calls are counted as %s, none is sent)", self.profile.name, why,
                        CONTEXT_EXCEEDED)
        self.stats.fail(CONTEXT_EXCEEDED)
        return ChatResult(None, None, error=why, error_kind=CONTEXT_EXCEEDED)

    async def _fetch(self, prepared: Prepared, keep_raw: bool) -> ChatResult:
        try:
            return await self._attempts(prepared, keep_raw)
        finally:
            if self._claims is not None:
                self._claims.release(prepared.key)  # never raises

    async def _attempts(self, prepared: Prepared, keep_raw: bool) -> ChatResult:
        """Attempt, decide, apply, until a decision ends the call."""
        if self._transport is None:
            raise RuntimeError("LLMEngine used outside `async with`")
        logical = prepared.logical or prepared.body
        # Only a TPM budget needs the estimate: no extra JSON encoding per call otherwise.
        prof = self.profile  # the one token rule (dry run, budget, TPM pacing): core.tokens.prompt_tokens
        est = (prompt_tokens(logical, prof.prompt.chars_per_token) + (prof.sampling.max_tokens or 0)
               if self._pacing.tpm is not None else 0)
        call = Call(prepared.key, logical, keep_raw, est, time.perf_counter())
        while True:
            if self._fatal is not None:
                raise self._fatal
            await self._pacing.gate.wait()
            got = await self._attempt(call)
            if got is None:  # another process holds the call: wait for its reply
                assert self._claims is not None
                shared = await self._claims.wait_for_other(call.key, self.lookup, lambda: self._fatal)
                if shared is not None:
                    self.stats.cache_hits += 1
                    self.stats.shared_elsewhere += 1
                    return shared
                continue  # the other process gave the call up (or died): make it ourselves
            if isinstance(got, ChatResult):
                return got
            decision = decide(got, call.state, self.profile, now=time.time(), jitter=self._rng.random())
            result = await self._decisions.apply(decision, call)
            if result is not None:
                return result

    # -- step 1: claim/lookup, pace, send once -----------------------------------------------------
    async def _attempt(self, call: Call) -> AttemptOutcome | ChatResult | None:
        """One attempt in a concurrency slot: an `AttemptOutcome`, a reply another process stored just
        before we claimed the call, or None when another process holds its claim."""
        hold = 0.0
        epoch = await self._limit.acquire()
        try:
            if self._claims is not None and not self._claims.holds(call.key):
                if not self._claims.take(call.key):
                    return None
                if (hit := self.lookup(call.key)) is not None:  # stored just before we claimed it
                    self.stats.cache_hits += 1
                    self.stats.shared_elsewhere += 1
                    return hit
            await self._pacing.pace(call.est_tokens)
            outcome = await self._send_once(call, epoch)
            if outcome.error is not None and outcome.error.kind == "timeout":
                hold = self.profile.connection.timeout_s  # the server most likely still works on it: keep its slot a while
            return outcome
        finally:
            self._limit.release(hold)
            self.stats.concurrency_limit = self._limit.limit

    async def _send_once(self, call: Call, epoch: int) -> AttemptOutcome:
        wire = self._shape.wire(call.logical)
        body = self._wire.encode(wire)
        reserved = await self._reserve(wire)
        if call.queued:
            call.queued = False
            self.stats.queue_waits.append(time.perf_counter() - call.started)
        self.stats.requests += 1
        self.stats.max_in_flight = max(self.stats.max_in_flight, self._limit.in_use)
        sent = frozenset(wire)
        schema = is_json_schema(wire.get("response_format"))
        t_send = time.perf_counter()
        exchange = asyncio.ensure_future(self._exchange(body))
        try:
            got = await asyncio.shield(exchange)
        except asyncio.CancelledError:
            await self._grace(exchange, call, sent, schema, reserved)
            raise
        latency = time.perf_counter() - t_send
        if isinstance(got, TransportFailure):
            outcome = AttemptOutcome(error=got, latency_s=latency, sent=sent, sent_json_schema=schema)
        else:
            if self.profile.pacing.follow_rate_headers:
                self._pacing.follow(got.headers)
            outcome = AttemptOutcome.http(got.status, got.headers, got.body, latency_s=latency, sent=sent,
                                   sent_json_schema=schema, keep_raw=call.keep_raw, max_tokens=_max_tokens(wire), max_tokens_known=True)
        self._tally.signal(outcome, epoch)
        self._count_reply(outcome, reserved, call)
        return outcome

    async def _exchange(self, body: bytes) -> Response | TransportFailure:
        """One POST of the chat body; the transport's `NoReply` as a `TransportFailure` value; a 200's body as
        chat.completion JSON whatever the wire."""
        assert self._transport is not None
        try:
            url = self._url if self._locate is None else self._wire.url(self._locate())
            got = await self._transport.send(Request("POST", url, body, self._headers, self.profile.connection.timeout_s))
        except NoReply as e:
            return e.error
        return dataclasses.replace(got, body=self._wire.decode(got.body)) if got.status == 200 else got

    async def _grace(self, exchange: asyncio.Future[Response | TransportFailure], call: Call, sent: frozenset[str], schema: bool,
                     reserved: float) -> None:
        """Cancelled with the request on the wire: give its reply `grace_s` to arrive, and store it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._grace_s
        while not exchange.done() and (left := deadline - loop.time()) > 0:
            # A fan-out cancels what is left once more (pipeline's cancel_all): the grace period still
            # holds. A second Ctrl-C cancels the exchange itself (asyncio.run cancels every task), which
            # ends the wait at once.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({exchange}, timeout=left)
        if not exchange.done():
            exchange.cancel()
            self._settle(reserved, None)
            return
        if exchange.cancelled() or exchange.exception() is not None:
            self._settle(reserved, None)
            return
        got = exchange.result()
        if isinstance(got, TransportFailure):
            self._settle(reserved, None)
            return
        outcome = AttemptOutcome.http(got.status, got.headers, got.body, sent=sent, sent_json_schema=schema,
                               max_tokens=_max_tokens(self._shape.wire(call.logical)), max_tokens_known=True)
        self._count_reply(outcome, reserved, call)
        decision = decide(outcome, call.state, self.profile, now=time.time(), jitter=0.0)
        if isinstance(decision, Retry) and decision.cause == "truncated" and outcome.reply is not None:
            decision = Reply(outcome.reply)  # no time for another try: keep the cut reply (marked as cut)
        if isinstance(decision, Reply):
            with contextlib.suppress(FatalLLMError):  # kept in memory and spilled; the stop is under way
                self._store(call.key, decision.result, dropped=self._shape.dropped_from(call.logical))

    def _count_reply(self, o: AttemptOutcome, reserved: float, call: Call) -> None:
        """Tokens of a 200 (estimated where the body has none), and what it cost the budget (tally.py)."""
        self._tally.estimate_usage(o.reply, call.logical)
        self._settle(reserved, o.reply)
        self._tally.tokens(o.reply)

    # -- budget --------------------------------------------------------------------------------------
    async def _reserve(self, wire: dict[str, Any]) -> float:
        """Reserve an attempt's worst case (core/tokens.py's token rule, the whole max_tokens)."""
        if self._budget is None:
            return 0.0
        usd = worst_case_usd(self.profile, wire)
        if not await self._budget.admit(usd):
            self._fatal = BudgetExhausted(self._budget.stop_message())
            raise self._fatal
        return usd

    def _settle(self, reserved: float, reply: ChatResult | None) -> None:
        if self._budget is not None:
            spent = capped_usd(self.profile.prices, reply.prompt_tokens, reply.completion_tokens, cached=reply.cached_tokens,
                               cache_write=reply.cache_write_tokens) if reply is not None else 0.0
            self._budget.settle(reserved, spent)

    # -- step 3 (carry_out.py) keeps a reply through this -------------------------------------------------
    async def _keep(self, call: Call, r: ChatResult) -> None:
        if r.cut == CONTEXT:
            await self.server_facts()  # stored with the context it was cut under
        self._store(call.key, r, dropped=self._shape.dropped_from(call.logical))

    # -- step 4: store -------------------------------------------------------------------------------
    def _store(self, key: str, r: ChatResult, *, dropped: list[str] | tuple[()]) -> None:
        """Commit the reply; on a storage error keep it (memory + spill file) and stop the command."""
        if self._cache is None:
            return
        entry = CacheEntry(
            content=r.content, finish_reason=r.finish_reason, prompt_tokens=max(0, r.prompt_tokens),
            completion_tokens=max(0, r.completion_tokens), model=self.profile.model, stored_at=time.time(),
            reasoning_only=r.reasoning_only, dropped=list(dropped), cut=r.cut, run_id=invocation_id(),
            n_ctx=self._facts.n_ctx if self._facts is not None else None, tokens_estimated=r.usage_missing,
        )
        try:
            self._cache.set(key, entry, tag=self.profile.name)
        except StoreError as e:
            self._unstored[key] = (self.profile.name, entry)
            spilled = self._cache.spill({key: (self.profile.name, entry)})
            if self._fatal is None:
                kept = (f"the reply received is kept in {spilled}, which the next run imports" if spilled is not None
                        else "the reply received could not be written anywhere and will be requested again")
                self._fatal = StoreError(f"{e} ({kept})", full=e.full)
            raise self._fatal from None
