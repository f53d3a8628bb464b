"""The output folder's contracts: typed `Record` (one line of `queries.jsonl`) and `Meta` (`meta.json`),
and the one reader and writer of an output folder (every write atomic, in `atomic_write`).

Facts derived from a record ("refused", "excluded because discovery failed", "truncated") are defined
here once, as properties; every analysis reads them from here. The JSON shapes are in docs/DESIGN.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .data import qid_key
from .llm.errors import ConfigError

__all__ = ["qid_key"]  # re-exported: the one sort key for query ids of mixed types

GOLDS: tuple[str, ...] = ("api_list", "relevant")
TRUNCATED = "length"  # the OpenAI-compatible finish_reason of a reply cut off at max_tokens

QUERIES_FILE = "queries.jsonl"
META_FILE = "meta.json"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"


class OutputError(Exception):
    """An output folder cannot be read or written; the message names it and says what to do."""


# ---------------------------------------------------------------- records


def round6(x: float) -> float:
    # Six decimals: far below any difference that matters, and stable across BLAS thread counts.
    return round(float(x), 6)


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
    parse_audit: dict[str, Any] | None = None  # which parse rule produced each field (parse.Plan.audit)

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

    def to_dict(self) -> dict[str, Any]:
        return {"steps": list(self.steps), "selected": list(self.selected), "refused": self.refused,
                "parse_error": self.parse_error, "llm_error": self.llm_error, "finish_reason": self.finish_reason,
                "llm_error_kind": self.llm_error_kind, "selected_offered": self.selected_offered,
                "parse_audit": self.parse_audit}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> PlanBlock | None:
        if d is None:
            return None
        offered = d.get("selected_offered")
        return cls(list(d.get("steps") or []), list(d.get("selected") or []), d.get("parse_error"),
                   d.get("llm_error"), d.get("finish_reason"), d.get("llm_error_kind"),
                   list(offered) if offered is not None else None, d.get("parse_audit"))


@dataclass
class StubRec:
    name: str
    reasoning: str
    rule: str = ""  # which parse rule produced it (parse.Stub.rule)
    example_copy: bool = False  # a copy of the discovery prompt's example: left out of Match%


def _tokens_to_dict(tokens: Mapping[str, Tokens]) -> dict[str, Any]:
    return {call: {"prompt": t.prompt, "completion": t.completion} for call, t in tokens.items()}


def _tokens_from(d: Mapping[str, Any] | None) -> dict[str, Tokens]:
    return {str(call): Tokens(int(c.get("prompt") or 0), int(c.get("completion") or 0))
            for call, c in (d or {}).items() if isinstance(c, Mapping)}


@dataclass
class ArchBlock:
    """One architecture's outcome for one query. PtR-only fields stay empty for RtP."""

    retrieved: list[str] = field(default_factory=list)  # top-K_MAX ids, best first
    scores: list[float] = field(default_factory=list)
    plan: PlanBlock | None = None  # None: the planner was not run (retrieval only / arch not run)
    tokens: dict[str, Tokens] = field(default_factory=dict)  # per call: "planner", "discovery"

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

    def to_dict(self) -> dict[str, Any]:
        return {"retrieved": list(self.retrieved), "scores": [round6(s) for s in self.scores],
                "plan": self.plan.to_dict() if self.plan is not None else None,
                "tokens": _tokens_to_dict(self.tokens)}


@dataclass
class PtrBlock(ArchBlock):
    stubs: list[StubRec] = field(default_factory=list)
    discovery_parse_error: str | None = None
    discovery_llm_error: str | None = None
    discovery_finish_reason: str | None = None
    discovery_llm_error_kind: str | None = None
    stub_hits: list[list[str]] = field(default_factory=list)  # per stub: top-K_MAX ids
    stub_scores: list[list[float]] = field(default_factory=list)
    width: dict[int, int] = field(default_factory=dict)  # |union of per-stub top-k| per k
    fallback: bool = False  # no stub: the raw query was searched instead

    @property
    def excluded(self) -> bool:
        """A discovery call that failed for good leaves no stubs to judge: PtR is not scored for the query."""
        return bool(self.discovery_llm_error)

    @property
    def stub_names(self) -> list[str]:
        """Normalised stub names (for Unique%); none when the query is excluded."""
        return [] if self.excluded else [s.name.strip().lower() for s in self.stubs]

    def truncated_replies(self) -> int:
        return super().truncated_replies() + int(self.discovery_finish_reason == TRUNCATED)

    def to_dict(self) -> dict[str, Any]:
        return super().to_dict() | {
            "stubs": [{"name": s.name, "reasoning": s.reasoning, "rule": s.rule, "example_copy": s.example_copy}
                      for s in self.stubs],
            "discovery_parse_error": self.discovery_parse_error,
            "discovery_llm_error": self.discovery_llm_error,
            "discovery_finish_reason": self.discovery_finish_reason,
            "discovery_llm_error_kind": self.discovery_llm_error_kind,
            "stub_hits": [list(h) for h in self.stub_hits],
            "stub_scores": [[round6(s) for s in sc] for sc in self.stub_scores],
            "width": {str(k): w for k, w in sorted(self.width.items())},
            "fallback": self.fallback,
        }


