"""MCP `tools/list` results as a registry: one API per tool, id `server::tool`.

A file holds `{"server": NAME, "tools": [...]}`, the bare result `{"tools": [...]}` (also wrapped in
a JSON-RPC response's `result`), a JSON list of tools, or one tool a line (JSONL). The server is the
`server` field, else the file's name without its suffixes.
"""

from __future__ import annotations

from evaluator.core.errors import DataError
from evaluator.data.model import Api, description_or_none
from evaluator.data.params import schema_params
from evaluator.data.source import get_str, json_type

Entry = tuple[str, Api]


def is_tool(rec: object) -> bool:
    return isinstance(rec, dict) and ("inputSchema" in rec or "input_schema" in rec)


def server_name(doc: dict, where: str, default: str) -> str:
    server = doc.get("server")
    if isinstance(server, dict):  # {"server": {"name": ...}}, as an initialize result's serverInfo
        server = server.get("name")
    if server is None:
        return default
    if not isinstance(server, str) or not server.strip():
        raise DataError(f"{where}: 'server' must be the server's name (a non-empty string), not {json_type(server)}.")
    return server.strip()


def tool_api(where: str, rec: object, server: str) -> Api:
    if not isinstance(rec, dict):
        raise DataError(f"{where}: expected an MCP tool object (name, description, inputSchema), got {json_type(rec)}.")
    if isinstance(rec.get("function"), dict) or rec.get("type") == "function":
        raise DataError(f"{where}: this is an OpenAI function definition, not an MCP tool; "
                        "use --tools-format openai or auto.")
    name = get_str(rec, "name", where, required=True)
    desc = get_str(rec, "description", where)
    key = "inputSchema" if "inputSchema" in rec else "input_schema"
    params = schema_params(rec.get(key), where, key)
    return Api(server, name, get_str(rec, "category", where) or None, description_or_none(desc), params)


def apis(records: list[tuple[str, object]], server: str) -> list[Entry]:
    return [(where, tool_api(where, rec, server)) for where, rec in records]
