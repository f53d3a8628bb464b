"""Model profiles: `configs/models/<name>.toml` -> `ModelProfile`, plus the key lookup.

A profile never holds the API key itself, only the name of the environment variable that does,
so profiles can be logged and written into `meta.json` as they are.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

MODELS_DIR = Path(__file__).resolve().parents[2] / "configs" / "models"


@dataclass(frozen=True)
class ModelProfile:
    """Everything needed to talk to one model; see `configs/models/*.toml` for each field's meaning."""

    name: str
    model: str
    base_url: str
    api_key_env: str | None = None
    concurrency: int = 16
    rpm: float | None = None
    tpm: float | None = None
    timeout_s: float = 60.0
    max_retries: int = 6
    max_tokens: int | None = None
    temperature: float = 0.0
    extra_body: dict[str, Any] = field(default_factory=dict)
    simulated: bool = False
    api_key_required: bool = True
    truncation_retries: int = 1
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    max_wait_s: float = 120.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy for `meta.json` (no secret can be in it: the key lives in the env)."""
        return dataclasses.asdict(self)


_FIELDS = {f.name for f in dataclasses.fields(ModelProfile)}
# Keys a TOML file may carry that are resolved here rather than copied onto the profile.
_LOADER_KEYS = {"base_url_env", "model_env"}


def available_profiles(models_dir: Path = MODELS_DIR) -> list[str]:
    return sorted(p.stem for p in models_dir.glob("*.toml"))


def _profile_path(name: str, models_dir: Path) -> Path:
    as_path = Path(name)
    if as_path.suffix == ".toml" and as_path.is_file():
        return as_path
    path = models_dir / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(available_profiles(models_dir)) or "none"
        raise ConfigError(
            f"unknown model {name!r}: no profile {path} (known: {known}); "
            f"add configs/models/{name}.toml or pass a path to a .toml profile"
        )
    return path


def load_profile(
    name: str,
    *,
    base_url: str | None = None,
    models_dir: Path = MODELS_DIR,
    env: Mapping[str, str] | None = None,
    require_key: bool = True,
    **overrides: Any,
) -> ModelProfile:
    """Load and validate a profile by name (or path to a .toml).

    `base_url` (the CLI's `--base-url`) beats the profile's `base_url_env`, which beats its `base_url`.
    `overrides` replace profile fields (e.g. `rpm=`, `concurrency=` from flags; None values are ignored).
    With `require_key`, a required key missing from the environment is a `ConfigError` now, not a 401 later.
    """
    env = os.environ if env is None else env
    path = _profile_path(name, models_dir)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read model profile {path}: {e}") from e

    unknown = set(raw) - _FIELDS - _LOADER_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown field(s) {sorted(unknown)}; known: {sorted(_FIELDS)}")
    raw.setdefault("name", path.stem)
    if raw.get("model_env") and env.get(raw["model_env"]):
        raw["model"] = env[raw["model_env"]]
    if raw.get("base_url_env") and env.get(raw["base_url_env"]):
        raw["base_url"] = env[raw["base_url_env"]]
    for k in _LOADER_KEYS:
        raw.pop(k, None)
    if base_url:
        raw["base_url"] = base_url
    raw.update({k: v for k, v in overrides.items() if v is not None})
    if "model" not in raw:
        raise ConfigError(f"{path}: 'model' (the provider's model id) is required")
    raw["base_url"] = str(raw.get("base_url") or "").rstrip("/")
    try:
        profile = ModelProfile(**raw)
    except TypeError as e:
        raise ConfigError(f"{path}: {e}") from e
    _validate(profile, path)
    if require_key:
        resolve_api_key(profile, env)
    return profile


def _validate(p: ModelProfile, path: Path) -> None:
    if not p.base_url and not p.simulated:
        raise ConfigError(f"{path}: no base_url; set it in the profile, its base_url_env, or pass --base-url")
    if p.base_url and not p.base_url.startswith(("http://", "https://")):
        raise ConfigError(f"{path}: base_url {p.base_url!r} must start with http:// or https://")
    if p.concurrency < 1 or p.max_retries < 0 or p.timeout_s <= 0:
        raise ConfigError(f"{path}: concurrency >= 1, max_retries >= 0 and timeout_s > 0 are required")
    for lim in ("rpm", "tpm"):
        v = getattr(p, lim)
        if v is not None and v <= 0:
            raise ConfigError(f"{path}: {lim} must be > 0 (omit it for no limit)")


def resolve_api_key(profile: ModelProfile, env: Mapping[str, str] | None = None) -> str | None:
    """The key from the profile's env var; `ConfigError` naming the variable if required and unset."""
    env = os.environ if env is None else env
    if not profile.api_key_env:
        return None
    key = env.get(profile.api_key_env, "").strip() or None
    if key is None and profile.api_key_required and not profile.simulated:
        raise ConfigError(
            f"model {profile.name!r} needs an API key: set {profile.api_key_env} "
            f"(e.g. `export {profile.api_key_env}=...`) before running"
        )
    return key
