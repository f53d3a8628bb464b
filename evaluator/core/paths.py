"""The repository's own places, computed once here: its root, `configs/` (the default settings, the model
profiles, the provider table) and `examples/`.

Where a path in the settings is read from: a relative one from the current directory if it exists
there, else from the repository root (`configs/default.toml`'s rule, for every path setting)."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO_ROOT / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "default.toml"
MODELS_DIR = CONFIG_DIR / "models"  # the bundled model profiles (llm.profiles)
PROVIDERS_FILE = CONFIG_DIR / "providers.toml"  # the provider table (llm.catalog)
EXAMPLES_DIR = REPO_ROOT / "examples"


def resolve_path(value: str) -> Path:
    """A relative path from the current directory if it exists there, else from the repository root."""
    p = Path(value).expanduser()
    if p.is_absolute() or (Path.cwd() / p).exists():
        return p
    return REPO_ROOT / p