def _arch_from(d: Mapping[str, Any] | None, ptr: bool) -> ArchBlock | None:
    if not d:
        return None
    common = dict(retrieved=list(d.get("retrieved") or []), scores=[float(s) for s in d.get("scores") or []],
                  plan=PlanBlock.from_dict(d.get("plan")), tokens=_tokens_from(d.get("tokens")))
    if not ptr:
        return ArchBlock(**common)
    return PtrBlock(
        **common,
        stubs=[StubRec(str(s.get("name") or ""), str(s.get("reasoning") or ""), str(s.get("rule") or ""),
                       bool(s.get("example_copy"))) for s in d.get("stubs") or [] if isinstance(s, Mapping)],
        discovery_parse_error=d.get("discovery_parse_error"),
        discovery_llm_error=d.get("discovery_llm_error"),
        discovery_finish_reason=d.get("discovery_finish_reason"),
        discovery_llm_error_kind=d.get("discovery_llm_error_kind"),
        stub_hits=[list(h) for h in d.get("stub_hits") or []],
        stub_scores=[[float(s) for s in sc] for sc in d.get("stub_scores") or []],
        width={int(k): int(w) for k, w in (d.get("width") or {}).items()},
        fallback=bool(d.get("fallback")),
    )


@dataclass
class Record:
    """One (model, run, subset, query). Retrieval-only runs: model None, run 0, only `rtp` (no plan)."""

    model: str | None
    run: int
    subset: str
    query_id: Any  # int in ToolBench; any JSON scalar is kept as given
    query: str
    gold: dict[str, list[str]]
    rtp: ArchBlock | None = None
    ptr: PtrBlock | None = None

    def block(self, arch: str) -> ArchBlock | None:
        return self.rtp if arch == "rtp" else self.ptr

    def gold_set(self, name: str) -> list[str]:
        return self.gold.get(name) or []

    @property
    def failed_calls(self) -> list[str]:
        """The error kind of each call of this record that failed for good (a rerun retries them)."""
        out = [b.plan.llm_error_kind or "error" for b in (self.rtp, self.ptr) if b and b.plan and b.plan.llm_error]
        if self.ptr and self.ptr.discovery_llm_error:
            out.append(self.ptr.discovery_llm_error_kind or "error")
        return out

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"model": self.model, "run": self.run, "subset": self.subset, "query_id": self.query_id,
                             "query": self.query, "gold": {g: list(ids) for g, ids in self.gold.items()}}
        if self.rtp is not None:
            d["rtp"] = self.rtp.to_dict()
        if self.ptr is not None:
            d["ptr"] = self.ptr.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Record:
        ptr = _arch_from(d.get("ptr"), ptr=True)
        assert ptr is None or isinstance(ptr, PtrBlock)
        return cls(model=d.get("model"), run=int(d.get("run") or 0), subset=str(d.get("subset")),
                   query_id=d.get("query_id"), query=str(d.get("query") or ""),
                   gold={str(g): list(ids or []) for g, ids in (d.get("gold") or {}).items()},
                   rtp=_arch_from(d.get("rtp"), ptr=False), ptr=ptr)


def record_key(r: Record) -> tuple[Any, ...]:
    return (r.model or "", r.run, r.subset, qid_key(r.query_id))


# ---------------------------------------------------------------- meta


@dataclass
class ModelInfo:
    name: str
    model: str = ""
    simulated: bool = False
    # Every request-shaping setting of the profile (no secret: keys live in the environment).
    profile: dict[str, Any] = field(default_factory=dict)


@dataclass
class RegistryInfo:
    choice: str = "?"
    size: int | None = None
    source: str = ""
    format: str = ""  # the reader(s) used: jsonl, toolbench, mcp, openai (evaluator.data)


