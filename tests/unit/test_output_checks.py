"""`--out` / `--cache-dir` are probed by a real write before any work, and the probe leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluator.core.errors import ConfigError
from evaluator.results.schema import check_writable


def test_a_folder_that_cannot_be_created_is_one_clear_error() -> None:
    # /proc refuses new entries even for root, where permission bits would say "writable".
    with pytest.raises(ConfigError, match=r"--out /proc/evaluator-out/x is not writable"):
        check_writable(Path("/proc/evaluator-out/x"), "--out")


def test_a_writable_new_folder_passes_and_nothing_is_left(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c"
    check_writable(target, "--out")
    assert list(tmp_path.iterdir()) == []


def test_an_existing_folder_keeps_its_files_only(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("x")
    check_writable(tmp_path, "--cache-dir")
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
