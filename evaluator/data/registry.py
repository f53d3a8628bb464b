"""Finding and reading a registry in any supported format, with the format detected from content.

Formats: `jsonl` (the project's and ToolBench's one API a line), `toolbench` (the `toolenv/tools`
tree), `mcp` (tools/list results), `openai` (function-calling definitions) and `beir` (a BEIR corpus: a
folder with corpus.jsonl, or the file itself; `data.beir`). A folder of tool files mixes formats freely;
each file is detected on its own unless `fmt` forces one.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import NamedTuple

from evaluator.core.errors import DataError
from evaluator.data import beir, mcp, openai, toolbench
from evaluator.data.model import (
    DESCRIPTION_CAP_CHARS,
    DESCRIPTION_CAP_TOKENS,
    NAME_CAP_CHARS,
    REGISTRY_CHOICES,
    Api,
    Registry,
    Warnings,
    bounded_name,
    loose_id,
    prompt_description,
)
from evaluator.data.source import json_type, parse_json, parse_jsonl, read_text, reading, stem

TOOLS_FORMATS = ("auto", "jsonl", "toolbench", "mcp", "openai", "beir")
TOOL_SUFFIXES = (".json", ".jsonl", ".ndjson", ".json.gz", ".jsonl.gz", ".ndjson.gz")
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz")
# Where a data folder keeps its registry, in the order they are tried.
CANDIDATES = (
    "registry/apis.jsonl.gz", "registry/apis.jsonl", "apis.jsonl.gz", "apis.jsonl",
    "data/toolenv/tools", "toolenv/tools",
    "tools", "tools.json", "tools.jsonl", "tools.jsonl.gz", "registry",
)
Entry = tuple[str, Api]


def _is_tool_file(p: Path) -> bool:
    name = p.name.lower()
    return p.is_file() and name.endswith(TOOL_SUFFIXES) and not _is_query_file(p)


def _is_query_file(p: Path) -> bool:
    # Query files may sit next to loose tool files in a data folder; they are never tool definitions.
    s = stem(p).lower()
    return s.startswith("queries") or s.endswith("_instruction")


def _is_tree(d: Path) -> bool:
    return any(p.is_dir() and any(p.glob("*.json")) for p in d.iterdir())


def locate(path: Path, fmt: str = "auto") -> tuple[str, Path]:
    """('file' | 'folder' | 'tree', where) for a registry file, a folder of tool files or a data folder."""
    if not path.exists():
        raise DataError(f"{path}: no such file or folder; check the path.")
    if path.is_file():
        return "file", path
    if fmt == "beir" or (fmt == "auto" and beir.is_folder(path)):
        return "file", beir.corpus_file(path)  # a BEIR folder: its corpus (what it lacks is named)
    with reading(path):
        for rel in CANDIDATES:
            c = path / rel
            if c.is_file():
                return "file", c
            if c.is_dir():
                return ("tree" if fmt == "toolbench" or _is_tree(c) else "folder"), c
        if fmt == "toolbench" or _is_tree(path):
            return "tree", path
        if any(_is_tool_file(p) for p in path.iterdir()):
            return "folder", path
    raise DataError(
        f"No registry found under {path}. Looked for: {', '.join(CANDIDATES)}, a BEIR folder's corpus.jsonl, a "
        f"ToolBench <Category>/<tool>.json tree, or tool definition files ({', '.join(TOOL_SUFFIXES)})."
    )


def _records(path: Path) -> tuple[dict | None, list[tuple[str, object]]]:
    """(container object or None, its tool records each with where it is)."""
    text = read_text(path)
    name = path.name.lower()
    if name.endswith(JSONL_SUFFIXES):
        return None, list(parse_jsonl(path, text))
    if not name.endswith((".json", ".json.gz")) and _several_lines(text):
        try:
            json.loads(text)
        except (ValueError, RecursionError):
            return None, list(parse_jsonl(path, text))  # another suffix holding one record a line
    doc = parse_json(path, text, "a JSON list or object of tool definitions (or use .jsonl for one a line)")
    if isinstance(doc, list):
        return None, [(f"{path} record {n}", r) for n, r in enumerate(doc)]
    if not isinstance(doc, dict):
        raise DataError(f"{path}: expected a JSON object or list of tool definitions, got {json_type(doc)}.")
    container = doc
    if isinstance(doc.get("result"), dict) and "tools" in doc["result"]:  # a JSON-RPC tools/list response
        container = {**doc["result"], **({"server": doc["server"]} if "server" in doc else {})}
    key = next((k for k in openai.LIST_KEYS if k in container), None)
    if key is None:
        return None, [(str(path), doc)]  # one tool definition
    items = container[key]
    if not isinstance(items, list):
        raise DataError(f"{path}: '{key}' must be a list of tool definitions, not {json_type(items)}.")
    return container, [(f"{path} {key}[{n}]", r) for n, r in enumerate(items)]


def _several_lines(text: str) -> bool:
    return sum(1 for ln in text.split("\n") if ln.strip()) > 1


def detect(container: dict | None, records: list[tuple[str, object]]) -> str:
    if container is not None and "server" in container:
        return "mcp"
    if container is not None and "tools" not in container:
        return "openai"  # functions / functionDeclarations
    first = next((r for _, r in openai.flatten(records[:1])), None) if records else None
    if container is None and beir.is_document(first):
        return "beir"
    if mcp.is_tool(first):
        return "mcp"
    if openai.is_function(first) or (isinstance(first, dict) and any(k in first for k in openai.LIST_KEYS[2:])):
        return "openai"
    if isinstance(first, dict) and ("tool_name" in first or "api_name" in first):
        return "jsonl"
    if container is not None:
        return "mcp"  # a tools/list result whose tools lack inputSchema
    if first is None:
        return "jsonl"  # an empty file: nothing to tell, nothing to read
    shown = json.dumps(first)[:120] if isinstance(first, dict) else json_type(first)
    raise DataError(
        f"{records[0][0]}: cannot tell the registry format from this record ({shown}); expected an MCP tool "
        "(name, inputSchema), an OpenAI function ({\"type\": \"function\", \"function\": {...}}) or a JSONL "
        "record (tool_name, api_name) or a BEIR corpus document (_id, title, text). Force one with "
        "--tools-format mcp|openai|jsonl|beir."
    )


def read_file(path: Path, fmt: str = "auto", warnings: Warnings | None = None) -> tuple[str, list[Entry]]:
    """(format used, the file's APIs); `warnings` counts what a reader lets pass (a BEIR corpus' repeated lines)."""
    if fmt == "toolbench":
        raise DataError(f"{path}: --tools-format toolbench reads a ToolBench tools folder (<Category>/<tool>.json), not a file.")
    with reading(path):
        container, records = _records(path)
        used = detect(container, records) if fmt == "auto" else fmt
        if used == "mcp":
            server = mcp.server_name(container or {}, str(path), stem(path))
            return used, mcp.apis(records, server)
        if used == "openai":
            return used, openai.apis(records, stem(path))
        if used == "beir":
            return used, beir.documents(records, warnings if warnings is not None else Warnings())
        out: list[Entry] = []
        for where, rec in records:
            if not isinstance(rec, dict):
                raise DataError(f"{where}: expected a JSON object (tool_name, api_name, ...), got {json_type(rec)}.")
            out.append((where, toolbench.jsonl_api(where, rec)))
        return used, out


class Entries(NamedTuple):
    formats: str  # the formats used, joined with + when mixed
    found: Path  # the file or folder read
    entries: list[Entry]  # its APIs in file order


def read_entries(path: Path, fmt: str = "auto", warnings: Warnings | None = None) -> Entries:
    """The APIs of a tools file or folder, where they were read and in which formats."""
    if fmt not in TOOLS_FORMATS:
        raise DataError(f"Unknown tools format {fmt!r}; use one of {', '.join(TOOLS_FORMATS)}.")
    kind, found = locate(path, fmt)
    if kind == "tree":
        return Entries("toolbench", found, toolbench.tree_apis(found))
    if kind == "file":
        used, read = read_file(found, fmt, warnings)
        return Entries(used, found, read)
    files = sorted(p for p in found.iterdir() if _is_tool_file(p))
    if not files:
        raise DataError(f"{found}: no tool definition files ({', '.join(TOOL_SUFFIXES)}) in this folder.")
    formats: list[str] = []
    entries: list[Entry] = []
    for f in files:
        used, more = read_file(f, fmt, warnings)
        formats += [used] if used not in formats else []
        entries += more
    return Entries("+".join(sorted(formats)), found, entries)


def load_registry(
    path: str | Path, choice: str = "full", warnings: Warnings | None = None, fmt: str | None = "auto"
) -> Registry:
    """Read a registry file or folder; `described` keeps only APIs that have a description."""
    if choice not in REGISTRY_CHOICES:
        raise DataError(f"Unknown registry choice {choice!r}; use one of {', '.join(REGISTRY_CHOICES)}.")
    warnings = warnings if warnings is not None else Warnings()
    used, found, entries = read_entries(Path(path), fmt or "auto", warnings)
    apis: list[Api] = []
    seen: dict[str, tuple[str, int]] = {}
    for where, api in entries:
        api = _bounded(where, api, warnings)
        aid = api.id
        if aid in seen:
            first_where, pos = seen[aid]
            # Keep the first record (or the first described one): a later duplicate never wins silently.
            warnings.add("duplicate_api", f"{where} repeats {aid!r} from {first_where}")
            if apis[pos].description is None and api.description is not None:
                apis[pos] = api
                seen[aid] = (where, pos)
            continue
        seen[aid] = (where, len(apis))
        apis.append(api)
    if not apis:
        raise DataError(f"{found}: the registry holds no API.")
    _count_near_duplicates(apis, warnings)
    left_out: frozenset[str] = frozenset()
    if choice == "described":
        kept = [a for a in apis if a.description is not None]
        if not kept:
            raise DataError(f"{found}: no API has a description, so the 'described' registry is empty.")
        left_out = frozenset(a.id for a in apis if a.description is None)
        apis = kept
    _count_long_descriptions(apis, warnings)
    return Registry(apis=apis, source=str(found), choice=choice, format=used, left_out=left_out)


def _bounded(where: str, api: Api, warnings: Warnings) -> Api:
    """The API with its tool and API names cut at NAME_CAP_CHARS (`bounded_name`), each cut counted. A corpus
    document is left as it is: its title is no part of its id, and an id longer than the cap is refused."""
    if api.document is not None:
        return api
    tool, cut_tool = bounded_name(api.tool_name)
    name, cut_name = bounded_name(api.api_name)
    if not (cut_tool or cut_name):
        return api
    for cut, what, raw in ((cut_tool, "tool", api.tool_name), (cut_name, "API", api.api_name)):
        if cut:
            warnings.add("long_name", f"{what} name of {len(raw):,} characters ({raw[:40]!r}...) is cut to "
                         f"{NAME_CAP_CHARS} characters ({where})")
    return dataclasses.replace(api, tool_name=tool, api_name=name)


def _count_near_duplicates(apis: list[Api], warnings: Warnings) -> None:
    """Ids that differ only by case or whitespace (`loose_id`) are kept as different APIs, as the registry
    names them, but never without a word: one warning per extra spelling."""
    first: dict[str, str] = {}
    for a in apis:
        prior = first.setdefault(loose_id(a.id), a.id)
        if prior != a.id:
            warnings.add("near_duplicate_api", f"{a.id!r} and {prior!r} differ only by case or whitespace; kept as "
                         "two APIs")


def _count_long_descriptions(apis: list[Api], warnings: Warnings) -> None:
    """A data warning per description that planner prompts will show cut (`prompt_description`)."""
    for a in apis:
        # The raw length bounds the collapsed one: only the rare long description is collapsed here.
        if a.description is not None and len(a.description) > DESCRIPTION_CAP_CHARS and prompt_description(a.description)[1]:
            warnings.add("long_description", f"{a.display}: description of {len(a.description):,} characters is cut to "
                         f"{DESCRIPTION_CAP_TOKENS:,} tokens (~{DESCRIPTION_CAP_CHARS:,} characters) in planner prompts")
