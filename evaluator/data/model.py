"""The data model every reader produces: APIs, the registry, queries, warnings, and `DataError`."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

GOLD_SETS: tuple[str, ...] = ("api_list", "relevant")  # a query's gold sets, in the order tables show them
REGISTRY_CHOICES = ("full", "described")

T = TypeVar("T")


def match_subsets(items: Sequence[T], wanted: Iterable[str], missing: Callable[[str], Exception],
                  name: Callable[[T], str] = str) -> list[T]:
    """The one rule for a subset named on the command line or in the config: each of `wanted` picks the
    items `name`d exactly so, else every item whose name starts with it (`G1` matches `G1_instruction`);
    the picks in `wanted`'s order, each once. A name that picks nothing raises `missing(name)`."""
    out: list[T] = []
    for w in wanted:
        hit = [x for x in items if name(x) == w] or [x for x in items if name(x).startswith(w)]
        if not hit:
            raise missing(w)
        out += [x for x in hit if x not in out]
    return out

# The one rule for the text that is embedded for an API, whatever file it came from (see Api.text); a BEIR
# corpus document's is CORPUS_TEXT_RULE.
EMBED_TEXT_RULE = (
    "Each API is embedded as `{tool}/{api}: {description}` (an API without a description as "
    "`{tool}/{api}: `); when its definition declares parameters (MCP `inputSchema`, OpenAI "
    "`parameters`, or a `parameters` JSON Schema in the JSONL registry) ` Parameters: name (description); "
    "name; ...` follows: the schema's top-level properties in declared order, each with its description "
    "when it has one. ToolBench registries (JSONL and the toolenv tree) carry no parameters, so their "
    "text is `{tool}/{api}: {description}` exactly as in the study. For MCP `{tool}` is the server, "
    "for OpenAI-style lists the `tool` field or the file's name."
)
# The text of a BEIR corpus document (Api.document): beir.retrieval.models.SentenceBERT.encode_corpus joins
# title and text with its default separator " " and strips the result.
CORPUS_TEXT_RULE = (
    "Each corpus document is embedded as BEIR's own dense models embed it: `(title + \" \" + text).strip()` "
    "(a missing title counts as empty), and shown to the planner as `{_id}: {that text}`."
)
CORPUS_SEPARATOR = " "


def corpus_text(title: str, text: str) -> str:
    """A BEIR document's embedded text, as BEIR's dense encoders build it from its title and text."""
    return (title + CORPUS_SEPARATOR + text).strip()


# Planner prompts show at most this much of one API's description (whitespace collapsed, ~4 characters a
# token): one oversized description must not be sent whole in every prompt that retrieves it. The longest
# ToolBench description is 27,348 characters (~6.8k tokens), so ToolBench prompts are never cut.
DESCRIPTION_CAP_TOKENS = 8192
DESCRIPTION_CAP_CHARS = 4 * DESCRIPTION_CAP_TOKENS


def prompt_description(description: str | None) -> tuple[str, bool]:
    """A description as one prompt line: whitespace collapsed, cut at the cap; and whether it was cut."""
    text = " ".join((description or "").split())
    if len(text) <= DESCRIPTION_CAP_CHARS:
        return text, False
    return text[:DESCRIPTION_CAP_CHARS].rstrip() + " [...]", True


# Tool and API names are cut at this many characters where they are read (`bounded_name`), so an id, the
# embedded text, a planner prompt line and every record of queries.jsonl stay bounded: a 10 MB tool name must
# not reach 7 of 12 prompts nor make each record megabytes. ToolBench's longest are 86 (tool) and 190 (API)
# characters; OpenAI caps function names at 64, MCP tool names at 128: 256 cuts no real registry's name.
NAME_CAP_CHARS = 256


def bounded_name(name: str) -> tuple[str, bool]:
    """A tool or API name cut at NAME_CAP_CHARS (and whether it was): the cut name ends in a short digest of
    the whole one, so two long names with one prefix stay two APIs. Gold ids go through the same rule
    (`bounded_id`), so a gold id written with the long name still finds its API."""
    if len(name) <= NAME_CAP_CHARS:
        return name, False
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{name[:NAME_CAP_CHARS - 16]}[...]{digest}", True


def bounded_id(aid: str) -> str:
    """A gold id `tool::api` with each name bounded as the registry's (`bounded_name`)."""
    if len(aid) <= NAME_CAP_CHARS:
        return aid
    tool, sep, api = aid.partition("::")
    return api_id(bounded_name(tool)[0], bounded_name(api)[0]) if sep else bounded_name(aid)[0]


def loose_id(aid: str) -> str:
    """The form under which two ids count as the same API written twice: case folded, runs of whitespace as one
    space, no space around the `::`. Ids stay as written (DESIGN: names raw); this only finds near-duplicates
    in a registry and suggests the right id for a gold id that matches none."""
    tool, sep, api = aid.partition("::")
    return f"{' '.join(tool.split()).casefold()}{sep}{' '.join(api.split()).casefold()}"


