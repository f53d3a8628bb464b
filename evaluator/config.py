"""Settings: `configs/default.toml` (every default) overridden by command-line flags."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO_ROOT / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "default.toml"


class ConfigError(Exception):
    """A setting is wrong; the message says which and what to do."""


@dataclass
class Settings:
    data_dir: str = "../shared/toolbench"
    registry: str = "full"
    subsets: list[str] = field(default_factory=list)
    limit: int = 0
    embedder: str = "bundled:all-MiniLM-L6-v2"
    device: str = "auto"
    precision: str = "auto"
    batch_size: int = 128
    k: int = 5
    ks: list[int] = field(default_factory=lambda: [1, 3, 5, 10, 20])
    fallback_to_query: bool = False
    models: list[str] = field(default_factory=lambda: ["sim"])
    runs: int = 4
    archs: list[str] = field(default_factory=lambda: ["rtp", "ptr"])
    cache_dir: str = "cache"
    out: str = ""
    data_from_cli: bool = False  # --data or EVALUATOR_DATA must exist; the config's path may fall back

    @property
    def k_max(self) -> int:
        return max([self.k, *self.ks])

    def resolve_path(self, value: str) -> Path:
        """A relative path from the current directory if it exists there, else from the repository root."""
        p = Path(value).expanduser()
        if p.is_absolute() or (Path.cwd() / p).exists():
            return p
        return REPO_ROOT / p


_SECTIONS = {
    "data": {"dir": "data_dir", "registry": "registry", "subsets": "subsets", "limit": "limit"},
    "embed": {"model": "embedder", "device": "device", "precision": "precision", "batch_size": "batch_size"},
    "retrieval": {"k": "k", "ks": "ks", "fallback_to_query": "fallback_to_query"},
    "run": {"models": "models", "runs": "runs", "archs": "archs", "cache_dir": "cache_dir", "out": "out"},
}


def load_settings(path: Path | None = None) -> Settings:
    path = path or DEFAULT_CONFIG
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the config ({e}).") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML ({e}).") from None
    s = Settings()
    for section, values in raw.items():
        names = _SECTIONS.get(section)
        if names is None or not isinstance(values, dict):
            raise ConfigError(f"{path}: unknown section [{section}]; known: {', '.join(_SECTIONS)}.")
        for key, value in values.items():
            if key not in names:
                raise ConfigError(f"{path}: unknown key {key!r} in [{section}]; known: {', '.join(names)}.")
            expected = type(getattr(s, names[key]))
            if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
                raise ConfigError(f"{path}: [{section}] {key} must be a {expected.__name__}, not {value!r}.")
            setattr(s, names[key], value)
    validate(s)
    return s


def validate(s: Settings) -> None:
    if s.registry not in ("full", "described"):
        raise ConfigError(f"registry must be 'full' or 'described', not {s.registry!r}.")
    if s.k < 1 or any(k < 1 for k in s.ks):
        raise ConfigError("k and every value of ks must be at least 1.")
    if s.runs < 1:
        raise ConfigError("runs must be at least 1.")
    bad = [a for a in s.archs if a not in ("rtp", "ptr")]
    if bad or not s.archs:
        raise ConfigError(f"archs must be a non-empty subset of rtp, ptr (got {s.archs}).")
    if s.limit < 0:
        raise ConfigError("limit must be 0 (all) or positive.")
