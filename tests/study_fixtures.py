"""The study CLI in a child process, against a simulator on loopback and the tiny data folder (dry run, budget)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from data_fixtures import make_data_dir

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from simulator.harness import start_simulator  # noqa: E402


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m evaluator ARGS` with no data folder or provider key from the environment."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name in ("EVALUATOR_DATA", "GEMINI_API_KEY"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "evaluator", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@contextmanager
def workspace(root: Path) -> Iterator[tuple[Path, Path, Any]]:
    """(root, tiny data folder, a running simulator)."""
    data = make_data_dir(root / "data")
    with start_simulator() as sim:
        yield root, data, sim


def study_args(ws: tuple[Path, Path, Any], cache: Path, out: Path, *extra: str, runs: int = 4) -> list[str]:
    """The study on the `sim` profile against the workspace's simulator, from a cache to an output folder."""
    _, data, sim = ws
    return ["--data", str(data), "--cache-dir", str(cache), "--out", str(out), "--model", "sim", "--runs", str(runs),
            "--base-url", sim.base_url, "--no-progress", "--no-extras", *extra]