# When gold ids match no API of the registry, as read: past this share of a file's gold ids (or of a BEIR
# folder's judgements) the study stops before any paid work. Why a share: a mistake in the id form (`tool/api`,
# `tool.api`, the API name alone, another case), or qrels of another corpus, leaves most ids unmatched; a typo or
# an API renamed since touches a few, and those are counted warnings (on stderr and in the report) that keep the
# run going. ToolBench's own files match every id; BEIR's ArguAna judges 5 documents its corpus lacks.
UNRESOLVED_GOLD_SHARE = 0.5


def api_id(tool_name: str, api_name: str) -> str:
    return f"{tool_name}::{api_name}"


QueryId = int | str  # int when the file's id is integral (ToolBench), else the string (data.queries.normalise_qid)


def qid_key(qid: QueryId) -> tuple[int, int | str]:
    """Sort key for query ids that may be ints or strings (ints first, each in natural order)."""
    return (0, qid) if isinstance(qid, int) else (1, str(qid))


Param = tuple[str, "str | None"]  # (name, description)


def description_or_none(value: str | None) -> str | None:
    """Every reader's rule: a blank description counts as none, so the API embeds as "{tool}/{api}: " (STUDY.md)."""
    return value if value is not None and value.strip() else None


@dataclass(frozen=True)
class Api:
    tool_name: str
    api_name: str
    category: str | None
    description: str | None
    parameters: tuple[Param, ...] = ()
    # A corpus document (a BEIR folder's corpus.jsonl): its text as embedded (`corpus_text`). Then `api_name` is
    # the document's `_id` and its id as the qrels and the TREC files name it, `tool_name` its title, and
    # `description` the embedded text again (what the planner prompt shows).
    document: str | None = None

    # asked ~3x per API on every load: computed once (a cached_property's lock cost more than the join)
    id: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", self.api_name if self.document is not None
                           else api_id(self.tool_name, self.api_name))

    @property
    def display(self) -> str:
        """How the planner prompt names the API (a corpus document: by its id, the one name it has that is
        unique)."""
        return self.api_name if self.document is not None else f"{self.tool_name}/{self.api_name}"

    @property
    def text(self) -> str:
        """The document text that is embedded: EMBED_TEXT_RULE (a corpus document: CORPUS_TEXT_RULE)."""
        if self.document is not None:
            return self.document
        head = f"{self.tool_name}/{self.api_name}: {self.description or ''}"
        if not self.parameters:
            return head  # ToolBench: byte-identical to the study's text, so cached embeddings stay valid
        params = "; ".join(f"{n} ({d})" if d else n for n, d in self.parameters)
        return f"{head.rstrip()} Parameters: {params}"


@dataclass
class Warnings:
    """Counted data problems; each kind keeps a few examples for the report."""

    counts: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, kind: str, example: str) -> None:
        self.counts[kind] += 1
        ex = self.examples.setdefault(kind, [])
        if len(ex) < 5:
            ex.append(example)

    def as_dict(self) -> dict:
        return {k: {"count": n, "examples": self.examples.get(k, [])} for k, n in sorted(self.counts.items())}


@dataclass
class Registry:
    apis: list[Api]
    source: str
    choice: str = "full"
    format: str = "jsonl"  # the reader(s) used: jsonl, toolbench, mcp, openai (joined with + when mixed)
    # Ids read but left out by the registry choice (`described`): a gold id among them is a known API the
    # retriever cannot find, not a gold id written in the wrong form.
    left_out: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        self.ids = [a.id for a in self.apis]
        self.row = {i: n for n, i in enumerate(self.ids)}

    def digest(self) -> str:
        """A digest of the registry's ids in row order (meta.json's `registry.digest`): a folder's records and
        its meta are checked against it (`report`), so another registry's run is never rendered as this one."""
        h = hashlib.sha256()
        for i in self.ids:
            h.update(i.encode("utf-8", "surrogatepass") + b"\n")
        return h.hexdigest()[:16]

    def __len__(self) -> int:
        return len(self.apis)

    def texts(self) -> list[str]:
        return [a.text for a in self.apis]

    def lookup_display(self) -> dict[str, str]:
        """Map of `tool/api` display names (case-folded) to ids, for resolving planner output. A corpus
        document is shown by its id; its title, when no other document or display has it, names it too (a
        planner may answer with the title it read rather than the id)."""
        out = {a.display.casefold(): a.id for a in self.apis}
        titles: dict[str, str | None] = {}
        for a in self.apis:
            if a.document is not None and a.tool_name.strip():
                t = " ".join(a.tool_name.split()).casefold()
                titles[t] = a.id if t not in titles else None  # a title two documents share names neither
        for t, aid in titles.items():
            if aid is not None:
                out.setdefault(t, aid)
        return out


@dataclass(frozen=True)
class Query:
    subset: str
    query_id: QueryId
    text: str
    gold: dict[str, tuple[str, ...]]  # gold set name -> API ids
    # Graded relevance (a BEIR folder's qrels scores): the grade of each gold id, every one > 0. Empty when every
    # gold id has grade 1 (binary gold: every other format, and qrels of 1s), so records stay as before.
    grades: dict[str, int] = field(default_factory=dict)
