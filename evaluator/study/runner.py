"""Pipeline stage: every (model, run, query) of the prepared study through RtP and PtR, concurrently.

Takes the prepared `Study` (its retrieval and run sections inside) and the chat clients, returns typed `Record`s; it
writes nothing and knows nothing of the command line. The chat client of each model and the stub
search are passed in through small protocols, so tests and benchmarks can hand in their own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from evaluator.core.aio import cancel_all, gather_all
from evaluator.data import Query, Registry
from evaluator.llm import ChatResult
from evaluator.results.schema import ArchBlock, PlanBlock, PtrBlock, Record, Tokens, round6
from evaluator.retrieval import search as retrieve
from evaluator.retrieval.index import searches_folder
from evaluator.retrieval.retrievers import Dense, Retriever
from evaluator.retrieval.search import Retrieved
from evaluator.study import prompts
from evaluator.study.parse import Plan, parse_plan, parse_stubs, stub_text
from evaluator.study.prepare import Study

_LINGER_S = 0.02


class ChatClient(Protocol):
    """What the pipeline needs of a model: `LLMEngine` is one."""

    async def chat(self, messages: list[dict], *, run: int, prompt_version: str,
                   schema: dict | None = None) -> ChatResult: ...


class StubSearch(Protocol):
    """Embeds and searches one query's stub texts; `serve` runs for the pipeline's lifetime."""

    async def retrieve(self, texts: list[str]) -> Retrieved: ...

    async def serve(self) -> None: ...


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


def _ptr_retrieval(block: PtrBlock, r: Retrieved, registry: Registry) -> PtrBlock:
    block.retrieved = [registry.ids[i] for i in r.rows]
    block.scores = [round6(s) for s in r.scores]
    block.stub_hits = [[registry.ids[i] for i in rows] for rows in r.stub_rows]
    block.stub_scores = [[round6(s) for s in sc] for sc in r.stub_scores]
    block.width = dict(r.width)
    return block


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


def retrieval_only_records(study: Study) -> list[Record]:
    out = []
    for q, r in zip(study.queries, study.rtp, strict=True):
        rec = base_record(q, None, 0, study.retrieval.retriever)
        rec.rtp = retrieval_block(r, study.registry)
        out.append(rec)
    return out


# ---------------------------------------------------------------- the runner


class StudyRunner:
    def __init__(self, study: Study, clients: Mapping[str, ChatClient], progress: Ticker | None = None,
                 batcher: StubSearch | None = None) -> None:
        self.study = study
        self.clients = clients
        self.progress = progress or _NoProgress()
        self.batcher = batcher or StubBatcher(study)
        self.display = study.registry.lookup_display()
        self.reg = study.registry
        self.records: list[Record] = []

    async def _chat(self, model: str, messages: list[dict], run: int, version: str,
                    schema: dict | None = None) -> ChatResult:
        # `schema` (prompts.*_SCHEMA) becomes response_format as the profile's `structured` says.
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

    async def _rtp(self, unit: Unit, qi: int) -> ArchBlock:
        q, r = self.study.queries[qi], self.study.rtp[qi]
        result, plan = await self._plan(unit.model, unit.run, q.text, r.rows)
        block = retrieval_block(r, self.reg)
        block.plan, block.tokens = plan_block(result, plan), {"planner": _tokens(result)}
        return block

    async def _ptr(self, unit: Unit, qi: int) -> PtrBlock:
        q = self.study.queries[qi]
        disc = await self._chat(unit.model, prompts.discovery_messages(q.text), unit.run, prompts.DISCOVERY_VERSION,
                                prompts.DISCOVERY_SCHEMA)
        stubs, perr = parse_stubs(disc.content, query=q.text) if disc.error is None else ([], None)
        texts = [stub_text(st) for st in stubs]
        fallback = not texts and self.study.retrieval.fallback_to_query
        if fallback:
            texts = [q.text]
        block = PtrBlock(stubs=list(stubs),
                         discovery_parse_error=perr,
                         discovery_llm_error=disc.error, discovery_finish_reason=disc.finish_reason,
                         discovery_llm_error_kind=disc.error_kind, fallback=fallback, discovery_cut=_cut(disc))
        if not texts:
            # No stub, no retrieval, no planner call: counted in Gen%, scored as retrieving nothing.
            self.progress.advance(unit.model)
            empty = Retrieved([], [], width={k: 0 for k in self.study.retrieval.ks})
            _ptr_retrieval(block, empty, self.reg)
            block.plan, block.tokens = plan_block(None, None), {"discovery": _tokens(disc), "planner": _tokens(None)}
            return block
        r = await self.batcher.retrieve(texts)
        result, plan = await self._plan(unit.model, unit.run, q.text, r.rows)
        _ptr_retrieval(block, r, self.reg)
        block.plan, block.tokens = plan_block(result, plan), {"discovery": _tokens(disc), "planner": _tokens(result)}
        return block

    async def _query(self, unit: Unit, qi: int) -> None:
        archs = self.study.run.archs
        rtp_t = asyncio.ensure_future(self._rtp(unit, qi) if "rtp" in archs else _none())
        ptr_t = asyncio.ensure_future(self._ptr(unit, qi) if "ptr" in archs else _none())
        await gather_all(rtp_t, ptr_t)  # a stop waits for both: each call on the wire keeps its grace
        rtp, ptr = rtp_t.result(), ptr_t.result()
        rec = base_record(self.study.queries[qi], unit.model, unit.run, self.study.retrieval.retriever)
        rec.rtp = rtp if rtp is not None else retrieval_block(self.study.rtp[qi], self.reg)
        rec.ptr = ptr
        self.records.append(rec)

    async def run(self, units: Sequence[Unit]) -> list[Record]:
        server = asyncio.create_task(self.batcher.serve())
        tasks: list[asyncio.Task] = []
        try:
            for u in units:
                for qi in range(len(self.study.queries)):
                    tasks.append(asyncio.create_task(self._query(u, qi)))
                    if len(tasks) % 64 == 0:
                        # Let these start (cache lookups, first requests) before creating more:
                        # thousands of ready tasks would otherwise hold every request back.
                        await asyncio.sleep(0)
            await asyncio.gather(*tasks)
        except BaseException:
            await cancel_all(tasks)  # also when stopped while tasks were still being created
            raise
        finally:
            server.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await server
        return self.records


async def _none() -> None:
    return None


def calls_per_unit(study: Study) -> int:
    """LLM calls one (model, run) makes at most: the progress bar's total."""
    archs = study.run.archs
    return (("rtp" in archs) + 2 * ("ptr" in archs)) * len(study.queries)
