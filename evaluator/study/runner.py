"""Pipeline stage: every (model, run, query) of the prepared study through each architecture, concurrently.

Takes the `PreparedStudy` (its retrieval and run sections inside) and the chat clients, returns typed `Record`s; it
writes nothing and knows nothing of the command line. The chat client of each model and the stub
search are passed in through small protocols, so tests and benchmarks can hand in their own.

Each architecture (`study.archs`: rtp, ptr, hyde, rewrite, fusion, route, a plugin) retrieves its list for a
query through a `Context`; the runner then makes the one planner call with its top k and writes its block
into `Record.archs`. Per (model, run, query) every architecture's outcome is computed once, whoever asks
(fusion and route reuse RtP's and PtR's), each in its own task.

The seam is checked per query: what `retrieve` returns (`archs.check_discovery`), what it hands `ctx.search` and
`ctx.chat`, its own time (wall time outside the model calls, searches and outcomes it waits on: `[run]
arch_timeout_s`) and the outcomes it waits on (a wait that would close a cycle is refused, never awaited). An
architecture that raises, breaks the contract, runs out of time or closes a cycle fails that query's block only
(`ArchBlock.failure`, kinds `results.schema.FAILURE_KINDS`): no planner call, not scored, counted; the study goes
on (`fail_fast`: the first stops it). What the engine or the search raise (a bad key, a spent budget, a full
disk) still stops the study, whichever architecture's call met it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import copy
import functools
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from evaluator.core.aio import cancel_all, gather_all
from evaluator.core.errors import EvaluatorError
from evaluator.core.paths import resolve_path
from evaluator.core.redact import redact
from evaluator.data import Query, Registry
from evaluator.llm import ChatResult
from evaluator.results.schema import ArchBlock, BlockFailure, PlanBlock, PtrBlock, Record, Tokens, round6
from evaluator.retrieval import ranking
from evaluator.retrieval.ranking import Retrieved
from evaluator.retrieval.retrievers import Retriever
from evaluator.settings.sections import RETRIEVER_CHOICES
from evaluator.study import archs, prompts
from evaluator.study.archs import ArchError, ArchFailure, Architecture, Context, Discovery, Hits, Searched
from evaluator.study.parse import Plan, parse_plan
from evaluator.study.prepare import PreparedStudy, build_retriever

T = TypeVar("T")
# The architecture whose task makes a call (the dry run counts calls per architecture by it).
ARCH_OF_CALL: contextvars.ContextVar[str] = contextvars.ContextVar("arch_of_call", default="")
# A collect pass's hook: (model, run, query index, architecture) whose planner waits on a deferred reply.
OnDeferred = Callable[[str, int, int, str], None]

_LINGER_S = 0.02


class ChatClient(Protocol):
    """What the pipeline needs of a model: `LLMEngine` is one."""

    async def chat(self, messages: list[dict], *, run: int, prompt_version: str,
                   schema: dict | None = None) -> ChatResult: ...


class StubSearch(Protocol):
    """Embeds and searches one query's stub texts (with the study's retriever, or another by name);
    `serve` runs for the pipeline's lifetime."""

    async def retrieve(self, texts: list[str], retriever: str | None = None) -> Retrieved: ...

    async def serve(self) -> None: ...


class Sink(Protocol):
    """Where the runner puts each finished record: a list, or `results.stream.RecordSpill` (to disk past a limit)."""

    def append(self, rec: Record, /) -> None: ...


# Queries in flight at once: far above what the engines let through (a profile's concurrency, 16 by default, 128
# at most among the shipped profiles; a query holds one or two calls at a time), and wide enough for the stub
# batcher's batches. Each query in flight holds its prompts and replies (what a window of them holds:
# bench/README.md, "study/runner.py").
WINDOW = 1024


class Ticker(Protocol):
    """Progress: told once per finished call (or skipped call) of a model."""

    def advance(self, model: str) -> None: ...


class _NoProgress:
    def advance(self, model: str) -> None:
        pass


@dataclass
class Unit:
    """One (model, run): its engine is shared by every run of the model, so one limiter spans them."""

    model: str
    run: int


