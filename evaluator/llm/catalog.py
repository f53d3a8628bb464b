"""The providers `--model PROVIDER/MODEL` knows, and the dated price and limits table of their known models.

The table is data, `configs/providers.toml` (its header says what every key means); this module reads and
checks it once and turns a provider and a model id into the keys of a model profile, in the profile's sections
(`profile_fields`): the provider's endpoint, key variable, wire, batch API, prompt caching and conservative
limits, then the model's prices, context window and overrides. `llm.profiles.load_profile` builds the profile
from them (a profile file naming `provider = "..."` is laid over them, section by section; flags over both). An unknown model of a known
provider runs with the provider's defaults and unknown prices (None, never 0).

The redactor (`core.redact.key_envs`) reads every provider's key variable from the same file.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import field
from functools import cache
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import Field
from pydantic.dataclasses import dataclass

from evaluator.core.errors import ConfigError
from evaluator.core.paths import PROVIDERS_FILE
from evaluator.core.validation import checked, toml_label

# How requests go on the wire: OpenAI's /chat/completions (and every OpenAI-compatible host) or Anthropic's
# Messages API (llm/dialects.py).
Wire = Literal["openai", "anthropic"]
# How each prompt's JSON schema is sent: "json_schema", "json_object", "json_object_schema"
# ({"type": "json_object", "schema": ...}, llama-cpp-python) or "none" (not at all); on the Anthropic wire
# "json_schema" is a forced tool whose input_schema is the schema (llm/dialects.py).
Structured = Literal["json_schema", "json_object", "json_object_schema", "none"]
# A provider's batch API (batch/providers.py).
BatchApi = Literal["openai", "gemini", "anthropic"]
# How a provider caches repeated prompt prefixes: by itself ("automatic"), where the request marks them
# ("explicit": Anthropic's cache_control, which the engine puts on the system prompt), or not at all.
PromptCache = Literal["none", "automatic", "explicit"]
WIRES: tuple[str, ...] = get_args(Wire)
BATCH_APIS: tuple[str, ...] = get_args(BatchApi)
# A dated model id of a known entry: claude-sonnet-4-5-20250929, gpt-4o-mini-2024-07-18.
_SNAPSHOT = re.compile(r"-(\d{8}|\d{4}-\d{2}-\d{2})$")
# The completion cap of a reasoning model when its entry names none: its thinking counts against it.
REASONING_MAX_TOKENS = 8192


@dataclass(frozen=True)
class ModelEntry:
    """One known model: its prices (USD per 1M tokens) and what differs from its provider's defaults."""

    input: float | None = Field(default=None, ge=0)
    output: float | None = Field(default=None, ge=0)
    cached_input: float | None = Field(default=None, ge=0)
    cache_write: float | None = Field(default=None, ge=0)
    batch_discount: float | None = Field(default=None, ge=0, le=1)
    context: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    rpm: float | None = Field(default=None, gt=0)
    tpm: float | None = Field(default=None, gt=0)
    cache_min_tokens: int | None = Field(default=None, ge=0)
    reasoning: bool | None = None  # None: the provider's reasoning_pattern decides


@dataclass(frozen=True)
class Provider:
    """One provider of `configs/providers.toml` (see its header for each key)."""

    name: str
    title: str
    wire: Wire = "openai"
    base_url: str = ""  # "" = the user must give one (--base-url or base_url_env)
    base_url_env: str | None = None
    api_key_env: str | None = None
    api_key_required: bool = True
    batch: BatchApi | None = None
    batch_discount: float | None = Field(default=None, ge=0, le=1)
    prompt_cache: PromptCache = "none"
    cache_min_tokens: int = Field(default=1024, ge=0)
    follow_rate_headers: bool = False
    self_hosted: bool = False
    concurrency: int = Field(default=16, ge=1)
    adaptive_concurrency: bool = False
    rpm: float | None = Field(default=None, gt=0)
    tpm: float | None = Field(default=None, gt=0)
    timeout_s: float = Field(default=120.0, gt=0)
    max_tokens: int = Field(default=2048, ge=1)
    truncation_retries: int = Field(default=1, ge=0)
    structured: Structured = "none"
    send_seed: bool = True
    reasoning_pattern: str | None = None
    prices_date: str | None = None
    prices_source: str | None = None
    notes: str = ""
    models: dict[str, ModelEntry] = field(default_factory=dict)

    def entry(self, model: str) -> ModelEntry | None:
        """The table's entry for `model`, or for the model a dated snapshot id names (claude-x-20250929)."""
        if model in self.models:
            return self.models[model]
        return self.models.get(_SNAPSHOT.sub("", model))

    def reasoning(self, model: str) -> bool:
        """`model` takes OpenAI's reasoning-model parameters (max_completion_tokens, the default temperature)."""
        e = self.entry(model)
        if e is not None and e.reasoning is not None:
            return e.reasoning
        return bool(self.reasoning_pattern and re.match(self.reasoning_pattern, model))

    def prices_label(self) -> str | None:
        """Where the prices come from, for the dry run, the report and meta.json."""
        if self.self_hosted:
            return f"{self.name}: self-hosted, no per-token bill ($0; your hardware's cost is not counted)"
        if not self.prices_date:
            return None
        return f"{self.name} prices as of {self.prices_date} ({self.prices_source}); check them before relying on them"


