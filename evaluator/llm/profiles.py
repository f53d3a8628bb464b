"""Model profiles: `configs/models/<name>.toml` -> `ModelProfile`, plus the key lookup.

A profile never holds the API key itself, only the name of the environment variable that does,
so profiles can be logged and written into `meta.json` as they are.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from typing import Any, NamedTuple, get_args
from urllib.parse import urlsplit

from pydantic import Field, field_validator
from pydantic.dataclasses import dataclass

from evaluator.core.errors import ConfigError
from evaluator.core.paths import MODELS_DIR, PROVIDERS_FILE
from evaluator.core.redact import redact_url, watch_env
from evaluator.core.tokens import CHARS_PER_TOKEN
from evaluator.core.validation import checked, toml_label
from evaluator.llm import catalog
from evaluator.llm.catalog import BatchApi, PromptCache, Structured, Wire

STRUCTURED: tuple[str, ...] = get_args(Structured)
# Requests in flight per model at most: the runner keeps at most 1,024 queries in flight (study.runner.WINDOW), and
# each request holds a connection; every other count of a profile has its bound beside it.
MAX_CONCURRENCY = 1_024


@dataclass(frozen=True)
class ModelProfile:
    """Everything needed to talk to one model; see `configs/models/*.toml` for each field's meaning."""

    name: str
    model: str
    base_url: str = ""  # without a trailing slash
    # The provider of configs/providers.toml this profile's defaults come from (`--model PROVIDER/MODEL`, or a
    # profile file's `provider = "..."`), None for a profile that names none.
    provider: str | None = None
    # How requests go on the wire: "openai" (/chat/completions) or "anthropic" (the Messages API, llm/dialects.py).
    wire: Wire = "openai"
    api_key_env: str | None = None
    concurrency: int = Field(default=16, ge=1, le=MAX_CONCURRENCY)
    rpm: float | None = Field(default=None, gt=0, le=1e7, allow_inf_nan=False)  # omit it for no limit
    tpm: float | None = Field(default=None, gt=0, le=1e10, allow_inf_nan=False)
    timeout_s: float = Field(default=60.0, gt=0, le=86_400, allow_inf_nan=False)
    max_retries: int = Field(default=6, ge=0, le=100)
    max_tokens: int | None = Field(default=None, ge=1, le=1_048_576)  # omit it to let the server decide
    temperature: float = Field(default=0.0, ge=0, le=2)
    # Provider-defined request fields sent as they are: a deliberate extension point (any JSON a host accepts).
    extra_body: dict[str, Any] = field(default_factory=dict)
    simulated: bool = False
    api_key_required: bool = True
    truncation_retries: int = Field(default=1, ge=0, le=10)
    backoff_base_s: float = Field(default=0.5, gt=0, le=3600, allow_inf_nan=False)
    backoff_max_s: float = Field(default=30.0, gt=0, le=86_400, allow_inf_nan=False)
    max_wait_s: float = Field(default=120.0, gt=0, le=86_400, allow_inf_nan=False)
    # A server retry hint longer than this stops the command ("resume after HH:MM UTC"); shorter ones past
    # max_wait_s are retried every max_wait_s, with one warning saying what the server asked for.
    give_up_after_s: float = Field(default=3600.0, gt=0, allow_inf_nan=False)
    # Concurrency: fixed at `concurrency`, or adaptive (AIMD) up to it for servers of unknown capacity.
    adaptive_concurrency: bool = False
    structured: Structured = "none"  # how each prompt's JSON schema is sent (`Structured`)
    # Send the run index as `seed`. False for hosts that answer 400 to it (Gemini's OpenAI-compatible
    # endpoint): then no path (online or batch) sends it, and the cache key says so.
    send_seed: bool = True
    # Provider batch API and prices (used by the batch/request-file commands; never in the cache key).
    batch: BatchApi | None = None
    batch_max_requests: int | None = Field(default=None, ge=1)
    batch_max_bytes: int | None = Field(default=None, ge=1)
    price_input_per_mtok: float | None = Field(default=None, ge=0)  # USD per 1M prompt tokens
    price_output_per_mtok: float | None = Field(default=None, ge=0)  # USD per 1M completion tokens
    batch_discount: float | None = Field(default=None, ge=0, le=1)  # share off the online price for batch (0.5 = half)
    # Prompt tokens served from the provider's prompt cache, and those written into it (Anthropic's cache writes);
    # None: the input price (no saving, no surcharge known).
    price_cached_input_per_mtok: float | None = Field(default=None, ge=0)
    price_cache_write_per_mtok: float | None = Field(default=None, ge=0)
    price_source: str | None = None  # where the prices come from and as of when (the provider table's date)
    # How the provider caches repeated prompt prefixes (`catalog.PromptCache`: "explicit" marks the system prompt
    # with Anthropic's cache_control) and the shortest prefix it caches (the dry run's estimate of cached tokens).
    prompt_cache: PromptCache = "none"
    cache_min_tokens: int = Field(default=1024, ge=0)
    # The rpm/tpm above are a start: pace to the limits the provider's rate-limit headers announce on each reply
    # (OpenAI's x-ratelimit-limit-*, Anthropic's anthropic-ratelimit-*), up or down, and hold back while they say
    # a limit is spent.
    follow_rate_headers: bool = False
    # OpenAI's reasoning models (o-series, gpt-5): `max_completion_tokens` instead of `max_tokens`, and no
    # temperature sent (they take only the default).
    reasoning_params: bool = False
    # Token rule for estimates (dry run, budget): characters of message text per prompt token (core/tokens.py).
    chars_per_token: float = Field(default=CHARS_PER_TOKEN, gt=0)
    # The model's context window in tokens, when known (llama.cpp's -c, vLLM's max_model_len): a prompt that
    # cannot fit is a counted `context_exceeded` error of its call, never sent (llm/budget.context_overflow).
    context_tokens: int | None = Field(default=None, ge=1)
    # A bundled model (evaluator/llamacpp: "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b") the evaluator serves
    # itself on llama.cpp when no base_url is given; its server's slots, threads (0: sized to the machine)
    # and context tokens per slot.
    local_model: str | None = None
    server_slots: int = Field(default=0, ge=0, le=256)
    server_threads: int = Field(default=0, ge=0, le=1024)
    server_ctx: int = Field(default=4096, ge=64, le=1_048_576)
    # The server gives the same reply to the same prompt whatever the seed at temperature 0 (one local
    # llama.cpp): runs then repeat each other, and the report says so instead of testing across runs.
    deterministic: bool = False

    @property
    def key_endpoint(self) -> str:
        """The endpoint part of the cache key: an auto-started server listens on a new port each time,
        and its answers do not depend on it."""
        if self.simulated:
            return f"simulator:{self.name}"
        if self.local_model:
            return f"llamacpp:{self.local_model}"
        return self.base_url

    @property
    def repeats_runs(self) -> bool:
        """Every run gets the same replies (a deterministic server at temperature 0)."""
        return self.deterministic and self.temperature == 0

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
        if "/" in name and as_path.suffix != ".toml":
            raise ConfigError(
                f"unknown provider {name.partition('/')[0]!r} in --model {name}; providers: "
                f"{', '.join(catalog.providers())} (`python -m evaluator models` lists them), or a profile: {known}")
        raise ConfigError(
            f"unknown model {name!r}: no profile {path} (known: {known}; or PROVIDER/MODEL, e.g. "
            f"anthropic/claude-sonnet-4-5); add configs/models/{name}.toml or pass a path to a .toml profile"
        )
    return path


