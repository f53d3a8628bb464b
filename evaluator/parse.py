"""Robust parsing of discovery (stubs) and planner (plan) replies.

Real models wrap JSON in code fences or prose, leave trailing commas, use single quotes, rename
keys, and get cut off by a token limit. Every one of those replies still carries usable content, so
the parsers recover what they can and only report an error when nothing JSON-like is found. A
recovered-but-imperfect reply is not an error: the study measures the architectures, not the
models' formatting discipline.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Plan", "Stub", "parse_plan", "parse_stubs", "stub_text"]


@dataclass
class Stub:
    name: str
    reasoning: str


@dataclass
class Plan:
    steps: list[str]
    selected: list[str]  # offered/registry api ids where resolvable, else the raw name
    refused: bool  # selected == [] (also when the reply could not be parsed; see parse_error)
    parse_error: str | None


def stub_text(stub: Stub) -> str:
    """The text embedded for a stub's retrieval (STUDY.md)."""
    return f"{stub.name}: {stub.reasoning}"


# ---------------------------------------------------------------------------------------------
# Tolerant JSON extraction
# ---------------------------------------------------------------------------------------------

_THINK_RE = re.compile(r"<think>.*?(</think>|\Z)", re.S | re.I)
_MAX_STARTS = 40  # bounds the work on long prose full of brackets
_MAX_CUTS = 60
_PY_LITERALS = {"True": "true", "False": "false", "None": "null"}


def _scan(text: str, start: int) -> tuple[int | None, list[tuple[int, list[str]]]]:
    """Match brackets from `text[start]`; return (index of the closing bracket or None, cut points).

    A cut point (end, closers) is a prefix that becomes valid JSON by appending the closers: right
    after a nested container closes, or at a comma inside a list (the element before it is
    complete). Commas inside objects are not cut points, so a truncated object is dropped whole
    rather than recovered without its later keys.
    """
    stack: list[str] = []
    cuts: list[tuple[int, list[str]]] = []
    quote: str | None = None
    i, n = start, len(text)
    while i < n:
        c = text[i]
        if quote is not None:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = None
        elif c == '"' or c == "'":
            quote = c
        elif c == "[":
            stack.append("]")
        elif c == "{":
            stack.append("}")
        elif c == "]" or c == "}":
            if not stack or stack[-1] != c:
                return None, cuts
            stack.pop()
            if not stack:
                return i, cuts
            cuts.append((i + 1, stack.copy()))
        elif c == "," and stack and stack[-1] == "]":
            cuts.append((i, stack.copy()))
        i += 1
    return None, cuts


def _repair(s: str) -> str:
    """Rewrite near-JSON as JSON: single-quoted strings, trailing commas, Python literals."""
    out: list[str] = []
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c == '"' or c == "'":
            quote = c
            out.append('"')
            i += 1
            while i < n and s[i] != quote:
                ch = s[i]
                if ch == "\\" and i + 1 < n:
                    nxt = s[i + 1]
                    # \' is not a JSON escape; the quote needs none inside a double-quoted string
                    out.append("'" if nxt == "'" else ch + nxt)
                    i += 2
                    continue
                if ch == '"':
                    out.append('\\"')
                elif ch == "\n":
                    out.append("\\n")
                else:
                    out.append(ch)
                i += 1
            out.append('"')
            i += 1
        elif c == ",":
            j = i + 1
            while j < n and s[j].isspace():
                j += 1
            if j >= n or s[j] not in "]}":
                out.append(c)
            i += 1
        elif c.isalpha():
            j = i
            while j < n and (s[j].isalnum() or s[j] == "_"):
                j += 1
            word = s[i:j]
            out.append(_PY_LITERALS.get(word, word))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _loads(s: str) -> Any:
    """json.loads, then once more after repair; raises ValueError when neither works."""
    try:
        return json.loads(s, strict=False)
    except ValueError:
        return json.loads(_repair(s), strict=False)