@dataclass
class Meta:
    """`meta.json`. Keys under `runtime`, `llm_stats` and the path settings change between otherwise
    identical invocations; `study_view()` leaves them out of `summary.json`."""

    version: str = "?"
    settings: dict[str, Any] = field(default_factory=dict)
    data_dir: str = ""
    embedder: str = "?"
    precision: str = "?"
    backend: str = "?"  # embedding runtime: torch, onnx, openvino
    registry: RegistryInfo = field(default_factory=RegistryInfo)
    subsets: dict[str, int] = field(default_factory=dict)
    k: int = 5
    ks: list[int] = field(default_factory=lambda: [1, 3, 5, 10, 20])
    runs: int = 1
    models: list[ModelInfo] = field(default_factory=list)
    retrieval_only: bool = False
    warnings: dict[str, Any] = field(default_factory=dict)
    llm_stats: dict[str, Any] = field(default_factory=dict)
    runtime: dict[str, Any] = field(default_factory=dict)
    # Why an analysis that follows the run (scaling, routing) did not run, by analysis.
    analysis_notes: dict[str, str] = field(default_factory=dict)
    # Per model: the batch API's work (--batch) and tokens + USD online/batch (evaluator.batch.cost).
    batch: dict[str, Any] = field(default_factory=dict)
    cost: dict[str, Any] = field(default_factory=dict)

    @property
    def simulated(self) -> bool:
        return any(m.simulated for m in self.models)

    @property
    def simulated_models(self) -> list[str]:
        return [m.name for m in self.models if m.simulated]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["simulated"] = self.simulated
        return d

    # settings that name places or machine resources, not the study: they stay out of summary.json
    VOLATILE_SETTINGS = ("cache_dir", "out", "device", "batch_size", "data_dir", "embed_threads", "tools", "queries")

    def study_view(self) -> dict[str, Any]:
        """What the study's numbers depend on (summary.json's `meta`): no paths, timings or accounting."""
        d = self.to_dict()
        for key in ("llm_stats", "runtime", "data_dir", "analysis_notes", "batch", "cost"):
            d.pop(key, None)
        d["settings"] = {k: v for k, v in self.settings.items() if k not in self.VOLATILE_SETTINGS}
        d["registry"] = {"choice": self.registry.choice, "size": self.registry.size}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Meta:
        reg = d.get("registry") if isinstance(d.get("registry"), Mapping) else {}
        models = []
        for m in d.get("models") or []:
            if isinstance(m, Mapping):
                models.append(ModelInfo(str(m.get("name")), str(m.get("model") or ""), bool(m.get("simulated")),
                                        dict(m.get("profile") or {})))
            else:
                models.append(ModelInfo(str(m)))
        subsets = d.get("subsets") or {}
        k = int(d.get("k") or 5)
        return cls(
            version=str(d.get("version") or "?"), settings=dict(d.get("settings") or {}),
            data_dir=str(d.get("data_dir") or ""), embedder=str(d.get("embedder") or "?"),
            precision=str(d.get("precision") or "?"), backend=str(d.get("backend") or "?"),
            registry=RegistryInfo(str(reg.get("choice") or "?"), reg.get("size"), str(reg.get("source") or ""),
                                  str(reg.get("format") or "")),
            subsets=dict(subsets) if isinstance(subsets, Mapping) else {str(s): 0 for s in subsets},
            k=k, ks=sorted({int(x) for x in d.get("ks") or [1, 3, 5, 10, 20]}),
            runs=int(d.get("runs") or 1), models=models, retrieval_only=bool(d.get("retrieval_only")),
            warnings=dict(d.get("warnings") or {}), llm_stats=dict(d.get("llm_stats") or {}),
            runtime=dict(d.get("runtime") or {}), analysis_notes=dict(d.get("analysis_notes") or {}),
            batch=dict(d.get("batch") or {}), cost=dict(d.get("cost") or {}),
        )


# ---------------------------------------------------------------- the output folder


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write via a temporary sibling and rename: a reader never sees half a file, a kill leaves the old one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if isinstance(data, str):
        tmp.write_text(data, encoding="utf-8")
    else:
        tmp.write_bytes(data)
    tmp.replace(path)


def dumps(obj: Any) -> str:
    """Deterministic JSON text (sorted keys) so a rerun reproduces a file byte for byte."""
    return json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False, default=_json_default) + "\n"


def _json_default(x: Any) -> Any:
    if hasattr(x, "item"):  # numpy scalars
        return x.item()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


@dataclass
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
        self.require()
        out: list[Record] = []
        with open(self.path / QUERIES_FILE, "rb") as fh:  # bytes: a bad encoding is caught per line below
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    out.append(Record.from_dict(json.loads(line)))
                except (ValueError, TypeError, AttributeError) as e:
                    raise OutputError(f"{self.path / QUERIES_FILE}: line {n} is not a record ({e}); "
                                      "rerun the study to rewrite it.") from None
        return out

    def read_meta(self) -> Meta:
        p = self.path / META_FILE
        if not p.is_file():
            return Meta()
        try:
            return Meta.from_dict(json.loads(p.read_text(encoding="utf-8")))
        except (ValueError, TypeError) as e:
            raise OutputError(f"{p}: unreadable meta.json ({e}); rerun the study to rewrite it.") from None

    def write_records(self, records: Iterable[Record]) -> int:
        recs = sorted(records, key=record_key)
        atomic_write(self.path / QUERIES_FILE, "".join(
            json.dumps(r.to_dict(), ensure_ascii=False, sort_keys=True) + "\n" for r in recs))
        return len(recs)

    def write_meta(self, meta: Meta) -> None:
        atomic_write(self.path / META_FILE, json.dumps(meta.to_dict(), indent=2, sort_keys=True, default=str))

    def write_json(self, name: str, obj: Any) -> None:
        atomic_write(self.path / name, dumps(obj))

    def write_text(self, name: str, text: str) -> None:
        atomic_write(self.path / name, text)

    def read_json(self, name: str) -> Any:
        p = self.path / name
        if not p.is_file():
            return None
        try:
            return json.loads(p.read_text(encoding="utf-8"))
        except ValueError as e:
            raise OutputError(f"{p}: unreadable JSON ({e}); delete it or rerun the analysis that writes it.") from None


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
    return [r if isinstance(r, Record) else Record.from_dict(r) for r in items]
