"""Registry texts that reach a prompt are bounded, and a prompt that cannot fit the model's context is never
sent (issue 31, item 7), driven through the CLI against the simulator."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from helpers import REPO
from helpers.cli import run_cli
from helpers.data import QUERIES, api_records
from helpers.procs import simulator
from helpers.records import flat

from evaluator.data.model import NAME_CAP_CHARS


def _data(root: Path, recs: list[dict]) -> Path:
    (root / "registry").mkdir(parents=True)
    (root / "queries").mkdir()
    with gzip.open(root / "registry" / "apis.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in recs))
    for stem, qs in QUERIES.items():
        (root / "queries" / f"{stem}.json").write_text(json.dumps(qs), encoding="utf-8")
    return root


def _records(out: Path) -> list[dict]:
    return [flat(json.loads(line)) for line in (out / "queries.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def sim():
    with simulator() as s:
        yield s


@pytest.mark.parametrize("field", ["tool_name", "api_name"])
def test_a_megabyte_name_is_cut_and_counted(tmp_path, sim, field):
    recs = api_records()
    huge = "Weather " + "x" * 1_000_000
    recs.append({"tool_name": "Weather API", "api_name": "get forecast", "category": "Weather",
                 "api_description": "Daily weather forecast for a city, hourly", field: huge})
    data = _data(tmp_path / "data", recs)
    out = tmp_path / "out"
    r = run_cli("--data", str(data), "--cache-dir", str(tmp_path / "cache"), "--out", str(out), "--model", "sim",
                "--runs", "1", "--base-url", sim.base_url, "--no-progress", "--no-extras", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "warning: data: 1 long_name" in r.stderr and f"cut to {NAME_CAP_CHARS} characters" in r.stderr
    assert len(r.stderr) < 5000  # the name is not echoed whole
    recs_out = _records(out)
    assert (out / "queries.jsonl").stat().st_size < 200_000
    ids = {x for rec in recs_out for x in rec["rtp"]["retrieved"]}
    assert max(len(x) for x in ids) <= 2 * NAME_CAP_CHARS + 2
    # every planner prompt stays small (the simulator bills prompt tokens by the engine's own rule)
    assert max(rec[a]["tokens"]["planner"]["prompt"] for rec in recs_out for a in ("rtp", "ptr")) < 2_000
    assert "long_name" in (out / "report.md").read_text(encoding="utf-8")


def test_a_prompt_beyond_the_context_is_a_counted_error_never_sent(tmp_path, sim):
    recs = api_records()
    for rec in recs:  # seven and more descriptions of 41 KB: five of them make a planner prompt of ~40k tokens
        rec["api_description"] = ((rec["api_description"] or "Does a thing") + ". ") * 1_400
    data = _data(tmp_path / "data", recs)
    profile = tmp_path / "smallctx.toml"
    profile.write_text((REPO / "configs" / "models" / "sim.toml").read_text(encoding="utf-8").replace(
        "[server]", "[prompt]\ncontext_tokens = 32768\n\n[server]"), encoding="utf-8")
    before = sim.stats()["requests"]
    out = tmp_path / "out"
    r = run_cli("--data", str(data), "--cache-dir", str(tmp_path / "cache"), "--out", str(out), "--model",
                str(profile), "--runs", "1", "--base-url", sim.base_url, "--no-progress", "--no-extras", cwd=tmp_path)
    assert r.returncode == 3, r.stderr[-2000:]  # done, some calls failed for good
    assert "context_exceeded" in r.stderr and "32,768" in r.stderr
    n_queries = sum(len(v) for v in QUERIES.values())
    # only the discovery prompts were sent: no planner prompt reached the server
    assert sim.stats()["requests"] - before == n_queries
    meta = json.loads((out / "meta.json").read_text())
    assert meta["llm_stats"]["smallctx"]["failed"] == {"context_exceeded": 2 * n_queries}
    for rec in _records(out):
        assert rec["rtp"]["plan"]["llm_error_kind"] == "context_exceeded"
    assert "context_exceeded" in (out / "report.md").read_text(encoding="utf-8")
