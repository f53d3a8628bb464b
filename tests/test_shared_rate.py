"""One rate per API key across processes: `SharedPacer` keeps two processes on one folder under one limit,
and two `requests run` on one cache folder stay under the simulator's enforced RPM (it answers 429 past it)."""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evaluator.llm.budget import Budget  # noqa: E402
from evaluator.llm.limiters import SharedPacer, SharedRates, rate_key  # noqa: E402
from evaluator.llm.profiles import ModelProfile, revised  # noqa: E402
from simulator.harness import start_simulator  # noqa: E402


def _acquire_times(folder: str, key: str, rpm: float, n: int, out: mp.Queue) -> None:
    async def go() -> list[float]:
        pacer = SharedPacer(folder, key, rpm)
        stamps = []
        for _ in range(n):
            await pacer.acquire()
            stamps.append(time.time())
        return stamps

    out.put(asyncio.run(go()))


def _two_processes(folder: Path, keys: tuple[str, str], rpm: float, n: int) -> list[float]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_acquire_times, args=(str(folder), k, rpm, n, q)) for k in keys]
    for p in procs:
        p.start()
    stamps = sorted(q.get(timeout=120) + q.get(timeout=120))
    for p in procs:
        p.join()
    return stamps


def _max_in_window(stamps: list[float], window: float) -> int:
    j, best = 0, 0
    for i, t in enumerate(stamps):
        while stamps[j] < t - window:
            j += 1
        best = max(best, i - j + 1)
    return best


def test_two_processes_on_one_row_share_the_rate(tmp_path):
    rpm, n = 600.0, 25  # 10 per second; 50 acquires in all
    stamps = _two_processes(tmp_path, ("k", "k"), rpm, n)
    # Over any 2 s, one 1-s burst plus 2 s of rate at most: 10 + 20 (+1 for the window's edges).
    assert _max_in_window(stamps, 2.0) <= 31
    assert stamps[-1] - stamps[0] >= (2 * n - 10) / 10 * 0.95


def test_different_keys_do_not_share(tmp_path):
    a, b = rate_key("http://h/v1", "m", "key-a", "rpm"), rate_key("http://h/v1", "m", "key-b", "rpm")
    assert a != b and "key-a" not in a  # a fingerprint, never the key
    stamps = _two_processes(tmp_path, (a, b), 600.0, 25)
    assert stamps[-1] - stamps[0] < (50 - 10) / 10 * 0.8  # each at the full rate: well under the shared time


def test_a_budget_call_waits_for_open_reservations_then_stops():
    async def go() -> tuple[bool, bool, float]:
        b = Budget(1.0)
        assert b.reserve(0.6)  # in flight, worst case 0.6
        waiter = asyncio.create_task(b.admit(0.6))  # does not fit now: waits for the open one
        await asyncio.sleep(0.01)
        assert not waiter.done()
        b.settle(0.6, 0.1)  # it cost 0.1
        first = await waiter  # 0.1 + 0.6 fits
        b.settle(0.6, 0.5)  # spent 0.6 now
        second = await b.admit(0.6)  # nothing open and 0.6 + 0.6 > 1: the run stops
        return first, second, b.spent_usd

    first, second, spent = asyncio.run(go())
    assert first and not second and spent == 0.6


def _pair(sim, tmp_path: Path, rpm: int, caches: tuple[str, str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    sim.reset_stats()
    procs = [subprocess.Popen([sys.executable, "-m", "evaluator", "requests", "run", str(tmp_path / f"{x}.jsonl"),
                               "--model", "sim", "--base-url", sim.base_url, "--rpm", str(rpm), "--cache-dir",
                               str(tmp_path / c), "--out", str(tmp_path / f"{x}-{c}.out.jsonl"), "--no-progress"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for x, c in zip("ab", caches, strict=True)]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    return sim.stats()


def test_two_request_runs_on_one_cache_stay_under_the_servers_rpm(tmp_path):
    rpm, n = 600, 200  # 10/s: each half alone takes 10 s, so the two processes overlap
    lines = [json.dumps({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"messages": [{"role": "user", "content": f"Request {i}"}], "max_tokens": 8}})
             for i in range(n)]
    (tmp_path / "a.jsonl").write_text("\n".join(lines[: n // 2]) + "\n")
    (tmp_path / "b.jsonl").write_text("\n".join(lines[n // 2:]) + "\n")
    with start_simulator(rpm=rpm) as sim:
        alone = _pair(sim, tmp_path, rpm, ("c1", "c2"))  # two caches: each paces to the full limit alone
        shared = _pair(sim, tmp_path, rpm, ("c3", "c3"))  # one cache: one shared schedule
    over_alone, over_shared = alone["by_status"].get("429", 0), shared["by_status"].get("429", 0)
    # Pacing alone, the overlapping pair sends twice the limit. Shared, it stays at the limit: the few 429s left
    # are the simulator answering in bunches when starved of CPU (one process alone takes them on a loaded machine).
    assert shared["ok"] == n and over_shared <= n // 50 and over_alone >= 5 * max(1, over_shared), (over_alone, over_shared)


def test_the_tpm_budget_is_shared_too(tmp_path):
    profile = revised(ModelProfile(name="p", model="m"), base_url="http://127.0.0.1:9/v1", tpm=6000)  # 100 tokens/s

    async def go() -> float:
        a, b = SharedRates(tmp_path).tpm(profile, 6000), SharedRates(tmp_path).tpm(profile, 6000)  # two processes' pacers
        t0 = time.time()
        await asyncio.gather(*(p.acquire(40) for _ in range(5) for p in (a, b)))  # 400 tokens in all
        return time.time() - t0

    # One burst (limits.PACED_BURST_S: 75 tokens), then 100 tokens/s: the last 40 may start at (400 - 75 - 40) / 100 s.
    assert asyncio.run(go()) >= 2.6 * 0.95
