"""report.md shows registry, query and reply texts as text (issue 38): HTML in them is escaped, a `|` does not
split a table cell, and a normal text is written as before.

Before the fix report.md passed raw HTML from registry and reply texts through (`<script>`, `<img onerror>`: 69
lines in one campaign run), which Markdown previewers render.
"""

from __future__ import annotations

import json
import re

from evaluator.cli import main as cli

XSS = "<img src=x onerror=alert(1)>"
TOOLS = [("Weather <script>alert(1)</script>", "get forecast", f"Daily forecast {XSS} for a city"),
         ("Weather API", "get current", "Current temperature & wind | for a location"),
         ("Currency Exchange", "convert", "Convert an amount between <b>two</b> currencies"),
         ("Currency Exchange", "rates", "Latest exchange rates for a base currency"),
         ("Football Data", "player transfers", "Transfer history of a football player"),
         ("Football Data", "team squad", "Current squad of a football club"),
         ("Hotels Finder", "search hotels", "Search hotels in a city by dates"),
         ("Flight Search", "search flights", "Find flights between two airports on a date"),
         (f"Evil {XSS}", "Get", "An API whose tool name is markup"),
         (f"evil {XSS}", "get", "The same id in another case: a near_duplicate_api warning quotes it")]
QUERIES = [("Weather <script>alert(2)</script> forecast for Paris | tomorrow", ["Weather <script>alert(1)</script>::get forecast"]),
           (f"Convert 100 euros {XSS} to dollars", ["Currency Exchange::convert"]),
           ("Current wind in Oslo and the exchange rates", ["Weather API::get current", "Currency Exchange::rates"]),
           ("Transfers of a football player and his team squad", ["Football Data::player transfers"]),
           ("Find flights from Rome to Paris and a hotel", ["Flight Search::search flights", "Hotels Finder::search hotels"]),
           ("Evil thing: get it", [f"Evil {XSS}::Get"])]


def _outside_code(md: str) -> str:
    return re.sub(r"`[^`\n]*`", "", md)


def test_markup_in_registry_query_and_reply_texts_renders_as_text(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EVALUATOR_DATA", raising=False)
    tools = tmp_path / "tools.jsonl"
    tools.write_text("".join(json.dumps({"tool_name": t, "api_name": a, "api_description": d, "category": "x"}) + "\n"
                             for t, a, d in TOOLS))
    queries = tmp_path / "queries.jsonl"
    queries.write_text("".join(json.dumps({"id": i, "subset": "s", "query": q, "gold": g}) + "\n"
                               for i, (q, g) in enumerate(QUERIES)))
    out = tmp_path / "out"
    rc = cli.main(["--tools", str(tools), "--queries", str(queries), "--model", "sim", "--runs", "2", "--ks", "1,3,5",
                   "--out", str(out), "--cache-dir", str(tmp_path / "cache"), "--no-progress", "--no-extras"])
    assert rc == 0, capsys.readouterr().err
    md = (out / "report.md").read_text()
    # no tag of the data anywhere, code spans included; our own <br> and <sup> only
    assert re.findall(r"<(?!br>|sup>|/sup>)[A-Za-z/!]", md) == []
    assert "&lt;img src=x onerror=alert(1)&gt;" in md  # the near-duplicate warning quotes it, escaped
    for block in md.split("\n\n"):  # every table keeps its columns: a | in a text is escaped
        rows = [ln for ln in block.splitlines() if ln.startswith("|")]
        widths = {len(re.findall(r"(?<!\\)\|", _outside_code(ln).replace("\\\\", ""))) for ln in rows}
        assert len(widths) <= 1, block
