"""The output folder's contracts: typed `Record` (one line of `queries.jsonl`) and `Meta` (`meta.json`),
the folder's file names and `FORMAT_VERSION`, the one JSON writer (`dumps`), and the one reader and
writer of an output folder (every write atomic, `core.files.atomic_write`).

The types are pydantic dataclasses: their fields are the JSON shape (docs/DESIGN.md), read and written by
pydantic; every older saved file is read through its step in `migrate`. Facts derived from a record
("refused", "excluded because discovery failed", "truncated") are defined here once, as properties; every
analysis reads them from here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import field, is_dataclass
from pathlib import Path, PurePath
from typing import Annotated, Any, BinaryIO, NamedTuple

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    computed_field,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic.dataclasses import dataclass

from evaluator.core.errors import ConfigError, OutputError
from evaluator.core.files import (
    atomic_write as atomic_write,  # every write of an output folder (the CLI prints an OSError as one line)
)
from evaluator.core.redact import scrub
from evaluator.data import GOLD_SETS, QueryId, qid_key
from evaluator.llm.accounting import CallStats
from evaluator.llm.profiles import ModelProfile, sectioned
from evaluator.llm.reply import cut_cause
from evaluator.results import migrate, outlock
from evaluator.results.cost import BatchStats, Cost
from evaluator.results.plans import ParseAudit, Stub
from evaluator.settings.sections import Fitted, RetrievalSettings, Settings

# re-exported: query ids (int or str) and their sort key, a PtR stub, a model's call counters, the version
__all__ = ["qid_key", "QueryId", "Stub", "CallStats", "FORMAT_VERSION"]

GOLDS = GOLD_SETS  # the data's gold sets (data.model), the ones every record carries
TRUNCATED = "length"  # the OpenAI-compatible finish_reason of a reply cut off at max_tokens

# The output folder's files. meta.json + queries.jsonl are the saved data; the rest is derived from them.
QUERIES_FILE = "queries.jsonl"
META_FILE = "meta.json"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"
SCALING_FILE = "scaling.json"
ROUTING_FILE = "routing.json"
# Every saved file's `format_version` (queries.jsonl: meta.json's); older shapes are read through the one
# module `migrate`. Bump it, and add a step there, when a saved shape changes.
FORMAT_VERSION = migrate.FORMAT_VERSION


# ---------------------------------------------------------------- records


def round6(x: float) -> float:
    # Six decimals: far below any difference that matters, and stable across BLAS thread counts.
    return round(float(x), 6)


def _absent(v: Any) -> bool:
    return v is None


def _empty(v: Any) -> bool:
    return not v


@dataclass
class Tokens:
    prompt: int = 0
    completion: int = 0

    @property
    def total(self) -> int:
        return self.prompt + self.completion


@dataclass
class PlanBlock:
    steps: list[str] = field(default_factory=list)
    selected: list[str] = field(default_factory=list)  # planner-selected APIs, registry ids where resolvable
    parse_error: str | None = None  # the reply could not be parsed
    llm_error: str | None = None  # the call failed for good (non-fatal)
    finish_reason: str | None = None  # of the planner reply
    llm_error_kind: str | None = None  # with llm_error: http_400, timeout, connection, ...
    # The selected APIs that were offered to the planner (None: a record from before this field).
    selected_offered: list[str] | None = None
    parse_audit: ParseAudit | None = None  # which parse rule produced each field (parse.Plan.audit)
    # Why the reply ended early (llm.reply.cut_cause: max_tokens, context, content_filter, ...); written only when cut.
    cut: str | None = Field(default=None, exclude_if=_absent)

    @property
    def unique_selected(self) -> list[str]:
        """Order-preserving dedupe; a planner may name an API twice."""
        return list(dict.fromkeys(x for x in self.selected if x is not None))

    @property
    def counted_selected(self) -> list[str]:
        """What counts as a selection (pass rate): only APIs that were offered; a name the planner made up,
        or a string from prose, is no selection."""
        if self.selected_offered is None:
            return self.unique_selected
        return list(dict.fromkeys(self.selected_offered))

    # written for readers of queries.jsonl; recomputed, never read back. The ignore is pydantic's documented
    # form (mypy does not support a decorator above @property).
    @computed_field  # type: ignore[prop-decorator]
    @property
    def refused(self) -> bool:
        """The planner answered, its reply parsed, and it chose no API. A PtR query with no stub (no
        planner call) counts as refused: the architecture chose nothing."""
        return self.usable and not self.unique_selected and not self.parse_error

    @property
    def usable(self) -> bool:
        """A call that failed for good is an infrastructure outcome, not a planner decision: excluded."""
        return not self.llm_error

    @property
    def truncated(self) -> bool:
        return self.finish_reason == TRUNCATED


# Why an architecture's block holds no result for a query (`ArchBlock.failure`): its `retrieve` raised
# (`arch_error`), broke the contract of `study.archs.Discovery` (`contract`: ids not of the registry, scores not
# finite, a trace that is not JSON, ...), ran past `[run] arch_timeout_s` of its own time (`timeout`), or waited on
# its own outcome through another's (`cycle`). The block is not scored and no planner is called for it.
FAILURE_KINDS: tuple[str, ...] = ("arch_error", "contract", "timeout", "cycle")


@dataclass
class BlockFailure:
    """An architecture that failed on one query: the kind (FAILURE_KINDS) and the first error, one line."""

    kind: str
    error: str


@dataclass
class ArchBlock:
    """One architecture's outcome for one query (`Record.archs[name]`). The fields after `tokens` are written
    only when set, so RtP's and PtR's blocks read as they did before architectures were plugins."""

    retrieved: list[str] = field(default_factory=list)  # top-K_MAX ids, best first
    scores: list[float] = field(default_factory=list)  # round6-ed where made (pipeline), written as they are
    plan: PlanBlock | None = None  # None: the planner was not run (retrieval only / arch not run)
    # per call: "planner", "discovery", "hyde", "rewrite", a plugin's own names; a reused call counts here too
    tokens: dict[str, Tokens] = field(default_factory=dict)
    side: str | None = Field(default=None, exclude_if=_absent)  # route: the architecture this query went to
    # What the viewer shows of how the list was made (rewrite: the query searched; a plugin's own JSON).
    trace: dict[str, Any] | None = Field(default=None, exclude_if=_absent)
    # Own calls (not the planner) that failed for good: call name -> error kind; the architecture is not scored.
    errors: dict[str, str] | None = Field(default=None, exclude_if=_absent)
    # The architecture itself failed on this query (FAILURE_KINDS): no list, no planner, not scored (format 5).
    failure: BlockFailure | None = Field(default=None, exclude_if=_absent)

    @property
    def excluded(self) -> bool:
        """Nothing to judge, the architecture is not scored for the query (no metric, no test, no planner call):
        a call its list depends on failed for good, or the architecture failed (`failure`)."""
        return bool(self.errors) or self.failure is not None

    @property
    def plan_usable(self) -> bool:
        return self.plan is not None and self.plan.usable

    def top(self, k: int) -> list[str]:
        return list(dict.fromkeys(x for x in self.retrieved[:k] if x is not None))

    @property
    def unique_retrieved(self) -> list[str]:
        return list(dict.fromkeys(x for x in self.retrieved if x is not None))

    @property
    def total_tokens(self) -> int:
        return sum(t.total for t in self.tokens.values())

    def truncated_replies(self) -> int:
        return int(self.plan is not None and self.plan.truncated)

    def cut_replies(self) -> list[str]:
        """The causes of this block's replies that were cut short (one entry per cut reply)."""
        return [c for c in [_cut_of(self.plan.cut, self.plan.finish_reason) if self.plan is not None else None] if c]


