"""The command line end to end on a tiny data folder, as a user runs it (simulated LLM on loopback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.cli import run_cli
from helpers.data import make_data_dir
from helpers.procs import simulator
from helpers.records import flat


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("ws")
    return root, make_data_dir(root / "data"), root / "cache"


def test_retrieval_only_reports_both_gold_sets(workspace):
    root, data, cache = workspace
    r = run_cli("--retrieval-only", "--data", str(data), "--cache-dir", str(cache), "--out", str(root / "ro"), "--no-progress", cwd=root)
    assert r.returncode == 0, r.stderr
    rows = json.loads((root / "ro" / "summary.json").read_text())["rows"]
    recall5 = {(x["subset"], x["gold"]): x for x in rows if x["metric"] == "recall" and x["k"] == 5 and x["arch"] == "rtp"}
    assert set(recall5) == {(s, g) for s in ("G1_instruction", "G2_instruction") for g in ("api_list", "relevant")}
    assert all(x["model"] is None and len(x["values"]) == 1 for x in recall5.values())
    # On this toy registry the query names its API outright: RtP must find the relevant ones.
    assert recall5[("G1_instruction", "relevant")]["mean"] == 1.0
    recs = [flat(json.loads(line)) for line in (root / "ro" / "queries.jsonl").read_text().splitlines()]
    # The config's ks include 20, above this 14-API registry: left out (said on stderr), not capped silently.
    assert len(recs) == 5 and all(len(r["rtp"]["retrieved"]) == 10 for r in recs)
    assert "k-ablation values 20" in r.stderr
    # meta.json saves the settings the study ran with, by section, and says what was fitted to the data
    meta = json.loads((root / "ro" / "meta.json").read_text())
    assert set(meta["settings"]) == {"data", "embed", "retrieval", "run", "analysis"}
    assert meta["settings"]["retrieval"]["ks"] == [1, 3, 5, 10]
    assert meta["fitted"]["retrieval.ks"]["asked"] == [1, 3, 5, 10, 20]
    assert meta["fitted"]["retrieval.ks"]["used"] == [1, 3, 5, 10]
    assert {x["k"] for x in rows if x["metric"] == "recall"} == {1, 3, 5, 10}


def test_full_study_with_simulator_then_rerun_from_cache(workspace):
    root, data, cache = workspace
    args = ["--data", str(data), "--cache-dir", str(cache), "--model", "sim", "--runs", "2", "--no-progress"]
    first = run_cli(*args, "--out", str(root / "s1"), cwd=root)
    assert first.returncode == 0, first.stderr
    meta = json.loads((root / "s1" / "meta.json").read_text())
    assert meta["llm_stats"]["sim"]["requests"] > 0
    report = (root / "s1" / "report.md").read_text()
    assert "SIMULATED" in report.upper()
    recs = [flat(json.loads(line)) for line in (root / "s1" / "queries.jsonl").read_text().splitlines()]
    assert len(recs) == 2 * 5
    assert all(r["ptr"]["stubs"] and r["rtp"]["plan"] is not None for r in recs)
    assert list((root / "s1" / "figures").glob("*.png"))

    second = run_cli(*args, "--out", str(root / "s2"), cwd=root)
    assert second.returncode == 0, second.stderr
    meta2 = json.loads((root / "s2" / "meta.json").read_text())
    stats = meta2["llm_stats"]["sim"]
    assert stats["requests"] == 0 and stats["cache_hits"] == stats["calls"]
    assert meta2["runtime"]["simulator_stats"]["sim"]["requests"] == 0  # the simulator saw nothing
    assert (root / "s1" / "summary.json").read_bytes() == (root / "s2" / "summary.json").read_bytes()

    # `report` re-renders from the saved data alone.
    rendered = (root / "s2" / "report.md").read_text()
    (root / "s2" / "report.md").unlink()
    again = run_cli("report", str(root / "s2"), cwd=root)
    assert again.returncode == 0, again.stderr
    assert (root / "s2" / "report.md").read_text() == rendered

    cs = run_cli("cache", "stats", "--cache-dir", str(cache), cwd=root)
    assert cs.returncode == 0 and "sim" in cs.stdout


def test_missing_data_is_one_clear_error(tmp_path):
    r = run_cli("--retrieval-only", "--data", str(tmp_path / "nope"), "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "nope" in r.stderr and "--data DIR or EVALUATOR_DATA" in r.stderr


def test_unknown_model_fails_before_any_work(workspace):
    root, data, cache = workspace
    r = run_cli("--data", str(data), "--cache-dir", str(cache), "--model", "no-such-model", "--out", str(root / "x"), cwd=root)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "no-such-model" in r.stderr and not (root / "x").exists()


def test_missing_key_names_the_variable(workspace):
    root, data, cache = workspace
    r = run_cli("--data", str(data), "--cache-dir", str(cache), "--model", "gemini", "--out", str(root / "g"), cwd=root, env={"GEMINI_API_KEY": ""})
    assert r.returncode == 2 and "GEMINI_API_KEY" in r.stderr and "Traceback" not in r.stderr


def test_two_models_share_nothing(workspace):
    root, data, cache = workspace
    r = run_cli("--data", str(data), "--cache-dir", str(cache), "--model", "sim", "--model", "sim-b", "--runs", "1",
                "--subsets", "G1", "--out", str(root / "two"), "--no-progress", cwd=root)
    assert r.returncode == 0, r.stderr
    meta = json.loads((root / "two" / "meta.json").read_text())
    # Each model's replies are its own: the second model is not answered from the first one's cache.
    stats = meta["llm_stats"]
    assert stats["sim-b"]["requests"] == stats["sim-b"]["calls"] > 0
    rows = json.loads((root / "two" / "summary.json").read_text())["rows"]
    models = {x["model"] for x in rows if x["metric"] == "pass"}
    assert models == {"sim", "sim-b"}


def _profile(tmp_path: Path, base_url: str) -> Path:
    p = tmp_path / "keyed.toml"
    p.write_text(
        f'model = "sim-1"\n[connection]\nbase_url = "{base_url}"\napi_key_env = "KEYED_SIM_KEY"\ntimeout_s = 10.0\n'
        "[pacing]\nconcurrency = 4\n[retries]\nmax_retries = 2\n",
        encoding="utf-8",
    )
    return p


def test_bad_key_stops_cleanly_without_leaking_it(workspace, tmp_path):
    root, data, cache = workspace
    with simulator(api_key="the-right-key") as sim:
        prof = _profile(tmp_path, sim.base_url)
        r = run_cli("--data", str(data), "--cache-dir", str(tmp_path / "c"), "--model", str(prof), "--runs", "1",
                    "--out", str(tmp_path / "o"), "--no-progress", cwd=root, env={"KEYED_SIM_KEY": "sk-WRONG-secret-123"})
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and "401" in r.stderr
    assert "sk-WRONG-secret-123" not in r.stderr + r.stdout


def test_daily_quota_stop_then_resume_pays_no_call_twice(workspace, tmp_path):
    root, data, cache = workspace
    args = ["--data", str(data), "--cache-dir", str(tmp_path / "c"), "--runs", "2", "--no-progress",
            "--out", str(tmp_path / "o")]
    env = {"KEYED_SIM_KEY": "k"}
    with simulator(api_key="k", daily_quota=12) as sim:
        prof = _profile(tmp_path, sim.base_url)
        first = run_cli(*args, "--model", str(prof), cwd=root, env=env)
        assert first.returncode != 0 and "Traceback" not in first.stderr
        assert "quota" in first.stderr.lower()
        done_before = sim.stats()["ok"]
        assert done_before == 12
        # The quota "resets": every call answered before the stop comes from the cache.
        sim.configure(daily_quota=None)
        sim.reset_stats()
        second = run_cli(*args, "--model", str(prof), cwd=root, env=env)
        assert second.returncode == 0, second.stderr
        meta = json.loads((tmp_path / "o" / "meta.json").read_text())
        calls = meta["llm_stats"]["keyed"]["calls"]
        assert sim.stats()["ok"] == calls - done_before