def _json_values(text: str) -> Iterator[Any]:
    """Yield every JSON container found in `text`, outermost first, in reading order.

    Callers take the first value that carries what they need, so a stray "[1]" or "{name}" in
    surrounding prose cannot hide the real answer.
    """
    text = _THINK_RE.sub("", text)
    starts = [m.start() for m in re.finditer(r"[\[{]", text)][:_MAX_STARTS]
    covered = -1
    for start in starts:
        if start <= covered:
            continue
        end, cuts = _scan(text, start)
        if end is not None:
            try:
                value = _loads(text[start : end + 1])
            except ValueError:
                continue
            covered = end
            yield value
            continue
        # Unclosed (truncated) container: try the longest recoverable prefix first.
        for cut, closers in reversed(cuts[-_MAX_CUTS:]):
            try:
                value = _loads(text[start:cut] + "".join(reversed(closers)))
            except ValueError:
                continue
            yield value
            # Its inner containers are parts of what was just recovered, not answers of their own.
            return
        # Nothing recovered: the unclosed bracket may have been prose ("see [1") before the answer.


def _no_json_reason(text: str, found_json: bool, what: str) -> str:
    if found_json:
        return f"reply JSON holds no {what}"
    if "[" in text or "{" in text:
        return "malformed or truncated JSON in reply"
    return "no JSON found in reply"


def _first(d: dict, keys: Sequence[str]) -> Any:
    for k in keys:
        if k in d and d[k] is not None:
            return d[k]
    lowered = {str(k).strip().lower(): v for k, v in d.items()}
    for k in keys:
        if lowered.get(k) is not None:
            return lowered[k]
    return None


# ---------------------------------------------------------------------------------------------
# Stubs
# ---------------------------------------------------------------------------------------------

_NAME_KEYS = ("name", "function", "function_name", "tool_name", "tool", "api_name", "api", "stub", "title")
_REASON_KEYS = (
    "reasoning", "reason", "description", "rationale", "purpose", "explanation", "why", "justification",
)
_STUB_LIST_KEYS = (
    "stubs", "tools", "functions", "tool_stubs", "apis", "api_stubs", "results", "items", "data",
)
_IDENT_RE = re.compile(r"^[A-Za-z_][\w.]*$")
_CALL_ARGS_RE = re.compile(r"\s*\(.*\)\s*$")


def _clean_name(name: Any) -> str:
    if not isinstance(name, str):
        return ""
    name = name.strip().strip("`'\" ")
    # "get_weather(city)" names the same function as "get_weather"
    return _CALL_ARGS_RE.sub("", name).strip()


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    return json.dumps(value, ensure_ascii=False)


def _stub_from(item: Any) -> Stub | None:
    if isinstance(item, str):
        head, sep, tail = item.partition(":")
        if sep and _IDENT_RE.match(head.strip()):
            return Stub(_clean_name(head), tail.strip()) if _clean_name(head) else None
        name = _clean_name(item)
        return Stub(name, "") if name else None
    if not isinstance(item, dict):
        return None
    # OpenAI tool-schema style: {"type": "function", "function": {"name": ..., "description": ...}}
    inner = item.get("function")
    if isinstance(inner, dict):
        return _stub_from(inner)
    name = _clean_name(_first(item, _NAME_KEYS))
    if not name:
        return None
    return Stub(name, _text(_first(item, _REASON_KEYS)))


def _stub_items(value: Any) -> list[Any] | None:
    """The list of stub-like items in a parsed value, or None if it does not look like stubs."""
    if isinstance(value, list):
        return value
    if not isinstance(value, dict):
        return None
    listed = _first(value, _STUB_LIST_KEYS)
    if isinstance(listed, list):
        return listed
    if _first(value, _NAME_KEYS) is not None:
        return [value]
    for v in value.values():
        if isinstance(v, list) and any(isinstance(x, dict) for x in v):
            return v
    # {"get_weather": "why", ...}: a name -> reasoning map
    if value and all(isinstance(k, str) and _IDENT_RE.match(k) for k in value) and all(
        isinstance(v, str) for v in value.values()
    ):
        return [{"name": k, "reasoning": v} for k, v in value.items()]
    return None


def _stubs_of(value: Any) -> list[Stub] | None:
    items = _stub_items(value)
    if items is None:
        return None
    out: list[Stub] = []
    seen: set[tuple[str, str]] = set()
    for item in items:
        stub = _stub_from(item)
        if stub is None or (stub.name, stub.reasoning) in seen:
            continue
        seen.add((stub.name, stub.reasoning))
        out.append(stub)
    return out


