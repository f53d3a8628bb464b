"""The batch runner's pieces in this process: what the collecting pass leaves out, Gemini's translation both ways,
and the split of requests into batches within both limits."""

from __future__ import annotations

import asyncio

import pytest
from helpers.llm import msgs

from evaluator.llm import LLMEngine, load_profile, revised


def test_collect_skips_calls_built_on_a_deferred_reply(tmp_path):
    """A PtR planner made after a deferred discovery (e.g. --fallback-to-query) is not a study request."""
    from evaluator.batch.collect import DEFERRED, _Collector

    async def go():
        p = revised(load_profile("sim"), base_url="http://127.0.0.1:9/v1")
        engine = LLMEngine(p, cache_root=tmp_path, api_key="")
        col = _Collector(engine)

        async def branch(i: int) -> list[str | None]:
            first = await col.chat(msgs(i), run=0, prompt_version="discovery")
            second = await col.chat(msgs(i + 100), run=0, prompt_version="planner")
            return [first.error, second.error]

        out = await asyncio.gather(branch(1), branch(2))  # two branches, each in its own task
        engine.close_cache()
        return out, col.calls

    out, calls = asyncio.run(go())
    assert out == [[DEFERRED, DEFERRED], [DEFERRED, DEFERRED]]
    assert len(calls) == 2  # the two first calls; the calls built on them were not collected


def test_gemini_translation_both_ways():
    from evaluator.batch.providers import chat_to_gemini, gemini_to_completion
    from evaluator.core.errors import ConfigError

    body = {"model": "gemini-2.5-flash", "temperature": 0.0, "max_tokens": 64, "seed": 3,
            "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}}
    req = chat_to_gemini(body)
    assert req["system_instruction"] == {"parts": [{"text": "S"}]}
    assert req["contents"] == [{"role": "user", "parts": [{"text": "U"}]}]
    assert req["generation_config"] == {"temperature": 0.0, "maxOutputTokens": 64, "seed": 3,
                                        "responseMimeType": "application/json", "responseJsonSchema": {"type": "object"}}
    with pytest.raises(ConfigError, match="logprobs"):
        chat_to_gemini({**body, "logprobs": True})
    resp = {"candidates": [{"content": {"parts": [{"text": "thinking...", "thought": True}, {"text": "answer"}]},
                            "finishReason": "MAX_TOKENS"}],
            "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "thoughtsTokenCount": 7}}
    done = gemini_to_completion(resp, "gemini-2.5-flash")
    assert done["choices"][0]["message"]["content"] == "answer" and done["choices"][0]["finish_reason"] == "length"
    assert done["usage"] == {"prompt_tokens": 10, "completion_tokens": 12, "total_tokens": 22}  # thinking is billed


def test_split_keeps_each_batch_within_both_limits():
    from evaluator.batch.request_format import Request, split

    reqs = [Request(f"k{i}", {"messages": [{"role": "user", "content": "x" * (i % 7 * 50)}]}) for i in range(40)]
    for max_req, max_bytes in ((7, None), (None, 900), (5, 600)):
        chunks = split(reqs, max_req, max_bytes)
        assert [r for c in chunks for r in c] == reqs
        assert all(len(c) <= (max_req or 10**9) and sum(len(r.line()) for r in c) <= (max_bytes or 10**12) for c in chunks)
