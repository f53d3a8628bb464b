"""Anthropic's Message Batches through the project's client and runner, against the simulator's routes on
loopback: replies equal the online ones, failed / expired / cancelled requests are submitted again and none is
answered twice, a batch over the provider's limits is split, a batch whose id was lost is found again (cancelling a stuck one:
tests/integration/test_batch_api.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from evaluator.batch.batch_submit import BatchRunner
from evaluator.batch.providers import AnthropicBatch, batch_api, batch_limits
from evaluator.batch.request_format import Request
from evaluator.batch.store import JobStore
from evaluator.llm import LLMEngine, load_profile, revised
from evaluator.llm.cache import ResponseCache
from simulator.harness import batch_stats, configure_batch, reset_batch_stats

KEY = "sk-ant-test-0123456789"


@pytest.fixture
def sim(batch_sim):
    """The module's simulator (helpers/batch_sim.py), batch knobs reset."""
    return batch_sim


def profile(sim, **kw):
    p = load_profile("anthropic/claude-haiku-4-5", base_url=sim.base_url, require_key=False)
    return revised(p, rpm=None, follow_rate_headers=False, **kw)


def messages(i: int) -> list[dict]:
    return [{"role": "system", "content": "You are the planning step of an LLM agent."},
            {"role": "user", "content": f"User request:\nfind the weather in city #{i}"}]


async def requests(p, root: Path, n: int) -> list[Request]:
    async with LLMEngine(p, cache_root=root, api_key=KEY) as engine:
        return [Request((pr := engine.prepare(messages(i), run=i % 2, prompt_version="v1")).key, pr.body)
                for i in range(n)]


async def run_batch(p, root: Path, n: int, **runner_kw):
    """n requests through p's Message Batches; (runner stats, {key: cached content})."""
    reqs = await requests(p, root, n)
    async with LLMEngine(p, cache_root=root, api_key=KEY) as engine:
        store, cache, api = JobStore(root), ResponseCache(root), batch_api(p, KEY)
        try:
            stats = await BatchRunner(p, engine, api, store, cache, log=lambda m: None, **runner_kw).run(reqs)
        finally:
            await api.close()
            store.close()
            cache.close()
        got = {r.custom_id: engine.lookup(r.custom_id) for r in reqs}
    return stats, {k: v.content if v else None for k, v in got.items()}


async def online(p, root: Path, n: int) -> dict[str, str | None]:
    async with LLMEngine(p, cache_root=root, api_key=KEY) as engine:
        out = {}
        for i in range(n):
            pr = engine.prepare(messages(i), run=i % 2, prompt_version="v1")
            out[pr.key] = (await engine.send(pr)).content
        return out


def test_message_batch_replies_equal_online_replies(sim, tmp_path):
    p = profile(sim)
    assert p.batch.api == "anthropic" and batch_limits(p) == (100_000, 256_000_000)
    stats, got = asyncio.run(run_batch(p, tmp_path / "b", 12))
    want = asyncio.run(online(p, tmp_path / "o", 12))
    assert got == want and all(want.values())
    assert stats.stored == 12 and stats.batches == 1 and stats.cached_prompt_tokens > 0  # one system prompt, cached
    assert batch_stats(sim.base_url)["batches_created"] == 1


def test_errored_and_expired_requests_resubmitted_nothing_paid_twice(sim, tmp_path):
    configure_batch(sim.base_url, p_fail=0.3, expire_next=1, expire_done_share=0.5, seed=3)
    stats, got = asyncio.run(run_batch(profile(sim), tmp_path, 30, max_attempts=8))
    assert all(got.values())
    server = batch_stats(sim.base_url)
    assert server["requests_failed"] > 0 and server["requests_expired"] > 0
    assert stats.resubmitted == server["requests_failed"] + server["requests_expired"]
    assert server["requests_ok"] == 30 and server["repeated_ok"] == 0


def test_invalid_requests_are_not_resubmitted(sim, tmp_path):
    configure_batch(sim.base_url, p_fail=1.0, fail_kind="invalid")  # errored: invalid_request_error (a 4xx)
    stats, got = asyncio.run(run_batch(profile(sim), tmp_path, 4, max_attempts=3))
    assert not any(got.values()) and stats.failed == 4 and stats.resubmitted == 0
    assert "invalid_request_error" in stats.errors[0] or "HTTP 400" in stats.errors[0]


def test_a_batch_over_the_providers_limit_is_refused_at_create_and_split(sim, tmp_path):
    configure_batch(sim.base_url, max_requests=8)  # the create answers 413 request_too_large over 8 requests
    stats, got = asyncio.run(run_batch(profile(sim), tmp_path / "blind", 20))
    server = batch_stats(sim.base_url)
    assert all(got.values()) and server["rejected_oversized"] >= 1 and stats.split >= 1
    assert server["requests_ok"] == 20 and server["repeated_ok"] == 0
    reset_batch_stats(sim.base_url)  # a limit the profile knows: split before submitting, nothing refused
    stats, got = asyncio.run(run_batch(profile(sim, batch_max_requests=8), tmp_path / "known", 20))
    server = batch_stats(sim.base_url)
    assert all(got.values()) and server["rejected_oversized"] == 0 and server["batches_created"] == 3


def test_byte_limit_counts_the_messages_body(sim, tmp_path):
    p = profile(sim, batch_max_bytes=3000)

    async def sizes() -> tuple[int, int]:
        req = (await requests(p, tmp_path, 1))[0]
        api = AnthropicBatch(p, KEY)  # its HTTP session needs the running loop
        await api.close()
        return api.line_size(req), len(orjson.dumps({"custom_id": req.custom_id, "params": api.wire.params(req.body)}))

    size, own = asyncio.run(sizes())
    assert size == own + 1  # its own Messages entry in the create body (and a comma), not the chat line
    configure_batch(sim.base_url, max_bytes=3000)
    stats, got = asyncio.run(run_batch(p, tmp_path, 20))
    assert all(got.values()) and batch_stats(sim.base_url)["rejected_oversized"] == 0 and stats.batches > 1


def test_batch_lost_before_its_id_was_stored_is_found_not_recreated(sim, tmp_path):
    p = profile(sim)

    async def crash_after_create(n: int, root: Path, twice: bool = False):
        reqs = await requests(p, root, n)
        store, api = JobStore(root), batch_api(p, KEY)
        job = store.new(p.name, "anthropic", [r.custom_id for r in reqs])
        await api.submit(reqs, job.token)  # the process "dies" before store.submitted(...)
        if twice:  # another batch of the same size at the same moment: which one is ours cannot be told
            await api.submit(reqs, "another-process")
        await api.close()
        store.close()

    # Anthropic's batches carry no token: the one batch of the job's size created since its record is it.
    asyncio.run(crash_after_create(7, tmp_path / "a"))
    stats, got = asyncio.run(run_batch(p, tmp_path / "a", 7))
    assert stats.resumed == 1 and all(got.values())
    assert batch_stats(sim.base_url)["batches_created"] == 1
    reset_batch_stats(sim.base_url)  # two candidates: none is taken (the requests are submitted again)
    asyncio.run(crash_after_create(9, tmp_path / "b", twice=True))
    stats, got = asyncio.run(run_batch(p, tmp_path / "b", 9))
    assert stats.resumed == 0 and all(got.values()) and batch_stats(sim.base_url)["batches_created"] == 3
