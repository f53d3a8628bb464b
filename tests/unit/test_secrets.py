"""Every configured key is redacted, a path profile's key once the profile is loaded, and a key written into the
base URL never reaches meta.json (a canary key searched for in everything the commands write:
tests/integration/test_secrets.py)."""

from __future__ import annotations

from helpers.keys import SIM_ENV, bundled_envs, canary

from evaluator.core import redact as redact_module
from evaluator.core.redact import known_keys, redact, redact_keys, watch_env


def test_every_configured_key_is_redacted(monkeypatch):
    names = bundled_envs()
    assert {"GEMINI_API_KEY", "GPT_OSS_API_KEY", "LOCAL_API_KEY"} <= set(names)
    for n in names:
        monkeypatch.setenv(n, canary(n))
    text = " / ".join(f"{n} was {canary(n)}" for n in names)
    out = redact(text)
    assert all(canary(n) not in out and f"[REDACTED:{n}]" in out for n in names), out
    # A path profile's variable is known once the profile is loaded (the loader calls watch_env); a test before
    # this one in the same process may have loaded such a profile already: start from none watched.
    monkeypatch.setattr(redact_module, "_watched", set())
    monkeypatch.setenv(SIM_ENV, "plain-words-key-123")
    assert "plain-words-key-123" in redact("plain-words-key-123")
    watch_env(SIM_ENV)
    assert redact("got plain-words-key-123.") == f"got [REDACTED:{SIM_ENV}]."
    assert redact_keys(b'{"m": "plain-words-key-123"}') == f'{{"m": "[REDACTED:{SIM_ENV}]"}}'.encode()
    # Key shapes we were not told about are masked in error text; short placeholder keys are left alone.
    assert redact("Bearer abcdefgh12345678 and AIzaSyA1234567890abcdefghijklmnop") == "[REDACTED] and [REDACTED]"
    monkeypatch.setenv("LOCAL_API_KEY", "x")
    assert "x" not in known_keys()


def test_a_key_written_into_the_base_url_never_reaches_meta():
    """A user who puts the key in the URL itself (userinfo, `?key=`) gets meta.json's profile echo masked;
    the rest of the URL (host, path, other parameters) stays as written."""
    from evaluator.core.redact import redact_url
    from evaluator.llm.profiles import load_profile

    secret = "AIzaSyD-not-a-real-key-0123456789abcdef"
    for url in (f"https://me:{secret}@proxy.example/v1", f"https://host.example/v1beta/openai?key={secret}",
                f"https://host.example/v1?api-version=2024-10-21&sig={secret}"):
        shown = load_profile("local", base_url=url).request_settings()["base_url"]
        assert secret not in shown and "[REDACTED]" in shown, shown
        assert "host.example" in shown or "proxy.example" in shown
    assert redact_url("https://host.example/v1?api-version=2024-10-21") == "https://host.example/v1?api-version=2024-10-21"
    assert redact_url("http://127.0.0.1:8080/v1") == "http://127.0.0.1:8080/v1"
