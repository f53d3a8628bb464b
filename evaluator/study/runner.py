"""Pipeline stage: every (model, run, query) of the prepared study through each architecture, concurrently.

Takes the prepared `Study` (its retrieval and run sections inside) and the chat clients, returns typed `Record`s; it
writes nothing and knows nothing of the command line. The chat client of each model and the stub
search are passed in through small protocols, so tests and benchmarks can hand in their own.

Each architecture (`study.archs`: rtp, ptr, hyde, rewrite, fusion, route, a plugin) retrieves its list for a
query through a `Context`; the runner then makes the one planner call with its top k and writes its block
into `Record.archs`. Per (model, run, query) every architecture's outcome is computed once, whoever asks
(fusion and route reuse RtP's and PtR's), each in its own task.
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
from evaluator.data import Query, Registry
from evaluator.llm import ChatResult
from evaluator.results.schema import ArchBlock, PlanBlock, PtrBlock, Record, Tokens, round6
from evaluator.retrieval import search as retrieve
from evaluator.retrieval.index import searches_folder
from evaluator.retrieval.retrievers import Dense, Retriever
from evaluator.retrieval.search import Retrieved
from evaluator.settings.paths import resolve_path
from evaluator.study import archs as arch_units
from evaluator.study import prompts
from evaluator.study.archs import ArchError, Architecture, Context, Discovery, Hits, Searched
from evaluator.study.parse import Plan, parse_plan
from evaluator.study.prepare import Study

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
    """Embeds and searches one query's stub texts; `serve` runs for the pipeline's lifetime."""

    async def retrieve(self, texts: list[str]) -> Retrieved: ...

    async def serve(self) -> None: ...


class Sink(Protocol):
    """Where the runner puts each finished record: a list, or `results.stream.RecordSpill` (to disk past a limit)."""

    def append(self, rec: Record, /) -> None: ...


# Queries in flight at once: far above what the engines let through (a profile's concurrency, 16 by default, 128
# at most among the shipped profiles; a query holds one or two calls at a time), and wide enough for the stub
# batcher's batches. Each query in flight holds its prompts and replies: 4,096 of them were ~0.25 GiB of a cold
# 10,000-query study (bench/scale.py).
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
    arrives while a batch is being processed joins the next batch.
    """

    def __init__(self, study: Study) -> None:
        self.study = study
        self.queue: asyncio.Queue[tuple[list[str], asyncio.Future[Retrieved]]] = asyncio.Queue()
        self.batches = 0
        # The study's retriever. Dense (the default, and a `Study` built without one) searches every stub
        # vector once, ever: a rerun's stubs come from the cache folder's `searches/` (the stub search was
        # most of a warm rerun's LLM stage).
        self.retriever: Retriever | None = study.retriever  # made on the first search when None

    async def retrieve(self, texts: list[str]) -> Retrieved:
        fut: asyncio.Future[Retrieved] = asyncio.get_running_loop().create_future()
        await self.queue.put((texts, fut))
        return await fut

    async def serve(self) -> None:
        while True:
            items = [await self.queue.get()]
            # Let replies that arrive together share one embedding call and one batched FAISS search
            # (FAISS's one-query path costs ~10x more per query); negligible next to LLM latency.
            await asyncio.sleep(_LINGER_S)
            while not self.queue.empty():
                items.append(self.queue.get_nowait())
            try:
                results = await asyncio.to_thread(self._search, [t for t, _ in items])
            except Exception as e:  # a failing batch must not leave its planners waiting forever
                for _, fut in items:
                    if not fut.done():
                        fut.set_exception(e)
                continue
            for (_, fut), r in zip(items, results, strict=True):
                if not fut.done():
                    fut.set_result(r)

    def _search(self, per_query: list[list[str]]) -> list[Retrieved]:
        self.batches += 1
        s = self.study.retrieval
        texts = [t for ts in per_query for t in ts]
        owners = [q for q, ts in enumerate(per_query) for _ in ts]
        # every stub searched by the retriever; merged by the retriever's own score, the best over stubs
        if self.retriever is None:
            self.retriever = Dense(self.study.embedder, self.study.index, searches_folder(self.study.embedder.cache_dir))
        scores, rows = self.retriever.search(texts, s.k_max)
        return retrieve.ptr_from_hits(scores, rows, owners, len(per_query), s.k_max, sorted(set(s.ks)))


