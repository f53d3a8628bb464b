"""Registries in every format: the same tools read from MCP, OpenAI-style and JSONL files give the same
registry, formats are detected from content or forced, and the embedded text follows one rule."""

from __future__ import annotations

import gzip
import json

import pytest

from evaluator.core.errors import DataError
from evaluator.data import EMBED_TEXT_RULE, Warnings, load_registry

# Two tools of one server, as an MCP tools/list result.
SEARCH_SCHEMA = {
    "type": "object",
    "properties": {"pattern": {"type": "string", "description": "Glob to match"}, "path": {"type": "string"}},
    "required": ["pattern"],
}
MCP_TOOLS = [
    {"name": "search_files", "description": "Find files by name", "inputSchema": SEARCH_SCHEMA},
    {"name": "list_allowed", "description": "", "inputSchema": {"type": "object", "properties": {}}},
]
EXPECTED_TEXTS = [
    "files/search_files: Find files by name Parameters: pattern (Glob to match); path",
    "files/list_allowed: ",
]


def openai_tool(t: dict) -> dict:
    return {"type": "function", "function": {"name": t["name"], "description": t["description"], "parameters": t["inputSchema"]}}


def write(path, content) -> object:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_text(json.dumps(content), encoding="utf-8")
    return path


def jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def shapes(tmp_path) -> dict[str, object]:
    """The same two tools in every supported shape (tool or server named `files`)."""
    jsonl_recs = [
        {"tool_name": "files", "api_name": t["name"], "api_description": t["description"] or None,
         "category": None, "parameters": t["inputSchema"]}
        for t in MCP_TOOLS
    ]
    gz = tmp_path / "l" / "apis.jsonl.gz"
    gz.parent.mkdir(parents=True)
    with gzip.open(gz, "wt", encoding="utf-8") as fh:
        fh.write(jsonl(jsonl_recs))
    return {
        "mcp server object": write(tmp_path / "a" / "whatever.json", {"server": "files", "tools": MCP_TOOLS}),
        "mcp bare result": write(tmp_path / "b" / "files.json", {"tools": MCP_TOOLS}),
        "mcp json-rpc reply": write(tmp_path / "c" / "files.json", {"jsonrpc": "2.0", "id": 1, "result": {"tools": MCP_TOOLS}}),
        "mcp list": write(tmp_path / "d" / "files.json", MCP_TOOLS),
        "mcp jsonl": write(tmp_path / "e" / "files.jsonl", jsonl(MCP_TOOLS)),
        "openai array": write(tmp_path / "f" / "files.json", [openai_tool(t) for t in MCP_TOOLS]),
        "openai jsonl": write(tmp_path / "g" / "x.jsonl", jsonl([{**openai_tool(t), "tool": "files"} for t in MCP_TOOLS])),
        "openai request body": write(tmp_path / "h" / "files.json", {"tools": [openai_tool(t) for t in MCP_TOOLS]}),
        "responses api flat": write(tmp_path / "i" / "files.json",
                                    [{"type": "function", **openai_tool(t)["function"]} for t in MCP_TOOLS]),
        "gemini declarations": write(tmp_path / "j" / "files.json",
                                     [{"functionDeclarations": [openai_tool(t)["function"] for t in MCP_TOOLS]}]),
        "jsonl registry": write(tmp_path / "k" / "apis.jsonl", jsonl(jsonl_recs)),
        "jsonl registry gzipped": gz,
        "folder of one mcp file": write(tmp_path / "m" / "tools" / "files.json", {"tools": MCP_TOOLS}).parent,
        "data folder with tools/": write(tmp_path / "n" / "tools" / "files.json", {"tools": MCP_TOOLS}).parent.parent,
    }


def test_every_format_reads_into_the_same_registry(tmp_path):
    for label, path in shapes(tmp_path).items():
        reg = load_registry(path)
        assert reg.ids == ["files::search_files", "files::list_allowed"], label
        assert reg.texts() == EXPECTED_TEXTS, label
        assert [a.description for a in reg.apis] == ["Find files by name", None], label


def test_detected_format_is_reported(tmp_path):
    s = shapes(tmp_path)
    assert load_registry(s["mcp list"]).format == "mcp"
    assert load_registry(s["openai array"]).format == "openai"
    assert load_registry(s["jsonl registry"]).format == "jsonl"


def test_embed_rule_is_stated_and_keeps_toolbench_text():
    from evaluator.data import Api

    assert "{tool}/{api}: {description}" in EMBED_TEXT_RULE and "Parameters:" in EMBED_TEXT_RULE
    # ToolBench APIs have no parameters: the study's text, byte for byte (cached embeddings stay valid).
    assert Api("Weather API", "get  forecast", "Weather", "Daily forecast").text == "Weather API/get  forecast: Daily forecast"
    assert Api("Mystery", "x", None, None).text == "Mystery/x: "


def test_forced_format_overrides_detection(tmp_path):
    # Bare function declarations without "parameters" are ambiguous: detection refuses and says how to force it.
    p = write(tmp_path / "svc.json", [{"name": "ping", "description": "Check the service is up"}])
    with pytest.raises(DataError, match=r"svc\.json record 0: cannot tell the registry format.*--tools-format"):
        load_registry(p)
    assert load_registry(p, fmt="openai").ids == ["svc::ping"]
    assert load_registry(p, fmt="mcp").ids == ["svc::ping"]
    # Forcing the wrong format is an error at the first record, naming what was expected.
    mcp_file = write(tmp_path / "m.json", {"server": "files", "tools": MCP_TOOLS})
    with pytest.raises(DataError, match=r"m\.json tools\[0\]: missing the string field 'tool_name'"):
        load_registry(mcp_file, fmt="jsonl")
    with pytest.raises(DataError, match=r"m\.json tools\[0\]: this is an MCP tool .* use --tools-format mcp"):
        load_registry(mcp_file, fmt="openai")
    oa_file = write(tmp_path / "o.json", [openai_tool(t) for t in MCP_TOOLS])
    with pytest.raises(DataError, match=r"o\.json record 0: this is an OpenAI function .* use --tools-format openai"):
        load_registry(oa_file, fmt="mcp")
    with pytest.raises(DataError, match="Unknown tools format 'yaml'"):
        load_registry(mcp_file, fmt="yaml")


def test_folder_mixes_formats_and_counts_duplicates(tmp_path):
    d = tmp_path / "tools"
    write(d / "files.json", {"tools": MCP_TOOLS})
    write(d / "web.jsonl", jsonl([openai_tool({"name": "fetch", "description": "Fetch a URL", "inputSchema": None})]))
    write(d / "again.json", {"server": "files", "tools": MCP_TOOLS[:1]})  # repeats files::search_files
    write(d / "README.md", "not a tool file")
    w = Warnings()
    reg = load_registry(d, warnings=w)
    assert reg.ids == ["files::search_files", "files::list_allowed", "web::fetch"]
    assert reg.format == "mcp+openai"
    assert w.counts["duplicate_api"] == 1 and "again.json tools[0]" in w.examples["duplicate_api"][0]
    assert [a.id for a in load_registry(d, "described").apis] == ["files::search_files", "web::fetch"]
