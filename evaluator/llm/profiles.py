"""Model profiles: `configs/models/<name>.toml` -> `ModelProfile`, plus the key lookup.

A profile is nested like the file it comes from: `name` and `model` at the top, then one section per table
(`[connection]`, `[sampling]`, `[pacing]`, `[retries]`, `[batch]`, `[prices]`, `[prompt]`, `[server]`), each
field documented where it is declared. A profile file written before the sections (every key at the top, the
way meta.json still saves a profile: `ModelProfile.flat`) loads through the one migration, `sectioned`, with a
note once per file. `revised` is the one way to change fields of a profile (a flag, a started server's port).

A profile never holds the API key itself, only the name of the environment variable that does,
so profiles can be logged and written into `meta.json` as they are.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import field
from pathlib import Path
from typing import Any, NamedTuple, get_args
from urllib.parse import urlsplit

from pydantic import ConfigDict, Field, field_validator
from pydantic.dataclasses import dataclass

from evaluator.core.errors import ConfigError
from evaluator.core.paths import MODELS_DIR, PROVIDERS_FILE
from evaluator.core.redact import redact_url, watch_env
from evaluator.core.tokens import CHARS_PER_TOKEN
from evaluator.core.validation import check_values, checked
from evaluator.llm import catalog
from evaluator.llm.catalog import BatchApi, PromptCache, Structured, Wire

log = logging.getLogger("evaluator.llm")

STRUCTURED: tuple[str, ...] = get_args(Structured)
# Requests in flight per model at most: the runner keeps at most 1,024 queries in flight (study.runner.WINDOW), and
# each request holds a connection; every other count of a profile has its bound beside it.
MAX_CONCURRENCY = 1_024
# Each field's docstring is its description (`dataclasses.fields` -> pydantic's `description`).
_DOCUMENTED = ConfigDict(use_attribute_docstrings=True)


@dataclass(frozen=True, config=_DOCUMENTED)
class Connection:
    """[connection]: where the requests go and how they are let in."""

    base_url: str = ""
    """The endpoint the engine appends /chat/completions (or Anthropic's /v1/messages) to, without a trailing
    slash; "" for a server the evaluator starts itself ([server]). `--base-url` beats the file's
    `base_url_env`, which beats this."""
    provider: str | None = None
    """The provider of configs/providers.toml this profile's defaults come from (`--model PROVIDER/MODEL`, or a
    profile file's `provider = "..."`); None for a profile that names none."""
    wire: Wire = "openai"
    """How requests go on the wire: "openai" (/chat/completions) or "anthropic" (the Messages API,
    llm/dialects.py)."""
    api_key_env: str | None = None
    """The environment variable holding the key (the key itself is never stored anywhere)."""
    api_key_required: bool = True
    """Stop before any work when the key is missing (false: a local server that needs none)."""
    timeout_s: float = Field(default=60.0, gt=0, le=86_400, allow_inf_nan=False)
    """Seconds one HTTP attempt may take, counted from when it is sent (`--timeout`); then it is retried."""

    @field_validator("base_url")
    @classmethod
    def _no_trailing_slash(cls, v: str) -> str:
        return v.rstrip("/")


@dataclass(frozen=True, config=_DOCUMENTED)
class Sampling:
    """[sampling]: what each request asks of the model (all of it but `structured` and `reasoning_params` is
    part of the cache key; `structured` is, through the schema it sends)."""

    temperature: float = Field(default=0.0, ge=0, le=2)
    """Sampling temperature (the study uses 0)."""
    max_tokens: int | None = Field(default=None, ge=1, le=1_048_576)
    """The completion cap (`--max-tokens`); omit it to let the server decide."""
    structured: Structured = "none"
    """How each prompt's JSON schema is sent (`catalog.Structured`; `--structured`)."""
    send_seed: bool = True
    """Send the run index as `seed`. False for hosts that answer 400 to it (Gemini's OpenAI-compatible
    endpoint): then no path (online or batch) sends it, and the cache key says so."""
    reasoning_params: bool = False
    """OpenAI's reasoning models (o-series, gpt-5): `max_completion_tokens` instead of `max_tokens`, and no
    temperature sent (they take only the default)."""
    deterministic: bool = False
    """The server gives the same reply to the same prompt whatever the seed at temperature 0 (one local
    llama.cpp): runs then repeat each other (`ModelProfile.repeats_runs`), and the report says so instead of
    testing across runs."""
    # Any: provider-defined request fields, a deliberate extension point (any JSON a host accepts).
    extra_body: dict[str, Any] = field(default_factory=dict)
    """Provider-defined request fields sent as they are ([sampling.extra_body]): a deliberate extension point
    (any JSON a host accepts)."""


@dataclass(frozen=True, config=_DOCUMENTED)
class Pacing:
    """[pacing]: how many requests are in flight and how fast they start."""

    concurrency: int = Field(default=16, ge=1, le=MAX_CONCURRENCY)
    """Requests in flight at once (`--concurrency`); the maximum when `adaptive_concurrency`."""
    adaptive_concurrency: bool = False
    """Concurrency fixed at `concurrency` (false), or adaptive (AIMD from 1) up to it, for servers of unknown
    capacity."""
    rpm: float | None = Field(default=None, gt=0, le=1e7, allow_inf_nan=False)
    """Requests per minute, paced client-side just below it (`--rpm`); omit it for no limit."""
    tpm: float | None = Field(default=None, gt=0, le=1e10, allow_inf_nan=False)
    """Tokens per minute (prompt estimate + max_tokens per request; `--tpm`); omit it for no limit."""
    follow_rate_headers: bool = False
    """The rpm/tpm above are a start: pace to the limits the provider's rate-limit headers announce on each
    reply (OpenAI's x-ratelimit-limit-*, Anthropic's anthropic-ratelimit-*), up or down, and hold back while
    they say a limit is spent. `--rpm`/`--tpm` turn it off."""


@dataclass(frozen=True, config=_DOCUMENTED)
class Retries:
    """[retries]: what happens after a failed or cut attempt."""

    max_retries: int = Field(default=6, ge=0, le=100)
    """Retries of one call after 429s, 5xx, timeouts or dropped connections."""
    truncation_retries: int = Field(default=1, ge=0, le=10)
    """Extra tries when a reply is cut at max_tokens (finish_reason "length"); the last one is kept."""
    backoff_base_s: float = Field(default=0.5, gt=0, le=3600, allow_inf_nan=False)
    """Backoff without a usable server hint: a wait drawn from [d/2, d],
    d = min(backoff_max_s, backoff_base_s * 2^attempt)."""
    backoff_max_s: float = Field(default=30.0, gt=0, le=86_400, allow_inf_nan=False)
    """The longest backoff without a server hint."""
    max_wait_s: float = Field(default=120.0, gt=0, le=86_400, allow_inf_nan=False)
    """The longest wait honoured from a server's hint (Retry-After, RetryInfo.retryDelay)."""
    give_up_after_s: float = Field(default=3600.0, gt=0, allow_inf_nan=False)
    """A server hint longer than this stops the command ("resume after HH:MM UTC"); shorter ones past
    `max_wait_s` are retried every `max_wait_s`, with one warning saying what the server asked for."""


@dataclass(frozen=True, config=_DOCUMENTED)
class Batch:
    """[batch]: the provider's batch API (`--batch`, the `requests` commands; never in the cache key)."""

    api: BatchApi | None = None
    """Which batch API the provider offers: "openai", "gemini" or "anthropic" (batch/providers.py)."""
    max_requests: int | None = Field(default=None, ge=1)
    """Requests per job at most (default: the provider's documented cap)."""
    max_bytes: int | None = Field(default=None, ge=1)
    """Bytes of requests per job at most (default: the provider's documented cap)."""


@dataclass(frozen=True, config=_DOCUMENTED)
class Prices:
    """[prices]: USD per 1M tokens (`core.money`, the one price rule; a price not given is unknown, never 0)."""

    input_per_mtok: float | None = Field(default=None, ge=0)
    """Prompt tokens, online."""
    output_per_mtok: float | None = Field(default=None, ge=0)
    """Completion tokens, online."""
    batch_discount: float | None = Field(default=None, ge=0, le=1)
    """The share off the online price through the batch API (0.5 = half)."""
    cached_input_per_mtok: float | None = Field(default=None, ge=0)
    """Prompt tokens served from the provider's prompt cache; None: the input price (no saving known)."""
    cache_write_per_mtok: float | None = Field(default=None, ge=0)
    """Prompt tokens written into the provider's prompt cache (Anthropic's cache writes); None: the input
    price (no surcharge known)."""
    source: str | None = None
    """Where the prices come from and as of when (the provider table's date)."""


@dataclass(frozen=True, config=_DOCUMENTED)
class Prompt:
    """[prompt]: how a prompt's tokens are counted, what fits the model, and what the provider caches of it."""

    chars_per_token: float = Field(default=CHARS_PER_TOKEN, gt=0)
    """The token rule of the estimates (dry run, budget, TPM pacing): characters of message text per prompt
    token (core/tokens.py)."""
    context_tokens: int | None = Field(default=None, ge=1)
    """The model's context window, when known (llama.cpp's -c, vLLM's max_model_len): a prompt that cannot fit
    is a counted `context_exceeded` error of its call, never sent (llm/budget.context_overflow)."""
    cache: PromptCache = "none"
    """How the provider caches repeated prompt prefixes (`catalog.PromptCache`: "explicit" marks the system
    prompt with Anthropic's cache_control)."""
    cache_min_tokens: int = Field(default=1024, ge=0)
    """The shortest prefix the provider caches (the dry run's estimate of cached tokens)."""


@dataclass(frozen=True, config=_DOCUMENTED)
class Server:
    """[server]: a server the evaluator starts itself for this profile when no base_url is given."""

    simulated: bool = False
    """The bundled simulator answers (auto-started on a free port): results are marked simulated."""
    local_model: str | None = None
    """A bundled model (evaluator/llamacpp: "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b") served on llama.cpp."""
    slots: int = Field(default=0, ge=0, le=256)
    """The llama.cpp server's slots (requests it decodes together); 0 sizes them to this machine."""
    threads: int = Field(default=0, ge=0, le=1024)
    """The llama.cpp server's CPU threads; 0 sizes them to the cores this process may use."""
    ctx: int = Field(default=4096, ge=64, le=1_048_576)
    """The llama.cpp server's context tokens per slot."""


@dataclass(frozen=True, config=_DOCUMENTED)
class ModelProfile:
    """Everything needed to talk to one model, in the sections of its file (`configs/models/*.toml`)."""

    name: str
    """The profile's name (the file's stem unless it sets one): what the study, the cache and the report call
    the model."""
    model: str
    """The provider's model id sent in each request."""
    connection: Connection = field(default_factory=Connection)
    """[connection]"""
    sampling: Sampling = field(default_factory=Sampling)
    """[sampling]"""
    pacing: Pacing = field(default_factory=Pacing)
    """[pacing]"""
    retries: Retries = field(default_factory=Retries)
    """[retries]"""
    batch: Batch = field(default_factory=Batch)
    """[batch]"""
    prices: Prices = field(default_factory=Prices)
    """[prices]"""
    prompt: Prompt = field(default_factory=Prompt)
    """[prompt]"""
    server: Server = field(default_factory=Server)
    """[server]"""

    @property
    def key_endpoint(self) -> str:
        """The endpoint part of the cache key: an auto-started server listens on a new port each time,
        and its answers do not depend on it."""
        if self.server.simulated:
            return f"simulator:{self.name}"
        if self.server.local_model:
            return f"llamacpp:{self.server.local_model}"
        return self.connection.base_url

    @property
    def loopback(self) -> bool:
        """The server is on this machine (the simulator, a self-hosted one on a loopback address): no proxy,
        and batches that finish in moments."""
        return self.server.simulated or urlsplit(self.connection.base_url).hostname in ("127.0.0.1", "localhost", "::1")

    @property
    def repeats_runs(self) -> bool:
        """Every run gets the same replies (a deterministic server at temperature 0)."""
        return self.sampling.deterministic and self.sampling.temperature == 0

    def flat(self) -> dict[str, Any]:
        """Every field by its flat name (`FLAT`), in the order meta.json has always saved them (a copy)."""
        nested = dataclasses.asdict(self)
        return {key: nested[section][name] if section else nested[name] for key, (section, name) in FLAT.items()}

    def request_settings(self) -> dict[str, Any]:
        """Every setting that shapes requests or their pacing, for `meta.json`: `flat`, the shape meta.json
        has always saved (results.schema.ModelInfo reads it back through `sectioned`).

        That is every field: the profile holds only the *name* of the key's environment variable,
        never the key. A key a user wrote into the base URL itself (`https://user:KEY@host`, `?key=...`)
        is masked (`redact_url`).
        """
        out = self.flat()
        out["base_url"] = redact_url(out["base_url"]) if out["base_url"] else out["base_url"]
        return out


# The sections, by table name, as `ModelProfile` declares them.
SECTIONS: dict[str, type] = {"connection": Connection, "sampling": Sampling, "pacing": Pacing, "retries": Retries,
                             "batch": Batch, "prices": Prices, "prompt": Prompt, "server": Server}
# Every field by its flat name (the layout before the sections, meta.json's, the flags'), in the order
# meta.json saves them: (section, field); "" is the top. A field keeps its name in its section unless that
# name began with the section's own (`price_input_per_mtok` is [prices] input_per_mtok).
FLAT: dict[str, tuple[str, str]] = {
    "name": ("", "name"), "model": ("", "model"), "base_url": ("connection", "base_url"),
    "provider": ("connection", "provider"), "wire": ("connection", "wire"),
    "api_key_env": ("connection", "api_key_env"), "concurrency": ("pacing", "concurrency"),
    "rpm": ("pacing", "rpm"), "tpm": ("pacing", "tpm"), "timeout_s": ("connection", "timeout_s"),
    "max_retries": ("retries", "max_retries"), "max_tokens": ("sampling", "max_tokens"),
    "temperature": ("sampling", "temperature"), "extra_body": ("sampling", "extra_body"),
    "simulated": ("server", "simulated"), "api_key_required": ("connection", "api_key_required"),
    "truncation_retries": ("retries", "truncation_retries"), "backoff_base_s": ("retries", "backoff_base_s"),
    "backoff_max_s": ("retries", "backoff_max_s"), "max_wait_s": ("retries", "max_wait_s"),
    "give_up_after_s": ("retries", "give_up_after_s"), "adaptive_concurrency": ("pacing", "adaptive_concurrency"),
    "structured": ("sampling", "structured"), "send_seed": ("sampling", "send_seed"), "batch": ("batch", "api"),
    "batch_max_requests": ("batch", "max_requests"), "batch_max_bytes": ("batch", "max_bytes"),
    "price_input_per_mtok": ("prices", "input_per_mtok"), "price_output_per_mtok": ("prices", "output_per_mtok"),
    "batch_discount": ("prices", "batch_discount"), "price_cached_input_per_mtok": ("prices", "cached_input_per_mtok"),
    "price_cache_write_per_mtok": ("prices", "cache_write_per_mtok"), "price_source": ("prices", "source"),
    "prompt_cache": ("prompt", "cache"), "cache_min_tokens": ("prompt", "cache_min_tokens"),
    "follow_rate_headers": ("pacing", "follow_rate_headers"), "reasoning_params": ("sampling", "reasoning_params"),
    "chars_per_token": ("prompt", "chars_per_token"), "context_tokens": ("prompt", "context_tokens"),
    "local_model": ("server", "local_model"), "server_slots": ("server", "slots"),
    "server_threads": ("server", "threads"), "server_ctx": ("server", "ctx"),
    "deterministic": ("sampling", "deterministic"),
}


@dataclass
class _LoaderKeys:
    """Keys a TOML file may carry that are resolved here rather than copied onto the profile: `model_env` at
    the top, `base_url_env` in [connection] (at the top in the flat layout)."""

    base_url_env: str | None = None
    """The environment variable whose value, when set, is the base_url (`--base-url` beats it)."""
    model_env: str | None = None
    """The environment variable whose value, when set, is the model id."""


# Where a loader key sits in a sectioned file, and its flat name.
_LOADER_AT: dict[str, tuple[str, str]] = {"model_env": ("", "model_env"), "base_url_env": ("connection", "base_url_env")}
_MOVES = FLAT | _LOADER_AT
# Every flat name of a section's field, by (section, field): the labels of a flat file's messages.
_FLAT_NAME = {where: key for key, where in _MOVES.items()}


def is_flat(raw: Mapping[str, Any]) -> bool:
    """`raw` (a profile file's keys) uses the layout before the sections: a section's key at the top."""
    return any(k in _MOVES and _MOVES[k][0] and not (k in SECTIONS and isinstance(v, Mapping))
               for k, v in raw.items())


def sectioned(raw: Mapping[str, Any], where: str = "") -> dict[str, Any]:
    """The one migration of the flat layout: every key of `raw` that names a field by its flat name (`FLAT`)
    moved into its section (`rpm` -> [pacing] rpm, `price_input_per_mtok` -> [prices] input_per_mtok, a
    string `batch` -> [batch] api); sections and unknown keys stay as they are (the caller judges them).
    A key given both ways is a `ConfigError` naming `where`."""
    out: dict[str, Any] = {}
    moving: list[tuple[str, Any]] = []
    for key, value in raw.items():
        if key in SECTIONS and isinstance(value, Mapping):
            out[key] = dict(value)
        elif key in _MOVES and _MOVES[key][0]:
            moving.append((key, value))
        else:
            out[key] = value
    for key, value in moving:
        section, name = _MOVES[key]
        table = out.setdefault(section, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{where}{section} = must be a table [{section}] of its settings")
        if name in table:
            raise ConfigError(f"{where}{key} is given twice: at the top (the flat layout) and as [{section}] {name}; "
                              "keep one")
        table[name] = value
    return out


def _build(raw: Mapping[str, Any], where: str, label: Callable[[str, str], str]) -> ModelProfile:
    """A profile from sectioned keys, each value checked against its field (one `ConfigError` line naming
    `where` and the key as `label(section, field)` spells it)."""
    top = {k: v for k, v in raw.items() if k not in SECTIONS}
    parts: dict[str, Any] = {}
    for section, cls in SECTIONS.items():
        values = raw.get(section, {})
        if not isinstance(values, Mapping):
            raise ConfigError(f"{where}{section} = must be a table [{section}] of its settings")
        known = cls.__pydantic_fields__  # type: ignore[attr-defined]  # pydantic adds it
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ConfigError(f"{where}[{section}] has unknown key(s) {unknown}; known: {sorted(known)}")
        parts[section] = checked(cls, values, where, functools.partial(label, section))
    unknown = sorted(set(top) - {"name", "model"})
    if unknown:
        raise ConfigError(f"{where}unknown field(s) {unknown}")
    check_values(ModelProfile, top, where, lambda k: label("", k))
    for required in ("name", "model"):
        if required not in top:
            raise ConfigError(f"{where}{required} is required")
    return ModelProfile(**top, **parts)


def _file_label(section: str, name: str) -> str:
    return f"[{section}] {name} =" if section else f"{name} ="


def _flat_label(section: str, name: str) -> str:
    return f"{_FLAT_NAME.get((section, name), name)} ="


def _as_named(spelled: str, _field: str) -> str:
    return spelled


def check_flat(values: Mapping[str, Any], where: str, label: Callable[[str], str]) -> None:
    """Values by flat name (`FLAT`: a flag's) against their fields' types and ranges; else one `ConfigError`
    line naming the key as `label(flat name)` spells it."""
    for key, value in values.items():
        if key not in FLAT:
            raise ValueError(f"no profile field named {key!r}")  # a programming error of the caller
        section, name = FLAT[key]
        check_values(SECTIONS[section] if section else ModelProfile, {name: value}, where,
                     functools.partial(_as_named, label(key)))


def revised(profile: ModelProfile, where: str = "", **changes: Any) -> ModelProfile:
    """A copy of `profile` with `changes` (fields by their flat names: `base_url=`, `rpm=`, `batch=`, as the
    flags and meta.json name them), checked as a file's values are (`where` names who asked). The one way to
    change a profile: nothing changes one in place."""
    unknown = sorted(set(changes) - set(FLAT))
    if unknown:
        raise ValueError(f"no profile field named {unknown}; known: {sorted(FLAT)}")  # the caller's mistake
    raw = dataclasses.asdict(profile)
    for key, value in changes.items():
        section, name = FLAT[key]
        (raw[section] if section else raw)[name] = value
    return _build(raw, where, _flat_label)


def overridden(profile: ModelProfile, overrides: Mapping[str, Any]) -> ModelProfile:
    """The command line's overrides (`settings.invocation.ProfileOverrides`, by flat name; None = not given)
    applied: the one place they are. A pace typed on the command line is kept, whatever the provider's
    headers say."""
    given = {k: v for k, v in overrides.items() if v is not None}
    unknown = sorted(set(given) - set(FLAT))
    if unknown:
        raise ConfigError(f"unknown model profile setting(s) {unknown} (from the command line); known: {sorted(FLAT)}")
    if given.keys() & {"rpm", "tpm"}:
        given["follow_rate_headers"] = False
    return revised(profile, "command line: ", **given) if given else profile


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


# The profile files already told they use the flat layout (one note per file and process).
_TOLD_FLAT: set[Path] = set()


def _note_flat(path: Path) -> None:
    key = path.resolve()
    if key in _TOLD_FLAT:
        return
    _TOLD_FLAT.add(key)
    example = MODELS_DIR / f"{path.stem}.toml"
    example = example if example.is_file() else MODELS_DIR / "local.toml"
    log.warning("profile %s uses the flat layout (every key at the top); it still loads. The sectioned form "
                "([connection], [sampling], [pacing], [retries], [batch], [prices], [prompt], [server]) is in %s; "
                "README \"Model profiles\" lists where each key went", path, example)


def _merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over`'s keys over `base`'s, section by section (a file naming a provider over the provider's)."""
    out = {k: dict(v) if isinstance(v, Mapping) and k in SECTIONS else v for k, v in base.items()}
    for k, v in over.items():
        if k in SECTIONS and isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


class _Raw(NamedTuple):
    fields: dict[str, Any]  # in sections: a file's, laid over its provider's
    where: str  # where they come from, for messages
    hint: str | None  # what to do about a missing endpoint
    flat: bool = False  # the file uses the flat layout: its messages name its keys as it does


def _raw_profile(name: str, models_dir: Path) -> _Raw:
    """The profile's keys in sections (a file's, laid over its provider's), where they come from (for
    messages), the hint for a missing endpoint, and whether the file used the flat layout. `PROVIDER/MODEL` is
    the provider table's profile (llm/catalog.py), unless a file of that path exists."""
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
    flat = is_flat(raw)
    if flat:
        _note_flat(path)
    raw = sectioned(raw, f"{path}: ")
    unknown = set(raw) - set(SECTIONS) - {"name", "model", "model_env"}
    if unknown:
        keys = sorted(_MOVES) if flat else ["name", "model", "model_env", *(f"[{s}]" for s in SECTIONS)]
        raise ConfigError(f"{path}: unknown field(s) {sorted(unknown)}; known: {keys}")
    raw.setdefault("name", path.stem)
    named = raw.get("connection", {}).get("provider") if isinstance(raw.get("connection"), Mapping) else None
    if named is None:
        return _Raw(raw, str(path), None, flat)
    known = catalog.providers()
    if not isinstance(named, str) or named not in known:
        raise ConfigError(f"{path}: provider = {named!r} is not a provider of {PROVIDERS_FILE} "
                          f"(known: {', '.join(known)})")
    if not isinstance(raw.get("model"), str):
        raise ConfigError(f"{path}: 'model' (the provider's model id) is required")
    # The file overrides anything of its provider's (prices included).
    return _Raw(_merged(catalog.profile_fields(known[named], raw["model"], raw["name"]), raw), str(path),
                catalog.base_url_hint(known[named]), flat)


def _loader_keys(raw: dict[str, Any], where: str, label: Callable[[str, str], str]) -> _LoaderKeys:
    """The loader's keys taken out of `raw` (`model_env` at the top, `base_url_env` in [connection])."""
    found: dict[str, Any] = {}
    for key, (section, name) in _LOADER_AT.items():
        table = raw.get(section) if section else raw
        if isinstance(table, dict) and name in table:
            found[key] = table.pop(name)
    return checked(_LoaderKeys, found, where, lambda k: label(*_LOADER_AT[k]))


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
    `overrides` replace profile fields by flat name (`rpm=`, `concurrency=` from flags; None values are
    ignored: `overridden`). With `require_key`, a required key missing from the environment is a `ConfigError`
    now, not a 401 later.
    """
    env = os.environ if env is None else env
    raw, where, hint, flat = _raw_profile(name, models_dir)
    label = _flat_label if flat else _file_label
    loader = _loader_keys(raw, f"{where}: ", label)
    connection = raw.setdefault("connection", {})
    if loader.model_env and env.get(loader.model_env):
        raw["model"] = env[loader.model_env]
    if loader.base_url_env and env.get(loader.base_url_env) and isinstance(connection, dict):
        connection["base_url"] = env[loader.base_url_env]
    if base_url and isinstance(connection, dict):
        connection["base_url"] = base_url
    if "model" not in raw:
        raise ConfigError(f"{where}: 'model' (the provider's model id) is required")
    profile = overridden(_build(raw, f"{where}: ", label), overrides)
    _validate(profile, where, hint)
    watch_env(profile.connection.api_key_env)  # a profile file from elsewhere: its key is redacted like the bundled ones
    if require_key:
        resolve_api_key(profile, env)
    return profile


# Request fields the engine itself sets per call; a profile's extra_body may not override them.
_ENGINE_FIELDS = ("model", "messages", "seed")


def _validate(p: ModelProfile, path: str, hint: str | None = None) -> None:
    c = p.connection
    if not p.model:
        raise ConfigError(f"{path}: model must not be empty")
    if not p.name.strip():
        raise ConfigError(f"{path}: name must not be empty")
    owned = [k for k in _ENGINE_FIELDS if k in p.sampling.extra_body]
    if owned:
        raise ConfigError(f"{path}: [sampling.extra_body] may not set {', '.join(owned)} (the engine sets them per call)")
    if p.sampling.reasoning_params and p.sampling.temperature != 1.0:
        raise ConfigError(f"{path}: {p.model} is a reasoning model: it takes only the default temperature (1); "
                          "remove temperature (or set reasoning_params = false for a host that accepts one)")
    if not c.base_url and not p.server.simulated and not p.server.local_model:
        raise ConfigError(f"{path}: no base_url; " + (hint or "set it in the profile, its base_url_env, or pass --base-url"))
    if c.base_url and not c.base_url.startswith(("http://", "https://")):
        raise ConfigError(f"{path}: base_url {c.base_url!r} must start with http:// or https://")
    if c.base_url:
        try:
            host = urlsplit(c.base_url).hostname
            urlsplit(c.base_url).port  # noqa: B018 - raises ValueError on a port that is not a number
        except ValueError as e:
            raise ConfigError(f"{path}: base_url {c.base_url!r} is not a URL ({e})") from None
        if not host:
            raise ConfigError(f"{path}: base_url {c.base_url!r} names no host")


def resolve_api_key(profile: ModelProfile, env: Mapping[str, str] | None = None) -> str | None:
    """The key from the profile's env var; `ConfigError` naming the variable if required and unset."""
    env = os.environ if env is None else env
    c = profile.connection
    if not c.api_key_env:
        return None
    key = env.get(c.api_key_env, "").strip() or None
    if key is None and c.api_key_required and not profile.server.simulated and not profile.server.local_model:
        raise ConfigError(
            f"model {profile.name!r} needs an API key: set {c.api_key_env} "
            f"(e.g. `export {c.api_key_env}=...`) before running"
        )
    return key
