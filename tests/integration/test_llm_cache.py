"""The response cache: what is in the key and what is not, secrets, cache stats/clear, two processes."""

from __future__ import annotations

import orjson
import pytest
from helpers import llm as F

from evaluator.llm import LLMEngine, cache_clear, cache_stats, revised

BASE = {"messages": F.msgs(1), "run": 0, "prompt_version": "planner-v1"}


def _variants(sim):
    other_host = sim.base_url.replace("127.0.0.1", "localhost")  # same server, another endpoint name
    return {
        "model": ({"model": "sim-2"}, {}),
        "endpoint": ({"base_url": other_host}, {}),
        "temperature": ({"temperature": 0.3}, {}),
        "max_tokens": ({"max_tokens": 99}, {}),
        "extra_body": ({"extra_body": {"top_p": 0.9}}, {}),
        "messages": ({}, {"messages": F.msgs(2)}),
        "run": ({}, {"run": 1}),
        "prompt_version": ({}, {"prompt_version": "planner-v2"}),
    }


TRANSPORT = {
    "timeout_s": 1.5, "concurrency": 3, "max_retries": 1, "rpm": 6000.0, "tpm": 10_000_000.0,
    "backoff_base_s": 0.2, "max_wait_s": 5.0, "truncation_retries": 3, "name": "renamed",
}


async def _call(prof, root, call, api_key=None):
    async with LLMEngine(prof, cache_root=root, api_key=api_key) as llm:
        return await llm.chat(call["messages"], run=call["run"], prompt_version=call["prompt_version"])


@pytest.mark.parametrize(
    "component", ["model", "endpoint", "temperature", "max_tokens", "extra_body", "messages", "run", "prompt_version"]
)
async def test_each_key_component_misses(sim, tmp_path, component):
    base = F.sim_profile(sim, simulated=False)  # a real endpoint: its URL is part of the key
    assert not (await _call(base, tmp_path, BASE)).cached
    assert (await _call(base, tmp_path, BASE)).cached
    prof_change, call_change = _variants(sim)[component]
    r = await _call(revised(base, **prof_change), tmp_path, {**BASE, **call_change})
    assert not r.cached and r.error is None
    assert sim.stats()["requests"] == 2


@pytest.mark.parametrize("setting", sorted(TRANSPORT))
async def test_transport_settings_and_key_do_not_change_the_key(sim, tmp_path, setting):
    base = F.sim_profile(sim, simulated=False)
    await _call(base, tmp_path, BASE)
    other = revised(base, **{setting: TRANSPORT[setting]})
    assert (await _call(other, tmp_path, BASE, api_key="sk-some-other-key-123456789")).cached
    assert sim.stats()["requests"] == 1


async def test_auto_started_simulator_keys_on_its_name_not_its_port(sim, tmp_path):
    # Each auto-started simulator gets a fresh port; its answers do not depend on it.
    base = F.sim_profile(sim)
    await _call(base, tmp_path, BASE)
    moved = revised(base, base_url=sim.base_url.replace("127.0.0.1", "localhost"))
    assert (await _call(moved, tmp_path, BASE)).cached
    assert not (await _call(revised(base, name="sim-other"), tmp_path, BASE)).cached


async def test_api_key_never_written_to_cache(sim, tmp_path):
    sim.configure(api_key=F.FAKE_KEY, script=["500", "null", "length"])
    prof = F.sim_profile(sim, api_key_env="SIM_API_KEY")
    async with LLMEngine(prof, cache_root=tmp_path, api_key=F.FAKE_KEY) as llm:
        for i in range(20):
            assert (await llm.chat(F.msgs(i), run=i % 4, prompt_version="v1")).error is None
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert files and cache_stats(tmp_path)["entries"] > 0
    for p in files:
        data = p.read_bytes()
        assert F.FAKE_KEY.encode() not in data and b"FAKEKEY" not in data, p


async def test_cache_stats_and_clear_by_model(sim, tmp_path):
    assert cache_stats(tmp_path)["entries"] == 0 and cache_clear(tmp_path) == 0
    for name, n in (("alpha", 3), ("beta", 2)):
        async with LLMEngine(F.sim_profile(sim, name=name, model=name), cache_root=tmp_path) as llm:
            for i in range(n):
                await llm.chat(F.msgs(i), run=0, prompt_version="v1")
    st = cache_stats(tmp_path)
    assert st["entries"] == 5 and st["by_model"] == {"alpha": 3, "beta": 2} and st["size_bytes"] > 0
    assert cache_clear(tmp_path, "alpha") == 3
    assert cache_stats(tmp_path)["by_model"] == {"beta": 2}
    assert cache_clear(tmp_path) == 2 and cache_stats(tmp_path)["entries"] == 0


def test_two_processes_share_one_cache(sim, tmp_path):
    sim.configure(latency_s=0.002)
    outs = [tmp_path / "a.json", tmp_path / "b.json"]
    # Overlapping ranges: calls 100..199 are made by both processes at the same time.
    procs = [
        F.spawn_child(sim.base_url, tmp_path / "cache", outs[0], first=0, n=200, concurrency=16),
        F.spawn_child(sim.base_url, tmp_path / "cache", outs[1], first=100, n=200, concurrency=16),
    ]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    a, b = (orjson.loads(o.read_bytes())["rows"] for o in outs)
    assert a[100:] == b[:100] and all(r[4] is None for r in a + b)
    assert cache_stats(tmp_path / "cache")["entries"] == 300
    # A third run finds everything and sends nothing.
    before = sim.stats()["requests"]
    p = F.spawn_child(sim.base_url, tmp_path / "cache", tmp_path / "c.json", first=0, n=300, concurrency=16)
    assert p.wait(timeout=300) == 0 and sim.stats()["requests"] == before
    c = orjson.loads((tmp_path / "c.json").read_bytes())
    assert c["stats"]["cache_hits"] == 300 and c["rows"][:200] == a
