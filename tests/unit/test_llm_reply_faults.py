"""Replies that are odd, cut short or without usage (issue 31), in this process: tool-call replies, recorded
llama.cpp bodies, replies without usage or empty, and a response cache holding an old entry or damaged pages
(the CLI against the simulator's knobs: tests/integration/test_llm_reply_faults.py)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest
from helpers import FIXTURES
from helpers import llm as F

from evaluator.core.tokens import prompt_tokens, text_tokens
from evaluator.llm.cache import (
    CacheEntry,
    ResponseCache,
    cache_dir,
    encode_entry,
    invocation_id,
    new_invocation,
    reusable,
)
from evaluator.llm.decide import AttemptOutcome, GiveUp, Reply, decide
from evaluator.llm.limiters import read_server_facts
from evaluator.llm.reply import read_reply


@pytest.fixture
def sim() -> F.LocalSim:
    """The simulator in this process, behind the engine's in-process transport (no socket)."""
    return F.LocalSim()


LLAMA = FIXTURES / "providers" / "llama_cpp"
ONLINE = FIXTURES / "providers" / "online"


def test_tool_call_replies_are_read_from_their_arguments():
    body = {"choices": [{"message": {"content": None, "tool_calls": [
        {"type": "function", "function": {"name": "plan", "arguments": '{"steps": [], "selected_apis": ["a/b"]}'}}]},
        "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}
    r = read_reply(orjson.dumps(body))
    assert r.error is None and r.content == '{"steps": [], "selected_apis": ["a/b"]}' and r.cut is None
    for bad in ({"content": [1, 2]}, {"content": [{"type": "text", "text": 5}]}, {"content": "x", "reasoning": 3}):
        got = read_reply({"choices": [{"message": bad, "finish_reason": "stop"}]})
        assert got.error_kind == "malformed_reply", bad
    odd = read_reply({"choices": [{"message": {"content": "x"}, "finish_reason": 7}]})
    assert odd.error_kind == "malformed_reply"


async def test_an_old_cache_entry_of_another_shape_is_a_miss_not_a_crash(sim, tmp_path, clock):
    async with sim.engine(F.sim_profile(sim), cache_root=tmp_path) as llm:
        key = llm.prepare(F.msgs(1), run=0, prompt_version="v1").key
    cache = ResponseCache(tmp_path)
    # What an older release could have kept: the provider's list of parts as the content.
    raw = orjson.dumps({"content": [{"type": "text", "text": "hi"}], "finish_reason": "stop", "prompt_tokens": 1,
                        "completion_tokens": 1})
    cache.set_raw(key, raw, tag="sim")
    cache.close()
    async with sim.engine(F.sim_profile(sim), cache_root=tmp_path) as llm:
        r = await llm.chat(F.msgs(1), run=0, prompt_version="v1")
    assert r.error is None and isinstance(r.content, str) and not r.cached
    assert llm.stats.cache_damaged == 1 and sim.stats()["ok"] == 1


def test_recorded_llama_cpp_bodies_tell_the_cut_causes_apart():
    def body(name: str) -> bytes:
        return orjson.dumps(orjson.loads((LLAMA / f"{name}.json").read_bytes())["body"])

    by_context = read_reply(body("200_cut_by_context"), max_tokens=2000, max_tokens_known=True)
    assert by_context.cut == "context" and by_context.content and by_context.truncated
    at_limit = read_reply(body("200_cut_at_max_tokens"), max_tokens=8, max_tokens_known=True)
    assert at_limit.cut == "max_tokens"
    assert read_reply(body("200_stop"), max_tokens=16, max_tokens_known=True).cut is None
    # A cut by the context is not retried as a max_tokens cut would be: the same request is cut the same way.
    prof = F.load_profile("sim", base_url="http://127.0.0.1:9/v1", truncation_retries=2)
    d = decide(AttemptOutcome.http(200, {}, body("200_cut_by_context"), max_tokens=2000), F_state(), prof, now=0.0, jitter=0.0)
    assert isinstance(d, Reply)
    rec = orjson.loads((ONLINE / "llama_cpp_400_exceeds_context.json").read_bytes())
    d = decide(AttemptOutcome.http(400, {}, orjson.dumps(rec["body"]), sent=frozenset({"model", "messages", "max_tokens"})),
               F_state(), prof, now=0.0, jitter=0.0)
    assert isinstance(d, GiveUp) and d.kind == "context_exceeded"
    facts = read_server_facts(*(orjson.loads((LLAMA / f"{n}.json").read_bytes())["body"] for n in ("props", "slots", "v1_models")))
    assert (facts.slots, facts.n_ctx) == (1, 256)
    assert read_server_facts(models=orjson.loads((LLAMA / "v1_models.json").read_bytes())["body"]).n_ctx == 256


def F_state():
    from evaluator.llm.decide import CallState

    return CallState()


# -- item 10: no usage; damaged cache pages ------------------------------------------------------------------
async def test_a_reply_without_usage_gets_estimated_tokens_and_says_so(sim, tmp_path, caplog, clock):
    sim.configure(usage=False)
    prof = F.sim_profile(sim)
    async with sim.engine(prof, cache_root=tmp_path) as llm:
        r = await llm.chat(F.msgs(3), run=0, prompt_version="v1")
    body = llm.prepare(F.msgs(3), run=0, prompt_version="v1").body
    assert r.prompt_tokens == prompt_tokens(body, prof.prompt.chars_per_token) > 0
    assert r.completion_tokens == text_tokens(r.content, prof.prompt.chars_per_token) > 0
    assert llm.stats.usage_estimated == 1 and llm.stats.prompt_tokens == r.prompt_tokens
    assert any("no token usage" in rec.getMessage() for rec in caplog.records)


def test_damaged_pages_are_one_line_and_only_the_damaged_rows_are_dropped(tmp_path, caplog):
    cache = ResponseCache(tmp_path)
    entry = CacheEntry(content="x" * 3000, finish_reason="stop", prompt_tokens=1, completion_tokens=1)
    for i in range(60):
        cache.set(f"k{i}", entry, tag="sim")
    cache.close()
    db = cache_dir(tmp_path) / "cache.db"
    raw = bytearray(db.read_bytes())
    page = 4096
    for p in range(2, len(raw) // page - 1, 7):  # scribble over the headers of a few b-tree pages
        raw[p * page:p * page + 64] = b"\xa5" * 64
    db.write_bytes(bytes(raw))
    cache = ResponseCache(tmp_path)
    kept = [i for i in range(60) if cache.get(f"k{i}") is not None]
    assert 0 < len(kept) < 60 and not cache.damaged  # the rest dropped; nothing half-read
    assert all(cache.get(f"k{i}") == entry for i in kept)
    warned = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(warned) == 1 and "\n" not in warned[0]
    assert f"{len(kept)} replies kept, {60 - len(kept)} damaged rows dropped" in warned[0]
    cache.set("new", entry, tag="sim")  # the repaired cache works
    assert cache.get("new") == entry and encode_entry(entry)
    assert list(db.parent.glob("cache.db.damaged-*"))


def test_an_empty_reply_is_sent_once_more_then_counted_and_said(caplog):
    """A server answering content null with no text (billed each time) cost 6 retries per call before (126 requests
    for 20 calls); now each call is sent twice at most, counted in `empty_replies` and failed as `empty_reply`."""
    sim = F.LocalSim(p_empty=1.0)
    profile = F.sim_profile(sim, max_retries=6, concurrency=4)

    async def go() -> list[Any]:
        async with sim.engine(profile) as llm:
            got = await asyncio.gather(*(llm.chat(F.msgs(i), run=0, prompt_version="v") for i in range(20)))
            return [got, llm.stats.summary()]

    with caplog.at_level(logging.WARNING, logger="evaluator.llm"):
        results, st = asyncio.run(go())
    assert sim.stats()["requests"] == 40  # 20 calls, each sent twice
    assert all(r.error_kind == "empty_reply" for r in results)
    assert st.empty_replies == 40 and st.failed == {"empty_reply": 20} and st.retries == 20
    said = [r.getMessage() for r in caplog.records if "empty reply" in r.getMessage()]
    assert len(said) == 1 and "sent 1 more time(s)" in said[0] and "empty_replies" in said[0]


def test_a_reply_cut_by_a_filter_stands_for_its_own_invocation_only() -> None:
    # two commands in one process (a notebook calling cli.main twice; a forked child) are two invocations
    cut = CacheEntry(content="x", finish_reason="content_filter", prompt_tokens=1, completion_tokens=1,
                     cut="content_filter", run_id=invocation_id())
    assert reusable(cut, "content_filter", None)
    new_invocation()
    assert not reusable(cut, "content_filter", None)  # the next one sends it again
    assert reusable(cut.model_copy(update={"run_id": invocation_id()}), "content_filter", None)
    whole = cut.model_copy(update={"cut": None, "finish_reason": "stop"})
    assert reusable(whole, None, None)
