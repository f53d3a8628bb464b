"""A tiny ToolBench-shaped data folder (registry JSONL + two query files) that tests build themselves."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

CATEGORIES = {
    "Weather": [("Weather API", "get forecast", "Daily weather forecast for a city"),
                ("Weather API", "get current", "Current temperature and wind for a location"),
                ("Climate Data", "historical", "Historical climate records by station")],
    "Finance": [("Currency Exchange", "convert", "Convert an amount between two currencies"),
                ("Currency Exchange", "rates", "Latest exchange rates for a base currency"),
                ("Stock Quotes", "quote", "Real-time stock price quote by ticker symbol")],
    "Sports": [("Football Data", "player transfers", "Transfer history of a football player"),
               ("Football Data", "team squad", "Current squad of a football club"),
               ("NBA Stats", "box score", "Box score of a basketball game")],
    "Travel": [("Hotels Finder", "search hotels", "Search hotels in a city by dates"),
               ("Airports Finder", "airports by city", "List airports near a city"),
               ("Flight Search", "search flights", "Find flights between two airports on a date")],
}
UNDESCRIBED = [("Mystery Tool", "do thing"), ("Mystery Tool", "other thing")]


def api_records() -> list[dict]:
    recs = [
        {"tool_name": t, "api_name": a, "category": c, "api_description": d}
        for c, apis in CATEGORIES.items()
        for t, a, d in apis
    ]
    recs += [{"tool_name": t, "api_name": a, "category": None, "api_description": None} for t, a in UNDESCRIBED]
    return recs


def _q(qid: int, text: str, apis: list[tuple[str, str]], relevant: list[tuple[str, str]]) -> dict:
    return {
        "query_id": qid,
        "query": text,
        "api_list": [{"category_name": "x", "tool_name": t, "api_name": a, "api_description": ""} for t, a in apis],
        "relevant APIs": [[t, a] for t, a in relevant],
    }


QUERIES = {
    "G1_instruction": [
        _q(1, "What is the weather forecast for Paris tomorrow?", [("Weather API", "get forecast"), ("Weather API", "get current")], [("Weather API", "get forecast")]),
        _q(2, "Convert 100 dollars to euros.", [("Currency Exchange", "convert"), ("Currency Exchange", "rates")], [("Currency Exchange", "convert")]),
        _q(3, "Show me the transfer history of Lionel Messi.", [("Football Data", "player transfers"), ("Football Data", "team squad")], [("Football Data", "player transfers")]),
    ],
    "G2_instruction": [
        _q(10, "I am travelling to London: find hotels there, list the airports near the city and convert 500 dollars to pounds.",
           [("Hotels Finder", "search hotels"), ("Airports Finder", "airports by city"), ("Currency Exchange", "convert")],
           [("Hotels Finder", "search hotels"), ("Currency Exchange", "convert")]),
        _q(11, "Find flights from Berlin to Rome and tell me the weather forecast in Rome.",
           [("Flight Search", "search flights"), ("Weather API", "get forecast")], [("Flight Search", "search flights")]),
    ],
}


def make_data_dir(root: Path, gz: bool = True) -> Path:
    (root / "registry").mkdir(parents=True, exist_ok=True)
    (root / "queries").mkdir(exist_ok=True)
    lines = "".join(json.dumps(r) + "\n" for r in api_records())
    if gz:
        with gzip.open(root / "registry" / "apis.jsonl.gz", "wt", encoding="utf-8") as fh:
            fh.write(lines)
    else:
        (root / "registry" / "apis.jsonl").write_text(lines, encoding="utf-8")
    for stem, qs in QUERIES.items():
        (root / "queries" / f"{stem}.json").write_text(json.dumps(qs), encoding="utf-8")
    return root


def make_toolenv_tree(root: Path) -> Path:
    """The same APIs in ToolBench's own `data/toolenv/tools/<Category>/<tool>.json` layout."""
    tools_root = root / "data" / "toolenv" / "tools"
    by_tool: dict[tuple[str, str], list[dict]] = {}
    for c, apis in CATEGORIES.items():
        for t, a, d in apis:
            by_tool.setdefault((c, t), []).append({"name": a, "url": "https://example", "description": d, "method": "GET"})
    for (c, t), api_list in by_tool.items():
        d = tools_root / c
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{t.replace(' ', '_').lower()}.json").write_text(
            json.dumps({"tool_name": t, "tool_description": "", "api_list": api_list}), encoding="utf-8"
        )
    return root
