"""Kill-and-resume: SIGKILL a process mid-run, rerun it, and prove no completed call was re-sent."""

from __future__ import annotations

import os
import signal

import orjson
from helpers import llm as F
from helpers.procs import wait_until

N, CONCURRENCY = 400, 8


def test_sigkill_then_rerun_repeats_no_completed_call(sim, tmp_path):
    # 0.05 s a reply: two thirds of the calls still take ~1.7 s when the kill comes, however late the test sees it
    sim.configure(latency_s=0.05)
    cache, out = tmp_path / "cache", tmp_path / "out.json"
    child = F.spawn_child(sim.base_url, cache, out, n=N, concurrency=CONCURRENCY)
    wait_until(lambda: sim.stats()["ok"] >= N // 3, child, what="a third of the calls answered")
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    at_kill = sim.stats()
    assert 0 < at_kill["ok"] < N and not out.exists()

    assert F.spawn_child(sim.base_url, cache, out, n=N, concurrency=CONCURRENCY).wait(timeout=300) == 0
    resumed = orjson.loads(out.read_bytes())
    st = sim.stats()
    print(f"killed after {at_kill['ok']} replies; rerun sent {st['ok'] - at_kill['ok']}; repeated {st['repeated_ok']}")
    assert st["distinct_ok"] == N
    # Only calls in flight at the kill (answered by the server, never received) may be sent twice.
    assert st["ok"] - st["distinct_ok"] <= CONCURRENCY and st["repeated_ok"] <= CONCURRENCY
    assert resumed["stats"]["cache_hits"] >= at_kill["ok"] - CONCURRENCY

    fresh_out = tmp_path / "fresh.json"
    assert F.spawn_child(sim.base_url, tmp_path / "fresh", fresh_out, n=N, concurrency=CONCURRENCY).wait(timeout=300) == 0
    assert resumed["rows"] == orjson.loads(fresh_out.read_bytes())["rows"]
