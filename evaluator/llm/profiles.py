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
from collections.abc import Callable, Mapping
from dataclasses import field
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin
from urllib.parse import urlsplit

from pydantic import Field, TypeAdapter, ValidationError, field_validator
from pydantic.dataclasses import dataclass
from pydantic.fields import FieldInfo

from ..redact import redact_url, watch_env
from .errors import ConfigError

MODELS_DIR = Path(__file__).resolve().parents[2] / "configs" / "models"

# How each prompt's JSON schema is sent: "json_schema", "json_object", "json_object_schema"
# ({"type": "json_object", "schema": ...}, llama-cpp-python) or "none" (not at all).
Structured = Literal["json_schema", "json_object", "json_object_schema", "none"]
BatchApi = Literal["openai", "gemini"]
STRUCTURED: tuple[str, ...] = get_args(Structured)
BATCH_APIS: tuple[str, ...] = get_args(BatchApi)


@dataclass(frozen=True)
class ModelProfile:
    """Everything needed to talk to one model; see `configs/models/*.toml` for each field's meaning."""

    name: str
    model: str
    base_url: str = ""  # without a trailing slash
    api_key_env: str | None = None
    concurrency: int = Field(16, ge=1)
    rpm: float | None = Field(None, gt=0)  # omit it for no limit
    tpm: float | None = Field(None, gt=0)
    timeout_s: float = Field(60.0, gt=0)
    max_retries: int = Field(6, ge=0)
    max_tokens: int | None = Field(None, ge=1)  # omit it to let the server decide
    temperature: float = Field(0.0, ge=0, le=2)
    extra_body: dict[str, Any] = field(default_factory=dict)
    simulated: bool = False
    api_key_required: bool = True
    truncation_retries: int = Field(1, ge=0)
    backoff_base_s: float = Field(0.5, gt=0)
    backoff_max_s: float = Field(30.0, gt=0)
    max_wait_s: float = Field(120.0, gt=0)
    # A server retry hint longer than this stops the run ("resume after HH:MM UTC"); shorter ones past
    # max_wait_s are retried every max_wait_s, with one warning saying what the server asked for.
    give_up_after_s: float = Field(3600.0, gt=0)
    # Concurrency: fixed at `concurrency`, or adaptive (AIMD) up to it for servers of unknown capacity.
    adaptive_concurrency: bool = False
    structured: Structured = "none"  # how each prompt's JSON schema is sent (`Structured`)
    # Send the run index as `seed`. False for hosts that answer 400 to it (Gemini's OpenAI-compatible
    # endpoint): then no path (online or batch) sends it, and the cache key says so.
    send_seed: bool = True
    # Provider batch API and prices (used by the batch/request-file commands; never in the cache key).
    batch: BatchApi | None = None
    batch_max_requests: int | None = Field(None, ge=1)
    batch_max_bytes: int | None = Field(None, ge=1)
    price_input_per_mtok: float | None = Field(None, ge=0)  # USD per 1M prompt tokens
    price_output_per_mtok: float | None = Field(None, ge=0)  # USD per 1M completion tokens
    batch_discount: float | None = Field(None, ge=0, le=1)  # share off the online price for batch (0.5 = half)
    # Token rule for estimates (dry run, budget): characters of message text per prompt token (llm/budget.py).
    chars_per_token: float = Field(4.0, gt=0)
    # The model's context window in tokens, when known (llama.cpp's -c, vLLM's max_model_len): a prompt that
    # cannot fit is a counted `context_exceeded` error of its call, never sent (llm/budget.context_overflow).
    context_tokens: int | None = Field(None, ge=1)

    def request_settings(self) -> dict[str, Any]:
        """Every setting that shapes requests or their pacing, for `meta.json`.

        That is every field: the profile holds only the *name* of the key's environment variable,
        never the key. A key a user wrote into the base URL itself (`https://user:KEY@host`, `?key=...`)
        is masked (`redact_url`).
        """
        out = dataclasses.asdict(self)
        out["base_url"] = redact_url(self.base_url) if self.base_url else self.base_url
        return out

    @field_validator("base_url")
    @classmethod
    def _no_trailing_slash(cls, v: str) -> str:
        return v.rstrip("/")


@dataclass
class _LoaderKeys:
    """Keys a TOML file may carry that are resolved here rather than copied onto the profile."""

    base_url_env: str | None = None
    model_env: str | None = None


_FIELDS = {f.name for f in dataclasses.fields(ModelProfile)}
_LOADER_KEYS = {f.name for f in dataclasses.fields(_LoaderKeys)}


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
    loader = checked(_LoaderKeys, {k: raw.pop(k) for k in _LOADER_KEYS & set(raw)}, f"{path}: ", _toml_label)
    raw.setdefault("name", path.stem)
    if loader.model_env and env.get(loader.model_env):
        raw["model"] = env[loader.model_env]
    if loader.base_url_env and env.get(loader.base_url_env):
        raw["base_url"] = env[loader.base_url_env]
    if base_url:
        raw["base_url"] = base_url
    if "model" not in raw:
        raise ConfigError(f"{path}: 'model' (the provider's model id) is required")
    profile = checked(ModelProfile, raw, f"{path}: ", _toml_label)
    given = {k: v for k, v in overrides.items() if v is not None}
    for k in given:
        if k not in _FIELDS:
            raise ConfigError(f"unknown model profile setting {k!r} (from the command line); known: {sorted(_FIELDS)}")
    if given:
        profile = checked(ModelProfile, dataclasses.asdict(profile) | given, "command line: ", _toml_label)
    _validate(profile, path)
    watch_env(profile.api_key_env)  # a profile file from elsewhere: its key is redacted like the bundled ones
    if require_key:
        resolve_api_key(profile, env)
    return profile


