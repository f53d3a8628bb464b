"""Settings: `configs/default.toml` (every default) overridden by command-line flags, typed and checked.

The file's tables are the sections of `settings.sections.Settings`, its keys their fields; [run] also
holds four options of the invocation (`INVOCATION_KEYS`, not saved). A wrong type, an unknown key or an
impossible value is one `ConfigError` naming the file and `[table] key` (or the flag) and what is
expected — before any work starts. The sections are built once, checked, and never changed after.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from evaluator.core.errors import ConfigError
from evaluator.core.paths import DEFAULT_CONFIG
from evaluator.core.validation import check_values
from evaluator.llm.profiles import check_flat
from evaluator.settings.invocation import Invocation, ProfileOverrides
from evaluator.settings.sections import (
    AnalysisSettings,
    DataSettings,
    EmbedSettings,
    RetrievalSettings,
    RunSettings,
    Settings,
)

__all__ = ["Settings", "Invocation", "load", "load_settings", "flag", "SECTIONS"]

# TOML table -> its section's type (the fields of `Settings`, in file order)
SECTIONS: dict[str, type] = {"data": DataSettings, "embed": EmbedSettings, "retrieval": RetrievalSettings,
                             "run": RunSettings, "analysis": AnalysisSettings}
# keys of a table that set the invocation's options, not the study's settings (never saved)
INVOCATION_KEYS: dict[str, tuple[str, ...]] = {"run": ("budget_usd", "rate_dir", "batch_fallback", "stop_grace_s")}
# flags whose name is not the key's (`--embedder` for [embed] model, `--timeout` for timeout_s, ...); by dotted
# name for a section's key, by name for an option of the invocation or a profile override
FLAGS = {"data.dir": "--data", "embed.model": "--embedder", "run.models": "--model",
         "analysis.scaling_sizes": "--sizes", "analysis.scaling_seeds": "--seeds", "analysis.scaling_subsets": "--subsets",
         "analysis.routing_train": "--train", "analysis.routing_test": "--test", "analysis.routing_folds": "--folds",
         "analysis.routing_seed": "--seed", "stop_grace_s": "--stop-grace", "timeout_s": "--timeout",
         "budget_usd": "--budget", "run.arch_timeout_s": "--arch-timeout"}


def flag(name: str) -> str:
    """The command-line flag of a setting (dotted: "retrieval.k") or an option ("budget_usd")."""
    return FLAGS.get(name) or "--" + name.rsplit(".", 1)[-1].replace("_", "-")


def _read(path: Path) -> dict[str, dict[str, Any]]:
    """The file's tables, every table and key known."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the config ({e.strerror or e}); pass a readable --config FILE.") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: invalid TOML ({e}).") from None
    for section, given in raw.items():
        cls = SECTIONS.get(section)
        if cls is None or not isinstance(given, dict):
            raise ConfigError(f"{path}: unknown section [{section}]; known: {', '.join(SECTIONS)}.")
        names = [f.name for f in dataclasses.fields(cls)] + list(INVOCATION_KEYS.get(section, ()))
        for key in given:
            if key not in names:
                raise ConfigError(f"{path}: unknown key {key!r} in [{section}]; known: {', '.join(names)}.")
    return raw


def _in_table(table: str) -> Callable[[str], str]:
    """How the file names a key of `table`: `[data] limit =`."""
    return lambda key: f"[{table}] {key} ="


def _as_flag(table: str) -> Callable[[str], str]:
    """The flag of a key of `table`: `--limit`."""
    return lambda key: flag(f"{table}.{key}")


def load(path: Path | None = None, flags: Mapping[str, Any] | None = None,
         options: Mapping[str, Any] | None = None) -> tuple[Settings, Invocation]:
    """The config file (default `configs/default.toml`) with `flags` over it, checked: the study's settings
    and this invocation's options. `flags`: setting values typed on the command line, by dotted name
    ("retrieval.k"; paths already made absolute); `options`: the invocation's, by field name ("dry_run",
    "budget_usd", "overrides")."""
    path = path or DEFAULT_CONFIG
    raw = _read(path)
    flags = dict(flags or {})
    unknown = sorted(k for k in flags if k.split(".", 1)[0] not in SECTIONS)
    if unknown:
        raise ValueError(f"no such settings: {unknown}")  # a programming error of the caller, not the user's
    opts = dict(options or {})
    # (type, the file's values, the flags' values, how each names a key): settings by section, then options
    parts: list[tuple[type, dict[str, Any], dict[str, Any], Callable[[str], str], Callable[[str], str]]] = []
    file_options: dict[str, Any] = {}
    for name, cls in SECTIONS.items():
        table = dict(raw.get(name, {}))
        file_options |= {k: table.pop(k) for k in INVOCATION_KEYS.get(name, ()) if k in table}
        typed = {k.split(".", 1)[1]: v for k, v in flags.items() if k.split(".", 1)[0] == name}
        parts.append((cls, table, typed, _in_table(name), _as_flag(name)))
    given = {k: v for k, v in opts.items() if k in INVOCATION_KEYS["run"]}
    parts.append((Invocation, file_options, given, _in_table("run"), flag))
    # the whole file first, then every flag: the first mistake in the file is the one reported, as it is read
    for cls, in_file, _, label, _ in parts:
        check_values(cls, in_file, f"{path}: ", label)
    for cls, _, typed, _, label in parts:
        check_values(cls, typed, "", label)
    overrides = opts.get("overrides", ProfileOverrides())
    check_flat(overrides.as_kwargs(), "", flag)  # each flag against its profile field's type and range
    built = [cls(**(in_file | typed)) for cls, in_file, typed, _, _ in parts]
    rest = {k: v for k, v in opts.items() if k not in given}
    invocation = dataclasses.replace(built.pop(), cli_keys=frozenset(flags), **rest)
    return Settings(*built), invocation


def load_settings(path: Path | None = None) -> Settings:
    """The config file's study settings alone (no flags)."""
    return load(path)[0]
