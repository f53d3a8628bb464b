"""Nothing paid twice across processes: two processes on one cache folder, started together or one mid-way
through the other's work, pay each call once (claims shared through the cache); a read-only cache is one line."""

from __future__ import annotations

import os
import signal
import sqlite3
from pathlib import Path

import orjson
import pytest
from helpers import llm as F
from helpers.procs import PYTHON, run, wait_until

from evaluator.core.cache_layout import CacheLayout
from evaluator.llm.cache import ResponseCache, cache_dir

N, CONCURRENCY = 120, 8


def _rows(path):
    return orjson.loads(path.read_bytes())


def test_two_processes_started_together_pay_each_call_once(socket_sim, tmp_path):
    socket_sim.configure(latency_s=0.02)
    outs = [tmp_path / "a.json", tmp_path / "b.json"]
    procs = [F.spawn_child(socket_sim.base_url, tmp_path / "cache", o, n=N, concurrency=CONCURRENCY) for o in outs]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    a, b = (_rows(o) for o in outs)
    st = socket_sim.stats()
    assert st["requests"] == N and st["distinct_ok"] == N  # each distinct call sent once, by one of them
    assert a["rows"] == b["rows"] and all(r[4] is None for r in a["rows"])
    assert a["stats"]["requests"] + b["stats"]["requests"] == N


def _claimed_by(cache: Path, pid: int) -> bool:
    """Whether the process `pid` holds a call's claim in `cache` (a claim's owner names its host and pid)."""
    claims = ResponseCache(cache)
    try:
        return any(str(claims._claims.get(k)).split(":")[1:2] == [str(pid)] for k in claims._claims)
    finally:
        claims.close()


def _writable(cache: Path) -> bool:
    """Whether both databases of `cache` (replies, claims) can take a write now: no transaction is held open."""
    for db in (cache_dir(cache) / "cache.db", CacheLayout(cache).claims / "cache.db"):
        con = sqlite3.connect(db, timeout=0.2)
        try:
            con.execute("BEGIN IMMEDIATE")
            con.rollback()
        except sqlite3.OperationalError:  # "database is locked"
            return False
        finally:
            con.close()
    return True


def _stop_between_writes(proc, cache: Path) -> None:
    """SIGSTOP `proc`'s group at a moment it holds no write transaction: stopped inside one, it would keep every
    other process (the second, the test's own reads) from writing until SIGCONT. Stopped, checked, let go on
    and stopped again until the databases are free."""
    while True:
        os.killpg(proc.pid, signal.SIGSTOP)
        if _writable(cache):
            return
        os.killpg(proc.pid, signal.SIGCONT)
        wait_until(lambda: _writable(cache), proc, what="the first process between two writes")


def test_second_process_started_midway_waits_for_the_first(socket_sim, tmp_path):
    # Stepped, not timed: the first process is stopped (SIGSTOP) with its calls on the wire and their claims held,
    # the second started and let run until it claims a call of its own (so it has passed the first's calls and
    # waits for their replies), then the first goes on and answers them.
    socket_sim.configure(latency_s=0.05)
    cache = tmp_path / "cache"
    first = F.spawn_child(socket_sim.base_url, cache, tmp_path / "a.json", n=N, concurrency=CONCURRENCY)
    wait_until(lambda: socket_sim.stats()["ok"] >= N // 4, first, what="a quarter of the first's calls")
    _stop_between_writes(first, cache)
    try:
        second = F.spawn_child(socket_sim.base_url, cache, tmp_path / "b.json", n=N, concurrency=CONCURRENCY)
        wait_until(lambda: _claimed_by(cache, second.pid), second, what="the second's first claim")
    finally:
        os.killpg(first.pid, signal.SIGCONT)
    assert [first.wait(timeout=300), second.wait(timeout=300)] == [0, 0]
    b = _rows(tmp_path / "b.json")
    assert socket_sim.stats()["requests"] == N and b["rows"] == _rows(tmp_path / "a.json")["rows"]
    assert b["stats"]["shared_elsewhere"] > 0  # it waited for replies the first one was buying


_OPEN = """
import sys
from evaluator.llm import LLMEngine, load_profile
from evaluator.core.errors import ConfigError, FatalLLMError
try:
    LLMEngine(load_profile("sim", env={{}}), cache_root={root!r})
except ConfigError as e:
    print(e)
    sys.exit(3)
"""


@pytest.mark.parametrize("fresh", [True, False], ids=["new-cache", "existing-cache"])
def test_read_only_cache_is_one_clear_line(tmp_path, fresh):
    root = tmp_path / "ro"
    root.mkdir()
    if not fresh:
        ResponseCache(root).close()  # an existing cache, then made read-only
    for p in [root, *root.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    tmp_path.chmod(0o755)
    # root ignores permissions: run the opener as an unprivileged user then (if that user can run Python).
    demote = (lambda: (os.setgroups([]), os.setgid(65534), os.setuid(65534))) if os.geteuid() == 0 else None
    try:
        out = run([PYTHON, "-c", _OPEN.format(root=str(root))], preexec_fn=demote, timeout=300)
    except PermissionError:
        pytest.skip("running as root and an unprivileged user cannot run this Python")
    finally:
        for p in [root, *root.rglob("*")]:
            p.chmod(0o755)
    assert out.returncode == 3, out.stderr
    assert out.stdout.startswith(f"cache dir {root} is not writable; use --cache-dir") and "Traceback" not in out.stderr
