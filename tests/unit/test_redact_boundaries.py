"""The one key list: every provider's variable, open to more names; a 200 reply's text loses the key as it is
read (a key quoted back in any file a study writes: tests/integration/test_redact_boundaries.py)."""

from __future__ import annotations

from evaluator.core.redact import key_envs, scrub
from evaluator.llm.reply import read_reply

KEY = "sk-canary-quoted-7d2e-4f0b-9a1c-reply-key"


def test_the_key_list_is_one_function_open_to_more_names(monkeypatch):
    assert {"OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GROQ_API_KEY", "GEMINI_API_KEY"} <= set(key_envs())
    monkeypatch.setenv("OPENAI_API_KEY", KEY)  # a provider's own variable, named by no profile
    assert scrub(f"x {KEY} y") == "x [REDACTED:OPENAI_API_KEY] y"
    # a 200 reply's text and its reasoning lose the key as they are read
    body = {"choices": [{"message": {"content": None, "reasoning_content": f"key {KEY}"}, "finish_reason": "stop"}]}
    assert KEY not in (read_reply(body).content or "") and "[REDACTED:OPENAI_API_KEY]" in (read_reply(body).content or "")
