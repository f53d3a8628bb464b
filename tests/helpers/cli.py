"""The command line in a child process, as a user runs it: `run_cli` (to its end) and `start_cli` (running).

Every call runs `python -m evaluator ARGS` with the worktree's code, without a data folder from the environment
(`EVALUATOR_DATA`), in its own process group (helpers/procs.py), stopped by that group on timeout.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from helpers.procs import PYTHON, REPO, child_env, run, start

CLI = (PYTHON, "-m", "evaluator")


def run_cli(*args: str, cwd: Path | str = REPO, env: Mapping[str, str | None] | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`python -m evaluator ARGS` to its end (stdout and stderr as text); `env` sets variables (None removes one)."""
    return run([*CLI, *args], cwd=cwd, env=child_env(env), timeout=timeout)


def start_cli(*args: str, cwd: Path | str = REPO, env: Mapping[str, str | None] | None = None,
              **kw: Any) -> subprocess.Popen[str]:
    """`python -m evaluator ARGS` started (pipes for stdout and stderr unless given); stop it with `procs.stop`,
    or let the test's end do it."""
    return start([*CLI, *args], cwd=cwd, env=child_env(env), **kw)


def one_line(err: str) -> str:
    """The one non-blank line of a CLI's stderr (a user's mistake, a stop): fails when there are more or none."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]