def parse_stubs(text: str | None) -> tuple[list[Stub], str | None]:
    """Parse a discovery reply into stubs; returns (stubs, error or None).

    An explicit empty list is a valid answer with no stubs (no error).
    """
    if text is None or not text.strip():
        return [], "empty reply"
    fallback: list[Stub] | None = None
    found_json = False
    for value in _json_values(text):
        found_json = True
        stubs = _stubs_of(value)
        if stubs:
            return stubs, None
        if stubs is not None and fallback is None:
            fallback = stubs
    if fallback is not None:
        return fallback, None
    return [], _no_json_reason(text, found_json, "stubs")


# ---------------------------------------------------------------------------------------------
# Plans
# ---------------------------------------------------------------------------------------------

_SELECTED_KEYS = (
    "selected_apis", "apis", "selected", "tools", "selected_tools", "api_list", "selected_api",
    "apis_selected", "chosen_apis",
)
_STEPS_KEYS = ("steps", "plan", "intended_steps", "step_list")
_STEP_TEXT_KEYS = ("step", "description", "action", "text", "task", "instruction")
_STEP_API_KEYS = ("api", "apis", "tool", "tools", "api_name", "selected_api", "uses")
_LEAD_RE = re.compile(r"^\s*(?:[-*\u2022]\s+|\(?\d{1,2}[.)]\s+|#\d{1,2}\s+)")
_QUOTES = " \t'\"`\u201c\u201d\u2018\u2019*"
_SLASH_RE = re.compile(r"\s*(?:/|::)\s*")
_HEAVY_RE = re.compile(r"[\W_]+")
_FUZZY_CUTOFF = 0.85
_FUZZY_MARGIN = 0.02  # a near-miss equally close to two offered APIs names neither


def _light(s: str) -> str:
    s = _LEAD_RE.sub("", s).strip(_QUOTES).rstrip(":.,;").strip(_QUOTES)
    s = _SLASH_RE.sub("/", s)
    return " ".join(s.split()).casefold()


def _heavy(s: str) -> str:
    return _HEAVY_RE.sub("", _light(s))


def _split_display(api_id: str, display: str) -> str | None:
    """The api-name part of a display, found by aligning it with the api id (names may hold '/')."""
    for m in re.finditer("/", display):
        i = m.start()
        if api_id[:i] == display[:i] and api_id[i : i + 2] == "::" and api_id[i + 2 :] == display[i + 1 :]:
            return display[i + 1 :]
    head, sep, tail = api_id.partition("::")
    return tail if sep else None


class _Resolver:
    """Maps a model-written API name to one of the offered api ids, from strict to lenient."""

    def __init__(self, offered: Sequence[tuple[str, str]]) -> None:
        self.exact: dict[str, str] = {}
        self.levels: list[dict[str, set[str]]] = [{}, {}, {}, {}]  # light, heavy, api light, api heavy
        self.fuzzy: list[tuple[str, str]] = []
        for api_id, display in offered:
            self.exact.setdefault(display, api_id)
            self.exact.setdefault(api_id, api_id)
            for key in (display, api_id):
                self.levels[0].setdefault(_light(key), set()).add(api_id)
                self.levels[1].setdefault(_heavy(key), set()).add(api_id)
            api_name = _split_display(api_id, display)
            if api_name:
                self.levels[2].setdefault(_light(api_name), set()).add(api_id)
                self.levels[3].setdefault(_heavy(api_name), set()).add(api_id)
            self.fuzzy.append((_light(display), api_id))

    def _lookup(self, name: str) -> str | None:
        if name in self.exact:
            return self.exact[name]
        keys = (_light(name), _heavy(name))
        for level, key in zip(self.levels, keys + keys, strict=True):
            ids = level.get(key) if key else None
            if ids and len(ids) == 1:
                return next(iter(ids))
        return None

    def resolve(self, name: str) -> str | None:
        found = self._lookup(name)
        if found:
            return found
        # A model sometimes copies the description too ("Tool/api: what it does"); names may hold
        # ": " themselves, so try each shorter prefix.
        parts = name.split(": ")
        for j in range(len(parts) - 1, 0, -1):
            found = self._lookup(": ".join(parts[:j]))
            if found:
                return found
        return self._close(name)

    def _close(self, name: str) -> str | None:
        target = _light(name)
        if not target:
            return None
        scored: list[tuple[float, str]] = []
        for disp, api_id in self.fuzzy:
            sm = difflib.SequenceMatcher(None, target, disp, autojunk=False)
            if sm.real_quick_ratio() >= _FUZZY_CUTOFF and sm.quick_ratio() >= _FUZZY_CUTOFF:
                scored.append((sm.ratio(), api_id))
        scored.sort(reverse=True)
        if not scored or scored[0][0] < _FUZZY_CUTOFF:
            return None
        if len(scored) > 1 and scored[1][1] != scored[0][1] and scored[0][0] - scored[1][0] < _FUZZY_MARGIN:
            return None
        return scored[0][1]


