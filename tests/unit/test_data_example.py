"""The bundled MCP example loads cleanly, and a tools file given wrong is one line before any work."""

from __future__ import annotations

import json

from helpers import EXAMPLE

from evaluator.cli import main as cli
from evaluator.data import Warnings, find_query_files, load_query_files, load_registry

SERVERS = {"filesystem", "git", "fetch", "time", "memory"}


def test_example_registry_and_queries_load_without_warnings():
    w = Warnings()
    reg = load_registry(EXAMPLE, "full", w)
    assert reg.format == "mcp" and len(reg) == 38
    assert {a.tool_name for a in reg.apis} == SERVERS
    queries = load_query_files(find_query_files(EXAMPLE), reg, w)
    assert len(queries) == 32 and {q.subset for q in queries} == {"single", "multi"}
    assert not w.counts, w.as_dict()  # every gold id names a tool of the registry


def test_bad_tools_file_is_one_line_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the files named relative to where the user stands
    (tmp_path / "tools.json").write_text(json.dumps([{"type": "function", "function": {"name": 3}}]))
    (tmp_path / "queries.csv").write_text("query,gold\nx,tools::a\n")
    # the sim profile at an endpoint nobody listens on: nothing is started or sent before the data is read
    rc = cli.main(["--tools", "tools.json", "--queries", "queries.csv", "--model", "sim", "--base-url",
                   "http://127.0.0.1:9/v1", "--out", "o", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert err.strip().splitlines() == [f"error: {tmp_path / 'tools.json'} record 0: 'name' must be a string, not a number."]
    assert not (tmp_path / "o").exists()
    rc = cli.main(["--tools", "tools.json", "--queries", "queries.csv", "--tools-format", "mcp", "--base-url",
                   "http://127.0.0.1:9/v1", "--out", "o", "--no-progress"])
    assert rc == 2 and "this is an OpenAI function definition, not an MCP tool" in capsys.readouterr().err
