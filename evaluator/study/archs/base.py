"""The architecture contract: what a discovery architecture is given (`Context`) and returns (`Discovery`).

An architecture turns one query into a ranked list of registry APIs. It gets the query, a search over the
study's configured retriever (texts -> each text's hits and their max-similarity merge, batched with every
other query's searches), the model's chat client (the one engine: cache, limits, retries, the batch collect
pass, the dry run) and the other architectures' outcomes for the same query (fusion, route: computed once,
never called twice). It returns its list (top K_MAX ids + scores), the LLM calls it made (their tokens go
into the record) and a trace the viewer shows. The runner (`study.runner`) then makes the one planner call
with its top k, as for RtP and PtR, and writes the block into `Record.archs[name]`.

A plugin is any class with a `name` (str, the key of its block) and `async def retrieve(self, ctx: Context)
-> Discovery`, instantiated without arguments (`study.archs.plugins` loads and checks it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from evaluator.core.errors import ConfigError
from evaluator.llm import ChatResult
from evaluator.results.schema import ArchBlock

# The error kind of a call a collect pass (batch.collect) recorded instead of sending: an outcome built on
# it is not the study's, so the runner plans nothing on it (the dry run counts the planner that will follow).
DEFERRED_KIND = "deferred"


class ArchError(ConfigError):
    """An architecture (a plugin) that cannot be loaded or breaks the contract: one line, exit 2."""


@dataclass
class Hits:
    """One searched text's hits (or a merge of several), best first."""

    ids: list[str]
    scores: list[float]


@dataclass
class Searched:
    """The result of `Context.search(texts)`: every text's own top K_MAX, and their union re-ranked by the best
    score any text gives an API (PtR's rule, `retrieval.search.ptr_from_hits`), cut to K_MAX."""

    merged: Hits
    per_text: list[Hits]
    width: dict[int, int]  # size of the union of the per-text top-k, per k of the ablation


@dataclass
class Discovery:
    """What an architecture returns for one query.

    `ids`/`scores`: its ranked list (registry ids, best first; the runner keeps the first K_MAX). `calls`: the
    LLM calls it made itself, by a name of its own ("hyde", "rewrite", ...): their tokens go into the block.
    `reused`: calls of another architecture its list depends on (fusion: PtR's discovery): their tokens count in
    its block too, but they were made once. `trace`: JSON the viewer shows (e.g. the query it searched).
    `block`: a typed block to fill instead of a plain one (PtR, hyde: stubs and each stub's hits).
    `plan`: False when there is nothing to plan with (no stub): no planner call, the query retrieves nothing.
    `side`: route only: the query takes that architecture's whole outcome, planner included (no call of its own).
    """

    ids: list[str]
    scores: list[float]
    calls: dict[str, ChatResult] = field(default_factory=dict)
    reused: dict[str, ChatResult] = field(default_factory=dict)
    trace: dict[str, Any] | None = None
    block: ArchBlock | None = None
    plan: bool = True
    side: str | None = None

    @property
    def deferred(self) -> bool:
        return any(r.error_kind == DEFERRED_KIND for r in (*self.calls.values(), *self.reused.values()))


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
    _search: Callable[[list[str]], Awaitable[Searched]]
    _chat: Callable[[list[dict], str, dict | None], Awaitable[ChatResult]]
    _outcome: Callable[[str], Awaitable[Discovery]]
    _describe: Callable[[str], tuple[str, str, str]]

    # Plain methods returning the awaitable (no coroutine of their own): one frame less on every resume of a
    # call, which the runner's warm rerun pays per query.
    def search(self, texts: list[str]) -> Awaitable[Searched]:
        """Every text searched by the study's retriever (top K_MAX each) and their max-score merge (await it)."""
        return self._search(list(texts))

    def chat(self, messages: list[dict], *, prompt_version: str, schema: dict | None = None) -> Awaitable[ChatResult]:
        """One call to the model through the engine (await it); `prompt_version` enters the response-cache key
        (change it when the prompt changes). A call that failed for good comes back with `error` set, never
        raised."""
        return self._chat(messages, prompt_version, schema)

    def outcome(self, arch: str) -> Awaitable[Discovery]:
        """Another architecture's outcome for the same query (a built-in or one of this run's; await it):
        computed once per query whoever asks, so a reused LLM call is never made twice."""
        return self._outcome(arch)

    def describe(self, api_id: str) -> tuple[str, str, str]:
        """(tool name, API name, description) of a registry API."""
        return self._describe(api_id)


@runtime_checkable
class Architecture(Protocol):
    """The contract every architecture (built-in or plugin) meets."""

    name: str

    async def retrieve(self, ctx: Context) -> Discovery: ...