@dataclass
class PtrBlock(ArchBlock):
    stubs: list[Stub] = field(default_factory=list)
    discovery_parse_error: str | None = None
    discovery_llm_error: str | None = None
    discovery_finish_reason: str | None = None
    discovery_llm_error_kind: str | None = None
    stub_hits: list[list[str]] = field(default_factory=list)  # per stub: top-K_MAX ids
    stub_scores: list[list[float]] = field(default_factory=list)  # round6-ed, as `scores`
    width: dict[int, int] = field(default_factory=dict)  # |union of per-stub top-k| per k
    fallback: bool = False  # no stub: the raw query was searched instead
    discovery_cut: str | None = Field(default=None, exclude_if=_absent)  # as PlanBlock.cut, for the discovery reply

    @property
    def excluded(self) -> bool:
        """A discovery call that failed for good leaves no stubs to judge: PtR is not scored for the query (nor
        when the architecture failed, `failure`)."""
        return bool(self.discovery_llm_error) or self.failure is not None

    @property
    def stub_names(self) -> list[str]:
        """Normalised stub names (for Unique%); none when the query is excluded."""
        return [] if self.excluded else [s.name.strip().lower() for s in self.stubs]

    def truncated_replies(self) -> int:
        return super().truncated_replies() + int(self.discovery_finish_reason == TRUNCATED)

    def cut_replies(self) -> list[str]:
        disc = _cut_of(self.discovery_cut, self.discovery_finish_reason)
        return super().cut_replies() + ([disc] if disc else [])


def _cut_of(cut: str | None, finish_reason: str | None) -> str | None:
    """A reply's cut cause; a record written before causes were kept: "length" is max_tokens, any other
    finish_reason but a whole reply's is its own cause (llm.reply.cut_cause without token counts)."""
    if cut is not None:
        return cut
    return cut_cause(finish_reason, 0, None, max_tokens_known=False)


def _block_kind(v: Any) -> str:
    """Which block type a saved block is: one with stubs (PtR, hyde) is a `PtrBlock`."""
    if isinstance(v, Mapping):
        return "stubs" if "stubs" in v else "list"
    return "stubs" if isinstance(v, PtrBlock) else "list"


