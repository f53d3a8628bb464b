"""OpenAI-style function definitions as a registry: id `tool::name`.

Each record is `{"type": "function", "function": {name, description, parameters}}` (Chat
Completions), the flat `{"type": "function", "name", ...}` (Responses API) or a bare function
declaration `{name, description, parameters}` (Gemini). A file is a JSON list of them, one a line
(JSONL), or an object holding the list under `tools`, `functions` or `functionDeclarations`. `tool` is
the record's `tool` field, else the file's name without its suffixes.
"""

from __future__ import annotations

from evaluator.core.errors import DataError
from evaluator.data.model import Api, description_or_none
from evaluator.data.params import schema_params
from evaluator.data.source import get_str, json_type

Entry = tuple[str, Api]
LIST_KEYS = ("tools", "functions", "functionDeclarations", "function_declarations")


def is_function(rec: object) -> bool:
    return isinstance(rec, dict) and (
        rec.get("type") == "function" or isinstance(rec.get("function"), dict) or ("name" in rec and "parameters" in rec)
    )


def flatten(records: list[tuple[str, object]]) -> list[tuple[str, object]]:
    """Gemini groups declarations: `[{"functionDeclarations": [...]}, ...]`."""
    out: list[tuple[str, object]] = []
    for where, rec in records:
        key = next((k for k in LIST_KEYS[2:] if isinstance(rec, dict) and k in rec), None)
        if key is None or not isinstance(rec, dict):
            out.append((where, rec))
            continue
        inner = rec[key]
        if not isinstance(inner, list):
            raise DataError(f"{where}: '{key}' must be a list of function declarations, not {json_type(inner)}.")
        out += [(f"{where} {key}[{n}]", r) for n, r in enumerate(inner)]
    return out


def function_api(where: str, rec: object, default_tool: str) -> Api:
    expected = 'an OpenAI tool: {"type": "function", "function": {"name", "description", "parameters"}}'
    if not isinstance(rec, dict):
        raise DataError(f"{where}: expected {expected}, got {json_type(rec)}.")
    if "function" not in rec and ("inputSchema" in rec or "input_schema" in rec):
        raise DataError(f"{where}: this is an MCP tool (it has inputSchema), not an OpenAI function; "
                        "use --tools-format mcp or auto.")
    if "type" in rec and rec["type"] != "function":
        raise DataError(f"{where}: only function tools can be retrieved; this one has type {rec['type']!r}.")
    fn = rec.get("function", rec)
    if not isinstance(fn, dict):
        raise DataError(f"{where}: 'function' must be an object, not {json_type(fn)}.")
    name = get_str(fn, "name", where, required=True)
    desc = get_str(fn, "description", where)
    tool = get_str(rec, "tool", where) or get_str(fn, "tool", where) or default_tool
    cat = get_str(rec, "category", where)
    params = schema_params(fn.get("parameters"), where, "parameters")
    return Api(tool, name, cat or None, description_or_none(desc), params)


def apis(records: list[tuple[str, object]], default_tool: str) -> list[Entry]:
    return [(where, function_api(where, rec, default_tool)) for where, rec in flatten(records)]