# ---------------------------------------------------------------- one line from a pydantic error

T = TypeVar("T")

_WANT = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "a table"}
_GOT = {str: "a string", bool: "a boolean", int: "an integer", float: "a number", dict: "a table", list: "a list"}
_PLURAL = {int: "integers", float: "numbers", str: "strings", bool: "booleans"}
# pydantic error types that mean "right type, impossible value"
_RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "literal_error", "too_short",
                 "finite_number"}


def _toml_label(key: str) -> str:
    return f"{key} ="


def _want(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Annotated:
        return _want(get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_want(a) for a in get_args(tp) if a is not type(None))
    if origin is Literal:
        return "one of " + ", ".join(map(str, get_args(tp)))
    if origin in (list, set):
        item = get_args(tp)[0]
        item = get_args(item)[0] if get_origin(item) is Annotated else item
        return f"a list of {_PLURAL.get(item) or _want(item)}"
    return _WANT.get(origin or tp, getattr(tp, "__name__", str(tp)))


def _bounds(info: FieldInfo) -> dict[str, Any]:
    """Every declared bound of a field, on it or on its list items: ge, gt, le, lt."""
    metas = list(info.metadata)
    for arg in get_args(info.annotation):
        for inner in get_args(arg)[1:] if get_origin(arg) is Annotated else ():
            metas += inner.metadata if isinstance(inner, FieldInfo) else [inner]
    return {a: getattr(m, a) for m in metas for a in ("ge", "gt", "le", "lt") if getattr(m, a, None) is not None}


def _need(info: FieldInfo, err: Mapping[str, Any]) -> str:
    b = _bounds(info)
    if err["type"] == "literal_error":
        return _choices(info.annotation)
    if err["type"] == "too_short":
        return "non-empty"
    if err["type"] == "finite_number":
        return "a finite number"
    if ("ge" in b or "gt" in b) and ("le" in b or "lt" in b):
        return f"between {b.get('ge', b.get('gt'))} and {b.get('le', b.get('lt'))}"
    if not b:
        return "valid"
    op, v = next(iter(b.items()))
    return f"{ {'ge': '>=', 'gt': '>', 'le': '<=', 'lt': '<'}[op]} {v}"


def _choices(tp: Any) -> str:
    for a in [tp, *get_args(tp)]:
        if get_origin(a) is Literal:
            return "one of " + ", ".join(map(str, get_args(a)))
    return _want(tp)


def config_error(e: ValidationError, info: FieldInfo, key: str, value: Any, where: str,
                 label: Callable[[str], str]) -> ConfigError:
    """One line naming where (`where`: the file, or "command line: "), the key (`label`: as the user
    wrote it, `k =` in a file, `--flag` on the command line), the value, and what it must be."""
    err = e.errors(include_url=False)[0]
    item = any(isinstance(x, int) for x in err["loc"])
    shown = f'"{value}"' if isinstance(value, str) else repr(value)
    if err["type"] in _RANGE_ERRORS and (err["type"] != "literal_error" or isinstance(err["input"], str)):
        need = _need(info, err)
        if type(None) in get_args(info.annotation):
            need += " (omit it for none)"
        return ConfigError(f"{where}{label(key)} {shown} is impossible; {'every value' if item else 'it'} must be {need}")
    bad = err["input"]
    got = _GOT.get(type(bad), type(bad).__name__)
    return ConfigError(f"{where}{label(key)} {shown} {'holds' if item else 'is'} {got}; expected {_want(info.annotation)}")


@cache
def _field_adapter(cls: type, key: str) -> TypeAdapter[Any]:
    info: FieldInfo = cls.__pydantic_fields__[key]  # type: ignore[attr-defined]
    return TypeAdapter(Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation)


def check_values(cls: type, values: Mapping[str, Any], where: str, label: Callable[[str], str]) -> None:
    """Each value against the type and range `cls` declares for it, with strict types (TOML's and
    argparse's values are typed already: a string is no number, true is no integer); else one
    `ConfigError` line."""
    for key, value in values.items():
        try:
            _field_adapter(cls, key).validate_python(value, strict=True)
        except ValidationError as e:
            raise config_error(e, cls.__pydantic_fields__[key], key, value, where, label) from None  # type: ignore[attr-defined]


def checked(cls: type[T], values: Mapping[str, Any], where: str, label: Callable[[str], str]) -> T:
    """`cls(**values)` once `check_values` passed, or one `ConfigError` line."""
    check_values(cls, values, where, label)
    try:
        return cls(**values)
    except ValidationError as e:  # a required value is missing
        raise ConfigError(f"{where}{e.errors(include_url=False)[0]['loc'][0]} is required") from None


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