# A block of `Record.archs`: typed by its shape, so a plugin's block and hyde's read back as what they were.
Block = Annotated[Annotated[PtrBlock, Tag("stubs")] | Annotated[ArchBlock, Tag("list")], Discriminator(_block_kind)]


@dataclass
class Record:
    """One (model, run, subset, query). `archs`: each architecture's block by name, in `--archs` order
    (format 4; before it, `rtp` and `ptr` were top-level keys: `migrate.record`). Retrieval-only runs:
    model None, run 0, only `rtp` (no plan). An architecture that did not run is left out."""

    model: str | None
    run: int
    subset: str
    query_id: QueryId
    query: str
    gold: dict[str, list[str]]
    archs: dict[str, Block] = field(default_factory=dict)
    # What made the lists (config.RETRIEVER_CHOICES); absent means "dense", as in every record before it.
    retriever: str | None = Field(default=None, exclude_if=_absent)
    # Graded relevance (format 5; a BEIR folder's qrels scores): the grade (> 0) of every gold id. Absent: every
    # gold id has grade 1 (binary gold, every record before format 5 and every query whose grades are all 1).
    grades: dict[str, int] | None = Field(default=None, exclude_if=_absent)

    @model_validator(mode="before")
    @classmethod
    def _top_level_blocks(cls, data: Any) -> Any:
        # A record built by hand (tests, tools) in the shape before format 4: top-level `rtp` / `ptr`.
        return migrate.archs_mapping(data) if isinstance(data, Mapping) else data

    # ---- the accessors every analysis reads blocks through
    @property
    def arch_names(self) -> list[str]:
        """The architectures of this record, in `--archs` order."""
        return list(self.archs)

    def arch(self, name: str) -> ArchBlock | None:
        return self.archs.get(name)

    def block(self, arch: str) -> ArchBlock | None:
        return self.archs.get(arch)

    @property
    def rtp(self) -> ArchBlock | None:
        return self.archs.get("rtp")

    @rtp.setter
    def rtp(self, block: ArchBlock | None) -> None:
        self._put("rtp", block)

    @property
    def ptr(self) -> PtrBlock | None:
        b = self.archs.get("ptr")
        return b if isinstance(b, PtrBlock) else None

    @ptr.setter
    def ptr(self, block: PtrBlock | None) -> None:
        self._put("ptr", block)

    def _put(self, name: str, block: ArchBlock | None) -> None:
        if block is None:
            self.archs.pop(name, None)
        else:
            self.archs[name] = block

    @property
    def retriever_name(self) -> str:
        return self.retriever or "dense"

    def gold_set(self, name: str) -> list[str]:
        return self.gold.get(name) or []

    def grade(self, api_id: str) -> int:
        """The relevance grade of a gold id (1 for binary gold); what NDCG gains and `export trec` writes."""
        return self.grades.get(api_id, 1) if self.grades else 1

    @property
    def failed_calls(self) -> list[str]:
        """The error kind of each call of this record that failed for good (a rerun retries them). A block
        that reuses another's outcome (route) is not counted again."""
        out: list[str] = []
        for b in self.archs.values():
            if b.side is not None and b.side in self.archs:
                continue
            if b.plan and b.plan.llm_error:
                out.append(b.plan.llm_error_kind or "error")
            if isinstance(b, PtrBlock) and b.discovery_llm_error:
                out.append(b.discovery_llm_error_kind or "error")
            out += list((b.errors or {}).values())
        return out

    @property
    def failed_blocks(self) -> list[tuple[str, BlockFailure]]:
        """(architecture, failure) of each block whose architecture failed on this query (`ArchBlock.failure`); a
        block that took another's outcome (route) is not counted again."""
        return [(name, b.failure) for name, b in self.archs.items()
                if b.failure is not None and not (b.side is not None and b.side in self.archs)]

    def to_dict(self) -> dict[str, Any]:
        return plain(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Record:
        return _RECORD.validate_python(d)

    @classmethod
    def from_json(cls, line: bytes) -> Record:
        """A line `record_line` wrote (of this format version)."""
        return _RECORD.validate_json(line)


_RECORD = TypeAdapter(Record)


def record_line(r: Record) -> str:
    """A record as one `queries.jsonl` line: keys sorted as `dumps` writes them, but `archs` in `--archs` order
    (a sorted mapping would put ptr before rtp); `archs` sorts first among the record's keys."""
    d = _RECORD.dump_python(r, mode="json")
    archs = d.pop("archs")
    rest = dumps(d, indent=None)
    blocks = ", ".join(f"{json.dumps(name, ensure_ascii=False)}: {dumps(b, indent=None).rstrip()}"
                       for name, b in archs.items())
    # A plugin's trace or a stub's text may hold a key (a reply's text is redacted as it is read): never written.
    return scrub('{"archs": {' + blocks + "}" + (", " + rest[1:] if rest.strip() != "{}" else "}\n"))


class RecordKey(NamedTuple):
    """Where a record sits in queries.jsonl: by model, run, subset, then query id (numbers before text)."""

    model: str  # "" for RtP alone
    run: int
    subset: str
    query: tuple[int, int | str]  # `qid_key`


def record_key(r: Record) -> RecordKey:
    return RecordKey(r.model or "", r.run, r.subset, qid_key(r.query_id))


# ---------------------------------------------------------------- meta


def repeats_note(model: str, runs: int) -> str:
    """Why a deterministic server's runs carry no run-to-run test (the report's and the dry run's words, defined once)."""
    what = (f"its {runs} runs are copies of one (each prompt is sent once, its reply serves every run)" if runs > 1
            else "one run has no run-to-run variance either")
    return (f"deterministic server, model {model}: a local llama.cpp server at temperature 0 gives the same "
            f"reply to the same prompt in every run, so {what}: the standard deviations across runs are 0 or "
            "empty and the t-tests across runs (one-sample, two-sample) are not defined, so none is shown; the "
            "Wilcoxon tests over queries stand. For run-to-run variance set [sampling] `temperature` (e.g. 0.7) "
            "in the profile: each run's index is sent as its seed, so each run is its own reproducible sample (a "
            "deviation from STUDY.md, which samples at temperature 0).")


@dataclass
class ModelInfo:
    name: str
    model: str = ""
    simulated: bool = False
    # Every request-shaping setting of the profile (no secret: keys live in the environment), saved flat as
    # meta.json always has (`ModelProfile.flat`: `rpm`, `price_input_per_mtok`, ...) and read back into its
    # sections by the profiles' one migration (`llm.profiles.sectioned`).
    profile: ModelProfile | None = None

    @field_validator("profile", mode="before")
    @classmethod
    def _sections(cls, v: Any) -> Any:
        return sectioned(v) if isinstance(v, Mapping) else v

    @field_serializer("profile")
    def _flat(self, v: ModelProfile | None) -> dict[str, Any] | None:
        return None if v is None else v.flat()


@dataclass
class RegistryInfo:
    choice: str = "?"
    size: int | None = None
    source: str = ""
    format: str = ""  # the reader(s) used: jsonl, toolbench, mcp, openai, beir (evaluator.data)
    digest: str = ""  # `data.Registry.digest()` of its ids ("" in folders written before it was kept)


@dataclass
class WarningCount:
    """One kind of data problem (`data.Warnings`): how often, and a few examples for the report."""

    count: int = 0
    examples: list[str] = field(default_factory=list)


@dataclass
class About:
    """What a scaling or routing section states about the study it analysed (copied from `Meta`)."""

    embedder: str = "?"
    precision: str = "?"
    backend: str = "?"
    registry_choice: str = "?"
    simulated_models: list[str] = field(default_factory=list)
    subsets_rule: str = "as set"
    split_rule: str = "as set"
    retriever: str = "dense"  # what made the lists (routing's τ is on its top-1 score)


def about_fields(about: About | Mapping[str, Any] | None) -> dict[str, Any]:
    """The fields of an `About` given as one or as its JSON shape (tests build it by hand), checked."""
    return dataclasses.asdict(_ABOUT.validate_python(about or {}))


_ABOUT = TypeAdapter(About)


@dataclass
class LocalServer:
    """The bundled llama.cpp server a study started for a model (`llamacpp.llama_server.LlamaHandle.stats`)."""

    model_file: str = ""  # the joined GGUF, checked by size and sha256
    sha256: str = ""
    size: int = 0
    server: str = ""  # "xllamacpp <version>"
    threads: int = 0
    slots: int = 0
    ctx_per_slot: int = 0
    restarts: int = 0  # times it died mid-run and was started again on the same port
    metrics: dict[str, float] = field(default_factory=dict)  # llama.cpp's /metrics counters at the stage's end


@dataclass
class SimulatorStats:
    """A simulator's own count of what it answered (`GET /stats` of `simulator`), as meta.json keeps it."""

    requests: int = 0
    by_status: dict[str, int] = field(default_factory=dict)  # HTTP status -> replies
    in_flight: int = 0
    max_in_flight: int = 0
    ok: int = 0
    distinct_ok: int = 0  # distinct request bodies answered 200
    repeated_ok: int = 0  # bodies answered 200 more than once
    faults: dict[str, int] = field(default_factory=dict)  # injected fault -> times
    prompt_tokens: int = 0
    completion_tokens: int = 0
    abandoned: int = 0  # requests whose client hung up before the reply
    max_waiting: int = 0  # serial simulator: most requests waiting for its one worker at once

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SimulatorStats:
        """From the simulator's JSON (`SimHandle.stats()`); a key this version does not know is left out."""
        return _adapter(cls).validate_python(d)


@dataclass
class PeakMemory:
    """Peak resident memory up to writing the report, MiB (getrusage's ru_maxrss): this process, its largest
    finished child (the model export runs in one), and the larger of the two (issue 29's bound: 1.5 GiB)."""

    largest_process: float = 0.0
    this_process: float = 0.0
    largest_child: float = 0.0


@dataclass(config=ConfigDict(validate_assignment=True))
class Runtime:
    """meta.json's `runtime`: what changes between otherwise identical invocations (never in summary.json)."""

    created: str = ""  # local time the study started, ISO 8601
    timings: dict[str, float] = field(default_factory=dict)  # stage -> seconds (bench/warm_run.py reads them)
    # The embedding cache's work (embed.EmbedStats's counters and seconds; schema does not import the embedder).
    embed: dict[str, int | float] = field(default_factory=dict)
    embed_runtime: str = ""  # which runtime path produced the vectors (Embedder.description)
    search: str = Field(default="", exclude_if=_empty)  # which engine searched (VectorIndex.description); absent before 41
    # Peak GPU memory the embedder and the search allocated (torch.cuda.max_memory_allocated), MiB; absent on a CPU.
    peak_gpu_mib: float | None = Field(default=None, exclude_if=_absent)
    # Per simulated model: the simulator's own count (a rerun from the cache shows zero requests); absent in
    # a retrieval-only run.
    simulator_stats: dict[str, SimulatorStats] | None = Field(default=None, exclude_if=_absent)
    peak_rss_mib: PeakMemory | None = Field(default=None, exclude_if=_absent)  # absent in runs before 29
    # Per bundled model (`local_model`): its llama.cpp server's file, hash, version, sizing and counters.
    local_server: dict[str, LocalServer] | None = Field(default=None, exclude_if=_absent)
    # Per model, per architecture: the chat calls its own code made (cache hits included; a reused call is
    # counted where it was made: fusion's discovery under ptr, route's under its side). The dry run's by_arch.
    arch_calls: dict[str, dict[str, int]] | None = Field(default=None, exclude_if=_absent)


@dataclass(config=ConfigDict(validate_assignment=True))
class Meta:
    """`meta.json`. Keys under `runtime`, `llm_stats` and the path settings change between otherwise
    identical invocations; `study_view()` leaves them out of `summary.json`."""

    format_version: int = FORMAT_VERSION
    version: str = "?"
    settings: Settings = field(default_factory=Settings)  # the study's settings, by section (no per-invocation options)
    # Settings the study changed to fit its data, by dotted name ("retrieval.ks": config budgets above the registry).
    fitted: dict[str, Fitted] = Field(default_factory=dict, exclude_if=_empty)
    data_dir: str = ""
    embedder: str = "?"
    precision: str = "?"
    backend: str = "?"  # embedding runtime: torch, onnx, openvino
    registry: RegistryInfo = field(default_factory=RegistryInfo)
    subsets: dict[str, int] = field(default_factory=dict)
    k: int = RetrievalSettings().k  # a meta.json without k or ks was written with the defaults
    ks: list[int] = field(default_factory=lambda: list(RetrievalSettings().ks))
    runs: int = 1
    models: list[ModelInfo] = field(default_factory=list)
    retrieval_only: bool = False
    warnings: dict[str, WarningCount] = field(default_factory=dict)
    llm_stats: dict[str, CallStats] = field(default_factory=dict)
    runtime: Runtime = field(default_factory=Runtime)
    # Why an analysis that follows the study (scaling, routing) did not run, by analysis.
    analysis_notes: dict[str, str] = field(default_factory=dict)
    # Per model: the batch API's work (--batch) and tokens + USD online/batch (evaluator.results.cost).
    batch: dict[str, BatchStats] = field(default_factory=dict)
    cost: dict[str, Cost] = field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _older_formats(cls, data: Any) -> Any:
        return migrate.meta(data) if isinstance(data, Mapping) else data

    @computed_field  # type: ignore[prop-decorator]  # as PlanBlock.refused
    @property
    def simulated(self) -> bool:
        return any(m.simulated for m in self.models)

    @property
    def simulated_models(self) -> list[str]:
        return [m.name for m in self.models if m.simulated]

    def about(self, subsets_rule: str, split_rule: str) -> About:
        return About(self.embedder, self.precision, self.backend, self.registry.choice, self.simulated_models,
                     subsets_rule, split_rule, self.settings.retrieval.retriever)

    def to_dict(self) -> dict[str, Any]:
        return plain(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Meta:
        return _META.validate_python(d)

    # settings that name places or machine resources, not the study: they stay out of summary.json
    VOLATILE_SETTINGS = {"data": ("dir", "tools", "queries"), "embed": ("device", "batch_size"),
                         "run": ("cache_dir", "out", "arch_timeout_s")}

    def study_view(self) -> dict[str, Any]:
        """What the study's numbers depend on (summary.json's `meta`): no paths, timings or accounting."""
        d = self.to_dict()
        for key in ("llm_stats", "runtime", "data_dir", "analysis_notes", "batch", "cost", "format_version"):
            d.pop(key, None)
        d["settings"] = {name: {k: v for k, v in section.items() if k not in self.VOLATILE_SETTINGS.get(name, ())}
                         for name, section in d["settings"].items()}
        d["registry"] = {"choice": self.registry.choice, "size": self.registry.size}
        if self.registry.digest:  # absent from folders written before it was kept: their summary.json stays as it was
            d["registry"]["digest"] = self.registry.digest
        return d


_META = TypeAdapter(Meta)


# ---------------------------------------------------------------- the output folder


def dumps(obj: Any, *, indent: int | None = 2) -> str:
    """The one JSON writer of the output folder: sorted keys, so a rerun reproduces a file byte for byte.
    `indent=None` gives one line (a queries.jsonl record). Typed values (records, meta, results) are
    written as their declared JSON shape."""
    return json.dumps(obj, sort_keys=True, indent=indent, ensure_ascii=False, default=_json_default) + "\n"


def plain(obj: Any) -> Any:
    """A typed value (pydantic dataclass or model) as JSON-ready Python data."""
    return _adapter(type(obj)).dump_python(obj, mode="json")


_ADAPTERS: dict[type, TypeAdapter[Any]] = {}


def _adapter(tp: type) -> TypeAdapter[Any]:
    """One TypeAdapter per type (building one is slow: bench/README.md, "results/schema.py"; `plain` runs per
    record)."""
    a = _ADAPTERS.get(tp)
    if a is None:
        a = _ADAPTERS[tp] = TypeAdapter(tp)
    return a


def _json_default(x: Any) -> Any:
    if is_dataclass(x) or isinstance(x, BaseModel):
        return plain(x)
    if hasattr(x, "item"):  # numpy scalars
        return x.item()
    if isinstance(x, PurePath):
        return str(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def _first_error(e: ValidationError) -> str:
    """A pydantic error as one line: where in the value, and what is wrong."""
    err = e.errors(include_url=False)[0]
    where = ".".join(str(x) for x in err["loc"])
    return f"{where}: {err['msg']}" if where else err["msg"]


@dataclasses.dataclass
class OutputDir:
    """One output folder: `meta.json` + `queries.jsonl` are the saved data; everything else is derived."""

    path: Path

    def __post_init__(self) -> None:
        self.path = Path(self.path)

    @property
    def figures(self) -> Path:
        return self.path / "figures"

    def require(self) -> OutputDir:
        if not (self.path / QUERIES_FILE).is_file():
            raise OutputError(f"{self.path}: not an evaluator output folder (no {QUERIES_FILE}). "
                              "Pass the --out folder of a finished run.")
        return self

    def read_records(self) -> list[Record]:
        return list(self.iter_records())

    def iter_records(self) -> Iterator[Record]:
        """queries.jsonl's records in file order, one at a time (`results.stream.SavedRecords` passes over a
        file too large to hold this way)."""
        self.require()
        version = self.saved_version()
        with open(self.path / QUERIES_FILE, "rb") as fh:  # bytes: a bad encoding is caught per line below
            for n, line in enumerate(fh, 1):
                if line.strip():
                    yield self.parse_record(line, n, version)

    def parse_record(self, line: bytes, n: int, version: int) -> Record:
        """Line `n` of queries.jsonl, of the folder's format `version`, as a record; one line when it is none."""
        try:
            if version == FORMAT_VERSION:  # the common case: pydantic parses the bytes itself
                return _RECORD.validate_json(line)
            return _RECORD.validate_python(migrate.record(json.loads(line), version))
        except ValueError as e:  # pydantic's ValidationError, or json's JSONDecodeError
            why = _first_error(e) if isinstance(e, ValidationError) else f"not JSON: {e}"
            raise OutputError(f"{self.path / QUERIES_FILE}: line {n} is not a record ({why}); "
                              "rerun the study to rewrite it.") from None

    def check_agree(self, meta: Meta, records: Iterable[Record]) -> None:
        """One line, before anything is overwritten, when meta.json is not that of these records (`disagreement`)."""
        p = self.path / META_FILE
        try:
            stated = json.loads(p.read_bytes()).keys() if p.is_file() else ()
        except (ValueError, AttributeError):
            stated = ()  # read_meta has read it already: a meta.json that is no object says so there
        why = disagreement(meta, records, self.read_json(SUMMARY_FILE), stated)
        if why:
            raise OutputError(f"{self.path / META_FILE} does not belong to {QUERIES_FILE} here: {why}. Nothing was "
                              "rewritten; put back this run's own meta.json, or rerun the study.")

    def saved_version(self) -> int:
        """The folder's format version (meta.json's; its queries.jsonl lines carry none)."""
        p = self.path / META_FILE
        try:
            d = json.loads(p.read_bytes()) if p.is_file() else {}
            return migrate.version_of(d if isinstance(d, Mapping) else {}, META_FILE)
        except (ValueError, migrate.FormatError) as e:  # no JSON, or a newer version than this evaluator's
            raise OutputError(f"{p}: {e}") from None

    def read_meta(self) -> Meta:
        p = self.path / META_FILE
        if not p.is_file():
            return Meta()
        try:
            return _META.validate_json(p.read_bytes())
        except ValidationError as e:
            raise OutputError(f"{p}: unreadable meta.json ({_first_error(e)}); rerun the study to rewrite it.") from None
        except migrate.FormatError as e:
            raise OutputError(f"{p}: {e}") from None

    def write_records(self, records: Iterable[Record]) -> int:
        recs = sorted(records, key=record_key)

        # line by line, not joined first (bench/README.md, "results/schema.py")
        def lines(fh: BinaryIO) -> None:
            for r in recs:
                fh.write(record_line(r).encode())

        self.write_records_with(lines)
        return len(recs)

    def write_records_with(self, write: Callable[[BinaryIO], None]) -> None:
        """queries.jsonl written (atomically) by `write`, which writes the record lines in record_key order."""
        atomic_write(self.path / QUERIES_FILE, write)

    def write_meta(self, meta: Meta) -> None:
        self.write_json(META_FILE, meta)

    def write_json(self, name: str, obj: Any, *, indent: int = 2) -> None:
        atomic_write(self.path / name, scrub(dumps(obj, indent=indent)))

    def write_text(self, name: str, text: str) -> None:
        atomic_write(self.path / name, scrub(text))  # report.md quotes replies and plugins' traces

    def writing(self, command: str, note: Callable[[str], None] = lambda _m: None) -> contextlib.AbstractContextManager[None]:
        """This folder's one-writer lock, held while the block runs (`results.outlock`): a second writer stops."""
        return outlock.writing(self.path, command, note)

    def clear(self, also: Iterable[str] = ()) -> None:
        """The results of the study this folder held, for `--overwrite`: its saved and derived files, its figures
        and the files named in `also` (the viewer's, the dry run's plan); nothing else in the folder."""
        for name in (META_FILE, QUERIES_FILE, SUMMARY_FILE, REPORT_FILE, SCALING_FILE, ROUTING_FILE, *also):
            p = self.path / name
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)
        for png in self.figures.glob("*.png") if self.figures.is_dir() else ():
            png.unlink()

    def read_figures(self, names: Iterable[str] | None = None) -> dict[str, bytes]:
        """PNG bytes by file name: the named figures (those a render drew), else every one in `figures/`."""
        if names is None:
            names = sorted(p.name for p in self.figures.glob("*.png")) if self.figures.is_dir() else []
        return {n: (self.figures / n).read_bytes() for n in names if (self.figures / n).is_file()}

    def read_json(self, name: str) -> dict[str, Any] | None:
        """A derived JSON file (scaling.json, routing.json, summary.json) in the shape of FORMAT_VERSION
        (migrated by `migrate`, not yet typed); None when the folder has none."""
        p = self.path / name
        if not p.is_file():
            return None
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except ValueError as e:
            raise OutputError(f"{p}: unreadable JSON ({e}); delete it or rerun the analysis that writes it.") from None
        if not isinstance(d, dict):
            raise OutputError(f"{p}: not a JSON object; delete it or rerun the analysis that writes it.")
        step = _MIGRATIONS.get(name)
        try:
            return step(d) if step else d
        except migrate.FormatError as e:
            raise OutputError(f"{p}: {e}") from None


_MIGRATIONS = {SCALING_FILE: migrate.scaling, ROUTING_FILE: migrate.routing, SUMMARY_FILE: migrate.summary}


def disagreement(meta: Meta, records: Iterable[Record], summary: Mapping[str, Any] | None = None,
                 stated: Iterable[str] | None = None) -> str | None:
    """How a folder's `meta.json` contradicts its records (and the `summary.json` written with them), or None.

    `report`, `scaling` and `routing` trust meta.json for models, subsets, runs and the registry: another run's
    meta.json copied into a folder would re-render its records under the wrong labels and overwrite summary.json.
    Checked: the models, the subsets and their query counts, the run indices, the registry (no record retrieved
    more distinct APIs than it holds) and, where summary.json is there, every field of its study view that
    meta.json restates (registry size and digest included). A folder from before a field existed is not held
    to it (a count of 0 from release 0.1.0, no digest), nor a meta.json written by hand to a field it leaves out
    (`stated`: the keys meta.json holds; None: all)."""
    said_keys = set(stated) if stated is not None else {"models", "subsets", "runs", "registry"}
    # One pass: the records may be a stream over a file too large to hold (`results.stream.SavedRecords`).
    found: set[str] = set()
    queries: dict[str, set[Any]] = {}
    run_set: set[int] = set()
    seen: set[str] = set()  # distinct retrieved APIs: at most the registry's size
    for r in records:
        if r.model is not None:
            found.add(r.model)
        queries.setdefault(r.subset, set()).add(qid_key(r.query_id))
        run_set.add(r.run)
        for b in r.archs.values():
            seen.update(b.retrieved)
    models = sorted(found)
    said = sorted(m.name for m in meta.models)
    if "models" in said_keys and models != said:
        return f"the records are of models {models or 'none (retrieval only)'}, meta.json names {said or 'none'}"
    counts = {sub: len(q) for sub, q in sorted(queries.items())}
    if "subsets" in said_keys and meta.subsets and (sorted(counts) != sorted(meta.subsets) or any(meta.subsets[s] and meta.subsets[s] != n for s, n in counts.items())):
        return f"the records hold subsets {counts}, meta.json says {dict(sorted(meta.subsets.items()))}"
    runs = sorted(run_set)
    if "runs" in said_keys and runs != list(range(meta.runs if models else 1)):
        return f"the records hold runs {runs}, meta.json says {meta.runs} run(s)"
    size = meta.registry.size
    if "registry" in said_keys and size is not None and len(seen) > size:
        return f"the records retrieve {len(seen):,} distinct APIs, meta.json's registry holds {size:,}"
    view = (summary or {}).get("meta")
    if isinstance(view, Mapping):
        ours = meta.study_view()
        for key in ("registry", "subsets", "runs", "k", "ks"):
            theirs, mine = view.get(key), ours.get(key)
            if key == "registry" and isinstance(theirs, Mapping) and isinstance(mine, Mapping):
                theirs = {f: theirs.get(f) for f in mine if f in theirs}  # an older summary lacks the digest
                mine = {f: mine[f] for f in theirs}
            if theirs is not None and theirs != mine:
                return f"{SUMMARY_FILE} was written for {key} {theirs}, meta.json says {mine}"
        names = sorted(str(m.get("name")) for m in view.get("models") or [] if isinstance(m, Mapping))
        if names and names != said:
            return f"{SUMMARY_FILE} was written for models {names}, meta.json names {said}"
    return None


def other_study(meta: Meta, settings: Settings, retrieval_only: bool) -> str | None:
    """How the study a folder's meta.json holds differs from the one about to write there (`settings`), in a few
    words; None when it is the same study, whose rerun resumes it and rewrites the folder with the same results.

    The same study: the same settings in every section but the places and machine resources
    (`Meta.VOLATILE_SETTINGS`: the data, cache and output paths, the device, the batch size), the ablation asked
    for (a fitted one is compared as asked), and retrieval-only or not. Any other setting (models, runs, limit,
    subsets, archs, k, ks, embedder, retriever, analysis) makes it another study."""
    if meta.retrieval_only != retrieval_only:
        return "a retrieval-only study" if meta.retrieval_only else f"a study of models {[m.name for m in meta.models]}"
    theirs, mine = _compared(meta.settings, meta.fitted), _compared(settings, {})
    for section, values in mine.items():
        saved = theirs.get(section, {})
        for key in sorted(set(values) | set(saved)):
            if saved.get(key) != values.get(key):
                return f"its {section}.{key} is {saved.get(key)!r}, this study's {values.get(key)!r}"
    return None


def _compared(s: Settings, fitted: Mapping[str, Fitted]) -> dict[str, dict[str, Any]]:
    d = plain(s)
    for dotted, f in fitted.items():  # a setting fitted to the data is compared as the study asked for it
        section, _, key = dotted.partition(".")
        if section in d:
            d[section][key] = list(f.asked)
    return {name: {k: v for k, v in section.items() if k not in Meta.VOLATILE_SETTINGS.get(name, ())}
            for name, section in d.items()}


def check_writable(path: Path, what: str) -> None:
    """Fail now, not after the LLM phase, when a folder cannot be created or written. Leaves nothing behind.

    It really creates the missing folders and a probe file, then removes them: permission bits say nothing for
    root, read-only mounts or pseudo file systems (`/proc`), and only a real write tells.
    """
    p = Path(path).expanduser().absolute()
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{what} {path} is a file, not a folder; pass a folder.")
    missing: list[Path] = []
    probe = p
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"{what} {path}: {probe} is a file, so the folder cannot be created; pass another folder.")
    created: list[Path] = []
    try:
        for d in reversed(missing):
            d.mkdir()
            created.append(d)
        fd, tmp = tempfile.mkstemp(dir=p, prefix=".write-probe-")
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise ConfigError(f"{what} {path} is not writable ({reason}); pass a writable folder.") from None
    finally:
        for d in reversed(created):
            with contextlib.suppress(OSError):
                d.rmdir()


def as_records(items: Sequence[Record | Mapping[str, Any]]) -> list[Record]:
    """Typed records from typed or JSON-shaped ones (tests and tools that build records by hand)."""
    return [r if isinstance(r, Record) else _RECORD.validate_python(r) for r in items]
