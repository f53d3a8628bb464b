"""The bundled MCP example: the whole study runs on it with the simulator, and `--tools`/`--queries` reach the
loaders from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import EXAMPLE
from helpers.cli import run_cli
from helpers.records import flat

SERVERS = {"filesystem", "git", "fetch", "time", "memory"}  # the example's five MCP servers


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")  # shared: the registry is embedded once for the module


def test_example_study_end_to_end_with_the_simulator(tmp_path, cache):
    out = tmp_path / "out"
    r = run_cli("--data", str(EXAMPLE), "--model", "sim", "--runs", "2", "--cache-dir", str(cache), "--out", str(out),
                "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = [flat(json.loads(line)) for line in (out / "queries.jsonl").read_text().splitlines()]
    assert len(recs) == 2 * 32 and {r["subset"] for r in recs} == {"single", "multi"}
    assert all(r["rtp"]["retrieved"][0].split("::")[0] in SERVERS for r in recs)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["registry"]["format"] == "mcp" and meta["registry"]["size"] == 38
    report = (out / "report.md").read_text()
    assert "38 APIs (mcp)" in report and "SIMULATED" in report.upper() and "Parameters:" in report


def test_tools_and_queries_flags_with_a_csv_and_string_ids(tmp_path, cache):
    q = tmp_path / "my tests.csv"
    q.write_text("id;query;gold\nt-1;What time is it in Oslo?;time::get_current_time\n"
                 "t-2;Show the git log of ~/code/app;git::git_log\n", encoding="utf-8")
    out = tmp_path / "out"
    r = run_cli("--tools", str(EXAMPLE / "tools"), "--queries", str(q), "--retrieval-only", "--cache-dir", str(cache),
                "--out", str(out), "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = [flat(json.loads(line)) for line in (out / "queries.jsonl").read_text().splitlines()]
    assert [(r["subset"], r["query_id"]) for r in recs] == [("my tests", "t-1"), ("my tests", "t-2")]
    assert recs[0]["rtp"]["retrieved"][0] == "time::get_current_time"
