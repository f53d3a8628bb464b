"""The architecture contract: what a discovery architecture is given (`Context`) and returns (`Discovery`).

An architecture turns one query into a ranked list of registry APIs. It gets the query, searches over every
retriever the study can build (the configured one by default; `dense`, `bm25` or `hybrid` by name: texts ->
each text's hits and their max-similarity merge, batched with every other query's searches), the registry
(ids, names, texts), the model's chat client (the one engine: cache, limits, retries, the batch collect pass,
the dry run) and the other architectures' outcomes for the same query (fusion, route: computed once, never
called twice). It returns its list (registry ids, best first, with scores where higher is better), the LLM
calls it made (their tokens go into the record) and a trace the viewer shows. The runner (`study.runner`)
checks what it returned (`study.archs.plugins.check_discovery`), then makes the one planner call with its
top k, as for RtP and PtR, and writes the block into `Record.archs[name]`.

A plugin is any class with a `name` (str, the key of its block) and `async def retrieve(self, ctx: Context)
-> Discovery`, instantiated without arguments (`study.archs.plugins` loads and checks it). What it may not do
on a query (raise, return something else than the contract says, take longer than `[run] arch_timeout_s` of
its own time, wait on its own outcome through another's) fails that query's block only: the block is kept
with its `failure`, left out of every metric and test, and counted (docs/ARCHITECTURES.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

from evaluator.core.errors import EXIT_FAILED_BLOCKS, ConfigError, EvaluatorError
from evaluator.data import Api, Registry, api_id
from evaluator.llm import ChatResult
from evaluator.results.schema import FAILURE_KINDS, ArchBlock

# The error kind of a call a collect pass (batch.collect) recorded instead of sending: an outcome built on
# it is not the study's, so the runner plans nothing on it (the dry run counts the planner that will follow).
DEFERRED_KIND = "deferred"


class ArchError(ConfigError):
    """An architecture (a plugin) that cannot be loaded, or that fails on the probe query or under --fail-fast:
    one line, exit 2."""


class ArchFailure(EvaluatorError):
    """An architecture failed on one query (`kind`: one of `results.schema.FAILURE_KINDS`). Raised to an
    architecture by `Context.outcome` when the one it asked for failed (catch it to go on without), by
    `Context.search` / `Context.chat` when called against the contract (`contract`), and by `Context.outcome`
    when the wait would be a cycle (`cycle`). The runner turns it into the query's failed block: it never ends a
    run (but as an `ArchError` under --fail-fast)."""

    exit_code = EXIT_FAILED_BLOCKS

    def __init__(self, kind: str, message: str) -> None:
        assert kind in FAILURE_KINDS, kind
        super().__init__(message)
        self.kind = kind


@dataclass
class Hits:
    """One searched text's hits (or a merge of several), best first."""

    ids: list[str]
    scores: list[float]


@dataclass
class Searched:
    """The result of `Context.search(texts)`: every text's own top K_MAX, and their union re-ranked by the best
    score any text gives an API (PtR's rule, `retrieval.ranking.ptr_from_hits`), cut to K_MAX."""

    merged: Hits
    per_text: list[Hits]
    width: dict[int, int]  # size of the union of the per-text top-k, per k of the ablation


@dataclass
class Discovery:
    """What an architecture returns for one query.

    `ids`: its ranked list, best first: registry ids (`ctx.registry.ids`; strings `"{tool}::{api}"`), the runner
    keeps the first K_MAX (an id listed twice keeps its first place). `scores`: one finite number per id, higher
    is better, so they do not increase down the list (what TREC tools re-sort by); omitted (None), they are
    1 / rank. An empty list needs `plan=False` (nothing to plan with). `calls`: the
    LLM calls it made itself, by a name of its own ("hyde", "rewrite", ...): their tokens go into the block.
    `reused`: calls of another architecture its list depends on (fusion: PtR's discovery): their tokens count in
    its block too, but they were made once. `trace`: a JSON object the viewer shows (e.g. the query it
    searched), at most `TRACE_MAX_BYTES` as JSON. `block`: a typed block to fill instead of a plain one (PtR,
    hyde: stubs and each stub's hits). `plan`: False when there is nothing to plan with (no stub): no planner
    call, the query retrieves nothing. `side`: a router's (route's): the query takes that other architecture's
    whole outcome, planner included (no call of its own).
    """

    ids: list[str]
    scores: list[float] | None = None
    calls: dict[str, ChatResult] = field(default_factory=dict)
    reused: dict[str, ChatResult] = field(default_factory=dict)
    trace: dict[str, Any] | None = None  # any JSON object of the architecture's (see above)
    block: ArchBlock | None = None
    plan: bool = True
    side: str | None = None

    @property
    def deferred(self) -> bool:
        return any(r.error_kind == DEFERRED_KIND for r in (*self.calls.values(), *self.reused.values()))


