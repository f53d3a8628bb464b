"""Nothing paid twice: in-flight claims shared through the cache (two engines in one process, on a virtual
clock); a crashed owner's claims do not block; an unwritable cache is one clear line."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from helpers import llm as F

from evaluator.core.errors import ConfigError, FatalLLMError
from evaluator.llm.cache import CacheEntry, ResponseCache, new_owner


@pytest.fixture
def sim() -> F.LocalSim:
    """The simulator in this process, behind the engine's in-process transport (no socket)."""
    return F.LocalSim()


async def test_a_long_call_keeps_its_claim_past_the_lease(sim, tmp_path, clock):
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


def test_dead_or_expired_claims_are_taken_over(tmp_path, monkeypatch):
    now = [time.time()]
    monkeypatch.setattr(time, "time", lambda: now[0])  # the leases' clock (diskcache's expiry), moved by hand
    cache = ResponseCache(tmp_path)
    me = new_owner()
    dead = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process has this pid: a dead owner
    host = me.split(":")[0]
    assert cache.claim("k1", f"{host}:{dead}:x", 60)  # an owner that died on this host
    assert cache.claim("k1", me, 60) is True  # ... is taken over at once
    assert cache.claim("k2", "other-host:1:x", 0.2)
    assert not cache.claim("k2", me, 60)  # a live (unknown) owner elsewhere is waited for
    now[0] += 0.3
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