class StubBatcher:
    """Embeds and searches PtR stubs in micro-batches as discovery replies arrive.

    Waiting for the slowest discovery reply before embedding would leave the planner idle; embedding
    each reply alone would pay one model call and one FAISS call per query. Instead every reply that
    arrives while a batch is being processed joins the next batch (one batch per retriever asked for).
    """

    def __init__(self, study: PreparedStudy) -> None:
        self.study = study
        self.queue: asyncio.Queue[tuple[list[str], str | None, asyncio.Future[Retrieved]]] = asyncio.Queue()
        self.batches = 0
        # The study's retriever and any other an architecture asks for by name (`Context.search(..., retriever=)`),
        # each made on its first search and kept. Dense (the default, and a `PreparedStudy` built without one) searches
        # every stub vector once, ever: a rerun's stubs come from the cache folder's `searches/` (the stub search
        # was most of a warm rerun's LLM stage).
        self.retrievers: dict[str, Retriever] = {}
        if study.retriever is not None:
            self.retrievers[study.retriever.name] = study.retriever
            for part in (getattr(study.retriever, "dense", None), getattr(study.retriever, "lexical", None)):
                if part is not None:  # hybrid: its two parts serve a search by name too
                    self.retrievers[part.name] = part

    async def retrieve(self, texts: list[str], retriever: str | None = None) -> Retrieved:
        fut: asyncio.Future[Retrieved] = asyncio.get_running_loop().create_future()
        await self.queue.put((texts, retriever, fut))
        return await fut

    async def serve(self) -> None:
        while True:
            items = [await self.queue.get()]
            # Let replies that arrive together share one embedding call and one batched FAISS search
            # (FAISS's one-query path is far slower per query: bench/README.md, "study/runner.py");
            # negligible next to LLM latency.
            await asyncio.sleep(_LINGER_S)
            while not self.queue.empty():
                items.append(self.queue.get_nowait())
            by_retriever: dict[str, list[tuple[list[str], asyncio.Future[Retrieved]]]] = {}
            for texts, name, fut in items:
                by_retriever.setdefault(name or self.study.retrieval.retriever, []).append((texts, fut))
            for name, group in by_retriever.items():
                try:
                    results = await asyncio.to_thread(self._search, [t for t, _ in group], name)
                except Exception as e:  # a failing batch must not leave its planners waiting forever
                    for _, fut in group:
                        if not fut.done():
                            fut.set_exception(e)
                    continue
                for (_, fut), r in zip(group, results, strict=True):
                    if not fut.done():
                        fut.set_result(r)

    def retriever(self, name: str) -> Retriever:
        """The retriever of that name, made on first use (`study.prepare.build_retriever`) and kept."""
        got = self.retrievers.get(name)
        if got is None:
            got = build_retriever(name, self.study, self.retrievers)
            self.retrievers[name] = got
        return got

    def _search(self, per_query: list[list[str]], name: str) -> list[Retrieved]:
        self.batches += 1
        s = self.study.retrieval
        texts = [t for ts in per_query for t in ts]
        owners = [q for q, ts in enumerate(per_query) for _ in ts]
        # every stub searched by the retriever; merged by the retriever's own score, the best over stubs
        scores, rows = self.retriever(name).search(texts, s.k_max)
        return ranking.ptr_from_hits(scores, rows, owners, len(per_query), s.k_max, sorted(set(s.ks)))


# ---------------------------------------------------------------- record blocks


def base_record(q: Query, model: str | None, run: int, retriever: str = "dense") -> Record:
    return Record(model=model, run=run, subset=q.subset, query_id=q.query_id, query=q.text,
                  gold={g: list(ids) for g, ids in q.gold.items()},
                  retriever=None if retriever == "dense" else retriever, grades=dict(q.grades) or None)


def retrieval_block(r: Retrieved, registry: Registry) -> ArchBlock:
    return ArchBlock(retrieved=[registry.ids[i] for i in r.rows], scores=[round6(s) for s in r.scores])


def plan_block(result: ChatResult | None, plan: Plan | None) -> PlanBlock:
    if result is None or plan is None:
        return PlanBlock(llm_error=result.error if result else None,
                         finish_reason=result.finish_reason if result else None,
                         llm_error_kind=result.error_kind if result else None,
                         cut=_cut(result))
    return PlanBlock(steps=plan.steps, selected=plan.selected, parse_error=plan.parse_error,
                     finish_reason=result.finish_reason, selected_offered=plan.selected_offered,
                     parse_audit=plan.audit(), cut=_cut(result))


def _cut(result: ChatResult | None) -> str | None:
    """Why the reply ended early (llm.reply.cut_cause); None for a client that does not say (test stand-ins)."""
    return getattr(result, "cut", None)


def _tokens(result: ChatResult | None) -> Tokens:
    return Tokens(result.prompt_tokens, result.completion_tokens) if result else Tokens()


def retrieval_only_records(study: PreparedStudy, sink: Sink | None = None) -> Sink:
    out: Sink = [] if sink is None else sink
    for q, r in zip(study.queries, study.rtp, strict=True):
        rec = base_record(q, None, 0, study.retrieval.retriever)
        rec.rtp = retrieval_block(r, study.registry)
        out.append(rec)
    return out


