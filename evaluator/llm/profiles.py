"""Model profiles: `configs/models/<name>.toml` -> `ModelProfile`, plus the key lookup.

A profile never holds the API key itself, only the name of the environment variable that does,
so profiles can be logged and written into `meta.json` as they are.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

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
    # Concurrency: fixed at `concurrency`, or adaptive (AIMD) up to it for servers of unknown capacity.
    adaptive_concurrency: bool = False
    # How each prompt's JSON schema is sent: "json_schema", "json_object", "json_object_schema"
    # ({"type": "json_object", "schema": ...}, llama-cpp-python) or "none" (not at all).
    structured: str = "none"
    # Provider batch API and prices (used by the batch/request-file commands; never in the cache key).
    batch: str | None = None  # "openai" | "gemini"
    batch_max_requests: int | None = None
    batch_max_bytes: int | None = None
    price_input_per_mtok: float | None = None  # USD per 1M prompt tokens
    price_output_per_mtok: float | None = None  # USD per 1M completion tokens
    batch_discount: float | None = None  # share off the online price for batch (0.5 = half price)

    def request_settings(self) -> dict[str, Any]:
        """Every setting that shapes requests or their pacing, for `meta.json`.

        That is every field: the profile holds only the *name* of the key's environment variable,
        never the key, so nothing here is secret.
        """
        return dataclasses.asdict(self)


_FIELDS = {f.name for f in dataclasses.fields(ModelProfile)}
_HINTS = typing.get_type_hints(ModelProfile)
STRUCTURED = ("json_schema", "json_object", "json_object_schema", "none")
BATCH_APIS = ("openai", "gemini")
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
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read model profile {path}: {e}") from None

    unknown = set(raw) - _FIELDS - _LOADER_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown field(s) {sorted(unknown)}; known: {sorted(_FIELDS | _LOADER_KEYS)}")
    for k, v in raw.items():
        _check_type(k, v, str(path))
    raw.setdefault("name", path.stem)
    if raw.get("model_env") and env.get(raw["model_env"]):
        raw["model"] = env[raw["model_env"]]
    if raw.get("base_url_env") and env.get(raw["base_url_env"]):
        raw["base_url"] = env[raw["base_url_env"]]
    for k in _LOADER_KEYS:
        raw.pop(k, None)
    if base_url:
        raw["base_url"] = base_url
    given = {k: v for k, v in overrides.items() if v is not None}
    for k, v in given.items():
        if k not in _FIELDS:
            raise ConfigError(f"unknown model profile setting {k!r} (from the command line); known: {sorted(_FIELDS)}")
        _check_type(k, v, "command line")
    raw.update(given)
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


_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "a table"}
_LOADER_TYPES: dict[str, Any] = {"base_url_env": str, "model_env": str}


def _accepts(tp: Any, value: Any) -> bool:
    if tp is Any:
        return True
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, typing.get_origin(tp) or tp)


def _check_type(key: str, value: Any, where: str) -> None:
    """One line naming the file (or flag), key, value and expected type, e.g. `concurrency = "8"`."""
    hint = _LOADER_TYPES.get(key) or _HINTS[key]
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if any(_accepts(a, value) for a in args if a is not type(None)):
        return
    want = " or ".join(_TYPE_WORDS.get(typing.get_origin(a) or a, str(a)) for a in args if a is not type(None))
    shown = f'"{value}"' if isinstance(value, str) else repr(value)
    got = {str: "a string", bool: "a boolean", int: "an integer", float: "a number", dict: "a table", list: "a list"}
    raise ConfigError(f"{where}: {key} = {shown} is {got.get(type(value), type(value).__name__)}; expected {want}")


# (field, test, what is required) for values of the right type that still make no sense.
_RANGES: list[tuple[str, typing.Callable[[Any], bool], str]] = [
    ("concurrency", lambda v: v >= 1, ">= 1"),
    ("max_retries", lambda v: v >= 0, ">= 0"),
    ("truncation_retries", lambda v: v >= 0, ">= 0"),
    ("timeout_s", lambda v: v > 0, "> 0"),
    ("rpm", lambda v: v is None or v > 0, "> 0 (omit it for no limit)"),
    ("tpm", lambda v: v is None or v > 0, "> 0 (omit it for no limit)"),
    ("max_tokens", lambda v: v is None or v >= 1, ">= 1 (omit it to let the server decide)"),
    ("temperature", lambda v: 0 <= v <= 2, "between 0 and 2"),
    ("backoff_base_s", lambda v: v > 0, "> 0"),
    ("backoff_max_s", lambda v: v > 0, "> 0"),
    ("max_wait_s", lambda v: v > 0, "> 0"),
    ("structured", lambda v: v in STRUCTURED, f"one of {', '.join(STRUCTURED)}"),
    ("batch", lambda v: v is None or v in BATCH_APIS, f"one of {', '.join(BATCH_APIS)} (omit it for none)"),
    ("batch_max_requests", lambda v: v is None or v >= 1, ">= 1"),
    ("batch_max_bytes", lambda v: v is None or v >= 1, ">= 1"),
    ("price_input_per_mtok", lambda v: v is None or v >= 0, ">= 0"),
    ("price_output_per_mtok", lambda v: v is None or v >= 0, ">= 0"),
    ("batch_discount", lambda v: v is None or 0 <= v <= 1, "between 0 and 1"),
]


# Request fields the engine itself sets per call; a profile's extra_body may not override them.
_ENGINE_FIELDS = ("model", "messages", "seed")


def _validate(p: ModelProfile, path: Path) -> None:
    if not p.model:
        raise ConfigError(f"{path}: model must not be empty")
    if not p.name.strip():
        raise ConfigError(f"{path}: name must not be empty")
    owned = [k for k in _ENGINE_FIELDS if k in p.extra_body]
    if owned:
        raise ConfigError(f"{path}: [extra_body] may not set {', '.join(owned)} (the engine sets them per call)")
    if not p.base_url and not p.simulated:
        raise ConfigError(f"{path}: no base_url; set it in the profile, its base_url_env, or pass --base-url")
    if p.base_url and not p.base_url.startswith(("http://", "https://")):
        raise ConfigError(f"{path}: base_url {p.base_url!r} must start with http:// or https://")
    if p.base_url:
        try:
            host = urlsplit(p.base_url).hostname
            urlsplit(p.base_url).port  # noqa: B018 - raises ValueError on a port that is not a number
        except ValueError as e:
            raise ConfigError(f"{path}: base_url {p.base_url!r} is not a URL ({e})") from None
        if not host:
            raise ConfigError(f"{path}: base_url {p.base_url!r} names no host")
    for key, ok, need in _RANGES:
        value = getattr(p, key)
        if not ok(value):
            raise ConfigError(f"{path}: {key} = {value!r} is impossible; it must be {need}")


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
