"""Strict, auditable parsing of discovery (stubs) and planner (plan) replies.

Real models wrap JSON in code fences or prose, leave trailing commas, use single quotes, rename
keys, and get cut off by a token limit; those replies still carry an answer and are read. What is
*not* read as an answer is everything else a reply may hold: a list in a code sample
(`params["origin"]`), an example object in prose (`{"name": "Paris"}`), a copy of the prompt's own
example. Every parsed field says which rule produced it, so a record can be audited.

Finding the answer object (`where` in the provenance strings), in this order:
- ``reply``: the whole reply (after any <think> block) is one JSON value;
- ``fence``: the whole content of a ```json (or untagged) code fence is one JSON value;
- ``lead`` (the reply opens with a JSON value, then goes on in prose) and ``prose`` (a JSON value
  embedded in prose). Only values with the answer's own shape count here: for discovery, a list of
  stub objects (a name and a reasoning each; a "description" counts as the reasoning only next to a
  function-like name, so {"name": "Paris", "description": ...} is no stub); for the planner, an
  object with a "steps" or selection key. A bare list of strings in prose or code never does.
A value that needed repair (single quotes, trailing commas, Python literals, comments: the
`json-repair` library) is marked ``/repaired``; one cut off by a token limit is closed after its last
complete element and marked ``/truncated`` (a half-written name is not a name).

Selections: each name in the answer's selection is resolved against the offered APIs by the
documented normalisation, strictest first (`Selection.rule`): ``exact`` display or id; ``case/space``
(case, spacing, bullets, numbering, quotes); ``punctuation`` (all punctuation dropped); ``api-name``
and ``api-name/punctuation`` (the API part alone, when only one offered API has it); ``prefix:<rule>``
(a copied description after ": " dropped); ``fuzzy`` (difflib ratio >= 0.85, unambiguous). Names that
resolve to no offered API go through the registry lookup (``registry``) or stay raw (``unresolved``);
they stay in `Plan.selected` (they lower fidelity) but only `Plan.selected_offered` counts as a
selection (pass rate).
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import json_repair

from evaluator.results.plans import ParseAudit, Stub, stub_text
from evaluator.study.prompts import DISCOVERY_EXAMPLES, EXAMPLE_TOPIC, HYDE_EXAMPLE, REWRITE_EXAMPLE

__all__ = ["Plan", "ParseAudit", "Selection", "Stub", "parse_plan", "parse_stubs", "stub_text", "parse_documents",
           "parse_query"]


@dataclass
class Selection:
    raw: str  # the name as the reply wrote it
    api: str  # the api id it resolved to, else the cleaned name
    rule: str  # which normalisation matched (module docstring)
    offered: bool  # `api` is one of the APIs shown to the planner


@dataclass
class Plan:
    steps: list[str]
    selected: list[str]  # offered/registry api ids where resolvable, else the raw name
    parse_error: str | None
    # The selected ids that name an offered API: only these count as a selection (pass rate).
    selected_offered: list[str] = field(default_factory=list)
    source: str = ""  # where the answer object came from: "<where>[/repaired|/truncated]"
    steps_rule: str = ""  # e.g. "key:steps", "step objects", "none"
    selected_rule: str = ""  # e.g. "key:selected_apis", "step apis", "bare list", "none"
    names: list[Selection] = field(default_factory=list)

    def audit(self) -> ParseAudit:
        """The provenance of every parsed field (for queries.jsonl)."""
        return ParseAudit(self.source, self.steps_rule, self.selected_rule,
                          [(s.raw, s.api, s.rule, s.offered) for s in self.names])


# ---------------------------------------------------------------------------------------------
# Locating JSON values
# ---------------------------------------------------------------------------------------------

_THINK_RE = re.compile(r"<think>.*?(</think>|\Z)", re.S | re.I)
_FENCE_RE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_JSON_FENCE_TAGS = ("", "json", "jsonc", "json5", "javascript", "js")
_MAX_STARTS = 40  # bounds the work on long prose full of brackets
_STRICT = ("lead", "prose")  # values with text around them: only the answer's own shape counts
_MAX_CUTS = 60


@dataclass
class _Found:
    value: Any  # a JSON value found in a model's reply: of any shape until the parse rules read it
    where: str  # "reply" | "fence" | "prose"
    state: str  # "json" | "repaired" | "truncated"

    @property
    def source(self) -> str:
        return self.where if self.state == "json" else f"{self.where}/{self.state}"


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


def _loads(s: str) -> tuple[Any, bool]:
    """(value, repaired): json.loads, else json-repair; raises ValueError when neither gives a container."""
    try:
        return json.loads(s, strict=False), False
    except ValueError:
        pass
    value = json_repair.repair_json(s, return_objects=True, skip_json_loads=True)
    if not isinstance(value, list | dict) or not value:
        raise ValueError("not JSON")
    return value, True


class _Value(NamedTuple):
    value: Any  # a parsed JSON container (list or dict) of any shape: the parse rules read it
    state: str  # json, repaired, truncated
    end: int | None  # its closing bracket's index; None if cut off


def _value_at(text: str, start: int) -> _Value | None:
    """The JSON container starting at `text[start]`, if any."""
    end, cuts = _scan(text, start)
    if end is not None:
        try:
            value, repaired = _loads(text[start : end + 1])
        except ValueError:
            return None
        return _Value(value, "repaired" if repaired else "json", end)
    # Unclosed (truncated) container: the longest prefix that ends after a complete element. Not left
    # to json-repair, which would close a half-written string ("Weather API/get hi") into a name.
    for cut, closers in reversed(cuts[-_MAX_CUTS:]):
        try:
            value, _ = _loads(text[start:cut] + "".join(reversed(closers)))
        except ValueError:
            continue
        return _Value(value, "truncated", None)
    return None


def _whole(text: str, where: str, lead: bool = False) -> _Found | None:
    """`text` as one JSON value (possibly cut off at its end), or None.

    With `lead`, a value that opens the text and is followed by prose also counts (where "lead"):
    a reply that starts with its answer and then explains it.
    """
    body = text.strip()
    if not body or body[0] not in "[{":
        return None
    try:
        # The common case, a reply that is exactly one JSON value: what the bracket scan below
        # would find (its closing bracket is the last character), without scanning character by character.
        got: _Value | None = _Value(json.loads(body, strict=False), "json", len(body) - 1)
    except ValueError:
        got = _value_at(body, 0)
    if got is None:
        return None
    value, state, end = got
    if end is not None and end != len(body) - 1:
        if lead:
            return _Found(value, "lead", state)
        return None  # more text follows: the value is part of prose, not the whole
    return _Found(value, where, state)


def _candidates(text: str) -> Iterator[_Found]:
    """Every JSON value of a reply that may be its answer, in the order of the module docstring."""
    text = _THINK_RE.sub("", text)
    whole = _whole(text, "reply", lead=True)
    if whole is not None:
        yield whole
        if whole.where == "reply":
            return
    code: list[tuple[int, int]] = []
    for m in _FENCE_RE.finditer(text):
        if m.group(1).lower() in _JSON_FENCE_TAGS:
            found = _whole(m.group(2), "fence")
            if found is not None:
                yield found
        else:
            code.append(m.span())
    # Values inside code in another language (```python ...```) are code, never an answer.
    for a, b in code:
        text = text[:a] + " " * (b - a) + text[b:]
    starts = [m.start() for m in re.finditer(r"[\[{]", text)][:_MAX_STARTS]
    covered = -1
    for start in starts:
        if start <= covered:
            continue
        got = _value_at(text, start)
        if got is not None and whole is not None and start == len(text) - len(text.lstrip()):
            covered = got[2] if got[2] is not None else len(text)
            continue  # the lead value, already given
        if got is None:
            continue  # an unclosed bracket in prose ("see [1") before the answer
        value, state, end = got
        yield _Found(value, "prose", state)
        if end is None:
            return  # the rest of the text is inside the cut-off value
        covered = end


def parse_json(text: str | None) -> tuple[Any, str | None]:
    """The JSON answer of a reply as the study's own parsers find it (the whole reply, a ```json fence, else the
    first object or array in prose; a think block and code in other languages skipped): (value, None), or
    (None, why) when the reply holds none (prose, a refusal, an empty reply). For a plugin's own prompts."""
    if text is None or not text.strip():
        return None, "empty reply"
    for found in _candidates(text):
        return found.value, None
    return None, _no_json_reason(text, False, "value")