def route_tau(study: PreparedStudy) -> float:
    """route's τ: the setting, else the median of RtP's top-1 scores over the study's queries (archs.route)."""
    tau = study.run.route_tau
    return float(tau) if tau is not None else archs.default_tau([r.scores[0] for r in study.rtp if r.scores])


def study_archs(study: PreparedStudy) -> dict[str, tuple[str, Architecture]]:
    """The run's architectures by name, in `--archs` order, made with the study's τ: from its lineup (`--archs`
    resolved once, before any work), else resolved from its run section (a study prepared by hand)."""
    lineup = study.lineup or archs.resolve(study.run.archs, resolve_path)
    return lineup.make(route_tau(study))


# ---------------------------------------------------------------- the runner


class _Query:
    """One (model, run, query): each architecture's outcome and planned block, computed once whoever asks.

    An architecture's planned block runs in a task of its own started from the query's context (a collect
    pass's per-branch state never leaks across), and computes its own outcome in that task; an outcome asked
    for by another architecture first (fusion's PtR when ptr is not run) gets a task of its own. Two tasks per
    query for RtP + PtR, as before architectures were units (a task per outcome too costs the runner more:
    bench/README.md, "study/runner.py")."""

    def __init__(self, unit: Unit, qi: int) -> None:
        self.unit, self.qi = unit, qi
        self.base = contextvars.copy_context()
        self.done: dict[tuple[str, str], asyncio.Future[Any]] = {}
        self.tasks: list[asyncio.Task[Any]] = []
        # Who waits on whom now: (kind, name) -> the (kind, name)s it awaits (an outcome on the outcomes it asked
        # for, a router's planned block on its side's); a wait that would close a circle is refused (`wait`).
        self.waiting: dict[tuple[str, str], Counter[tuple[str, str]]] = {}
        self.deferred: set[str] = set()  # architectures whose outcome rests on a deferred call (a collect pass)

    def _path(self, start: tuple[str, str], goal: tuple[str, str]) -> list[tuple[str, str]] | None:
        """A chain of waits from `start` to `goal`, if any."""
        paths = [[start]]
        seen = {start}
        while paths:
            path = paths.pop()
            if path[-1] == goal:
                return path
            for nxt in self.waiting.get(path[-1], ()):
                if nxt not in seen:
                    seen.add(nxt)
                    paths.append([*path, nxt])
        return None

    def cycle(self, waiter: tuple[str, str], awaited: tuple[str, str]) -> ArchFailure | None:
        """The `cycle` failure of `waiter` waiting on `awaited` when `awaited` waits, through others, on `waiter`
        (that wait would never end), else None."""
        path = self._path(awaited, waiter)
        if path is None:
            return None
        return ArchFailure("cycle", f"waits on its own outcome: {' -> '.join(n for _, n in [waiter, *path])}")

    async def wait(self, waiter: tuple[str, str], awaited: tuple[str, str], aw: Awaitable[T]) -> T:
        """`await aw` (the outcome or planned block `awaited`) on behalf of `waiter`, unless that closes a cycle."""
        failure = self.cycle(waiter, awaited)
        if failure is not None:
            raise failure
        edges = self.waiting.setdefault(waiter, Counter())
        edges[awaited] += 1
        try:
            return await aw
        finally:
            edges[awaited] -= 1
            if not edges[awaited]:
                del edges[awaited]

    def spawn(self, kind: str, name: str, make: Callable[[], Coroutine[Any, Any, T]]) -> Awaitable[T]:
        """`make()` once, in a task of its own tagged with the architecture's name."""
        got = self.done.get((kind, name))
        if got is None:
            context = self.base.copy()
            context.run(ARCH_OF_CALL.set, name)
            task = asyncio.get_running_loop().create_task(make(), context=context)
            self.done[(kind, name)] = task
            self.tasks.append(task)
            got = task
        return got

    async def inline(self, kind: str, name: str, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """`make()` once, in the calling task (the architecture's own), unless another already started it."""
        got = self.done.get((kind, name))
        if got is not None:
            return await got
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self.done[(kind, name)] = fut
        try:
            value = await make()
        except BaseException as e:
            if isinstance(e, asyncio.CancelledError):
                fut.cancel()
            else:
                fut.set_exception(e)
                fut.exception()  # raised here; whoever else awaits it sees it too
            raise
        fut.set_result(value)
        return value


class _OwnTime:
    """An architecture's own time on one query: the wall time of its `retrieve` outside the seams (model calls,
    searches, other architectures' outcomes, which may wait as long as a provider's limits make them), held to
    `limit`. One timer per `retrieve`, set `limit` seconds on; when it fires it cancels the task only if the
    time outside the seams has reached `limit`, else it is set again for what is left (a built-in spends
    microseconds outside them; a plugin that awaits something else forever times out). Entering and leaving a
    seam only reads the clock."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.loop = asyncio.get_running_loop()
        self.start = self.loop.time()
        self.in_seams = 0.0  # seconds spent with a seam awaited, up to `since`
        self.inside = 0  # seams awaited now (an architecture may await several at once)
        self.since = 0.0  # when the seams now awaited began
        self.task: asyncio.Task[Any] | None = None
        self.cancelling = 0
        self.handle: asyncio.TimerHandle | None = None
        self.expired = False
        self.seam_error: BaseException | None = None  # what a seam raised (the engine's, the search's): not the arch's

    def arm(self) -> None:
        self.task = asyncio.current_task()
        assert self.task is not None
        self.cancelling = self.task.cancelling()
        self.handle = self.loop.call_at(self.start + self.limit, self._check)

    def disarm(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None

    def _check(self) -> None:
        now = self.loop.time()
        own = now - self.start - self.in_seams - (now - self.since if self.inside else 0.0)
        if own < self.limit:
            self.handle = self.loop.call_at(now + self.limit - own, self._check)
            return
        self.handle = None
        self.expired = True
        assert self.task is not None
        self.task.cancel()

    def timed_out(self) -> bool:
        """Whether a CancelledError out of retrieve is this timer's (not a stop of the run's)."""
        return self.expired and self.task is not None and self.task.uncancel() <= self.cancelling

    def enter(self) -> None:
        if not self.inside:
            self.since = self.loop.time()
        self.inside += 1

    def leave(self, error: BaseException | None = None) -> None:
        self.inside -= 1
        if not self.inside:
            self.in_seams += self.loop.time() - self.since
        if error is not None and not isinstance(error, ArchFailure):
            self.seam_error = error  # another architecture's failure, or a cycle, is this one's to handle


class _Names:
    """The architectures a router's `side` may name: this run's, the built-ins asked for, every built-in."""

    def __init__(self, runner: StudyRunner) -> None:
        self.runner = runner

    def __contains__(self, name: object) -> bool:
        r = self.runner
        return name in r.archs or name in r._helpers or name in archs.BUILTIN


def _line(e: BaseException | str, limit: int = 400) -> str:
    """An error as one bounded line, keys redacted (it is saved in the record and printed)."""
    text = " ".join(str(e).split())
    return redact(text if len(text) <= limit else text[: limit - 3] + "...")


class StudyRunner:
    def __init__(self, study: PreparedStudy, clients: Mapping[str, ChatClient], progress: Ticker | None = None,
                 batcher: StubSearch | None = None, on_deferred: OnDeferred | None = None,
                 resolved: Mapping[str, tuple[str, Architecture]] | None = None, sink: Sink | None = None,
                 fail_fast: bool = False) -> None:
        self.study = study
        self.clients = clients
        self.progress = progress or _NoProgress()
        self.batcher = batcher or StubBatcher(study)
        self.display = study.registry.lookup_display()
        self.reg = study.registry
        self.records: Sink = sink if sink is not None else []  # where each finished record goes
        self.on_deferred = on_deferred
        self.archs = dict(resolved) if resolved is not None else study_archs(study)
        self._helpers: dict[str, tuple[str, Architecture]] = {}  # built-ins asked for by another, not in --archs
        self.arch_calls: Counter[tuple[str, str]] = Counter()  # (model, architecture) -> chat calls it made
        self.registry_view = archs.RegistryView(self.reg)
        self._names = _Names(self)
        self.fail_fast = fail_fast  # the first failed block stops the study (ArchError), for plugin authors

    def _arch(self, name: str) -> tuple[str, Architecture]:
        got = self.archs.get(name) or self._helpers.get(name)
        if got is None:
            if name not in archs.BUILTIN:
                raise ArchError(f"an architecture asked for the outcome of {name!r}, which is neither built-in "
                                f"({', '.join(archs.BUILTIN)}) nor in --archs")
            got = self._helpers[name] = (name, archs.builtin(name, route_tau(self.study)))
        return got

    async def _chat(self, model: str, messages: list[dict], run: int, version: str,
                    schema: dict | None = None) -> ChatResult:
        # `schema` (prompts.*_SCHEMA) becomes response_format as the profile's `structured` says.
        self.arch_calls[(model, ARCH_OF_CALL.get())] += 1
        result = await self.clients[model].chat(messages, run=run, prompt_version=version, schema=schema)
        self.progress.advance(model)
        return result

    async def _plan(self, model: str, run: int, query: str, rows: list[int]) -> tuple[ChatResult, Plan | None]:
        apis = [self.reg.apis[i] for i in rows[: self.study.retrieval.k]]
        msgs = prompts.planner_messages(query, [(a.display, a.description) for a in apis])
        result = await self._chat(model, msgs, run, prompts.PLANNER_VERSION, prompts.PLANNER_SCHEMA)
        if result.error is not None:
            return result, None
        plan = parse_plan(result.content, [(a.id, a.display) for a in apis], lambda n: self.display.get(n.casefold()))
        return result, plan

    async def _search(self, texts: list[str], retriever: str | None = None) -> Searched:
        own = retriever is None or retriever == self.study.retrieval.retriever
        r = await (self.batcher.retrieve(texts) if own else self.batcher.retrieve(texts, retriever))
        ids = self.reg.ids
        return Searched(Hits([ids[i] for i in r.rows], list(r.scores)),
                        [Hits([ids[i] for i in rows], list(sc)) for rows, sc in zip(r.stub_rows, r.stub_scores,
                                                                                    strict=True)],
                        dict(r.width))

    def _query_hits(self, qi: int) -> Hits:
        """The raw query's list, as architectures see it: made for each (unit, query), not kept per query
        (bench/README.md, "study/runner.py")."""
        r = self.study.rtp[qi]
        return Hits([self.reg.ids[i] for i in r.rows], list(r.scores))

    def _context(self, state: _Query, name: str, clock: _OwnTime) -> Context:
        """What architecture `name` is given for the query: every seam goes through `clock` (its own time) and
        checks what it is handed."""
        unit, qi, s = state.unit, state.qi, self.study.retrieval
        q = self.study.queries[qi]
        return Context(text=q.text, subset=q.subset, query_id=q.query_id, model=unit.model, run=unit.run, k=s.k,
                       k_max=s.k_max, ks=list(s.ks), fallback_to_query=s.fallback_to_query,
                       query_hits=self._query_hits(qi), registry=self.registry_view, retriever=s.retriever,
                       _search=functools.partial(self._search_seam, clock),
                       _chat=functools.partial(self._chat_seam, state, name, clock),
                       _outcome=functools.partial(self._outcome_seam, state, name, clock))

    async def _search_seam(self, clock: _OwnTime, texts: Sequence[str], retriever: str | None) -> Searched:
        if isinstance(texts, str | bytes) or not isinstance(texts, Sequence) \
                or not all(isinstance(t, str) for t in texts):
            raise ArchFailure("contract", f"ctx.search takes a list of strings, not {archs.shown(texts)}")
        if retriever is not None and retriever not in RETRIEVER_CHOICES:
            raise ArchFailure("contract", f"ctx.search(retriever={retriever!r}): one of {', '.join(RETRIEVER_CHOICES)}")
        clock.enter()
        try:
            found = await self._search(list(texts), retriever)
        except BaseException as e:
            clock.leave(e)
            raise
        clock.leave()
        return found

    async def _chat_seam(self, state: _Query, name: str, clock: _OwnTime, messages: list[dict], version: str,
                         schema: dict | None) -> ChatResult:
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str | list)
                for m in messages):
            raise ArchFailure("contract", "ctx.chat takes a non-empty list of messages, each a dict with a \"role\" "
                                          f"and a \"content\" string, not {archs.shown(messages)}")
        if not isinstance(version, str) or not version:
            raise ArchFailure("contract", f"ctx.chat(prompt_version={version!r}): a non-empty string naming the prompt")
        if schema is not None and not (isinstance(schema, dict) and isinstance(schema.get("name"), str)
                                       and isinstance(schema.get("schema"), dict)):
            raise ArchFailure("contract", "ctx.chat(schema=...): {\"name\": str, \"schema\": a JSON schema dict}, not "
                                          f"{archs.shown(schema)}")
        unit = state.unit
        clock.enter()
        try:
            result = await self._chat(unit.model, messages, unit.run, version, schema)
        except BaseException as e:
            clock.leave(e)
            raise
        clock.leave()
        if result.error_kind == archs.DEFERRED_KIND:
            state.deferred.add(name)
        return result

    async def _outcome_seam(self, state: _Query, name: str, clock: _OwnTime, other: str) -> Discovery:
        """Another architecture's outcome for `name` (`Context.outcome`): shared, in its own task if nobody started
        it; a failure of it is `name`'s to handle (`ArchFailure`), a wait that closes a circle a `cycle`."""
        if not isinstance(other, str) or not (other in self.archs or other in self._helpers
                                              or other in archs.BUILTIN):
            raise ArchFailure("contract", f"asked for the outcome of {other!r}, which is neither built-in "
                                          f"({', '.join(archs.BUILTIN)}) nor in --archs")
        waiter, awaited = ("outcome", name), ("outcome", other)
        cycle = state.cycle(waiter, awaited)
        if cycle is not None:
            raise cycle
        clock.enter()
        try:
            got = await state.wait(waiter, awaited, state.spawn("outcome", other, self._retrieve(state, other)))
        except ArchFailure as f:
            clock.leave()
            raise ArchFailure(f.kind, f"its outcome of {other!r} failed ({f.kind}): {f}") from None
        except BaseException as e:
            clock.leave(e)
            raise
        clock.leave()
        if got.deferred or other in state.deferred:
            state.deferred.add(name)
        return got

    def _retrieve(self, state: _Query, name: str) -> Callable[[], Coroutine[Any, Any, Discovery]]:
        _, arch = self._arch(name)

        async def make() -> Discovery:
            clock = _OwnTime(self.study.run.arch_timeout_s)
            clock.arm()
            try:
                got = await arch.retrieve(self._context(state, name, clock))
            except ArchFailure:
                raise  # a seam's contract, a cycle, or an outcome it waited on and let fail
            except asyncio.CancelledError:
                if not clock.timed_out():
                    raise
                raise ArchFailure("timeout", f"retrieve ran past [run] arch_timeout_s = {clock.limit:g} s of its own "
                                             "time (model calls, searches and outcomes it waits on not counted)"
                                  ) from None
            except Exception as e:
                if e is clock.seam_error or isinstance(e, EvaluatorError):
                    raise  # the engine's or the search's (a bad key, a spent budget, a full disk): the run's
                raise ArchFailure("arch_error", f"retrieve raised {type(e).__name__}: {_line(e)}") from None
            finally:
                clock.disarm()
            return archs.check_discovery(got, self.reg.row, self._names, name)
        return make

    def _planned(self, state: _Query, name: str) -> Awaitable[ArchBlock]:
        return state.spawn("planned", name, lambda: self._plan_outcome(state, name))

    async def _plan_outcome(self, state: _Query, name: str) -> ArchBlock:
        unit, qi = state.unit, state.qi
        try:
            d = await state.inline("outcome", name, self._retrieve(state, name))
            if d.side is not None:  # a router: the side's whole outcome, planner and tokens included
                side = await state.wait(("planned", name), ("planned", d.side), self._planned(state, d.side))
                block = copy.deepcopy(side)
                block.side, block.trace = d.side, d.trace
                return block
        except ArchFailure as f:
            return self._failed(state, name, f)
        block = d.block if d.block is not None else ArchBlock(trace=d.trace)
        if d.block is not None and d.trace is not None:
            block.trace = d.trace
        k_max = self.study.retrieval.k_max
        assert d.scores is not None  # check_discovery fills omitted scores
        if len(set(d.ids)) == len(d.ids):  # the common case (every built-in): no id twice
            kept, scores = d.ids[:k_max], d.scores[:k_max]
        else:  # an id listed twice keeps its first (best-placed) place and score
            first = dict(zip(reversed(d.ids), reversed(d.scores), strict=True))
            kept = list(dict.fromkeys(d.ids))[:k_max]
            scores = [first[i] for i in kept]
        block.retrieved, block.scores = list(kept), [round6(x) for x in scores]
        tokens = {n: _tokens(r) for n, r in {**d.reused, **d.calls}.items()}
        if not isinstance(block, PtrBlock):
            failed = {n: r.error_kind or "error" for n, r in d.calls.items() if r.error is not None}
            block.errors = failed or None
        if d.deferred or name in state.deferred:  # a collect pass: the planner comes once the reply is in
            if self.on_deferred is not None:
                self.on_deferred(unit.model, unit.run, qi, name)
            block.tokens = tokens
            return block
        if not d.plan or block.excluded:
            # Nothing to plan with (no stub), or nothing to judge (an own call failed for good): no planner call;
            # scored as retrieving nothing, or not scored (`ArchBlock.excluded`).
            self.progress.advance(unit.model)
            block.plan, block.tokens = plan_block(None, None), {**tokens, "planner": _tokens(None)}
            return block
        result, plan = await self._plan(unit.model, unit.run, self.study.queries[qi].text,
                                        [self.reg.row[i] for i in kept[: self.study.retrieval.k]])
        block.plan, block.tokens = plan_block(result, plan), {**tokens, "planner": _tokens(result)}
        return block

    def _failed(self, state: _Query, name: str, f: ArchFailure) -> ArchBlock:
        """The block of an architecture that failed on the query: its failure, no list, no planner call."""
        unit = state.unit
        if name in state.deferred and self.on_deferred is not None:
            # a collect pass: it failed on a reply not in yet (a stand-in), not on the study's; plan as deferred
            self.on_deferred(unit.model, unit.run, state.qi, name)
            return ArchBlock()
        why = _line(f)
        if self.fail_fast:
            q = self.study.queries[state.qi]
            raise ArchError(f"--archs {self._arch(name)[0]}: {why} ({f.kind}, model {unit.model} run {unit.run}, "
                            f"{q.subset} query {q.query_id}; --fail-fast stopped the run)")
        self.progress.advance(unit.model)  # the planner call it does not make
        return ArchBlock(failure=BlockFailure(f.kind, why))

    async def _query(self, unit: Unit, qi: int) -> Record:
        state = _Query(unit, qi)
        names = list(self.archs)
        try:
            blocks = await gather_all(*(self._planned(state, n) for n in names))
        except BaseException:
            await cancel_all(state.tasks)  # done ones are left as they are
            raise
        # An outcome asked for and never awaited (a plugin's) must not outlive the query; the common case, all
        # done, awaits nothing more (a gather of done tasks costs a loop turn per query on a warm rerun).
        pending = [t for t in state.tasks if not t.done()]
        if pending:
            await cancel_all(pending)
        for t in state.tasks:  # an outcome nobody awaited: its failure is in no block, the run's error is raised
            e = None if t.cancelled() else t.exception()
            if e is not None and not isinstance(e, ArchFailure):
                raise e
        rec = base_record(self.study.queries[qi], unit.model, unit.run, self.study.retrieval.retriever)
        if "rtp" not in names:  # RtP's retrieval is the study's baseline: every record keeps it
            rec.rtp = retrieval_block(self.study.rtp[qi], self.reg)
        for n, b in zip(names, blocks, strict=True):
            rec.archs[n] = b
        self.records.append(rec)
        return rec

    async def run_one(self, unit: Unit, qi: int) -> Record:
        """One (model, run, query) alone (the plugins' probe)."""
        server = asyncio.create_task(self.batcher.serve())
        try:
            return await self._query(unit, qi)
        finally:
            server.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await server

    async def run(self, units: Sequence[Unit], window: int = WINDOW) -> Sink:
        """Every query of every unit, at most `window` queries in flight (not a task per query of a large study
        at once: bench/README.md, "study/runner.py"), admitted by `Admission`:
        each model keeps its own share of the window busy, so two models' rate limits are spent side by
        side, not one after the other."""
        server = asyncio.create_task(self.batcher.serve())
        admission = Admission(units, len(self.study.queries), window)
        live: set[asyncio.Task[Record]] = set()
        finished: collections.deque[tuple[str, asyncio.Task[Record]]] = collections.deque()
        wake = asyncio.Event()

        def on_done(model: str, task: asyncio.Task[Record]) -> None:
            finished.append((model, task))
            wake.set()

        created = 0
        try:
            while True:
                for unit, qi in admission.admit():
                    task = asyncio.create_task(self._query(unit, qi))
                    task.add_done_callback(functools.partial(on_done, unit.model))
                    live.add(task)
                    created += 1
                    if created % 64 == 0:
                        # Let these start (cache lookups, first requests) before creating more:
                        # thousands of ready tasks would otherwise hold every request back.
                        await asyncio.sleep(0)
                if not live:
                    break
                await wake.wait()
                wake.clear()
                done: list[asyncio.Task[Record]] = []
                while finished:
                    model, task = finished.popleft()
                    live.discard(task)
                    admission.finished(model)
                    done.append(task)
                _raise_first(done)
        except BaseException:
            await cancel_all(list(live))  # also when stopped while tasks were still being created
            raise
        finally:
            server.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await server
        return self.records


