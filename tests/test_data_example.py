"""The bundled MCP example: it loads cleanly, the whole study runs on it with the simulator, and
`--tools`/`--queries`/`--tools-format` reach the loaders from the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from records_fixtures import flat

from evaluator.data import Warnings, find_query_files, load_query_files, load_registry

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "mcp"
SERVERS = {"filesystem", "git", "fetch", "time", "memory"}


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("EVALUATOR_DATA", None)
    return subprocess.run([sys.executable, "-m", "evaluator", *args, "--no-progress"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")  # shared: the registry is embedded once for the module


def test_example_registry_and_queries_load_without_warnings():
    w = Warnings()
    reg = load_registry(EXAMPLE, "full", w)
    assert reg.format == "mcp" and len(reg) == 38
    assert {a.tool_name for a in reg.apis} == SERVERS
    queries = load_query_files(find_query_files(EXAMPLE), reg, w)
    assert len(queries) == 32 and {q.subset for q in queries} == {"single", "multi"}
    assert not w.counts, w.as_dict()  # every gold id names a tool of the registry


def test_example_study_end_to_end_with_the_simulator(tmp_path, cache):
    out = tmp_path / "out"
    r = run_cli("--data", str(EXAMPLE), "--model", "sim", "--runs", "2", "--cache-dir", str(cache), "--out", str(out),
                cwd=tmp_path)
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
                "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = [flat(json.loads(line)) for line in (out / "queries.jsonl").read_text().splitlines()]
    assert [(r["subset"], r["query_id"]) for r in recs] == [("my tests", "t-1"), ("my tests", "t-2")]
    assert recs[0]["rtp"]["retrieved"][0] == "time::get_current_time"


def test_bad_tools_file_is_one_line_before_any_work(tmp_path):
    (tmp_path / "tools.json").write_text(json.dumps([{"type": "function", "function": {"name": 3}}]))
    (tmp_path / "queries.csv").write_text("query,gold\nx,tools::a\n")
    r = run_cli("--tools", "tools.json", "--queries", "queries.csv", "--model", "sim", "--out", "o", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [f"error: {tmp_path / 'tools.json'} record 0: 'name' must be a string, not a number."]
    assert not (tmp_path / "o").exists()
    r = run_cli("--tools", "tools.json", "--queries", "queries.csv", "--tools-format", "mcp", "--out", "o", cwd=tmp_path)
    assert r.returncode == 2 and "this is an OpenAI function definition, not an MCP tool" in r.stderr