# ---------------------------------------------------------------- record blocks


def base_record(q: Query, model: str | None, run: int, retriever: str = "dense") -> Record:
    return Record(model=model, run=run, subset=q.subset, query_id=q.query_id, query=q.text,
                  gold={g: list(ids) for g, ids in q.gold.items()},
                  retriever=None if retriever == "dense" else retriever)


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


def retrieval_only_records(study: Study, sink: Sink | None = None) -> Sink:
    out: Sink = [] if sink is None else sink
    for q, r in zip(study.queries, study.rtp, strict=True):
        rec = base_record(q, None, 0, study.retrieval.retriever)
        rec.rtp = retrieval_block(r, study.registry)
        out.append(rec)
    return out


def route_tau(study: Study) -> float:
    """route's τ: the setting, else the median of RtP's top-1 scores over the study's queries (archs.route)."""
    tau = study.run.route_tau
    return float(tau) if tau is not None else arch_units.default_tau([r.scores[0] for r in study.rtp if r.scores])


def study_archs(study: Study) -> dict[str, tuple[str, Architecture]]:
    """The run's architectures by name, in `--archs` order (plugins loaded and checked: `study.archs.plugins`)."""
    return arch_units.resolve(study.run.archs, route_tau(study), resolve_path)


# ---------------------------------------------------------------- the runner


class _Query:
    """One (model, run, query): each architecture's outcome and planned block, computed once whoever asks.

    An architecture's planned block runs in a task of its own started from the query's context (a collect
    pass's per-branch state never leaks across), and computes its own outcome in that task; an outcome asked
    for by another architecture first (fusion's PtR when ptr is not run) gets a task of its own. Two tasks per
    query for RtP + PtR, as before architectures were units (a task per outcome too made the runner's own
    cost 1.5x on a warm rerun)."""

    def __init__(self, unit: Unit, qi: int) -> None:
        self.unit, self.qi = unit, qi
        self.base = contextvars.copy_context()
        self.done: dict[tuple[str, str], asyncio.Future[Any]] = {}
        self.tasks: list[asyncio.Task[Any]] = []

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


