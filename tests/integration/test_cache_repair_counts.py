"""The response cache's repair counts what was lost (issue 38): replies in a damaged write-ahead log are counted,
whether the main file is damaged too (repaired) or not (only the log).

Before the fix a database damaged after a killed run said "5 replies kept, 0 damaged rows dropped" while the 4
replies of the log were lost and bought again; a damaged log alone lost them without a word.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from helpers.procs import PYTHON, run

from evaluator.llm.cache import ResponseCache, cache_dir, wal_lost_writes

WRITE = """
import os, sys
from evaluator.llm.cache import CacheEntry, ResponseCache
c = ResponseCache(sys.argv[1])
for i in range(int(sys.argv[2]), int(sys.argv[3])):
    c.set(f"k{i}", CacheEntry(content="x" * 3000, finish_reason="stop", prompt_tokens=1, completion_tokens=1), tag="sim")
if sys.argv[4] == "kill":
    os._exit(0)  # killed: the last replies stay in the write-ahead log
c.close()
"""
PAGE = 4096


def _write(root: Path, lo: int, hi: int, how: str) -> None:
    done = run([PYTHON, "-c", WRITE, str(root), str(lo), str(hi), how], timeout=300)
    assert done.returncode == 0, done.stderr


def _damage_log(db: Path) -> None:
    wal = Path(str(db) + "-wal")
    raw = bytearray(wal.read_bytes())
    raw[32 + 24 + 100] ^= 0xFF  # a byte of the first frame's page: it and every frame after it are dropped
    wal.write_bytes(bytes(raw))


@pytest.fixture
def killed(tmp_path) -> Path:
    """5 replies in the database, 4 more in its write-ahead log (the process was killed)."""
    _write(tmp_path, 0, 5, "close")
    _write(tmp_path, 5, 9, "kill")
    db = cache_dir(tmp_path) / "cache.db"
    assert Path(str(db) + "-wal").stat().st_size > 0
    return db


def _kept(root: Path) -> int:
    c = ResponseCache(root)
    try:
        return sum(c.get(f"k{i}") is not None for i in range(9))
    finally:
        c.close()


def test_a_repair_counts_the_replies_of_a_damaged_log(killed, tmp_path, caplog):
    _damage_log(killed)
    raw = bytearray(killed.read_bytes())
    raw[5 * PAGE:5 * PAGE + 64] = b"\xa5" * 64  # and a b-tree page of the main file (page 6: the key index)
    killed.write_bytes(bytes(raw))
    assert wal_lost_writes(Path(str(killed) + "-wal")) == 4
    with caplog.at_level(logging.WARNING, logger="evaluator.llm"):
        kept = _kept(tmp_path)
    said = [r.getMessage() for r in caplog.records if "repaired" in r.getMessage()]
    assert kept == 5 and len(said) == 1 and "5 replies kept, 4 damaged rows dropped" in said[0], said


def test_a_damaged_log_alone_is_said(killed, tmp_path, caplog):
    _damage_log(killed)
    with caplog.at_level(logging.WARNING, logger="evaluator.llm"):
        kept = _kept(tmp_path)
    said = [r.getMessage() for r in caplog.records if "write-ahead log" in r.getMessage()]
    assert kept == 5 and len(said) == 1 and "the last 4 replies stored in it were lost" in said[0], said


def test_a_sound_log_is_no_loss(killed, tmp_path, caplog):
    assert wal_lost_writes(Path(str(killed) + "-wal")) == 0
    with caplog.at_level(logging.WARNING, logger="evaluator.llm"):
        assert _kept(tmp_path) == 9
    assert not [r for r in caplog.records if "lost" in r.getMessage() or "damaged" in r.getMessage()]
