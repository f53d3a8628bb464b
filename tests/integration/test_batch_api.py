"""Batch clients and runner against the simulator's OpenAI-style and Gemini-style batch APIs."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from helpers.procs import PYTHON, child_env, run, start

from evaluator.batch.batch_submit import BatchRunner
from evaluator.batch.providers import batch_api, chat_to_gemini
from evaluator.batch.request_format import Request
from evaluator.batch.store import JobStore
from evaluator.llm import LLMEngine, load_profile, revised
from evaluator.llm.cache import ResponseCache
from simulator.harness import batch_stats, configure_batch, reset_batch_stats


@pytest.fixture
def sim(batch_sim):
    """The module's simulator (helpers/batch_sim.py), batch knobs reset."""
    return batch_sim


def profile(sim, kind: str = "openai", **kw):
    return revised(load_profile("sim", base_url=sim.base_url), batch=kind, **kw)


def messages(i: int) -> list[dict]:
    return [{"role": "system", "content": "You are the planning step of an LLM agent."},
            {"role": "user", "content": f"User request:\nfind the weather in city #{i}"}]


async def run_batch(p, root: Path, n: int, **runner_kw):
    """Submit n requests through p's batch API; returns (runner stats, {key: cached content})."""
    async with LLMEngine(p, cache_root=root) as engine:
        reqs = [Request((pr := engine.prepare(messages(i), run=i % 2, prompt_version="v1")).key, pr.body) for i in range(n)]
        store, cache = JobStore(root), ResponseCache(root)
        api = batch_api(p, None)
        try:
            runner = BatchRunner(p, engine, api, store, cache, log=lambda m: None, **runner_kw)
            stats = await runner.run(reqs)
        finally:
            await api.close()
            store.close()
            cache.close()
        contents = {r.custom_id: (engine.lookup(r.custom_id) or None) for r in reqs}
    return stats, {k: v.content if v else None for k, v in contents.items()}


async def online(p, root: Path, n: int) -> dict[str, str | None]:
    async with LLMEngine(p, cache_root=root) as engine:
        out = {}
        for i in range(n):
            pr = engine.prepare(messages(i), run=i % 2, prompt_version="v1")
            out[pr.key] = (await engine.send(pr)).content
        return out


@pytest.mark.parametrize("kind", ["openai", "gemini"])
def test_batch_replies_equal_online_replies(sim, tmp_path, kind):
    p = profile(sim, kind)
    stats, got = asyncio.run(run_batch(p, tmp_path / "b", 12))
    want = asyncio.run(online(p, tmp_path / "o", 12))
    assert got == want and all(want.values())
    assert stats.stored == 12 and stats.batches == 1
    assert batch_stats(sim.base_url)["batches_created"] == 1


@pytest.mark.parametrize("kind", ["openai", "gemini"])
def test_failed_and_expired_requests_resubmitted_nothing_paid_twice(sim, tmp_path, kind):
    configure_batch(sim.base_url, p_fail=0.3, expire_next=1, expire_done_share=0.5, seed=3)
    stats, got = asyncio.run(run_batch(profile(sim, kind), tmp_path, 30, max_attempts=8))
    assert all(got.values())  # every request ends up answered and cached
    server = batch_stats(sim.base_url)
    assert server["requests_failed"] > 0 and server["requests_expired"] > 0
    assert stats.resubmitted == server["requests_failed"] + server["requests_expired"]
    assert server["requests_ok"] == 30 and server["repeated_ok"] == 0  # nothing answered (billed) twice


def test_oversized_batch_is_split(sim, tmp_path):
    configure_batch(sim.base_url, max_requests=8)
    # The profile does not know the limit: the provider rejects the batch and it is split until it fits.
    stats, got = asyncio.run(run_batch(profile(sim), tmp_path / "blind", 20))
    server = batch_stats(sim.base_url)
    assert all(got.values()) and server["rejected_oversized"] >= 1 and stats.split >= 1
    assert server["requests_ok"] == 20
    # A profile that declares the limit splits before submitting: nothing rejected.
    reset_batch_stats(sim.base_url)
    stats, got = asyncio.run(run_batch(profile(sim, batch_max_requests=8), tmp_path / "known", 20))
    server = batch_stats(sim.base_url)
    assert all(got.values()) and server["rejected_oversized"] == 0 and server["batches_created"] == 3


def test_byte_limit_split(sim, tmp_path):
    configure_batch(sim.base_url, max_bytes=2000)
    stats, got = asyncio.run(run_batch(profile(sim, batch_max_bytes=2000), tmp_path, 20))
    server = batch_stats(sim.base_url)
    assert all(got.values()) and server["rejected_oversized"] == 0 and server["batches_created"] > 1