class StudyRunner:
    def __init__(self, study: Study, clients: Mapping[str, ChatClient], progress: Ticker | None = None,
                 batcher: StubSearch | None = None, on_deferred: OnDeferred | None = None,
                 archs: Mapping[str, tuple[str, Architecture]] | None = None, sink: Sink | None = None) -> None:
        self.study = study
        self.clients = clients
        self.progress = progress or _NoProgress()
        self.batcher = batcher or StubBatcher(study)
        self.display = study.registry.lookup_display()
        self.reg = study.registry
        self.records: Sink = sink if sink is not None else []  # where each finished record goes
        self.on_deferred = on_deferred
        self.archs = dict(archs) if archs is not None else study_archs(study)
        self._helpers: dict[str, tuple[str, Architecture]] = {}  # built-ins asked for by another, not in --archs
        self.arch_calls: Counter[tuple[str, str]] = Counter()  # (model, architecture) -> chat calls it made

    def _arch(self, name: str) -> tuple[str, Architecture]:
        got = self.archs.get(name) or self._helpers.get(name)
        if got is None:
            if name not in arch_units.BUILTIN:
                raise ArchError(f"an architecture asked for the outcome of {name!r}, which is neither built-in "
                                f"({', '.join(arch_units.BUILTIN)}) nor in --archs")
            got = self._helpers[name] = (name, arch_units.builtin(name, route_tau(self.study)))
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
        msgs = prompts.planner_messages(query, [(a.tool_name, a.api_name, a.description) for a in apis])
        result = await self._chat(model, msgs, run, prompts.PLANNER_VERSION, prompts.PLANNER_SCHEMA)
        if result.error is not None:
            return result, None
        plan = parse_plan(result.content, [(a.id, a.display) for a in apis], lambda n: self.display.get(n.casefold()))
        return result, plan

    async def _search(self, texts: list[str]) -> Searched:
        r = await self.batcher.retrieve(texts)
        ids = self.reg.ids
        return Searched(Hits([ids[i] for i in r.rows], list(r.scores)),
                        [Hits([ids[i] for i in rows], list(sc)) for rows, sc in zip(r.stub_rows, r.stub_scores,
                                                                                    strict=True)],
                        dict(r.width))

    def _query_hits(self, qi: int) -> Hits:
        """The raw query's list, as architectures see it: made for each (unit, query), not kept (kept per query,
        these lists were ~1 KiB of the memory per query of a study)."""
        r = self.study.rtp[qi]
        return Hits([self.reg.ids[i] for i in r.rows], list(r.scores))

    def _describe(self, api_id: str) -> tuple[str, str, str]:
        a = self.reg.apis[self.reg.row[api_id]]
        return a.tool_name, a.api_name, a.description or ""

    def _context(self, state: _Query) -> Context:
        unit, qi, s = state.unit, state.qi, self.study.retrieval
        q = self.study.queries[qi]
        return Context(text=q.text, subset=q.subset, query_id=q.query_id, model=unit.model, run=unit.run, k=s.k,
                       k_max=s.k_max, ks=list(s.ks), fallback_to_query=s.fallback_to_query,
                       query_hits=self._query_hits(qi), _search=self._search,
                       _chat=functools.partial(self._chat_of, unit.model, unit.run),
                       _outcome=functools.partial(self._outcome, state), _describe=self._describe)

    def _chat_of(self, model: str, run: int, messages: list[dict], version: str,
                 schema: dict | None) -> Awaitable[ChatResult]:
        return self._chat(model, messages, run, version, schema)

    def _retrieve(self, state: _Query, name: str) -> Callable[[], Coroutine[Any, Any, Discovery]]:
        spec, arch = self._arch(name)

        async def make() -> Discovery:
            try:
                got = await arch.retrieve(self._context(state))
            except (ArchError, asyncio.CancelledError):
                raise
            except Exception as e:
                if name in arch_units.BUILTIN:
                    raise
                raise ArchError(f"--archs {spec}: retrieve raised {type(e).__name__}: {e}") from None
            return arch_units.check_discovery(got, spec)
        return make

    def _outcome(self, state: _Query, name: str) -> Awaitable[Discovery]:
        """Another architecture's outcome (`Context.outcome`): shared, in its own task if nobody started it."""
        return state.spawn("outcome", name, self._retrieve(state, name))

    def _planned(self, state: _Query, name: str) -> Awaitable[ArchBlock]:
        return state.spawn("planned", name, lambda: self._plan_outcome(state, name))

    async def _plan_outcome(self, state: _Query, name: str) -> ArchBlock:
        unit, qi = state.unit, state.qi
        d = await state.inline("outcome", name, self._retrieve(state, name))
        if d.side is not None:  # route: the side's whole outcome, planner and tokens included
            block = copy.deepcopy(await self._planned(state, d.side))
            block.side, block.trace = d.side, d.trace
            return block
        spec, _ = self._arch(name)
        block = d.block if d.block is not None else ArchBlock(trace=d.trace)
        if d.block is not None and d.trace is not None:
            block.trace = d.trace
        k_max = self.study.retrieval.k_max
        if len(set(d.ids)) == len(d.ids):  # the common case (every built-in): no id twice
            kept, scores = d.ids[:k_max], d.scores[:k_max]
        else:  # an id listed twice keeps its first (best-placed) place and score
            first = dict(zip(reversed(d.ids), reversed(d.scores), strict=True))
            kept = list(dict.fromkeys(d.ids))[:k_max]
            scores = [first[i] for i in kept]
        if name not in arch_units.BUILTIN:  # a built-in lists registry ids by construction
            unknown = [i for i in kept if i not in self.reg.row]
            if unknown:
                raise ArchError(f"--archs {spec}: retrieve returned ids that are not in the registry, e.g. "
                                f"{unknown[0]!r}")
        block.retrieved, block.scores = list(kept), [round6(x) for x in scores]
        tokens = {n: _tokens(r) for n, r in {**d.reused, **d.calls}.items()}
        if not isinstance(block, PtrBlock):
            failed = {n: r.error_kind or "error" for n, r in d.calls.items() if r.error is not None}
            block.errors = failed or None
        if d.deferred:  # a collect pass: the planner comes once the reply is in
            if self.on_deferred is not None:
                self.on_deferred(unit.model, unit.run, qi, name)
            block.tokens = tokens
            return block
        if not d.plan:
            # Nothing to plan with (no stub): no planner call, scored as retrieving nothing.
            self.progress.advance(unit.model)
            block.plan, block.tokens = plan_block(None, None), {**tokens, "planner": _tokens(None)}
            return block
        result, plan = await self._plan(unit.model, unit.run, self.study.queries[qi].text,
                                        [self.reg.row[i] for i in kept[: self.study.retrieval.k]])
        block.plan, block.tokens = plan_block(result, plan), {**tokens, "planner": _tokens(result)}
        return block

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
        """Every query of every unit, at most `window` queries in flight (a task per query of a 100,000-query
        study at once held ~25 KiB each until the last finished, bench/scale.py), admitted by `Admission`:
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
    were nearly done, so the second model's rate limit sat idle for half the study (bench/fanout: 1.42x
    the floor). Here each model with queries left to start is guaranteed `share` = window // models of the
    window, refilled as its own queries finish, whatever the others do; a share a model no longer fills
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


async def probe_archs(study: Study, archs: Mapping[str, tuple[str, Architecture]],
                      batcher: StubSearch | None = None) -> None:
    """Every plugin run once on the first query with a client that sends nothing (its calls fail) and the real
    search: a plugin that raises or returns something else than a `Discovery` is one line before any paid work."""
    plugins = {n: a for n, a in archs.items() if n not in arch_units.BUILTIN}
    if not plugins or not study.queries:
        return
    runner = StudyRunner(study, {"probe": _Probe()}, batcher=batcher, archs=plugins)
    await runner.run_one(Unit("probe", 0), 0)


def calls_per_unit(study: Study, archs: Mapping[str, tuple[str, Architecture]] | None = None) -> int:
    """LLM calls one (model, run) makes at most: the progress bar's total. Each built-in's own calls counted
    once however many reuse them; route counts its side's; a plugin counts one call before its planner."""
    names = list(archs) if archs is not None else list(study.run.archs)
    slots: set[tuple[str, int]] = set()
    own = {"rtp": [], "ptr": ["discovery"], "hyde": ["hyde"], "rewrite": ["rewrite"], "fusion": ["ptr:discovery"]}
    tau = route_tau(study) if "route" in names else 0.0
    for qi, r in enumerate(study.rtp):
        for n in names:
            if n == "route":
                side = arch_units.route_side(list(r.scores), tau)
                slots.update({(f"{side}:planner", qi), *((("ptr:discovery", qi),) if side == "ptr" else ())})
                continue
            for c in own.get(n, ["own"]):
                slots.add((c if ":" in c else f"{n}:{c}", qi))
            slots.add((f"{n}:planner", qi))
    return len(slots)
