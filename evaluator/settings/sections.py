"""The study's settings as saved in meta.json: one frozen section per table of `configs/default.toml`
([data], [embed], [retrieval], [run], [analysis]), each field named as its TOML key.

Each stage is handed the section it needs (data loading the data section, the embedder the embed section,
the searches and the runner the retrieval section, the analyses the analysis section); only `cli` and `app`
hold the whole `Settings`. Nothing changes a section once it is checked: a value fitted to the data is a new
section (`dataclasses.replace`), and meta.json says what was fitted (`Fitted`). What one invocation asks
beyond the study (dry run, batch, budget, profile overrides, ...) is `settings.invocation.Invocation`, never
saved.
"""

from __future__ import annotations

from dataclasses import field
from typing import TYPE_CHECKING, Annotated, Literal, TypeAlias, get_args

from pydantic import AfterValidator, Field
from pydantic.dataclasses import dataclass

from evaluator.data import REGISTRY_CHOICES, TOOLS_FORMATS
from evaluator.data.beir import DEFAULT_SPLIT
from evaluator.retrieval.backends import BACKENDS, PRECISIONS
from evaluator.retrieval.bundled import MINILM

# The choices of each setting, declared once (the config file, the flags' `choices` and the checks use these).
if TYPE_CHECKING:  # a Literal built from the tables is no type to a static checker: it sees strings
    Backend: TypeAlias = str
    Precision: TypeAlias = str
    ToolsFormat: TypeAlias = str
    RegistryChoice: TypeAlias = str
else:  # pydantic checks the choices
    Backend = Literal[("auto", *BACKENDS)]  # auto: see evaluator/retrieval/embed.py AUTO_CPU
    Precision = Literal[("auto", *dict.fromkeys(p for ps in PRECISIONS.values() for p in ps))]
    ToolsFormat = Literal[TOOLS_FORMATS]  # auto: detected per file
    RegistryChoice = Literal[REGISTRY_CHOICES]  # full: every API; described: only those with a description
# --archs: the built-in architectures, or a plugin `path/file.py:Class` / `module:Class`. The one list of the
# built-ins' names (the registry): `study.archs` makes each from the class of that `name`; the help and every
# message list them from here.
ARCHS: tuple[str, ...] = ("rtp", "ptr", "hyde", "rewrite", "fusion", "route")


def _arch_spec(v: str) -> str:
    """A built-in's name or a plugin spec (its import and protocol are checked before the study: study.archs)."""
    target, sep, cls = v.rpartition(":")
    if v in ARCHS or (sep and target and cls.isidentifier()):
        return v
    raise ValueError(f"must be one of {', '.join(ARCHS)}, or a plugin path/to/file.py:ClassName or "
                     "package.module:ClassName")


Arch = Annotated[str, AfterValidator(_arch_spec)]


def _split_name(v: str) -> str:
    """A BEIR split: the stem of one file of the folder's qrels/ (test, dev, train)."""
    if not v.strip() or any(c in v for c in "/\\"):
        raise ValueError("must name a split of the BEIR folder's qrels/ (test, dev, train, ...), without '/'")
    return v


Split = Annotated[str, AfterValidator(_split_name)]
RetrieverChoice = Literal["dense", "bm25", "hybrid"]  # evaluator/retrieval/retrievers.py
BACKEND_CHOICES: tuple[str, ...] = get_args(Backend)
PRECISION_CHOICES: tuple[str, ...] = get_args(Precision)
TOOLS_FORMAT_CHOICES: tuple[str, ...] = get_args(ToolsFormat)
RETRIEVER_CHOICES: tuple[str, ...] = get_args(RetrieverChoice)
AtLeast1 = Annotated[int, Field(ge=1)]
# Upper bounds of the counts a user gives (one line past them, `core.validation`): each keeps the study's memory and
# files bounded, far beyond the paper's values (k 5, ks up to 20, 4 runs). A record keeps K_MAX = max(k, ks) ids
# per searched text, so the ablation's depth bounds queries.jsonl; the runs multiply every call.
MAX_K = 100
MAX_KS = 32  # values of the ablation
MAX_RUNS = 1_000
MAX_BATCH = 4_096  # texts per embedding batch (batches are also cut at 8,192 padded tokens)
MAX_SIZES = 32  # sub-registry sizes of the scaling study
MAX_SEEDS = 100  # distractor draws per size
MAX_FOLDS = 100
KBudget = Annotated[int, Field(ge=1, le=MAX_K)]
RegistrySize = Annotated[int, Field(ge=1, le=100_000_000)]

