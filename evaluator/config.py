"""Settings: `configs/default.toml` (every default) overridden by command-line flags, typed and checked.

A wrong type, an unknown key or an impossible value is one `ConfigError` naming the file (or flag),
the key and what is expected — before any work starts.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .data import TOOLS_FORMATS
from .llm.errors import ConfigError  # one ConfigError for settings and model profiles

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO_ROOT / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "default.toml"

__all__ = ["ConfigError", "Settings", "ProfileOverrides", "load_settings", "validate", "match_subsets",
           "analysis_subsets"]


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
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass
class Settings:
    # [data]
    data_dir: str = "../shared/toolbench"
    registry: str = "full"
    subsets: list[str] = field(default_factory=list)
    limit: int = 0
    tools: str = ""  # a registry file or folder in any supported format (else the data folder's)
    queries: list[str] = field(default_factory=list)  # query files or folders (else the data folder's)
    tools_format: str = "auto"  # auto (detected per file), jsonl, toolbench, mcp, openai
    # [embed]
    embedder: str = "bundled:all-MiniLM-L6-v2"
    device: str = "auto"
    precision: str = "auto"
    backend: str = "auto"  # torch, onnx, openvino; auto: see evaluator/embed.py AUTO_CPU
    batch_size: int = 128
    # [retrieval]
    k: int = 5
    ks: list[int] = field(default_factory=lambda: [1, 3, 5, 10, 20])
    fallback_to_query: bool = False
    # [run]
    models: list[str] = field(default_factory=lambda: ["sim"])
    runs: int = 4
    archs: list[str] = field(default_factory=lambda: ["rtp", "ptr"])
    cache_dir: str = "cache"
    out: str = ""
    # [analysis] subset names or prefixes; empty = derived from the subsets present (see analysis_subsets)
    routing_train: list[str] = field(default_factory=list)
    routing_test: list[str] = field(default_factory=list)
    routing_folds: int = 5
    routing_seed: int = 0
    scaling_subsets: list[str] = field(default_factory=list)
    scaling_sizes: list[int] = field(default_factory=lambda: [1000, 2000, 5000, 10000, 20000])
    scaling_seeds: int = 5
    divergence_subset: str = ""
    # not in the file: command line only
    data_from_cli: bool = False  # --data or EVALUATOR_DATA must exist; the config's path may fall back
    extras: bool = True  # the scaling and routing studies after a full run
    batch: str | None = None  # --batch: "submit" through the profiles' batch APIs; --batch-cancel: "cancel"
    overrides: ProfileOverrides = field(default_factory=ProfileOverrides)
    cli_keys: set[str] = field(default_factory=set)  # settings given as flags (not from the file)

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
        """The settings as written into meta.json (command-line-only plumbing left out)."""
        d = dataclasses.asdict(self)
        for key in ("data_from_cli", "overrides", "extras", "cli_keys", "batch"):
            d.pop(key)
        return d


SECTIONS: dict[str, dict[str, str]] = {
    "data": {"dir": "data_dir", "registry": "registry", "subsets": "subsets", "limit": "limit", "tools": "tools",
             "queries": "queries", "tools_format": "tools_format"},
    "embed": {"model": "embedder", "device": "device", "precision": "precision", "backend": "backend",
              "batch_size": "batch_size"},
    "retrieval": {"k": "k", "ks": "ks", "fallback_to_query": "fallback_to_query"},
    "run": {"models": "models", "runs": "runs", "archs": "archs", "cache_dir": "cache_dir", "out": "out"},
    "analysis": {"routing_train": "routing_train", "routing_test": "routing_test", "routing_folds": "routing_folds",
                 "routing_seed": "routing_seed", "scaling_subsets": "scaling_subsets",
                 "scaling_sizes": "scaling_sizes", "scaling_seeds": "scaling_seeds",
                 "divergence_subset": "divergence_subset"},
}
_HINTS = typing.get_type_hints(Settings)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}s"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp) if a is not type(None))
    return {"str": "string", "int": "integer", "float": "number", "bool": "boolean (true/false)"}.get(
        getattr(tp, "__name__", str(tp)), str(tp))


def check_type(value: Any, tp: Any) -> bool:
    """`value` (from TOML) fits the annotation `tp`; bools are not integers and integers are numbers."""
    origin = typing.get_origin(tp)
    if origin is list:
        (item,) = typing.get_args(tp)
        return isinstance(value, list) and all(check_type(v, item) for v in value)
    if origin in (typing.Union, types.UnionType):
        return any(check_type(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, tp)


def load_settings(path: Path | None = None) -> Settings:
    path = path or DEFAULT_CONFIG
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the config ({e.strerror or e}); pass a readable --config FILE.") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: invalid TOML ({e}).") from None
    s = Settings()
    for section, values in raw.items():
        names = SECTIONS.get(section)
        if names is None or not isinstance(values, dict):
            raise ConfigError(f"{path}: unknown section [{section}]; known: {', '.join(SECTIONS)}.")
        for key, value in values.items():
            if key not in names:
                raise ConfigError(f"{path}: unknown key {key!r} in [{section}]; known: {', '.join(names)}.")
            tp = _HINTS[names[key]]
            if not check_type(value, tp):
                raise ConfigError(f"{path}: [{section}] {key} must be a {_type_name(tp)}, not {value!r}.")
            if tp is float:
                value = float(value)
            setattr(s, names[key], value)
    validate(s, where=f"{path}: ")
    return s


def validate(s: Settings, where: str = "") -> None:
    """Impossible values; `where` prefixes the message (the file, or nothing for flags)."""
    def bad(msg: str) -> None:
        raise ConfigError(f"{where}{msg}")

    if s.registry not in ("full", "described"):
        bad(f"registry must be 'full' or 'described', not {s.registry!r}.")
    if s.tools_format not in TOOLS_FORMATS:
        bad(f"tools_format (--tools-format) must be one of {', '.join(TOOLS_FORMATS)}, not {s.tools_format!r}.")
    if s.k < 1 or any(k < 1 for k in s.ks):
        bad("k (--k) and every value of ks (--ks) must be at least 1.")
    if s.runs < 1:
        bad("runs (--runs) must be at least 1.")
    wrong = [a for a in s.archs if a not in ("rtp", "ptr")]
    if wrong or not s.archs:
        bad(f"archs (--archs) must be a non-empty subset of rtp, ptr (got {s.archs}).")
    if s.limit < 0:
        bad("limit (--limit) must be 0 (all) or positive.")
    if s.batch_size < 1:
        bad("embed batch_size must be at least 1.")
    if s.precision not in ("auto", "fp32", "bf16", "fp16", "int8"):
        bad(f"precision must be one of auto, fp32, bf16, fp16, int8, not {s.precision!r}.")
    if s.backend not in ("auto", "torch", "onnx", "openvino"):
        bad(f"embed backend (--backend) must be one of auto, torch, onnx, openvino, not {s.backend!r}.")
    if s.routing_folds < 2:
        bad("analysis routing_folds must be at least 2.")
    if s.scaling_seeds < 1 or any(n < 1 for n in s.scaling_sizes):
        bad("analysis scaling_seeds and every scaling_sizes value must be at least 1.")
    o = s.overrides
    for name in ("concurrency", "max_tokens"):
        v = getattr(o, name)
        if v is not None and v < 1:
            bad(f"--{name.replace('_', '-')} must be at least 1, not {v}.")
    for name, flag in (("rpm", "--rpm"), ("tpm", "--tpm"), ("timeout_s", "--timeout")):
        v = getattr(o, name)
        if v is not None and not v > 0:
            bad(f"{flag} must be above 0, not {v}.")


# ---------------------------------------------------------------- subsets for the analyses


def match_subsets(available: list[str], wanted: list[str], what: str) -> list[str]:
    """`wanted` holds subset names or prefixes (`G1` matches `G1_instruction`), as on the run's CLI."""
    out: list[str] = []
    for w in wanted:
        hit = [s for s in available if s == w] or [s for s in available if s.startswith(w)]
        if not hit:
            raise ConfigError(f"{what}: subset {w!r} is not in this run; it has {', '.join(available) or 'none'}.")
        out += [s for s in hit if s not in out]
    return out


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
