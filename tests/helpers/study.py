"""A study's workspace for the CLI tests: the tiny data folder and a simulator on loopback (dry run, budget,
output lock), and the study's flags against them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from helpers.data import make_data_dir
from helpers.procs import simulator


@contextmanager
def workspace(root: Path) -> Iterator[tuple[Path, Path, Any]]:
    """(root, tiny data folder, a running simulator)."""
    data = make_data_dir(root / "data")
    with simulator() as sim:
        yield root, data, sim


def study_args(ws: tuple[Path, Path, Any], cache: Path, out: Path, *extra: str, runs: int = 4) -> list[str]:
    """The study on the `sim` profile against the workspace's simulator, from a cache to an output folder."""
    _, data, sim = ws
    return ["--data", str(data), "--cache-dir", str(cache), "--out", str(out), "--model", "sim", "--runs", str(runs),
            "--base-url", sim.base_url, "--no-progress", "--no-extras", *extra]
