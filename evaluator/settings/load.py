"""Settings: `configs/default.toml` (every default) overridden by command-line flags, typed and checked.

A wrong type, an unknown key or an impossible value is one `ConfigError` naming the file (or flag),
the key and what is expected — before any work starts.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias, get_args

from pydantic import AfterValidator, Field, TypeAdapter
from pydantic.dataclasses import dataclass

from evaluator import data
from evaluator.core.errors import ConfigError  # one ConfigError for settings and model profiles
from evaluator.core.validation import check_values, checked
from evaluator.data import TOOLS_FORMATS
from evaluator.llm.engine import STOP_GRACE_S
from evaluator.llm.profiles import ModelProfile
from evaluator.retrieval.backends import BACKENDS, PRECISIONS

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO_ROOT / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "default.toml"

__all__ = ["ConfigError", "Settings", "ProfileOverrides", "load_settings", "validate", "match_subsets",
           "analysis_subsets"]

# The choices of each setting, declared once (the config file, the flags' `choices` and the checks use these).
if TYPE_CHECKING:  # a Literal built from the tables is no type to a static checker: it sees strings
    Backend: TypeAlias = str
    Precision: TypeAlias = str
    ToolsFormat: TypeAlias = str
else:  # pydantic checks the choices
    Backend = Literal[("auto", *BACKENDS)]  # auto: see evaluator/retrieval/embed.py AUTO_CPU
    Precision = Literal[("auto", *dict.fromkeys(p for ps in PRECISIONS.values() for p in ps))]
    ToolsFormat = Literal[TOOLS_FORMATS]  # auto: detected per file
RegistryChoice = Literal["full", "described"]
# --archs: the built-in architectures (evaluator/study/archs/), or a plugin `path/file.py:Class` / `module:Class`
ARCHS: tuple[str, ...] = ("rtp", "ptr", "hyde", "rewrite", "fusion", "route")


def _arch_spec(v: str) -> str:
    """A built-in's name or a plugin spec (its import and protocol are checked before the run: study.archs)."""
    target, sep, cls = v.rpartition(":")
    if v in ARCHS or (sep and target and cls.isidentifier()):
        return v
    raise ValueError(f"must be one of {', '.join(ARCHS)}, or a plugin path/to/file.py:ClassName or "
                     "package.module:ClassName")


Arch = Annotated[str, AfterValidator(_arch_spec)]
RetrieverChoice = Literal["dense", "bm25", "hybrid"]  # evaluator/retrieval/retrievers.py
# --batch-fallback: requests the batch API did not answer stop the run, or go online at the online price
BATCH_FALLBACKS = ("stop", "online")
BatchFallback = Literal[BATCH_FALLBACKS]  # type: ignore[valid-type]
BACKEND_CHOICES: tuple[str, ...] = get_args(Backend)
PRECISION_CHOICES: tuple[str, ...] = get_args(Precision)
TOOLS_FORMAT_CHOICES: tuple[str, ...] = get_args(ToolsFormat)
REGISTRY_CHOICES: tuple[str, ...] = get_args(RegistryChoice)
RETRIEVER_CHOICES: tuple[str, ...] = get_args(RetrieverChoice)
AtLeast1 = Annotated[int, Field(ge=1)]


