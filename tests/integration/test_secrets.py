"""No configured API key reaches a file, the terminal or the report, whatever the command (issue 18).

A canary key is set for every profile's `api_key_env` (the bundled profiles and a `--model path.toml`
one); the simulator requires the path profile's key and quotes it back, as some providers do: in the
401 a wrong key gets, and in the messages of failed batch lines. Then a study, a `--batch` study,
`requests export|run|import` and a failing run are made, and every byte they wrote (output folders,
the cache with its SQLite files, request and result files, stdout and stderr) is searched for any
canary. Before the fix the `--batch` run wrote the key into meta.json (`batch.<model>.errors`) and
report.md ("First batch errors").
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from helpers import REPO
from helpers.keys import SIM_ENV, bundled_envs, canary
from helpers.procs import simulator

from evaluator.cli import main as cli
from simulator.harness import configure_batch

MCP = REPO / "examples" / "mcp"


def _run(args: list[str], capfd, logs: list[str]) -> tuple[int, str]:
    """One command in this process (imports and the embedding model are paid once); what it printed is kept."""
    rc = cli.main(args)
    out, err = capfd.readouterr()
    logs += [out, err]
    return rc, err


def _leaks(root: Path, logs: list[str], secrets: list[str]) -> list[str]:
    found = []
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        data = f.read_bytes()  # SQLite pages, npz shards and JSON alike, as bytes
        found += [f"{f.relative_to(root)}: {s}" for s in secrets if s.encode() in data]
    found += [f"output {i}: {s}" for i, text in enumerate(logs) for s in secrets if s in text]
    return found


def test_no_canary_key_in_anything_written(tmp_path, monkeypatch, capfd):
    envs = [*bundled_envs(), SIM_ENV]
    keys = {n: canary(n) for n in envs}
    wrong = "sk-canary-7f3a-wrong-key-for-the-401-5e2b"
    secrets = [*keys.values(), wrong]
    for n, k in keys.items():
        monkeypatch.setenv(n, k)
    monkeypatch.delenv("EVALUATOR_DATA", raising=False)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # the CLI installs its redacting hook
    monkeypatch.chdir(tmp_path)
    logs: list[str] = []
    with simulator(api_key=keys[SIM_ENV]) as sim:
        configure_batch(sim.base_url, reset=True, turnaround_s=0.05, p_fail=0.5, echo_key=True, seed=3)
        prof = tmp_path / "canary.toml"
        prof.write_text(
            f'model = "sim-1"\n[connection]\nbase_url = "{sim.base_url}"\napi_key_env = "{SIM_ENV}"\n'
            '[server]\nsimulated = true\n[batch]\napi = "openai"\n[pacing]\nconcurrency = 8\n'
            '[retries]\nmax_retries = 1\nbackoff_base_s = 0.01\nbackoff_max_s = 0.05\n',
            encoding="utf-8")
        cache, work = tmp_path / "cache", tmp_path / "work"
        base = ["--tools", str(MCP / "tools"), "--queries", str(MCP / "queries.jsonl"), "--limit", "1",
                "--runs", "1", "--cache-dir", str(cache), "--no-progress", "--no-extras"]
        data = [*base, "--model", str(prof)]

        # A --batch study: half the batch lines fail, each quoting the key (re-submitted, then online).
        rc, err = _run([*data, "--out", str(work / "batch"), "--batch"], capfd, logs)
        assert rc == 0, err
        meta = json.loads((work / "batch" / "meta.json").read_text())
        errors = next(iter(meta["batch"].values()))["errors"]
        assert errors and all(f"[REDACTED:{SIM_ENV}]" in e for e in errors), errors  # the echo was there, and cut
        assert f"[REDACTED:{SIM_ENV}]" in (work / "batch" / "report.md").read_text()

        # The other runs start from the first one's embeddings (no model to load) and from empty LLM
        # caches, so every call goes to the server.
        for c in ("cache2", "cache3", "cache4", "cache5", "cache6"):
            shutil.copytree(cache / "embeddings", tmp_path / c / "embeddings")

        # The same through Gemini's batch API (another client, another error format: google.rpc.Status).
        gem = tmp_path / "canary-gemini.toml"
        gem.write_text(prof.read_text(encoding="utf-8").replace('api = "openai"', 'api = "gemini"'), encoding="utf-8")
        rc, err = _run([*base, "--model", str(gem), "--cache-dir", str(tmp_path / "cache6"), "--out", str(work / "gemini"),
                        "--batch"], capfd, logs)
        assert rc == 0, err
        meta = json.loads((work / "gemini" / "meta.json").read_text())
        assert any(f"[REDACTED:{SIM_ENV}]" in e for s in meta["batch"].values() for e in s["errors"]), meta["batch"]

        # An online study.
        rc, err = _run([*data, "--cache-dir", str(tmp_path / "cache2"), "--out", str(work / "online")], capfd, logs)
        assert rc == 0, err

        # Request files: export what a fresh cache lacks, run it online, import the results.
        fresh = ["--cache-dir", str(tmp_path / "cache3")]
        rc, err = _run(["requests", "export", str(work / "req.jsonl"), *data, *fresh], capfd, logs)
        assert rc == 0, err
        rc, err = _run(["requests", "run", str(work / "req.jsonl"), "--model", str(prof), "--out", str(work / "res.jsonl"),
                        *fresh, "--no-progress"], capfd, logs)
        assert rc == 0, err
        # (--model: `requests import` finds an export's profile by name only, and this one is a path)
        rc, err = _run(["requests", "import", str(work / "res.jsonl"), "--model", str(prof), *fresh], capfd, logs)
        assert rc == 0, err

        # A failing run: a wrong key, which the server's 401 quotes back; the run stops with one line.
        monkeypatch.setenv(SIM_ENV, wrong)
        rc, err = _run([*data, "--cache-dir", str(tmp_path / "cache4"), "--out", str(work / "fail")], capfd, logs)
        assert rc == 1 and "401" in err and "[REDACTED" in err, err
        rc, err = _run(["requests", "run", str(work / "req.jsonl"), "--model", str(prof), "--out",
                        str(work / "res-fail.jsonl"), "--cache-dir", str(tmp_path / "cache5"), "--no-progress"], capfd, logs)
        assert rc == 1, err
    assert len(logs) == 16
    assert _leaks(tmp_path, logs, secrets) == []