# A trace is kept in every record of the architecture (queries.jsonl) and shown by the viewer: bounded.
TRACE_MAX_BYTES = 16_384


class RegistryView(Sequence[Api]):
    """The study's registry as an architecture sees it, read-only and in row order: `ids`, each API (`Api`:
    tool_name, api_name, category, description, parameters, `text` as embedded, `display` as the planner sees
    it), by position or by id (`api(id)`), and `id_of(tool, api)` (the one id rule)."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        self.ids: tuple[str, ...] = tuple(registry.ids)

    def __len__(self) -> int:
        return len(self._registry.apis)

    def __getitem__(self, i: Any) -> Any:
        return self._registry.apis[i]

    def __iter__(self) -> Iterator[Api]:
        return iter(self._registry.apis)

    def __contains__(self, api: object) -> bool:
        return isinstance(api, str) and api in self._registry.row or isinstance(api, Api) and api.id in self._registry.row

    def api(self, api: str) -> Api:
        """The API of an id (KeyError when the registry has none)."""
        return self._registry.apis[self._registry.row[api]]

    def texts(self) -> list[str]:
        """Every API's text as the dense retriever embeds it (`Api.text`), in row order."""
        return self._registry.texts()

    @staticmethod
    def id_of(tool_name: str, api_name: str) -> str:
        return api_id(tool_name, api_name)


class Described(NamedTuple):
    """A registry API as `Context.describe` gives it."""

    tool: str
    api: str
    description: str


@dataclass
class Context:
    """What an architecture is given for one (model, run, query). Only the query's text, subset and id: never
    its gold sets."""

    text: str
    subset: str
    query_id: int | str
    model: str
    run: int
    k: int  # the planner's budget
    k_max: int  # the list length kept (the k-ablation's largest k)
    ks: list[int]  # the k-ablation's budgets, as set
    fallback_to_query: bool  # the setting: no text to search -> search the raw query
    query_hits: Hits  # the raw query's own top K_MAX (RtP's list, searched once before the LLM stage)
    registry: RegistryView  # every API of the study: ids, names, descriptions, texts (no file to read)
    retriever: str  # the study's retriever (`--retriever`): what `search` uses unless told another
    _search: Callable[[list[str], str | None], Awaitable[Searched]]
    _chat: Callable[[list[dict], str, dict | None], Awaitable[ChatResult]]
    _outcome: Callable[[str], Awaitable[Discovery]]

    # Plain methods returning the awaitable (no coroutine of their own): one frame less on every resume of a
    # call, which the runner's warm rerun pays per query.
    def search(self, texts: Sequence[str], retriever: str | None = None) -> Awaitable[Searched]:
        """Every text searched (top K_MAX each) and their max-score merge (await it). `retriever`: "dense",
        "bm25" or "hybrid" (`settings.sections.RETRIEVER_CHOICES`; built on first use, cached as the study's own); None: the study's.
        Scores are the retriever's own (cosine, BM25, RRF): higher is better. A BM25 text sharing no token with
        the registry finds nothing."""
        return self._search(texts, retriever)  # type: ignore[arg-type]  # checked at the seam (runner)

    def chat(self, messages: list[dict], *, prompt_version: str, schema: dict | None = None) -> Awaitable[ChatResult]:
        """One call to the model through the engine (await it); `prompt_version` enters the response-cache key
        (change it when the prompt changes); `schema` ({"name", "schema"}: a JSON schema) becomes the request's
        `response_format` as the model's profile says (`structured`). A call that failed for good comes back
        with `error` set, never raised."""
        return self._chat(messages, prompt_version, schema)

    def outcome(self, arch: str) -> Awaitable[Discovery]:
        """Another architecture's outcome for the same query (a built-in or one of this run's; await it):
        computed once per query whoever asks, so a reused LLM call is never made twice. Raises `ArchFailure`
        when that architecture failed on the query, or when waiting for it would wait for this one (a cycle)."""
        return self._outcome(arch)

    def describe(self, api_id: str) -> Described:
        """(tool name, API name, description) of a registry API."""
        a = self.registry.api(api_id)
        return Described(a.tool_name, a.api_name, a.description or "")


@runtime_checkable
class Architecture(Protocol):
    """The contract every architecture (built-in or plugin) meets: a `name`, and `retrieve` returning a
    `Discovery` whose `ids` are registry ids, best first, with `scores` where higher is better (finite, not
    increasing down the list; omitted: 1 / rank) and a JSON `trace` of at most `TRACE_MAX_BYTES`."""

    name: str

    async def retrieve(self, ctx: Context) -> Discovery: ...
