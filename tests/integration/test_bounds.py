"""A dry run far past the runs bound is one line, before any work, in a child process whose address space is
limited to the campaign's 3 GB; at the bound it counts every call within the same limit (issue 38)."""

from __future__ import annotations

import json
import resource
import subprocess
from pathlib import Path

from helpers.cli import CLI, one_line
from helpers.data import make_data_dir
from helpers.procs import child_env, run

LIMIT = 3 * 2**30  # the address space of the child: the campaign's 3 GB


def _limited(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))

    return run([*CLI, *args], cwd=cwd, env=child_env(), timeout=300, preexec_fn=limit)


def test_a_dry_run_far_past_the_runs_bound_is_one_line_under_a_memory_limit(tmp_path):
    data = make_data_dir(tmp_path / "data")
    base = ["--data", str(data), "--model", "sim", "--dry-run", "--no-progress", "--cache-dir", str(tmp_path / "c")]
    far = _limited([*base, "--runs", "100000000", "--out", str(tmp_path / "far")], tmp_path)
    assert far.returncode == 2 and one_line(far.stderr) == ("error: --runs 100000000 is impossible; it must be "
                                                              "between 1 and 1000"), far.stderr
    assert not (tmp_path / "far").exists() and not (tmp_path / "c").exists()  # stopped before any work
    # At the bound the dry run counts every call within the same limit.
    at = _limited([*base, "--runs", "1000", "--limit", "1", "--out", str(tmp_path / "at")], tmp_path)
    assert at.returncode == 0, at.stderr[-2000:]
    plan = json.loads((tmp_path / "at" / "plan.json").read_text())["models"]["sim"]
    assert plan["calls"] == 2 * 1000 * 3 and plan["to_send"] == 2 * 1000 * 3  # 2 queries x 1000 runs x 3 calls
