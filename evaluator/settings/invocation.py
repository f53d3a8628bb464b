"""What one invocation asks beyond the study's settings: a dry run, the batch APIs, a budget, the profile
flags, where the pacing is shared, which settings were typed as flags. Never saved in meta.json (the
numbers do not depend on it); held by `cli` and `app` only, which hand each stage the values it needs."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import field
from typing import Any, Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from evaluator.llm.engine import STOP_GRACE_S

# --batch-fallback: requests the batch API did not answer stop the study, or go online at the online price
BATCH_FALLBACKS = ("stop", "online")
BatchFallback = Literal[BATCH_FALLBACKS]  # type: ignore[valid-type]  # a Literal of a tuple: pydantic reads it


@dataclass(frozen=True)
class ProfileOverrides:
    """Flags that replace a model profile's request settings for this invocation (None = keep the profile's).

    Each is named as the profile field it replaces by its flat name (`llm.profiles.FLAT`: `rpm` is [pacing]
    rpm); `llm.profiles.overridden` applies them, the one place that does."""

    base_url: str | None = None
    concurrency: int | None = None
    rpm: float | None = None
    tpm: float | None = None
    max_tokens: int | None = None
    timeout_s: float | None = None
    structured: str | None = None  # how each prompt's JSON schema is sent (the profile's choices)

    @classmethod
    def given_in(cls, values: Mapping[str, Any]) -> ProfileOverrides:
        """The overrides among `values` (parsed flags by destination: `--timeout` is `timeout_s`); absent = None."""
        return cls(**{f.name: values.get(f.name) for f in dataclasses.fields(cls)})

    def as_kwargs(self) -> dict[str, Any]:
        """The flags given; their types and ranges are the profile's (`ModelProfile`), checked in `settings.load`."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass(frozen=True)
class Invocation:
    """This invocation's options. The first four may also come from the config's [run] table."""

    # --budget: the most this invocation may spend (USD, online prices)
    budget_usd: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    # --rate-dir: share RPM/TPM pacing with other processes here (else the cache folder)
    rate_dir: str = ""
    # --batch-fallback: requests the batch API did not answer stop the study ("stop") or go online ("online")
    batch_fallback: BatchFallback = "stop"
    # --stop-grace: seconds a call on the wire at a stop signal (SIGTERM, SIGHUP, Ctrl-C) gets to arrive and be cached
    stop_grace_s: float = Field(default=STOP_GRACE_S, ge=0, le=600)
    # command line only
    data_from_cli: bool = False  # --data or EVALUATOR_DATA must exist; else may fall back
    extras: bool = True  # the scaling and routing studies after a full run
    # --batch: "submit" through the profiles' batch APIs; --batch-cancel: "cancel"
    batch: Literal["submit", "cancel"] | None = None
    dry_run: bool = False  # --dry-run: plan the calls, tokens, cost and time; send nothing
    overwrite: bool = False  # --overwrite: --out may hold another study's results; they are replaced, not merged
    fail_fast: bool = False  # --fail-fast: the first architecture that fails on a query stops the study (plugin authors)
    overrides: ProfileOverrides = field(default_factory=ProfileOverrides)
    # settings given as flags (not from the file), by dotted name ("retrieval.ks")
    cli_keys: frozenset[str] = frozenset()
