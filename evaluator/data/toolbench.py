"""ToolBench's layouts: the registry JSONL (one API a line), the `toolenv/tools` tree, query files.

The JSONL is also the project's own registry format: `tool_name`, `api_name`, optional `category`,
`api_description` (or `description`) and `parameters` (a JSON Schema object, as in OpenAI's format).
"""

from __future__ import annotations

import json
from pathlib import Path

from evaluator.core.errors import DataError
from evaluator.data.model import Api, api_id, description_or_none
from evaluator.data.params import schema_params
from evaluator.data.source import get_str, json_type, located, one_line, parse_json, read_text

Entry = tuple[str, Api]  # (where the record is, the API)


def jsonl_api(where: str, rec: dict) -> Api:
    tool, name = rec.get("tool_name"), rec.get("api_name")
    desc, cat = rec.get("api_description"), rec.get("category")
    # ToolBench's record (four string-or-null fields, no alias, no parameters) in one check: the
    # field-by-field path below is the slow part of a load (bench/README.md, "data/toolbench.py") and gives
    # the same Api.
    if (
        type(tool) is str and type(name) is str and tool.strip() and name.strip()
        and (type(desc) is str or (desc is None and "description" not in rec))
        and (type(cat) is str or (cat is None and "category_name" not in rec))
        and rec.get("parameters") is None
    ):
        return Api(tool, name, cat or None, description_or_none(desc))
    tool = get_str(rec, "tool_name", where, required=True)
    name = get_str(rec, "api_name", where, required=True)
    desc = get_str(rec, "api_description", where, aliases=("description",))
    cat = get_str(rec, "category", where, aliases=("category_name",))
    params = schema_params(rec.get("parameters"), where, "parameters")
    return Api(tool, name, cat or None, description_or_none(desc), params)


def tree_apis(root: Path) -> list[Entry]:
    """ToolBench's `tools/<Category>/<tool>.json`: one tool per file with its `api_list`.

    Parameters are not read: the study embedded ToolBench APIs without them (EMBED_TEXT_RULE).
    """
    files = sorted(root.glob("*/*.json"))
    if not files:
        raise DataError(f"{root}: no <Category>/<tool>.json files found in this ToolBench tools tree.")
    out: list[Entry] = []
    for path in files:
        tool = parse_json(path, read_text(path), "one JSON object describing a tool")
        if not isinstance(tool, dict):
            raise DataError(f"{path}: expected a JSON object describing one tool, got {json_type(tool)}.")
        tool_name = get_str(tool, "tool_name", str(path), aliases=("name",)) or path.stem
        api_list = tool.get("api_list") or []
        if not isinstance(api_list, list):
            raise DataError(f"{path}: 'api_list' must be a list, not {json_type(api_list)}.")
        for n, api in enumerate(api_list):
            where = f"{path} api_list[{n}]"
            if not isinstance(api, dict):
                raise DataError(f"{where}: expected an object, got {json_type(api)}.")
            name = get_str(api, "name", where, aliases=("api_name",))
            if not name:
                raise DataError(f"{where}: missing the string field 'name'.")
            desc = get_str(api, "description", where, aliases=("api_description",))
            out.append((where, Api(tool_name, name, path.parent.name, description_or_none(desc))))
    return out


def is_query_record(rec: object) -> bool:
    return isinstance(rec, dict) and ("api_list" in rec or "relevant APIs" in rec or "relevant_apis" in rec)


def gold_ids(where: str, rec: dict) -> dict[str, tuple[str, ...]]:
    api_list = rec.get("api_list")
    relevant = rec.get("relevant APIs", rec.get("relevant_apis"))
    if not isinstance(api_list, list) or not isinstance(relevant, list):
        raise DataError(f"{where}: needs a list 'api_list' and a list 'relevant APIs'.")
    expected = "'api_list' entries with tool_name and api_name, and 'relevant APIs' as [tool_name, api_name] pairs"
    with located(where, expected):
        al = [api_id(_name(a["tool_name"]), _name(a["api_name"])) for a in api_list]
        rel = []
        for pair in relevant:
            if not isinstance(pair, list) or len(pair) != 2:
                raise ValueError(f"{one_line(json.dumps(pair), 80)} is not a [tool_name, api_name] pair")
            tool, api = pair
            rel.append(api_id(_name(tool), _name(api)))
    return {"api_list": tuple(dict.fromkeys(al)), "relevant": tuple(dict.fromkeys(rel))}


def _name(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"a name is {json_type(value)}")
    return value