class _Raw(NamedTuple):
    fields: dict[str, Any]  # as given: a file's, laid over its provider's
    where: str  # where they come from, for messages
    hint: str | None  # what to do about a missing endpoint


def _raw_profile(name: str, models_dir: Path) -> _Raw:
    """The profile's fields as given (a file's, laid over its provider's), where they come from (for messages),
    and the hint for a missing endpoint. `PROVIDER/MODEL` is the provider table's profile (llm/catalog.py),
    unless a file of that path exists."""
    as_path = Path(name)
    split = None if as_path.suffix == ".toml" and as_path.is_file() else catalog.split_name(name)
    if split is not None:
        provider, model = split
        return _Raw(catalog.profile_fields(provider, model, name), f"--model {name}", catalog.base_url_hint(provider))
    path = _profile_path(name, models_dir)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read model profile {path}: {e}") from None
    unknown = set(raw) - _FIELDS - _LOADER_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown field(s) {sorted(unknown)}; known: {sorted(_FIELDS | _LOADER_KEYS)}")
    raw.setdefault("name", path.stem)
    named = raw.get("provider")
    if named is None:
        return _Raw(raw, str(path), None)
    known = catalog.providers()
    if not isinstance(named, str) or named not in known:
        raise ConfigError(f"{path}: provider = {named!r} is not a provider of {PROVIDERS_FILE} "
                          f"(known: {', '.join(known)})")
    if not isinstance(raw.get("model"), str):
        raise ConfigError(f"{path}: 'model' (the provider's model id) is required")
    # The file overrides anything of its provider's (prices included).
    return _Raw(catalog.profile_fields(known[named], raw["model"], raw["name"]) | raw, str(path),
                catalog.base_url_hint(known[named]))