# Lists are tuples: a frozen section holds no value that could be changed in place. TOML and argparse
# give lists; `core.validation` checks them as lists and the section stores them as tuples.


@dataclass(frozen=True)
class DataSettings:
    """[data]: where the registry and the queries come from, and which of them."""

    dir: str = "../shared/toolbench"
    registry: RegistryChoice = "full"
    subsets: tuple[str, ...] = ()
    limit: int = Field(default=0, ge=0)  # 0: all
    tools: str = ""  # a registry file or folder in any supported format (else the data folder's)
    queries: tuple[str, ...] = ()  # query files or folders (else the data folder's)
    tools_format: ToolsFormat = "auto"
    # A BEIR folder (data.beir): the split whose qrels judge the queries, and the query field naming each query's
    # subset (dotted: "metadata.subset"; "" = one subset named after the folder). Saved only when not the default,
    # so the settings of a study of other data read as they did before these existed.
    split: Split = Field(default=DEFAULT_SPLIT, exclude_if=lambda v: v == DEFAULT_SPLIT)
    subset_field: str = Field(default="", exclude_if=lambda v: not v)


@dataclass(frozen=True)
class EmbedSettings:
    """[embed]: the embedding model and how it runs."""

    model: str = MINILM
    device: str = "auto"
    precision: Precision = "auto"
    backend: Backend = "auto"
    batch_size: int = Field(default=128, ge=1, le=MAX_BATCH)


@dataclass(frozen=True)
class RetrievalSettings:
    """[retrieval]: the planner's budget, the k-ablation and what every architecture searches with."""

    k: int = Field(default=5, ge=1, le=MAX_K)
    ks: tuple[KBudget, ...] = Field(default=(1, 3, 5, 10, 20), max_length=MAX_KS)
    fallback_to_query: bool = False
    retriever: RetrieverChoice = "dense"

    @property
    def k_max(self) -> int:
        """The deepest list any budget reads (the searches keep this many)."""
        return max([self.k, *self.ks])


_BOTH: tuple[str, ...] = ("rtp", "ptr")
# An architecture's own time on one query: far above any built-in's (milliseconds) or a sane plugin's, short of
# a study that waits forever on one that hangs.
ARCH_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class RunSettings:
    """[run]: the models, runs and architectures of the study, and where its files go."""

    models: tuple[str, ...] = ("sim",)
    runs: int = Field(default=4, ge=1, le=MAX_RUNS)
    archs: tuple[Arch, ...] = Field(default=_BOTH, min_length=1)
    # route's τ on RtP's top-1 score; None: the median of the study's top-1 scores (study/archs/route.py)
    route_tau: float | None = Field(default=None, allow_inf_nan=False, exclude_if=lambda v: v is None)
    # An architecture's own time on one query (its `retrieve`, outside the model calls, searches and other
    # architectures' outcomes it waits on), seconds; past it the query's block is a `timeout` (study/runner.py).
    arch_timeout_s: float = Field(default=ARCH_TIMEOUT_S, gt=0, le=86_400, allow_inf_nan=False)
    cache_dir: str = "cache"
    out: str = ""


@dataclass(frozen=True)
class AnalysisSettings:
    """[analysis]: subset names or prefixes (empty = derived from the subsets present, see
    `settings.subsets.analysis_subsets`), routing's folds and seed, scaling's sizes and draws."""

    routing_train: tuple[str, ...] = ()
    routing_test: tuple[str, ...] = ()
    routing_folds: int = Field(default=5, ge=2, le=MAX_FOLDS)
    routing_seed: int = 0
    scaling_subsets: tuple[str, ...] = ()
    scaling_sizes: tuple[RegistrySize, ...] = Field(default=(1000, 2000, 5000, 10000, 20000), max_length=MAX_SIZES)
    scaling_seeds: int = Field(default=5, ge=1, le=MAX_SEEDS)
    divergence_subset: str = ""


@dataclass(frozen=True)
class Settings:
    """The study's settings, one section per TOML table: what meta.json saves (no per-invocation options)."""

    data: DataSettings = field(default_factory=DataSettings)
    embed: EmbedSettings = field(default_factory=EmbedSettings)
    retrieval: RetrievalSettings = field(default_factory=RetrievalSettings)
    run: RunSettings = field(default_factory=RunSettings)
    analysis: AnalysisSettings = field(default_factory=AnalysisSettings)


@dataclass(frozen=True)
class Fitted:
    """A setting the study changed to fit its data (meta.json `fitted`, by dotted name): what the
    config asked for, what the study used, and why."""

    asked: tuple[int, ...]
    used: tuple[int, ...]
    why: str
