"""Replies that are odd, cut short or without usage, driven as a user meets them (issue 31): the CLI against
the simulator's knobs (content as parts, content filter, a server context, no usage), recorded llama.cpp
bodies, and a response cache holding an old entry or damaged pages."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import llm_fixtures as F
import orjson
import pytest
from data_fixtures import make_data_dir
from records_fixtures import flat

from evaluator.core.tokens import prompt_tokens, text_tokens
from evaluator.llm.cache import CacheEntry, ResponseCache, cache_dir, encode_entry
from evaluator.llm.decide import AttemptOutcome, GiveUp, Reply, decide
from evaluator.llm.limiters import read_server_facts
from evaluator.llm.reply import read_reply

sim_server, any_sim, socket_sim = F.sim_server, F.any_sim, F.socket_sim  # pytest finds fixtures by module attribute


@pytest.fixture
def sim() -> F.LocalSim:
    """The simulator in this process, behind the engine's in-process transport (no socket)."""
    return F.LocalSim()


REPO = Path(__file__).resolve().parents[1]
LLAMA = Path(__file__).parent / "fixtures" / "providers" / "llama_cpp"
ONLINE = Path(__file__).parent / "fixtures" / "providers" / "online"


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("EVALUATOR_DATA", None)
    return subprocess.run([sys.executable, "-m", "evaluator", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture
def study(socket_sim, tmp_path):
    """(args of a small study against the shared simulator, its output folder)."""
    data = make_data_dir(tmp_path / "data")
    prof = tmp_path / "srv.toml"
    prof.write_text(f'model = "sim-1"\n[connection]\nbase_url = "{socket_sim.base_url}"\n[server]\nsimulated = true\n'
                    "[pacing]\nconcurrency = 4\n[retries]\nmax_retries = 1\nbackoff_base_s = 0.01\nbackoff_max_s = 0.02\n")
    out = tmp_path / "out"
    args = ["--data", str(data), "--cache-dir", str(tmp_path / "cache"), "--model", str(prof), "--runs", "1",
            "--out", str(out), "--no-progress", "--no-extras"]
    return args, out


def _records(out: Path) -> list[dict]:
    return [flat(json.loads(line)) for line in (out / "queries.jsonl").read_text().splitlines()]


def _strip(recs: list[dict]) -> list[dict]:
    """Records without the per-call token counts (a list of parts is billed like its text)."""
    for r in recs:
        for b in (r.get("rtp"), r.get("ptr")):
            if b:
                b.pop("tokens", None)
    return recs


# -- item 3: reply shapes ---------------------------------------------------------------------------------
def test_content_as_a_list_of_parts_gives_the_same_results_as_a_string(socket_sim, study, tmp_path):
    args, out = study
    socket_sim.configure(content_form="parts")
    parts = _cli(args, tmp_path)
    assert parts.returncode == 0, parts.stderr
    assert "Traceback" not in parts.stderr
    got = _strip(_records(out))
    socket_sim.configure(content_form="string")
    args2 = [a if a != str(tmp_path / "cache") else str(tmp_path / "cache2") for a in args]
    args2[args2.index(str(out))] = str(tmp_path / "out2")
    plain = _cli(args2, tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert got == _strip(_records(tmp_path / "out2"))


@pytest.mark.parametrize("form", ["number", "object"])
def test_an_undocumented_content_shape_is_one_counted_malformed_reply(socket_sim, study, tmp_path, form):
    args, out = study
    socket_sim.configure(content_form=form)
    r = _cli(args, tmp_path)
    assert r.returncode == 3, r.stderr  # done, some calls failed for good
    assert "Traceback" not in r.stderr and "ValidationError" not in r.stderr
    assert "malformed_reply" in r.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["llm_stats"]["srv"]["failed"].get("malformed_reply", 0) > 0


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


async def test_an_old_cache_entry_of_another_shape_is_a_miss_not_a_crash(sim, tmp_path):
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


# -- item 4: cut replies ------------------------------------------------------------------------------------
def test_a_content_filter_cut_is_reported_by_cause_and_sent_again_by_the_next_run(socket_sim, study, tmp_path):
    args, out = study
    socket_sim.configure(p_filter=1.0)
    first = _cli(args, tmp_path)
    assert first.returncode == 0, first.stderr
    assert "content filter" in first.stderr and "content_filter" in first.stderr
    report = (out / "report.md").read_text()
    assert "cut replies: 0" not in report and "content_filter" in report
    n_cut = sum(1 for r in _records(out) for b in (r["rtp"], r["ptr"]) for c in
                [b["plan"].get("cut") if b.get("plan") else None, b.get("discovery_cut")] if c == "content_filter")
    assert n_cut > 0
    # The filter is lifted: the rerun sends the filtered calls again, and only those.
    socket_sim.configure(p_filter=0.0)
    socket_sim.reset_stats()
    second = _cli(args, tmp_path)
    assert second.returncode == 0, second.stderr
    assert socket_sim.stats()["ok"] >= n_cut
    assert "cut replies: 0" in (out / "report.md").read_text()


def test_a_reply_cut_by_the_servers_context_is_sent_again_once_the_context_is_larger(socket_sim, study, tmp_path):
    args, out = study
    # Discovery prompts (~175-195 tokens) fit in 200 and their replies are cut; planner prompts (~300) do not.
    socket_sim.configure(n_ctx=200)
    first = _cli(args, tmp_path)
    assert first.returncode == 3, first.stderr
    assert "context_exceeded" in first.stderr and "exceeds the available context size" in first.stderr
    assert "server's context" in first.stderr
    report = (out / "report.md").read_text()
    assert "context " in report.split("cut replies:")[1].split("\n")[0]
    # Same server, same context: the cut replies are what it answers; only the failed calls go again.
    socket_sim.reset_stats()
    same = _cli(args, tmp_path)
    assert same.returncode == 3
    failed = json.loads((out / "meta.json").read_text())["llm_stats"]["srv"]["failed"]["context_exceeded"]
    assert socket_sim.stats()["requests"] == failed
    # The user restarts the server with a proper context: every cut reply and failed call is sent again.
    socket_sim.configure(n_ctx=8192)
    socket_sim.reset_stats()
    fixed = _cli(args, tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    recs = _records(out)
    assert all(not r["ptr"].get("discovery_cut") and not r["rtp"]["plan"].get("cut") for r in recs)
    assert "cut replies: 0" in (out / "report.md").read_text()
    meta = json.loads((out / "meta.json").read_text())
    assert meta["llm_stats"]["srv"]["cut_resent"] > 0


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
async def test_a_reply_without_usage_gets_estimated_tokens_and_says_so(sim, tmp_path, caplog):
    sim.configure(usage=False)
    prof = F.sim_profile(sim)
    async with sim.engine(prof, cache_root=tmp_path) as llm:
        r = await llm.chat(F.msgs(3), run=0, prompt_version="v1")
    body = llm.prepare(F.msgs(3), run=0, prompt_version="v1").body
    assert r.prompt_tokens == prompt_tokens(body, prof.prompt.chars_per_token) > 0
    assert r.completion_tokens == text_tokens(r.content, prof.prompt.chars_per_token) > 0
    assert llm.stats.usage_estimated == 1 and llm.stats.prompt_tokens == r.prompt_tokens
    assert any("no token usage" in rec.getMessage() for rec in caplog.records)


def test_a_study_without_usage_reports_estimates_on_stderr(socket_sim, study, tmp_path):
    args, out = study
    socket_sim.configure(usage=False)
    r = _cli(args, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "no token usage" in r.stderr
    meta = json.loads((out / "meta.json").read_text())
    st = meta["llm_stats"]["srv"]
    assert st["usage_estimated"] == st["requests"] > 0 and st["prompt_tokens"] > 0 and st["completion_tokens"] > 0


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
