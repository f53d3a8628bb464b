"""Model profiles: loading, overrides, and the one clear error before any work."""

from __future__ import annotations

import llm_fixtures as F
import pytest

from evaluator.llm import ConfigError, LLMEngine, available_profiles, load_profile


def test_bundled_profiles_load():
    assert {"gemini", "gpt-oss-120b", "sim"} <= set(available_profiles())
    g = load_profile("gemini", env={"GEMINI_API_KEY": F.FAKE_KEY})
    assert g.model == "gemini-2.5-flash" and g.base_url == "https://generativelanguage.googleapis.com/v1beta/openai"
    assert g.api_key_env == "GEMINI_API_KEY" and g.rpm and not g.simulated
    assert F.FAKE_KEY not in repr(g) and F.FAKE_KEY not in str(g.to_dict())
    s = load_profile("sim", env={})
    assert s.simulated and s.base_url == ""


def test_unknown_model_is_one_clear_error():
    with pytest.raises(ConfigError, match=r"unknown model 'nope'.*known: .*gemini"):
        load_profile("nope")


def test_missing_key_is_one_clear_error():
    with pytest.raises(ConfigError, match="set GEMINI_API_KEY"):
        load_profile("gemini", env={})


def test_optional_key_and_env_base_url():
    p = load_profile("gpt-oss-120b", env={"GPT_OSS_BASE_URL": "https://host.example/v1/", "GPT_OSS_MODEL": "gpt-oss"})
    assert p.base_url == "https://host.example/v1" and p.model == "gpt-oss"
    p2 = load_profile("gpt-oss-120b", env={"GPT_OSS_BASE_URL": "https://host.example/v1"}, base_url="http://127.0.0.1:9/v1")
    assert p2.base_url == "http://127.0.0.1:9/v1"  # --base-url beats the environment


def test_overrides_and_validation(tmp_path):
    p = load_profile("sim", base_url="http://127.0.0.1:1/v1", rpm=600, concurrency=None)
    assert p.rpm == 600 and p.concurrency == 128  # None = flag not given
    bad = tmp_path / "bad.toml"
    bad.write_text('model = "x"\nbase_url = "ftp://x"\n')
    with pytest.raises(ConfigError, match="must start with http"):
        load_profile(str(bad))
    bad.write_text('model = "x"\nbase_url = "http://x"\nrpmm = 3\n')
    with pytest.raises(ConfigError, match="unknown field"):
        load_profile(str(bad))


def test_user_profile_from_path(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text('model = "m"\nbase_url = "http://127.0.0.1:5/v1"\napi_key_env = "MY_KEY"\n[extra_body]\ntop_k = 5\n')
    p = load_profile(str(f), env={"MY_KEY": "k"})
    assert p.name == "mine" and p.extra_body == {"top_k": 5}


async def test_engine_needs_a_base_url():
    with pytest.raises(ConfigError, match="no base_url"):
        async with LLMEngine(load_profile("sim", env={})):
            pass