@dataclass
class ProfileOverrides:
    """Flags that replace a model profile's request settings for this invocation (None = keep the profile's)."""

    base_url: str | None = None
    concurrency: int | None = None
    rpm: float | None = None
    tpm: float | None = None
    max_tokens: int | None = None
    timeout_s: float | None = None

    def as_kwargs(self) -> dict[str, Any]:
        """The flags given; their types and ranges are the profile's (`ModelProfile`), checked in `validate`."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


_BOTH: list[str] = ["rtp", "ptr"]

@dataclass
class Settings:
    # [data]
    data_dir: str = "../shared/toolbench"
    registry: RegistryChoice = "full"
    subsets: list[str] = field(default_factory=list)
    limit: int = Field(default=0, ge=0)  # 0: all
    tools: str = ""  # a registry file or folder in any supported format (else the data folder's)
    queries: list[str] = field(default_factory=list)  # query files or folders (else the data folder's)
    tools_format: ToolsFormat = "auto"
    # [embed]
    embedder: str = "bundled:all-MiniLM-L6-v2"
    device: str = "auto"
    precision: Precision = "auto"
    backend: Backend = "auto"
    batch_size: int = Field(default=128, ge=1)
    # [retrieval]
    k: int = Field(default=5, ge=1)
    ks: list[AtLeast1] = field(default_factory=lambda: [1, 3, 5, 10, 20])
    fallback_to_query: bool = False
    retriever: RetrieverChoice = "dense"
    # [run]
    models: list[str] = field(default_factory=lambda: ["sim"])
    runs: int = Field(default=4, ge=1)
    archs: list[Arch] = Field(default_factory=lambda: list(_BOTH), min_length=1)
    # route's τ on RtP's top-1 score; None: the median of the study's top-1 scores (study/archs/route.py)
    route_tau: float | None = Field(default=None, allow_inf_nan=False, exclude_if=lambda v: v is None)
    cache_dir: str = "cache"
    out: str = ""
    # --budget: the most this invocation may spend (USD, online prices)
    budget_usd: float | None = Field(default=None, ge=0, allow_inf_nan=False, exclude=True)
    # --rate-dir: share RPM/TPM pacing with other processes here (else the cache folder)
    rate_dir: str = Field(default="", exclude=True)
    # --batch-fallback: requests the batch API did not answer stop the run ("stop") or go online ("online")
    batch_fallback: BatchFallback = Field(default="stop", exclude=True)
    # --stop-grace: seconds a call on the wire at a stop signal (SIGTERM, SIGHUP, Ctrl-C) gets to arrive and be cached
    stop_grace_s: float = Field(default=STOP_GRACE_S, ge=0, le=600, exclude=True)
    # [analysis] subset names or prefixes; empty = derived from the subsets present (see analysis_subsets)
    routing_train: list[str] = field(default_factory=list)
    routing_test: list[str] = field(default_factory=list)
    routing_folds: int = Field(default=5, ge=2)
    routing_seed: int = 0
    scaling_subsets: list[str] = field(default_factory=list)
    scaling_sizes: list[AtLeast1] = field(default_factory=lambda: [1000, 2000, 5000, 10000, 20000])
    scaling_seeds: int = Field(default=5, ge=1)
    divergence_subset: str = ""
    # not in the file: command line only, and not in meta.json (excluded)
    data_from_cli: bool = Field(default=False, exclude=True)  # --data or EVALUATOR_DATA must exist; else may fall back
    extras: bool = Field(default=True, exclude=True)  # the scaling and routing studies after a full run
    # --batch: "submit" through the profiles' batch APIs; --batch-cancel: "cancel"
    batch: Literal["submit", "cancel"] | None = Field(default=None, exclude=True)
    dry_run: bool = Field(default=False, exclude=True)  # --dry-run: plan the calls, tokens, cost and time; send nothing
    overrides: ProfileOverrides = Field(default_factory=ProfileOverrides, exclude=True)
    cli_keys: set[str] = Field(default_factory=set, exclude=True)  # settings given as flags (not from the file)

    @property
    def k_max(self) -> int:
        return max([self.k, *self.ks])

    def resolve_path(self, value: str) -> Path:
        """A relative path from the current directory if it exists there, else from the repository root."""
        p = Path(value).expanduser()
        if p.is_absolute() or (Path.cwd() / p).exists():
            return p
        return REPO_ROOT / p

    def study_dict(self) -> dict[str, Any]:
        """The settings as written into meta.json (command-line-only plumbing, `exclude=True`, left out)."""
        return _SETTINGS.dump_python(self, mode="json")


_SETTINGS: TypeAdapter[Settings] = TypeAdapter(Settings)


SECTIONS: dict[str, dict[str, str]] = {
    "data": {"dir": "data_dir", "registry": "registry", "subsets": "subsets", "limit": "limit", "tools": "tools",
             "queries": "queries", "tools_format": "tools_format"},
    "embed": {"model": "embedder", "device": "device", "precision": "precision", "backend": "backend",
              "batch_size": "batch_size"},
    "retrieval": {"k": "k", "ks": "ks", "fallback_to_query": "fallback_to_query", "retriever": "retriever"},
    "run": {"models": "models", "runs": "runs", "archs": "archs", "route_tau": "route_tau", "cache_dir": "cache_dir", "out": "out",
            "budget_usd": "budget_usd", "rate_dir": "rate_dir", "batch_fallback": "batch_fallback",
            "stop_grace_s": "stop_grace_s"},
    "analysis": {"routing_train": "routing_train", "routing_test": "routing_test", "routing_folds": "routing_folds",
                 "routing_seed": "routing_seed", "scaling_subsets": "scaling_subsets",
                 "scaling_sizes": "scaling_sizes", "scaling_seeds": "scaling_seeds",
                 "divergence_subset": "divergence_subset"},
}
# flags whose name is not the setting's (`--k` for k, `--tools-format` for tools_format, ...)
FLAGS = {"models": "--model", "stop_grace_s": "--stop-grace", "timeout_s": "--timeout", "budget_usd": "--budget", "scaling_sizes": "--sizes",
         "scaling_seeds": "--seeds", "scaling_subsets": "--subsets", "routing_train": "--train",
         "routing_test": "--test", "routing_folds": "--folds", "routing_seed": "--seed"}


def flag(name: str) -> str:
    return FLAGS.get(name) or "--" + name.replace("_", "-")


def load_settings(path: Path | None = None) -> Settings:
    path = path or DEFAULT_CONFIG
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the config ({e.strerror or e}); pass a readable --config FILE.") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: invalid TOML ({e}).") from None
    values: dict[str, Any] = {}
    labels: dict[str, str] = {}  # setting -> how the file names it
    for section, given in raw.items():
        names = SECTIONS.get(section)
        if names is None or not isinstance(given, dict):
            raise ConfigError(f"{path}: unknown section [{section}]; known: {', '.join(SECTIONS)}.")
        for key, value in given.items():
            if key not in names:
                raise ConfigError(f"{path}: unknown key {key!r} in [{section}]; known: {', '.join(names)}.")
            values[names[key]] = value
            labels[names[key]] = f"[{section}] {key} ="
    return checked(Settings, values, f"{path}: ", labels.__getitem__)


def validate(s: Settings, where: str = "") -> None:
    """Every setting and profile flag against its declared type and range, after flags were set;
    `where` prefixes the message (nothing for flags: the message names the flag)."""
    names = [f.name for f in dataclasses.fields(s)]
    check_values(Settings, {k: getattr(s, k) for k in names if k != "overrides"}, where, flag)
    check_values(ModelProfile, s.overrides.as_kwargs(), where, flag)


# ---------------------------------------------------------------- subsets for the analyses


def match_subsets(available: list[str], wanted: list[str], what: str) -> list[str]:
    """`wanted` holds subset names or prefixes, as on the run's CLI (`data.match_subsets`, the one rule)."""
    return data.match_subsets(available, wanted, lambda w: ConfigError(
        f"{what}: subset {w!r} is not in this run; it has {', '.join(available) or 'none'}."))