def _no_json_reason(text: str, found_json: bool, what: str) -> str:
    if found_json:
        return f"reply JSON holds no {what}"
    if "[" in text or "{" in text:
        return "malformed or truncated JSON in reply"
    return "no JSON found in reply"


def _key(d: dict, keys: Sequence[str]) -> str | None:
    """The first of `keys` present (exactly, then case-insensitively) with a non-null value."""
    for k in keys:
        if d.get(k) is not None:
            return k
    lowered = {str(k).strip().lower(): k for k in d}
    for k in keys:
        if k in lowered and d[lowered[k]] is not None:
            return lowered[k]
    return None


def _first(d: dict, keys: Sequence[str]) -> Any:
    k = _key(d, keys)
    return None if k is None else d[k]


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    return json.dumps(value, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------
# Stubs
# ---------------------------------------------------------------------------------------------

_NAME_KEYS = ("name", "function", "function_name", "tool_name", "tool", "api_name", "api", "stub", "title")
_REASON_KEYS = (
    "reasoning", "reason", "description", "rationale", "purpose", "explanation", "why", "justification",
)
_STRICT_NAME_KEYS = ("name", "function", "function_name", "tool_name", "api_name", "stub")
_STRICT_REASON_KEYS = ("reasoning", "reason", "rationale", "why", "justification")
_STUB_LIST_KEYS = ("stubs", "tools", "functions", "tool_stubs", "apis", "api_stubs", "function_stubs")
_IDENT_RE = re.compile(r"^[A-Za-z_][\w.]*$")
_CALL_ARGS_RE = re.compile(r"\s*\(.*\)\s*$")
_WORDISH_RE = re.compile(r"[a-z0-9]+")


def _clean_name(name: Any) -> str:
    if not isinstance(name, str):
        return ""
    name = name.strip().strip("`'\" ")
    # "get_weather(city)" names the same function as "get_weather"
    return _CALL_ARGS_RE.sub("", name).strip()


def _function_like(name: str) -> bool:
    """snake_case, camelCase or dotted: how a developer names a function (not "Paris")."""
    return bool(_IDENT_RE.match(name)) and ("_" in name or "." in name or re.search(r"[a-z][A-Z]", name) is not None)


def _stub_from(item: Any) -> tuple[Stub, str] | None:
    """A stub and the item form that produced it, or None."""
    if isinstance(item, str):
        head, sep, tail = item.partition(":")
        if sep and _IDENT_RE.match(head.strip()) and _clean_name(head):
            return Stub(_clean_name(head), tail.strip()), "string name:reasoning"
        name = _clean_name(item)
        return (Stub(name, ""), "string") if name else None
    if not isinstance(item, dict):
        return None
    # OpenAI tool-schema style: {"type": "function", "function": {"name": ..., "description": ...}}
    inner = item.get("function")
    if isinstance(inner, dict):
        got = _stub_from(inner)
        return (got[0], f"tool schema {got[1]}") if got else None
    name_key = _key(item, _NAME_KEYS)
    name = _clean_name(item[name_key]) if name_key else ""
    if not name:
        return None
    reason_key = _key(item, _REASON_KEYS)
    reasoning = _text(item[reason_key]) if reason_key else ""
    return Stub(name, reasoning), f"{name_key}+{reason_key or '-'}"


def _stub_shaped(item: Any) -> bool:
    """An object that can only be a stub: a name and a reasoning ("description" only with a function-like
    name: {"name": "Paris", "description": "a city"} describes a place, not a function)."""
    if not isinstance(item, dict):
        return False
    inner = item.get("function")
    if isinstance(inner, dict):
        item = inner
    name = _clean_name(_first(item, _STRICT_NAME_KEYS))
    if not name:
        return False
    if _first(item, _STRICT_REASON_KEYS) is not None:
        return True
    return _function_like(name) and _first(item, _REASON_KEYS) is not None


def _stub_list(value: Any, strict: bool) -> tuple[list[Any], str] | None:
    """(items, container rule) of the stub list in an answer value, or None.

    `strict` (values found in prose) accepts only the answer's own shape: a list of stub objects,
    directly or under a stub-list key.
    """
    if isinstance(value, list):
        if strict and not (value and all(_stub_shaped(x) for x in value)):
            return None
        return value, "list"
    if not isinstance(value, dict):
        return None
    k = _key(value, _STUB_LIST_KEYS)
    if k is not None and isinstance(value[k], list):
        if strict and not (value[k] and all(_stub_shaped(x) for x in value[k])):
            return None
        return value[k], f"key {k}"
    if _stub_shaped(value):
        return [value], "single object"
    if strict:
        return None
    # {"answer": [stub objects]}: the one list of a one-key wrapper, when its items are stubs
    if len(value) == 1:
        (k, v), = value.items()
        if isinstance(v, list) and v and all(_stub_shaped(x) for x in v):
            return v, f"key {k}"
    # {"get_weather": "why", ...}: a map from function names to reasons
    if value and all(isinstance(k, str) and _function_like(k) for k in value) and all(
        isinstance(v, str) for v in value.values()
    ):
        return [{"name": k, "reasoning": v} for k, v in value.items()], "name map"
    return None


def _copied_example(stub: Stub, query: str | None) -> bool:
    """The stub repeats the prompt's example: its reasoning too, or a name the request has no word of."""
    norm = _WORDISH_RE.findall
    for name, reasoning in DISCOVERY_EXAMPLES:
        if stub.name.casefold() != name:
            continue
        if reasoning is not None and norm(stub.reasoning.casefold()) == norm(reasoning.casefold()):
            return True
        if query is not None:
            # "search_flights" for a request about flights is the model's own need
            content = [w for w in name.split("_")[1:] if len(w) > 2]
            q = query.casefold()
            if not any(w.rstrip("s") in q for w in content):
                return True
    return False


def parse_stubs(text: str | None, query: str | None = None) -> tuple[list[Stub], str | None]:
    """Parse a discovery reply into stubs; returns (stubs, error or None).

    An explicit empty list is a valid answer with no stubs (no error). With `query`, a stub named
    like the prompt's example is flagged (`example_copy`) when the request has nothing to do with it.
    """
    if text is None or not text.strip():
        return [], "empty reply"
    found_json = False
    for found in _candidates(text):
        found_json = True
        listed = _stub_list(found.value, strict=found.where in _STRICT)
        if listed is None:
            continue
        items, container = listed
        out: list[Stub] = []
        seen: set[tuple[str, str]] = set()
        for item in items:
            got = _stub_from(item)
            if got is None or (got[0].name, got[0].reasoning) in seen:
                continue
            stub, form = got
            seen.add((stub.name, stub.reasoning))
            stub.rule = f"{found.source}:{container}:{form}"
            stub.example_copy = _copied_example(stub, query)
            out.append(stub)
        if out or not items:
            return out, None
    return [], _no_json_reason(text, found_json, "stubs")


# ---------------------------------------------------------------------------------------------
# hyde's documents and rewrite's query
# ---------------------------------------------------------------------------------------------

_DOC_LIST_KEYS = ("entries", "documents", "docs", "apis", *_STUB_LIST_KEYS)
_DOC_TEXT_KEYS = ("description", "documentation", "doc", "text", *_REASON_KEYS)


def _doc_shaped(item: Any) -> bool:
    return isinstance(item, dict) and bool(_clean_name(_first(item, _NAME_KEYS))) and \
        _first(item, _DOC_TEXT_KEYS) is not None


def _off_topic(query: str | None) -> bool:
    """The request has nothing of the prompts' weather example: a reply repeating the example copied it."""
    return query is not None and not any(w in query.casefold() for w in EXAMPLE_TOPIC)


def parse_documents(text: str | None, query: str | None = None) -> tuple[list[Stub], str | None]:
    """Parse a hyde reply (hypothetical API documentation entries) into stubs: name + description as the
    reasoning, so each is searched as `stub_text` (as PtR's stubs are). Values found in prose count only
    as a list of name + description objects (the answer's own shape). With `query`, an entry named as the
    prompt's example is flagged (`example_copy`) when the request has nothing to do with it."""
    if text is None or not text.strip():
        return [], "empty reply"
    found_json = False
    for found in _candidates(text):
        found_json = True
        value = found.value
        container = "list"
        if isinstance(value, dict):
            k = _key(value, _DOC_LIST_KEYS)
            if k is not None and isinstance(value[k], list):
                value, container = value[k], f"key {k}"
            elif _doc_shaped(value):
                value, container = [value], "single object"
        if not isinstance(value, list) or (found.where in _STRICT and not (value and all(map(_doc_shaped, value)))):
            continue
        out: list[Stub] = []
        for item in value:
            if not isinstance(item, dict):
                continue
            name = _clean_name(_first(item, _NAME_KEYS))
            doc = _text(_first(item, _DOC_TEXT_KEYS))
            if name and (name, doc) not in {(o.name, o.reasoning) for o in out}:
                out.append(Stub(name, doc, rule=f"{found.source}:{container}:name+description",
                                example_copy=name.casefold() == HYDE_EXAMPLE.casefold() and _off_topic(query)))
        if out or not value:
            return out, None
    return [], _no_json_reason(text, found_json, "documentation entries")


_QUERY_KEYS = ("query", "search_query", "rewritten_query", "rewrite", "q")


def parse_query(text: str | None, request: str | None = None) -> tuple[str, str | None]:
    """Parse a rewrite reply into its one search query: {"query": ...} (or a bare JSON string). The prompt asks
    for JSON only, so a reply with no JSON (prose, a refusal, a bare line) is no query: error "no JSON found in
    reply", never searched as if it were one. Returns (query, error).
    With `request`: the prompt's example query repeated for a request that has nothing to do with it is
    no query (error "copied the prompt's example")."""
    query, err = _query_of(text)
    if query and query.casefold() == REWRITE_EXAMPLE.casefold() and _off_topic(request):
        return "", "copied the prompt's example"
    return query, err


def _query_of(text: str | None) -> tuple[str, str | None]:
    if text is None or not text.strip():
        return "", "empty reply"
    for found in _candidates(text):
        value = found.value
        if isinstance(value, str) and value.strip() and found.where not in _STRICT:
            return " ".join(value.split()), None
        if isinstance(value, dict):
            q = _first(value, _QUERY_KEYS)
            if isinstance(q, str) and q.strip():
                return " ".join(q.split()), None
    bare = _THINK_RE.sub("", text).strip()
    if bare.startswith('"'):  # the whole reply one JSON string
        with contextlib.suppress(ValueError):
            value = json.loads(bare)
            if isinstance(value, str) and value.strip():
                return " ".join(value.split()), None
    return "", _no_json_reason(text, any(True for _ in _candidates(text)), "query")


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
_LEVEL_RULES = ("case/space", "punctuation", "api-name", "api-name/punctuation")


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
        self.offered = offered
        self.exact: dict[str, str] = {}
        for api_id, display in offered:
            self.exact.setdefault(display, api_id)
            self.exact.setdefault(api_id, api_id)

    @functools.cached_property
    def levels(self) -> list[dict[str, set[str]]]:
        """light, heavy, api light, api heavy: built on the first name that is not exact (most
        replies name the offered APIs exactly, and the normalising regexes cost more than the rest
        of a cached call)."""
        levels: list[dict[str, set[str]]] = [{}, {}, {}, {}]
        for api_id, display in self.offered:
            for key in (display, api_id):
                levels[0].setdefault(_light(key), set()).add(api_id)
                levels[1].setdefault(_heavy(key), set()).add(api_id)
            api_name = _split_display(api_id, display)
            if api_name:
                levels[2].setdefault(_light(api_name), set()).add(api_id)
                levels[3].setdefault(_heavy(api_name), set()).add(api_id)
        return levels

    @functools.cached_property
    def fuzzy(self) -> list[tuple[str, str]]:
        return [(_light(display), api_id) for api_id, display in self.offered]

    def _lookup(self, name: str) -> tuple[str, str] | None:
        if name in self.exact:
            return self.exact[name], "exact"
        keys = (_light(name), _heavy(name))
        for level, key, rule in zip(self.levels, keys + keys, _LEVEL_RULES, strict=True):
            ids = level.get(key) if key else None
            if ids and len(ids) == 1:
                return next(iter(ids)), rule
        return None

    def resolve(self, name: str) -> tuple[str, str] | None:
        """(api id, rule) or None."""
        found = self._lookup(name)
        if found:
            return found
        # A model sometimes copies the description too ("Tool/api: what it does"); names may hold
        # ": " themselves, so try each shorter prefix.
        parts = name.split(": ")
        for j in range(len(parts) - 1, 0, -1):
            found = self._lookup(": ".join(parts[:j]))
            if found:
                return found[0], f"prefix:{found[1]}"
        close = self._close(name)
        return (close, "fuzzy") if close else None

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


@dataclass
class _Fields:
    steps: list[str]
    names: list[str]
    explicit: bool  # the answer holds a selection list (possibly empty)
    steps_rule: str
    selected_rule: str


def _plan_fields(value: Any, strict: bool) -> _Fields | None:
    """The plan in an answer value, or None. `strict` (values found in prose): objects only."""
    if isinstance(value, list):
        if strict or not value:
            return None
        if all(isinstance(v, dict) for v in value):
            steps, apis = _steps_and_apis(value)
            return _Fields(steps, apis, False, "step objects", "step apis" if apis else "none")
        # the whole reply is a list of strings: the selection without steps
        return _Fields([], _api_names(value), True, "none", "bare list")
    if not isinstance(value, dict):
        return None
    steps_key = _key(value, _STEPS_KEYS)
    steps, step_apis = _steps_and_apis(value[steps_key] if steps_key else None)
    steps_rule = f"key:{steps_key}" if steps_key else "none"
    sel_key = next((k for k in value if str(k).strip().lower() in _SELECTED_KEYS), None)
    if sel_key is not None:
        sel_key = _key(value, _SELECTED_KEYS) or sel_key
        return _Fields(steps, _api_names(value[sel_key]), True, steps_rule, f"key:{sel_key}")
    if not steps and not step_apis:
        # e.g. {"plan": {"steps": [...], "apis": [...]}}
        for k, v in value.items():
            if isinstance(v, dict):
                inner = _plan_fields(v, strict=True)
                if inner is not None:
                    inner.steps_rule = f"in {k}:{inner.steps_rule}"
                    inner.selected_rule = f"in {k}:{inner.selected_rule}"
                    return inner
        return None
    return _Fields(steps, step_apis, False, steps_rule, "step apis" if step_apis else "none")


def parse_plan(
    text: str | None,
    offered: Sequence[tuple[str, str]],
    registry_lookup: Callable[[str], str | None] | None = None,
) -> Plan:
    """Parse a planner reply and map the selected names to api ids.

    `offered` holds (api_id, display) pairs, display being "{tool_name}/{api_name}" as the prompt
    showed it. Names that match no offered API go to `registry_lookup` (which may return an id
    outside the offered set) and otherwise stay raw; either way they lower fidelity downstream and
    never count as a selection (`selected_offered`).
    """
    if text is None or not text.strip():
        return Plan([], [], "empty reply", source="none", steps_rule="none", selected_rule="none")
    fields: _Fields | None = None
    source = ""
    found_json = False
    for found in _candidates(text):
        found_json = True
        got = _plan_fields(found.value, strict=found.where in _STRICT)
        if got is None:
            continue
        if fields is None or (got.names and not fields.names):
            fields, source = got, found.source
        if got.names or got.explicit:
            break
    if fields is None:
        reason = _no_json_reason(text, found_json, "plan")
        return Plan([], [], reason, source="none", steps_rule="none", selected_rule="none")
    # Steps without any selection (no list, no API in a step) is a cut-off or malformed reply, not
    # the explicit empty list the prompt asks for when refusing.
    error = None if fields.explicit or fields.names else "reply has no API selection"
    resolver = _Resolver(offered)
    offered_ids = {api_id for api_id, _ in offered}
    names: list[Selection] = []
    selected: list[str] = []
    for name in fields.names:
        hit = resolver.resolve(name)
        if hit is None:
            cleaned = _LEAD_RE.sub("", name).strip(_QUOTES)
            elsewhere = registry_lookup(cleaned) if registry_lookup else None
            hit = (elsewhere, "registry") if elsewhere else (cleaned, "unresolved")
        api, rule = hit
        names.append(Selection(name, api, rule, api in offered_ids))
        if api and api not in selected:
            selected.append(api)
    selected_offered = [a for a in selected if a in offered_ids]
    return Plan(
        fields.steps, selected, error,
        selected_offered=selected_offered, source=source, steps_rule=fields.steps_rule,
        selected_rule=fields.selected_rule, names=names,
    )
