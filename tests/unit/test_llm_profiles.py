"""Model profiles: loading, overrides, and the one clear error before any work."""

from __future__ import annotations

import pytest
from helpers import llm as F

from evaluator.core.errors import ConfigError
from evaluator.core.paths import MODELS_DIR
from evaluator.llm import LLMEngine, available_profiles, load_profile


def test_bundled_profiles_load():
    assert {"gemini", "gpt-oss-120b", "sim"} <= set(available_profiles())
    g = load_profile("gemini", env={"GEMINI_API_KEY": F.FAKE_KEY})
    assert g.model == "gemini-2.5-flash" and g.connection.base_url == "https://generativelanguage.googleapis.com/v1beta/openai"
    assert g.connection.api_key_env == "GEMINI_API_KEY" and g.pacing.rpm and not g.server.simulated
    assert F.FAKE_KEY not in repr(g) and F.FAKE_KEY not in str(g.request_settings())
    s = load_profile("sim", env={})
    assert s.server.simulated and s.connection.base_url == ""


def test_unknown_model_is_one_clear_error():
    with pytest.raises(ConfigError, match=r"unknown model 'nope'.*known: .*gemini"):
        load_profile("nope")


def test_missing_key_is_one_clear_error():
    with pytest.raises(ConfigError, match="set GEMINI_API_KEY"):
        load_profile("gemini", env={})


def test_optional_key_and_env_base_url():
    p = load_profile("gpt-oss-120b", env={"GPT_OSS_BASE_URL": "https://host.example/v1/", "GPT_OSS_MODEL": "gpt-oss"})
    assert p.connection.base_url == "https://host.example/v1" and p.model == "gpt-oss"
    p2 = load_profile("gpt-oss-120b", env={"GPT_OSS_BASE_URL": "https://host.example/v1"}, base_url="http://127.0.0.1:9/v1")
    assert p2.connection.base_url == "http://127.0.0.1:9/v1"  # --base-url beats the environment


def test_overrides_and_validation(tmp_path):
    p = load_profile("sim", base_url="http://127.0.0.1:1/v1", rpm=600, concurrency=None)
    assert p.pacing.rpm == 600 and p.pacing.concurrency == 128  # None = flag not given
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
    assert p.name == "mine" and p.sampling.extra_body == {"top_k": 5}


async def test_engine_needs_a_base_url():
    with pytest.raises(ConfigError, match="no base_url"):
        async with LLMEngine(load_profile("sim", env={})):
            pass


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('concurrency = "8"', 'concurrency = "8" is a string; expected an integer'),
        ("concurrency = 8.5", "concurrency = 8.5 is a number; expected an integer"),
        ('timeout_s = "60"', "expected a number"),
        ('adaptive_concurrency = "yes"', "expected true or false"),
        ("extra_body = 3", "expected a table"),
        ("rpm = true", "rpm = True is a boolean; expected a number"),
        ("concurrency = 0", "concurrency = 0 is impossible; it must be between 1 and 1024"),
        ("temperature = 7.0", "between 0 and 2"),
        ('structured = "yaml"', "one of json_schema, json_object, json_object_schema, none"),
        ("max_tokens = 0", "max_tokens = 0 is impossible"),
        ('batch = "azure"', "one of openai, gemini"),
        ("batch_discount = 1.5", "between 0 and 1"),
        ("model_env = 5", "model_env = 5 is an integer; expected a string"),
    ],
)
def test_wrong_types_and_impossible_values_name_file_and_key(tmp_path, line, says):
    f = tmp_path / "mine.toml"
    f.write_text(f'model = "m"\nbase_url = "http://127.0.0.1:5/v1"\n{line}\n')
    with pytest.raises(ConfigError) as e:
        load_profile(str(f), env={})
    msg = str(e.value)
    assert msg.startswith(str(f)) and says in msg and "\n" not in msg


def test_bad_override_names_the_command_line():
    with pytest.raises(ConfigError, match=r"^command line: max_tokens = \"9\" is a string; expected an integer"):
        load_profile("sim", base_url="http://127.0.0.1:1/v1", max_tokens="9")


def test_request_settings_hold_every_request_shaping_setting_and_no_key():
    g = load_profile("gemini", env={"GEMINI_API_KEY": F.FAKE_KEY})
    s = g.request_settings()
    for k in ("model", "base_url", "max_tokens", "temperature", "timeout_s", "concurrency", "adaptive_concurrency",
              "rpm", "tpm", "structured", "extra_body", "max_retries", "truncation_retries"):
        assert k in s, k
    assert s["api_key_env"] == "GEMINI_API_KEY" and F.FAKE_KEY not in str(s)


def test_bundled_profiles_document_the_new_keys():
    for name in ("sim", "sim-b", "gemini", "gpt-oss-120b"):
        text = (MODELS_DIR / f"{name}.toml").read_text()
        assert "adaptive_concurrency =" in text and "structured =" in text, name
    assert not load_profile("sim", env={}).pacing.adaptive_concurrency  # the bench's fan-out keeps its fixed concurrency


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('model = "m"\nbase_url = "http:///v1"\n', "names no host"),
        ('model = "m"\nbase_url = "http://h:port/v1"\n', "is not a URL"),
        ('model = "m"\nbase_url = "http://h/v1"\n[extra_body]\nseed = 3\n', "may not set seed"),
        ('model = ""\nbase_url = "http://h/v1"\n', "model must not be empty"),
        ('model = "m"\nbase_url = "http://h/v1"\nconcurrency = \n', "cannot read model profile"),
    ],
)
def test_unusable_profiles_are_one_line(tmp_path, text, says):
    f = tmp_path / "p.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=says):
        load_profile(str(f), env={})


def test_undecodable_profile_is_one_line(tmp_path):
    f = tmp_path / "p.toml"
    f.write_bytes(b'model = "\xff\xfe"\n')
    with pytest.raises(ConfigError, match="cannot read model profile"):
        load_profile(str(f), env={})