def load_profile(
    name: str,
    *,
    base_url: str | None = None,
    models_dir: Path = MODELS_DIR,
    env: Mapping[str, str] | None = None,
    require_key: bool = True,
    **overrides: Any,
) -> ModelProfile:
    """Load and validate a profile by name (or path to a .toml, or `PROVIDER/MODEL`: llm/catalog.py).

    `base_url` (the CLI's `--base-url`) beats the profile's `base_url_env`, which beats its `base_url`.
    `overrides` replace profile fields (e.g. `rpm=`, `concurrency=` from flags; None values are ignored).
    With `require_key`, a required key missing from the environment is a `ConfigError` now, not a 401 later.
    """
    env = os.environ if env is None else env
    raw, where, hint = _raw_profile(name, models_dir)
    loader = checked(_LoaderKeys, {k: raw.pop(k) for k in _LOADER_KEYS & set(raw)}, f"{where}: ", toml_label)
    if loader.model_env and env.get(loader.model_env):
        raw["model"] = env[loader.model_env]
    if loader.base_url_env and env.get(loader.base_url_env):
        raw["base_url"] = env[loader.base_url_env]
    if base_url:
        raw["base_url"] = base_url
    if "model" not in raw:
        raise ConfigError(f"{where}: 'model' (the provider's model id) is required")
    profile = checked(ModelProfile, raw, f"{where}: ", toml_label)
    given = {k: v for k, v in overrides.items() if v is not None}
    for k in given:
        if k not in _FIELDS:
            raise ConfigError(f"unknown model profile setting {k!r} (from the command line); known: {sorted(_FIELDS)}")
    if given.keys() & {"rpm", "tpm"}:
        given["follow_rate_headers"] = False  # a pace typed on the command line is kept, whatever the headers say
    if given:
        profile = checked(ModelProfile, dataclasses.asdict(profile) | given, "command line: ", toml_label)
    _validate(profile, where, hint)
    watch_env(profile.api_key_env)  # a profile file from elsewhere: its key is redacted like the bundled ones
    if require_key:
        resolve_api_key(profile, env)
    return profile


# Request fields the engine itself sets per call; a profile's extra_body may not override them.
_ENGINE_FIELDS = ("model", "messages", "seed")


def _validate(p: ModelProfile, path: str, hint: str | None = None) -> None:
    if not p.model:
        raise ConfigError(f"{path}: model must not be empty")
    if not p.name.strip():
        raise ConfigError(f"{path}: name must not be empty")
    owned = [k for k in _ENGINE_FIELDS if k in p.extra_body]
    if owned:
        raise ConfigError(f"{path}: [extra_body] may not set {', '.join(owned)} (the engine sets them per call)")
    if p.reasoning_params and p.temperature != 1.0:
        raise ConfigError(f"{path}: {p.model} is a reasoning model: it takes only the default temperature (1); "
                          "remove temperature (or set reasoning_params = false for a host that accepts one)")
    if not p.base_url and not p.simulated and not p.local_model:
        raise ConfigError(f"{path}: no base_url; " + (hint or "set it in the profile, its base_url_env, or pass --base-url"))
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
    if key is None and profile.api_key_required and not profile.simulated and not profile.local_model:
        raise ConfigError(
            f"model {profile.name!r} needs an API key: set {profile.api_key_env} "
            f"(e.g. `export {profile.api_key_env}=...`) before running"
        )
    return key
