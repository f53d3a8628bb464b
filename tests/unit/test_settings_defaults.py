"""Every default is written once, in the settings sections (`evaluator/settings/sections.py`, the invocation's in
`settings/invocation.py`); `configs/default.toml` documents them for a user and must say the same: every key it
holds equals its field's default, and every field with a value (not None) is there."""

from __future__ import annotations

import dataclasses
import tomllib

from evaluator.core.paths import DEFAULT_CONFIG
from evaluator.settings.invocation import Invocation
from evaluator.settings.load import INVOCATION_KEYS, SECTIONS, load
from evaluator.settings.sections import ARCHS, Settings
from evaluator.study import archs


def _default(cls: type, name: str) -> object:
    return getattr(cls(), name)


def disagreements(doc: dict[str, dict[str, object]]) -> list[str]:
    """Where a TOML document of the settings differs from the sections' defaults (lists read as tuples)."""
    bad = []
    for table, cls in SECTIONS.items():
        given = doc.get(table, {})
        options = INVOCATION_KEYS.get(table, ())
        for f in dataclasses.fields(cls):
            want = _default(cls, f.name)
            if f.name not in given:
                if want is not None:
                    bad.append(f"[{table}] {f.name}: missing (default {want!r})")
                continue
            got = given[f.name]
            if (tuple(got) if isinstance(got, list) else got) != want:
                bad.append(f"[{table}] {f.name} = {got!r}, but the default is {want!r}")
        for name in options:
            want = _default(Invocation, name)
            if name not in given:
                if want is not None:
                    bad.append(f"[{table}] {name}: missing (default {want!r})")
            elif given[name] != want:
                bad.append(f"[{table}] {name} = {given[name]!r}, but the default is {want!r}")
    return bad


def test_default_toml_says_what_the_sections_default_to() -> None:
    doc = tomllib.loads(DEFAULT_CONFIG.read_text(encoding="utf-8"))
    assert disagreements(doc) == []
    assert load(DEFAULT_CONFIG) == (Settings(), Invocation())  # and it loads to exactly the defaults


def test_a_drifted_default_is_found() -> None:
    doc = tomllib.loads(DEFAULT_CONFIG.read_text(encoding="utf-8"))
    doc["retrieval"]["ks"] = [1, 3, 5, 10]
    del doc["run"]["runs"]
    doc["run"]["stop_grace_s"] = 30
    assert disagreements(doc) == ["[retrieval] ks = [1, 3, 5, 10], but the default is (1, 3, 5, 10, 20)",
                                  "[run] runs: missing (default 4)",
                                  "[run] stop_grace_s = 30, but the default is 8.0"]


def test_the_built_in_architectures_are_named_once() -> None:
    """`settings.sections.ARCHS` is the one list of the built-ins' names: `study.archs` makes each from the class
    of that name (a class renamed without the list, or a list entry without its class, fails here)."""
    assert archs.BUILTIN is ARCHS
    assert [archs.builtin(name, 0.0).name for name in ARCHS] == list(ARCHS)