class Admission:
    """Which (unit, query) starts next: every model keeps its own share of the window in flight.

    One window over the units in order (model by model) let the first model's queries fill it until they
    were nearly done, so the second model's rate limit sat idle for half the study (bench/README.md,
    "study/runner.py"). Here each model with queries left to start is guaranteed `share` = window // models
    of the window, refilled as its own queries finish, whatever the others do; a share a model no longer fills
    (all its queries started) goes to the models still starting theirs, one query each in turn, but never a
    slot another model is still owed. So the second model's first request goes out with the first model's,
    and a model stalled by its provider never holds back another's.

    Memory bound: at most max(window, models) queries in flight in all (`window` = 1,024 for any study of
    at most 1,024 models; each model at least one), as before the shares. Runs of one model share its engine
    (one limiter), so within a model the queries go run by run, in query order.
    """

    def __init__(self, units: Sequence[Unit], n_queries: int, window: int) -> None:
        by_model: dict[str, list[Unit]] = {}
        for u in units:
            by_model.setdefault(u.model, []).append(u)
        self.window = max(1, window)
        self.share = max(1, self.window // max(1, len(by_model)))
        self._next = {m: ((u, qi) for u in us for qi in range(n_queries)) for m, us in by_model.items()}
        self._left = {m: len(us) * n_queries for m, us in by_model.items()}  # queries not yet started
        self.in_flight = dict.fromkeys(by_model, 0)
        self.total = 0

    def _owed(self) -> int:
        """Slots the models still starting queries are guaranteed and do not hold yet."""
        return sum(max(0, self.share - self.in_flight[m]) for m, left in self._left.items() if left)

    def admit(self) -> Iterator[tuple[Unit, int]]:
        """What may start now: one query per model in turn, each model up to its share, then into what the
        window has left beyond every slot still owed (read again after each start)."""
        while True:
            started = False
            for m, left in self._left.items():
                if not left:
                    continue
                if self.in_flight[m] >= self.share and self.total + self._owed() >= self.window:
                    continue
                self._left[m] -= 1
                self.in_flight[m] += 1
                self.total += 1
                started = True
                yield next(self._next[m])
            if not started:
                return

    def finished(self, model: str) -> None:
        self.in_flight[model] -= 1
        self.total -= 1


def _raise_first(done: Sequence[asyncio.Task]) -> None:
    """The first error of the finished query tasks, every other one retrieved (no "never retrieved" noise)."""
    errors = [e for t in done if not t.cancelled() and (e := t.exception()) is not None]
    if errors:
        raise errors[0]


class _Probe:
    """A chat client that sends nothing: every call comes back failed (the plugins' probe)."""

    async def chat(self, messages: list[dict], *, run: int, prompt_version: str,
                   schema: dict | None = None) -> ChatResult:
        return ChatResult(None, None, error="probe: not sent", error_kind="probe")


async def probe_archs(study: PreparedStudy, lineup: archs.Lineup, batcher: StubSearch | None = None) -> None:
    """Every plugin run once on the first query with a client that sends nothing (its calls fail) and the real
    search: a plugin that fails there (raises, breaks the contract, runs out of time, waits in a cycle) is
    broken on every query, so it is one line (`ArchError`) before any paid work. A plugin that fails only on
    some later query fails that query's block alone, in the study."""
    if all(n in archs.BUILTIN for n in lineup.specs) or not study.queries:
        return
    plugins = {n: a for n, a in lineup.make(route_tau(study)).items() if n not in archs.BUILTIN}  # the probe's own
    runner = StudyRunner(study, {"probe": _Probe()}, batcher=batcher, resolved=plugins)
    rec = await runner.run_one(Unit("probe", 0), 0)
    for name, failure in rec.failed_blocks:
        raise ArchError(f"--archs {plugins[name][0]}: {failure.error} ({failure.kind}, on the probe: query "
                        f"{rec.subset} {rec.query_id}, every model call coming back failed as a call may in a run, "
                        "nothing sent); fix the plugin, or run `python -m evaluator arch check` on it")


def calls_per_unit(study: PreparedStudy, resolved: Mapping[str, tuple[str, Architecture]] | None = None) -> int:
    """LLM calls one (model, run) makes at most: the progress bar's total. Each built-in's own calls counted
    once however many reuse them; route counts its side's; a plugin counts one call before its planner."""
    names = list(resolved) if resolved is not None else list(study.run.archs)
    slots: set[tuple[str, int]] = set()
    own = {"rtp": [], "ptr": ["discovery"], "hyde": ["hyde"], "rewrite": ["rewrite"], "fusion": ["ptr:discovery"]}
    tau = route_tau(study) if "route" in names else 0.0
    for qi, r in enumerate(study.rtp):
        for n in names:
            if n == "route":
                side = archs.route_side(list(r.scores), tau)
                slots.update({(f"{side}:planner", qi), *((("ptr:discovery", qi),) if side == "ptr" else ())})
                continue
            for c in own.get(n, ["own"]):
                slots.add((c if ":" in c else f"{n}:{c}", qi))
            slots.add((f"{n}:planner", qi))
    return len(slots)
