"""Replies that are odd, cut short or without usage, as a user meets them (issue 31): the CLI against the
simulator's knobs on loopback (content as parts or of an undocumented shape, a content filter, a server's context,
no usage)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.cli import run_cli
from helpers.data import make_data_dir
from helpers.records import flat


@pytest.fixture
def study(socket_sim, tmp_path):
    """(args of a small study against the shared simulator, its output folder)."""
    data = make_data_dir(tmp_path / "data")
    prof = tmp_path / "srv.toml"
    prof.write_text(f'model = "sim-1"\n[connection]\nbase_url = "{socket_sim.base_url}"\n[server]\nsimulated = true\n'
                    "[pacing]\nconcurrency = 4\n[retries]\nmax_retries = 1\nbackoff_base_s = 0.01\nbackoff_max_s = 0.02\n")
    out = tmp_path / "out"
    args = ["--data", str(data), "--cache-dir", str(tmp_path / "cache"), "--model", str(prof), "--runs", "1",
            "--out", str(out), "--no-progress", "--no-extras"]
    return args, out


def _records(out: Path) -> list[dict]:
    return [flat(json.loads(line)) for line in (out / "queries.jsonl").read_text().splitlines()]


def _strip(recs: list[dict]) -> list[dict]:
    """Records without the per-call token counts (a list of parts is billed like its text)."""
    for r in recs:
        for b in (r.get("rtp"), r.get("ptr")):
            if b:
                b.pop("tokens", None)
    return recs


# -- item 3: reply shapes ---------------------------------------------------------------------------------
def test_content_as_a_list_of_parts_gives_the_same_results_as_a_string(socket_sim, study, tmp_path):
    args, out = study
    socket_sim.configure(content_form="parts")
    parts = run_cli(*args, cwd=tmp_path)
    assert parts.returncode == 0, parts.stderr
    assert "Traceback" not in parts.stderr
    got = _strip(_records(out))
    socket_sim.configure(content_form="string")
    args2 = [a if a != str(tmp_path / "cache") else str(tmp_path / "cache2") for a in args]
    args2[args2.index(str(out))] = str(tmp_path / "out2")
    plain = run_cli(*args2, cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert got == _strip(_records(tmp_path / "out2"))


@pytest.mark.parametrize("form", ["number", "object"])
def test_an_undocumented_content_shape_is_one_counted_malformed_reply(socket_sim, study, tmp_path, form):
    args, out = study
    socket_sim.configure(content_form=form)
    r = run_cli(*args, cwd=tmp_path)
    assert r.returncode == 3, r.stderr  # done, some calls failed for good
    assert "Traceback" not in r.stderr and "ValidationError" not in r.stderr
    assert "malformed_reply" in r.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["llm_stats"]["srv"]["failed"].get("malformed_reply", 0) > 0


# -- item 4: cut replies ------------------------------------------------------------------------------------
def test_a_content_filter_cut_is_reported_by_cause_and_sent_again_by_the_next_run(socket_sim, study, tmp_path):
    args, out = study
    socket_sim.configure(p_filter=1.0)
    first = run_cli(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "content filter" in first.stderr and "content_filter" in first.stderr
    report = (out / "report.md").read_text()
    assert "cut replies: 0" not in report and "content_filter" in report
    n_cut = sum(1 for r in _records(out) for b in (r["rtp"], r["ptr"]) for c in
                [b["plan"].get("cut") if b.get("plan") else None, b.get("discovery_cut")] if c == "content_filter")
    assert n_cut > 0
    # The filter is lifted: the rerun sends the filtered calls again, and only those.
    socket_sim.configure(p_filter=0.0)
    socket_sim.reset_stats()
    second = run_cli(*args, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert socket_sim.stats()["ok"] >= n_cut
    assert "cut replies: 0" in (out / "report.md").read_text()


def test_a_reply_cut_by_the_servers_context_is_sent_again_once_the_context_is_larger(socket_sim, study, tmp_path):
    args, out = study
    # Discovery prompts (~175-195 tokens) fit in 200 and their replies are cut; planner prompts (~300) do not.
    socket_sim.configure(n_ctx=200)
    first = run_cli(*args, cwd=tmp_path)
    assert first.returncode == 3, first.stderr
    assert "context_exceeded" in first.stderr and "exceeds the available context size" in first.stderr
    assert "server's context" in first.stderr
    report = (out / "report.md").read_text()
    assert "context " in report.split("cut replies:")[1].split("\n")[0]
    # Same server, same context: the cut replies are what it answers; only the failed calls go again.
    socket_sim.reset_stats()
    same = run_cli(*args, cwd=tmp_path)
    assert same.returncode == 3
    failed = json.loads((out / "meta.json").read_text())["llm_stats"]["srv"]["failed"]["context_exceeded"]
    assert socket_sim.stats()["requests"] == failed
    # The user restarts the server with a proper context: every cut reply and failed call is sent again.
    socket_sim.configure(n_ctx=8192)
    socket_sim.reset_stats()
    fixed = run_cli(*args, cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    recs = _records(out)
    assert all(not r["ptr"].get("discovery_cut") and not r["rtp"]["plan"].get("cut") for r in recs)
    assert "cut replies: 0" in (out / "report.md").read_text()
    meta = json.loads((out / "meta.json").read_text())
    assert meta["llm_stats"]["srv"]["cut_resent"] > 0


def test_a_study_without_usage_reports_estimates_on_stderr(socket_sim, study, tmp_path):
    args, out = study
    socket_sim.configure(usage=False)
    r = run_cli(*args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "no token usage" in r.stderr
    meta = json.loads((out / "meta.json").read_text())
    st = meta["llm_stats"]["srv"]
    assert st["usage_estimated"] == st["requests"] > 0 and st["prompt_tokens"] > 0 and st["completion_tokens"] > 0
