"""Nothing paid twice across processes: in-flight claims shared through the cache; a crashed owner's
claims do not block; an unwritable cache is one clear line."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import llm_fixtures as F
import orjson
import pytest

from evaluator.core.errors import ConfigError, FatalLLMError
from evaluator.llm.cache import CacheEntry, ResponseCache, new_owner

sim_server, any_sim, socket_sim = F.sim_server, F.any_sim, F.socket_sim  # pytest finds fixtures by module attribute


@pytest.fixture
def sim() -> F.LocalSim:
    """The simulator in this process, behind the engine's in-process transport (no socket)."""
    return F.LocalSim()


N, CONCURRENCY = 120, 8


def _rows(path):
    return orjson.loads(path.read_bytes())


def test_two_processes_started_together_pay_each_call_once(socket_sim, tmp_path):
    socket_sim.configure(latency_s=0.02)
    outs = [tmp_path / "a.json", tmp_path / "b.json"]
    procs = [F.spawn_child(socket_sim.base_url, tmp_path / "cache", o, n=N, concurrency=CONCURRENCY) for o in outs]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    a, b = (_rows(o) for o in outs)
    st = socket_sim.stats()
    assert st["requests"] == N and st["distinct_ok"] == N  # each distinct call sent once, by one of them
    assert a["rows"] == b["rows"] and all(r[4] is None for r in a["rows"])
    assert a["stats"]["requests"] + b["stats"]["requests"] == N


def test_second_process_started_midway_waits_for_the_first(socket_sim, tmp_path):
    socket_sim.configure(latency_s=0.2)  # ~3 s of work for the first one: the second starts mid-way
    cache = tmp_path / "cache"
    first = F.spawn_child(socket_sim.base_url, cache, tmp_path / "a.json", n=N, concurrency=CONCURRENCY)
    deadline = time.monotonic() + 60
    while socket_sim.stats()["ok"] < N // 4:  # the first one is well under way (~1-2 s in)
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.01)
    second = F.spawn_child(socket_sim.base_url, cache, tmp_path / "b.json", n=N, concurrency=CONCURRENCY)
    # The rest of the first one's work now takes ~7 s: the second has time to start on a loaded machine.
    socket_sim.configure(latency_s=0.6)
    assert [first.wait(timeout=120), second.wait(timeout=120)] == [0, 0]
    b = _rows(tmp_path / "b.json")
    assert socket_sim.stats()["requests"] == N and b["rows"] == _rows(tmp_path / "a.json")["rows"]
    assert b["stats"]["shared_elsewhere"] > 0  # it waited for replies the first one was buying


async def test_a_long_call_keeps_its_claim_past_the_lease(sim, tmp_path):
    # Lease 0.3 s, call 1.2 s: the owner renews, so a second engine (another owner) waits for it.
    sim.configure(latency_s=1.2)
    prof = F.sim_profile(sim)
    async with sim.engine(prof, cache_root=tmp_path, claim_lease_s=0.3) as a, sim.engine(
        prof, cache_root=tmp_path, claim_lease_s=0.3
    ) as b:
        first = asyncio.create_task(a.chat(F.msgs(1), run=0, prompt_version="v1"))
        await asyncio.sleep(0.7)
        second = await b.chat(F.msgs(1), run=0, prompt_version="v1")
        assert (await first).content == second.content
    assert sim.stats()["requests"] == 1 and b.stats.shared_elsewhere == 1


def test_dead_or_expired_claims_are_taken_over(tmp_path):
    cache = ResponseCache(tmp_path)
    me = new_owner()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = me.split(":")[0]
    assert cache.claim("k1", f"{host}:{dead.pid}:x", 60)  # an owner that died on this host
    assert cache.claim("k1", me, 60) is True  # ... is taken over at once
    assert cache.claim("k2", "other-host:1:x", 0.2)
    assert not cache.claim("k2", me, 60)  # a live (unknown) owner elsewhere is waited for
    time.sleep(0.3)
    assert cache.claim("k2", me, 60)  # until its lease runs out
    cache.release(["k1", "k2"], me)
    assert cache.claim("k1", "other-host:1:y", 60)
    cache.close()


# -- an unwritable cache ------------------------------------------------------------------------------
def test_cache_dir_that_is_a_file_is_one_clear_line(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ConfigError) as e:
        ResponseCache(f)
    assert str(e.value).startswith(f"cache dir {f} is not writable; use --cache-dir")


_OPEN = """
import sys
sys.path.insert(0, {repo!r})
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
        out = subprocess.run(
            [sys.executable, "-c", _OPEN.format(repo=str(F.REPO), root=str(root))],
            capture_output=True, text=True, preexec_fn=demote, timeout=60,
        )
    except PermissionError:
        pytest.skip("running as root and an unprivileged user cannot run this Python")
    finally:
        for p in [root, *root.rglob("*")]:
            p.chmod(0o755)
    assert out.returncode == 3, out.stderr
    assert out.stdout.startswith(f"cache dir {root} is not writable; use --cache-dir") and "Traceback" not in out.stderr


def test_read_only_database_is_one_clear_line_at_open_and_mid_run(tmp_path, monkeypatch):
    # What SQLite raises on a read-only file (also as root, where permissions cannot make one).
    import sqlite3

    import diskcache

    def readonly(*_a, **_k):
        raise sqlite3.OperationalError("attempt to write a readonly database")

    cache = ResponseCache(tmp_path / "mid")
    monkeypatch.setattr(diskcache.Cache, "set", readonly)
    with pytest.raises(FatalLLMError, match=r"^cache dir .*/mid is not writable; use --cache-dir"):
        cache.set("k", CacheEntry(content="x", finish_reason="stop", prompt_tokens=1, completion_tokens=1), tag="sim")
    cache.close()
    monkeypatch.setattr(diskcache.Cache, "transact", readonly)
    with pytest.raises(ConfigError, match=r"^cache dir .*/open is not writable; use --cache-dir"):
        ResponseCache(tmp_path / "open")