@dataclass
class AnalysisSubsets:
    routing_train: list[str]
    routing_test: list[str]
    scaling: list[str]
    divergence: str


def analysis_subsets(s: Settings, available: list[str]) -> AnalysisSubsets:
    """The subsets each analysis uses, as full names. Rule for what is not set: subsets in sorted
    order; routing's held-out test set is the last one and the others tune τ (none with one subset);
    scaling uses every subset but that last one (all of them when there are fewer than three);
    Div% is reported for the first scaling subset. On ToolBench's G1/G2/G3 this is the paper's
    choice: G1+G2 → G3, scaling on G1 and G2."""
    subs = sorted(available)
    test = match_subsets(subs, s.routing_test, "analysis routing_test") if s.routing_test else subs[-1:]
    if s.routing_train:
        train = match_subsets(subs, s.routing_train, "analysis routing_train")
    else:
        train = [x for x in subs if x not in test]
    if len(subs) < 2 and not s.routing_test:
        train, test = [], []
    scaling = (match_subsets(subs, s.scaling_subsets, "analysis scaling_subsets") if s.scaling_subsets
               else subs[:-1] if len(subs) >= 3 else subs)
    if s.divergence_subset:
        div = match_subsets(subs, [s.divergence_subset], "analysis divergence_subset")[0]
    else:
        div = scaling[0] if scaling else ""
    return AnalysisSubsets(train, test, scaling, div)