@cache
def providers(path: Path = PROVIDERS_FILE) -> dict[str, Provider]:
    """Every provider of the table, checked (one `ConfigError` line naming the file and key otherwise)."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read the provider table {path}: {e}") from None
    out: dict[str, Provider] = {}
    for name, table in raw.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: {name} = must be a table [{name}]")
        table = dict(table)
        models = table.pop("models", {})
        if not isinstance(models, dict):
            raise ConfigError(f"{path}: [{name}.models] must be a table of models")
        unknown = set(table) - set(Provider.__pydantic_fields__)  # type: ignore[attr-defined]  # pydantic adds it
        if unknown:
            raise ConfigError(f"{path}: [{name}] has unknown key(s) {sorted(unknown)}")
        entries = {}
        for model, values in models.items():
            if not isinstance(values, dict):
                raise ConfigError(f"{path}: [{name}.models.\"{model}\"] must be a table")
            bad = set(values) - set(ModelEntry.__pydantic_fields__)  # type: ignore[attr-defined]  # pydantic adds it
            if bad:
                raise ConfigError(f"{path}: [{name}.models.\"{model}\"] has unknown key(s) {sorted(bad)}")
            entries[model] = checked(ModelEntry, values, f"{path}: [{name}.models.\"{model}\"] ", toml_label)
        p = checked(Provider, {**table, "name": name}, f"{path}: [{name}] ", toml_label)
        out[name] = Provider(**{**_fields(p), "models": entries})
    return out


def _fields(p: Provider) -> dict[str, Any]:
    return {k: getattr(p, k) for k in Provider.__pydantic_fields__}  # type: ignore[attr-defined]  # pydantic adds it


def split_name(name: str) -> tuple[Provider, str] | None:
    """`PROVIDER/MODEL` (the model id may hold slashes: together/meta-llama/Llama-3.3-70B-Instruct-Turbo) as
    (provider, model id); None when `name` names no known provider (a profile name or a path)."""
    head, sep, model = name.partition("/")
    known = providers()
    if not sep or head not in known:
        return None
    if not model.strip():
        raise ConfigError(f"--model {name}: name the model after the provider, e.g. {head}/"
                          f"{next(iter(known[head].models), 'MODEL')}")
    return known[head], model


def profile_fields(provider: Provider, model: str, name: str) -> dict[str, Any]:
    """The keys of a model profile for `model` at `provider`, in the profile's sections (as a sectioned profile
    file would give them, its [connection] `base_url_env` included; `llm.profiles.ModelProfile`); `name` is the
    profile's name. A model the table does not list keeps the provider's defaults and unknown prices."""
    p, e = provider, provider.entry(model)
    connection = {"provider": p.name, "wire": p.wire, "base_url": p.base_url, "base_url_env": p.base_url_env,
                  "api_key_env": p.api_key_env, "api_key_required": p.api_key_required, "timeout_s": p.timeout_s}
    sampling: dict[str, Any] = {"max_tokens": p.max_tokens, "structured": p.structured, "send_seed": p.send_seed}
    pacing = {"concurrency": p.concurrency, "adaptive_concurrency": p.adaptive_concurrency, "rpm": p.rpm,
              "tpm": p.tpm, "follow_rate_headers": p.follow_rate_headers}
    prices: dict[str, Any] = {}
    prompt: dict[str, Any] = {"cache": p.prompt_cache, "cache_min_tokens": p.cache_min_tokens}
    if p.self_hosted:
        prices |= {"input_per_mtok": 0.0, "output_per_mtok": 0.0, "source": p.prices_label()}
    if e is not None:  # what the model's entry gives, over the provider's
        prices |= _given({"input_per_mtok": e.input, "output_per_mtok": e.output,
                          "cached_input_per_mtok": e.cached_input, "cache_write_per_mtok": e.cache_write})
        prices["source"] = p.prices_label()
        prompt |= _given({"context_tokens": e.context, "cache_min_tokens": e.cache_min_tokens})
        sampling |= _given({"max_tokens": e.max_tokens})
        pacing |= _given({"rpm": e.rpm, "tpm": e.tpm})
    if p.batch is not None:
        prices["batch_discount"] = e.batch_discount if e is not None and e.batch_discount is not None else p.batch_discount
    if p.reasoning(model):
        # OpenAI's reasoning models take only the default temperature (1): it is what they sample at, so it is
        # what the profile (and the cache key) says; the engine sends none.
        sampling |= {"reasoning_params": True, "temperature": 1.0}
        if e is None or e.max_tokens is None:
            sampling["max_tokens"] = max(p.max_tokens, REASONING_MAX_TOKENS)
    sections = {"connection": connection, "sampling": sampling, "pacing": pacing,
                "retries": {"truncation_retries": p.truncation_retries}, "batch": {"api": p.batch},
                "prices": prices, "prompt": prompt}
    # A value the table does not give (None) is the profile's default, as if the key were not written.
    return {"name": name, "model": model, **{s: _given(values) for s, values in sections.items()}}


def _given(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def base_url_hint(provider: Provider) -> str:
    """What to do when a self-hosted provider has no endpoint."""
    env = f" or set {provider.base_url_env}" if provider.base_url_env else ""
    return f"{provider.name} is self-hosted: pass --base-url URL (the server's /v1 address){env}"