def _api_names(value: Any) -> list[str]:
    """Flatten a selection entry into API name strings."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value.strip() else []
    if isinstance(value, list):
        return [n for v in value for n in _api_names(v)]
    if isinstance(value, dict):
        tool = _first(value, ("tool_name", "tool"))
        api = _first(value, ("api_name", "api", "name", "endpoint"))
        if isinstance(tool, str) and isinstance(api, str) and tool.strip() and api.strip():
            return [f"{tool}/{api}"]
        named = _first(value, ("name", "api", "api_name", "tool", "id", "function"))
        return _api_names(named) if not isinstance(named, dict) else []
    return [str(value)]


def _steps_and_apis(raw_steps: Any) -> tuple[list[str], list[str]]:
    if raw_steps is None:
        return [], []
    if not isinstance(raw_steps, list):
        raw_steps = [raw_steps]
    steps: list[str] = []
    apis: list[str] = []
    for s in raw_steps:
        if isinstance(s, dict):
            text = _first(s, _STEP_TEXT_KEYS)
            steps.append(_text(text) if text is not None else _text(s))
            apis.extend(_api_names(_first(s, _STEP_API_KEYS)))
        elif s is not None and _text(s):
            steps.append(_text(s))
    return steps, apis


def _plan_fields(value: Any) -> tuple[list[str], list[str], bool] | None:
    """(steps, raw selected names, had an explicit selection) from a parsed value, or None."""
    if isinstance(value, list):
        if all(isinstance(v, dict) for v in value) and value:
            steps, apis = _steps_and_apis(value)
            return steps, apis, False
        # a bare list of strings is the selection without steps
        return [], _api_names(value), True
    if not isinstance(value, dict):
        return None
    steps, step_apis = _steps_and_apis(_first(value, _STEPS_KEYS))
    if any(str(k).strip().lower() in _SELECTED_KEYS for k in value):
        return steps, _api_names(_first(value, _SELECTED_KEYS)), True
    if not steps and not step_apis:
        # e.g. {"plan": {"steps": [...], "apis": [...]}}
        for v in value.values():
            if isinstance(v, dict):
                inner = _plan_fields(v)
                if inner is not None:
                    return inner
        return None
    return steps, step_apis, False


def parse_plan(
    text: str | None,
    offered: Sequence[tuple[str, str]],
    registry_lookup: Callable[[str], str | None] | None = None,
) -> Plan:
    """Parse a planner reply and map the selected names to api ids.

    `offered` holds (api_id, display) pairs, display being "{tool_name}/{api_name}" as the prompt
    showed it. Names that match no offered API go to `registry_lookup` (which may return an id
    outside the offered set) and otherwise stay raw; either way they lower fidelity downstream.
    """
    if text is None or not text.strip():
        return Plan([], [], True, "empty reply")
    fields: tuple[list[str], list[str], bool] | None = None
    found_json = False
    for value in _json_values(text):
        found_json = True
        got = _plan_fields(value)
        if got is None:
            continue
        if fields is None or (got[1] and not fields[1]):
            fields = got
        if got[1] or got[2]:
            break
    if fields is None:
        return Plan([], [], True, _no_json_reason(text, found_json, "plan"))
    steps, names, explicit = fields
    # Steps without any selection (no list, no API in a step) is a cut-off or malformed reply, not
    # the explicit empty list the prompt asks for when refusing.
    error = None if explicit or names else "reply has no API selection"
    resolver = _Resolver(offered)
    selected: list[str] = []
    seen: set[str] = set()
    for name in names:
        resolved = resolver.resolve(name)
        if resolved is None:
            cleaned = _LEAD_RE.sub("", name).strip(_QUOTES)
            resolved = (registry_lookup(cleaned) if registry_lookup else None) or cleaned
        if resolved and resolved not in seen:
            seen.add(resolved)
            selected.append(resolved)
    return Plan(steps, selected, not selected, error)
