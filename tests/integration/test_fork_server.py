"""`run_cli`'s fork server (helpers/forkserver.py) is a faithful `python -m evaluator`: a command forked from it
writes what a cold start writes, says the same on stderr with the same exit code, sees the environment of its
call, and is stopped with everything it started when it runs past its timeout. The rest of the suite runs on it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import psutil
import pytest
from helpers import EXAMPLE, FIXTURES
from helpers.cli import _server, run_cli
from helpers.procs import wait_until


def _study(root: Path, name: str, *extra: str) -> list[str]:
    return ["--tools", str(EXAMPLE / "tools"), "--queries", str(EXAMPLE / "queries.jsonl"), "--limit", "2",
            "--runs", "2", "--model", "sim", "--no-progress", "--no-extras", "--cache-dir", str(root / f"c-{name}"),
            "--out", str(root / name), *extra]


def test_a_forked_study_writes_what_a_cold_one_writes(tmp_path):
    warm = run_cli(*_study(tmp_path, "warm"), cwd=tmp_path)
    cold = run_cli(*_study(tmp_path, "cold"), cwd=tmp_path, cold=True)
    assert warm.returncode == cold.returncode == 0, warm.stderr + cold.stderr
    assert warm.stderr.replace("warm", "cold") == cold.stderr
    assert warm.stdout.replace("warm", "cold") == cold.stdout
    assert (tmp_path / "warm" / "queries.jsonl").read_bytes() == (tmp_path / "cold" / "queries.jsonl").read_bytes()
    rows = [json.loads((tmp_path / d / "summary.json").read_text())["rows"] for d in ("warm", "cold")]
    assert rows[0] == rows[1]
    assert [ln.replace("warm", "cold") for ln in _report(tmp_path / "warm")] == _report(tmp_path / "cold")
    # a second forked command is an invocation of its own, as a second process is (llm/cache.py, `reusable`)
    again = run_cli(*_study(tmp_path, "warm"), "--overwrite", cwd=tmp_path)
    assert again.returncode == 0, again.stderr


def _report(out: Path) -> list[str]:
    """report.md less its one measurement of the process (peak memory: the first of the two runs also built the
    embedder's export, in a child)."""
    return [ln for ln in (out / "report.md").read_text().splitlines() if "Peak resident memory" not in ln]


@pytest.mark.parametrize("args", [("--runs", "0"), ("--no-such-flag",), ("view",)])
def test_a_mistake_is_the_same_line_and_exit_code(tmp_path, args):
    warm = run_cli(*args, cwd=tmp_path)
    cold = run_cli(*args, cwd=tmp_path, cold=True)
    assert (warm.returncode, warm.stdout, warm.stderr) == (cold.returncode, cold.stdout, cold.stderr)
    assert warm.returncode != 0 and "Traceback" not in warm.stderr


def test_the_call_s_environment_and_working_directory_are_the_command_s(tmp_path):
    # EVALUATOR_DATA is read by the command (data/locate.py): the call's value, not the fork server's (none)
    data = tmp_path / "nowhere"
    warm = run_cli("--dry-run", "--model", "sim", cwd=tmp_path, env={"EVALUATOR_DATA": str(data)})
    assert warm.returncode != 0 and str(data) in warm.stderr, warm.stderr
    # a relative --out is the call's working directory's
    r = run_cli(*_study(tmp_path, "x")[:-2], "--out", "rel", cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "rel" / "queries.jsonl").is_file(), r.stderr


def test_a_command_past_its_timeout_is_stopped_and_reaped(tmp_path):
    server = _server()
    assert server is not None, "the fork server did not start"
    shutil.copytree(FIXTURES / "release-0.1.0", tmp_path / "old")
    with pytest.raises(pytest.fail.Exception, match="did not end in 2 s; stopped"):
        run_cli("view", str(tmp_path / "old"), "--serve", cwd=tmp_path, timeout=2)  # serves until stopped
    # the command was stopped and reaped: the fork server has no child left
    wait_until(lambda: not psutil.Process(server.proc.pid).children(), timeout_s=30, what="the command reaped")