@pytest.mark.parametrize("kind", ["openai", "gemini"])
def test_batch_lost_before_its_id_was_stored_is_found_not_recreated(sim, tmp_path, kind):
    p = profile(sim, kind)

    async def crash_after_create():
        async with LLMEngine(p, cache_root=tmp_path) as engine:
            reqs = [Request((pr := engine.prepare(messages(i), run=i % 2, prompt_version="v1")).key, pr.body) for i in range(5)]
        store, api = JobStore(tmp_path), batch_api(p, None)
        job = store.new(p.name, kind, [r.custom_id for r in reqs])
        await api.submit(reqs, job.token)  # the process "dies" before store.submitted(...)
        await api.close()
        store.close()
        return reqs

    asyncio.run(crash_after_create())
    stats, got = asyncio.run(run_batch(p, tmp_path, 5))
    assert stats.resumed == 1 and all(got.values())
    assert batch_stats(sim.base_url)["batches_created"] == 1


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_cancel_stuck_batch(sim, tmp_path, kind):
    configure_batch(sim.base_url, stuck_next=1)
    p = profile(sim, kind, **({"wire": "anthropic"} if kind == "anthropic" else {}))  # Message Batches: its wire

    async def go():
        async with LLMEngine(p, cache_root=tmp_path) as engine:
            reqs = [Request((pr := engine.prepare(messages(i), run=0, prompt_version="v1")).key, pr.body) for i in range(4)]
            store, cache, api = JobStore(tmp_path), ResponseCache(tmp_path), batch_api(p, None)
            runner = BatchRunner(p, engine, api, store, cache, log=lambda m: None)
            task = asyncio.create_task(runner.run(reqs))
            await asyncio.sleep(0.5)
            assert not task.done()  # the stuck batch keeps it polling
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert len(store.open_jobs(p.name)) == 1
            n = await BatchRunner(p, engine, api, store, cache, log=lambda m: None).cancel_open()
            left = store.open_jobs(p.name)
            await api.close()
            store.close()
            cache.close()
            return n, left

    n, left = asyncio.run(go())
    assert n == 1 and left == []
    assert batch_stats(sim.base_url)["cancelled"] == 1


CHILD = """
import asyncio
from integration.test_batch_api import run_batch
from evaluator.llm import load_profile, revised
from pathlib import Path
p = revised(load_profile("sim", base_url={url!r}), batch="openai", batch_max_requests=10)
stats, got = asyncio.run(run_batch(p, Path({root!r}), 40))
assert all(got.values())
"""


def test_sigkill_while_polling_then_rerun_submits_no_batch_twice(sim, tmp_path):
    configure_batch(sim.base_url, turnaround_s=3.0)
    code = CHILD.format(url=sim.base_url, root=str(tmp_path))
    child = start([PYTHON, "-c", code], env=child_env(tests=True))  # its own process group, stopped at the end
    deadline = time.monotonic() + 300
    while batch_stats(sim.base_url)["batches_created"] < 4:  # all four batches submitted: now polling
        assert time.monotonic() < deadline and child.poll() is None, child.communicate()
        time.sleep(0.05)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    configure_batch(sim.base_url, turnaround_s=0.1)
    rerun = run([PYTHON, "-c", code], env=child_env(tests=True), timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    server = batch_stats(sim.base_url)
    assert server["batches_created"] == 4  # the rerun polled the four batches; it created none
    assert server["requests_ok"] == 40 and server["repeated_ok"] == 0


def test_batch_unknown_to_the_endpoint_is_resubmitted_not_fatal(sim, tmp_path):
    """E.g. an earlier run's auto-started simulator: its batch ids mean nothing to this one."""
    p = profile(sim)
    store = JobStore(tmp_path)
    job = store.new(p.name, "openai", ["k1", "k2"])
    store.submitted(job, "batch_999999")
    store.close()
    stats, got = asyncio.run(run_batch(p, tmp_path, 4))
    assert all(got.values()) and stats.resumed == 0 and stats.stored == 4
    assert JobStore(tmp_path).open_jobs(p.name) == []


@pytest.mark.parametrize("kind", ["openai", "gemini"])
def test_full_queue_waits_for_running_batches_instead_of_splitting(sim, tmp_path, kind):
    """OpenAI fails the batch with token_limit_exceeded, Gemini answers the create with 429: either way the
    chunk waits for a running batch to finish and goes again whole; nothing is split, everything is stored."""
    configure_batch(sim.base_url, max_enqueued_tokens=150)  # ~30 prompt tokens a request: one 4-request batch at a time
    stats, got = asyncio.run(run_batch(profile(sim, kind, batch_max_requests=4), tmp_path, 12))
    server = batch_stats(sim.base_url)
    assert all(got.values()) and stats.stored == 12
    assert stats.split == 0 and server["rejected_oversized"] == 0
    assert server["rejected_queue_full"] >= 1 and stats.queue_waits >= 1
    assert server["requests_ok"] == 12 and server["repeated_ok"] == 0


def test_gemini_file_split_at_its_own_line_size_before_upload(sim, tmp_path):
    """The byte cap applies to the file actually uploaded (Gemini's translated lines), so nothing is rejected."""
    p = profile(sim, "gemini", batch_max_bytes=1500)
    configure_batch(sim.base_url, max_bytes=1500)
    stats, got = asyncio.run(run_batch(p, tmp_path, 20))
    server = batch_stats(sim.base_url)
    assert all(got.values()) and server["rejected_oversized"] == 0 and server["batches_created"] > 1 and stats.split == 0


def test_profile_without_seed_sends_none_online_or_batch_and_keys_say_so(sim, tmp_path):
    """Gemini's OpenAI-compatible endpoint answers 400 to `seed`: with send_seed = false neither path sends it,
    and the cache key differs from the seed-sending profile's (it describes what was asked)."""
    configure_batch(sim.base_url, reset=True, turnaround_s=0.1)
    with_seed, without = profile(sim, "gemini"), profile(sim, "gemini", send_seed=False)

    async def prepared(p):
        async with LLMEngine(p, cache_root=tmp_path / p.name) as engine:
            return engine.prepare(messages(1), run=1, prompt_version="v1")

    a, b = asyncio.run(prepared(with_seed)), asyncio.run(prepared(without))
    assert a.body["seed"] == 1 and "seed" not in b.body and a.key != b.key
    assert "seed" not in chat_to_gemini(b.body)["generation_config"]
    sim.configure(reject_seed=True)  # the online endpoint now refuses seed, as Gemini's does
    sim.reset_stats()
    try:
        got = asyncio.run(online(without, tmp_path / "online", 2))
        assert all(got.values()) and sim.stats()["by_status"].get("400", 0) == 0
    finally:
        sim.configure(reject_seed=False)
