"""`--model PROVIDER/MODEL`: the provider table (configs/providers.toml) as profiles, the dry run of three providers
with no key, `python -m evaluator models`, cached input tokens priced at the cached rate (studies against the
simulator standing in for each provider: tests/integration/test_providers.py)."""

from __future__ import annotations

import json
import os

import pytest
from helpers.data import make_data_dir

from evaluator.app.dry_run import cache_estimate
from evaluator.batch.providers import gemini_to_completion
from evaluator.cli import main as cli
from evaluator.core.errors import ConfigError
from evaluator.core.money import cost_usd
from evaluator.core.redact import key_envs, redact
from evaluator.llm import load_profile
from evaluator.llm.budget import check_priced
from evaluator.llm.catalog import providers
from evaluator.llm.reply import read_reply

KEYS = sorted(key_envs())
ANTHROPIC = "anthropic/claude-sonnet-4-5"


@pytest.fixture
def cli_run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """`python -m evaluator ARGS` in this process with no provider key, endpoint or data folder from the environment
    but `env_vars`: (exit code, stdout, stderr)."""
    for k in os.environ:
        if k in KEYS or k == "EVALUATOR_DATA" or k.endswith("_BASE_URL"):
            monkeypatch.delenv(k)

    def run(*args: str, **env_vars: str) -> tuple[int, str, str]:
        with monkeypatch.context() as m:
            for k, v in env_vars.items():
                m.setenv(k, v)
            rc = cli.main(list(args))
        out, err = capsys.readouterr()
        return rc, out, err

    return run


# -- the table as profiles ----------------------------------------------------------------------------------------
def test_every_provider_of_the_table_gives_a_profile():
    for name, p in providers().items():
        url = None if p.base_url else "http://127.0.0.1:9/v1"  # self-hosted: the user names the server
        prof = load_profile(f"{name}/some-model", base_url=url, require_key=False, env={})
        assert prof.connection.provider == name and prof.model == "some-model" and prof.connection.api_key_env == p.api_key_env
        assert prof.batch.api == p.batch and prof.connection.wire == p.wire and prof.name == f"{name}/some-model"
        # an unknown model: unknown prices (never 0), except on a self-hosted server (no per-token bill)
        assert prof.prices.input_per_mtok == (0.0 if p.self_hosted else None)
    for required in ("openai", "anthropic", "google", "vllm", "sglang", "ollama", "llamacpp", "together", "groq",
                     "openrouter", "deepseek", "mistral", "fireworks"):
        assert required in providers()


def test_known_models_carry_dated_prices_and_their_limits():
    p = load_profile(ANTHROPIC, require_key=False, env={})
    assert (p.prices.input_per_mtok, p.prices.output_per_mtok, p.prices.cached_input_per_mtok,
            p.prices.cache_write_per_mtok, p.prices.batch_discount, p.prompt.context_tokens) == (3.0, 15.0, 0.3, 3.75, 0.5, 200000)
    assert "as of 2025-12" in p.prices.source and p.prompt.cache == "explicit" and p.connection.wire == "anthropic"
    dated = load_profile("anthropic/claude-sonnet-4-5-20250929", require_key=False, env={})  # a dated snapshot id
    assert dated.prices.input_per_mtok == 3.0 and dated.model == "claude-sonnet-4-5-20250929"
    flash = load_profile("google/gemini-2.5-flash", require_key=False, env={})
    assert flash.pacing.rpm == 1000 and flash.batch.api == "gemini" and not flash.sampling.send_seed
    llama = load_profile("together/meta-llama/Llama-3.3-70B-Instruct-Turbo", require_key=False, env={})
    assert llama.model == "meta-llama/Llama-3.3-70B-Instruct-Turbo" and llama.prices.input_per_mtok == 0.88


def test_endpoint_precedence_and_self_hosted_servers():
    env = {"OLLAMA_BASE_URL": "http://gpu-box:11434/v1"}
    assert load_profile("ollama/llama3.2", require_key=False, env={}).connection.base_url == "http://localhost:11434/v1"
    assert load_profile("ollama/llama3.2", require_key=False, env=env).connection.base_url == "http://gpu-box:11434/v1"
    assert load_profile("ollama/llama3.2", base_url="http://h:1/v1", require_key=False, env=env).connection.base_url == "http://h:1/v1"
    with pytest.raises(ConfigError, match="vllm is self-hosted: pass --base-url URL.*VLLM_BASE_URL"):
        load_profile("vllm/Qwen/Qwen2.5-7B-Instruct", require_key=False, env={})
    with pytest.raises(ConfigError, match="unknown provider 'acme'.*anthropic"):
        load_profile("acme/model-1", require_key=False, env={})
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):  # a hosted provider's key is checked before any work
        load_profile(ANTHROPIC, env={})
    assert load_profile("ollama/llama3.2", env={}).connection.api_key_required is False  # a local server needs none


def test_a_profile_file_naming_a_provider_overrides_its_defaults(tmp_path):
    f = tmp_path / "claude-fast.toml"
    f.write_text('provider = "anthropic"\nmodel = "claude-haiku-4-5"\nrpm = 4000\nprice_input_per_mtok = 0.9\n'
                 'structured = "json_schema"\n')
    p = load_profile(str(f), require_key=False, env={})
    assert (p.name, p.connection.provider, p.connection.wire, p.batch.api, p.pacing.rpm, p.prices.input_per_mtok, p.prices.output_per_mtok) == (
        "claude-fast", "anthropic", "anthropic", "anthropic", 4000, 0.9, 5.0)
    assert p.sampling.structured == "json_schema" and p.prompt.cache_min_tokens == 2048  # the model's own entry
    bad = tmp_path / "o3.toml"
    bad.write_text('provider = "openai"\nmodel = "o3"\ntemperature = 0.0\n')
    with pytest.raises(ConfigError, match="reasoning model: it takes only the default temperature"):
        load_profile(str(bad), require_key=False, env={})
    unknown = tmp_path / "x.toml"
    unknown.write_text('provider = "acme"\nmodel = "m"\n')
    with pytest.raises(ConfigError, match="provider = 'acme' is not a provider"):
        load_profile(str(unknown), require_key=False, env={})


def test_every_providers_key_is_redacted(monkeypatch):
    secret = "dsk-0123456789abcdefSECRET"
    monkeypatch.setenv("DEEPSEEK_API_KEY", secret)
    load_profile("sim")  # any profile load registers every provider's key variable with the redactor
    assert secret not in redact(f"HTTP 401: bad key {secret}") and "[REDACTED:DEEPSEEK_API_KEY]" in redact(secret)
    assert {"OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "GROQ_API_KEY", "MISTRAL_API_KEY"} <= set(key_envs())


def test_models_command_lists_providers_prices_and_whether_each_key_is_set(cli_run):
    secret = "sk-ant-VALUE-never-printed-0123"
    rc, out, err = cli_run("models", ANTHROPIC_API_KEY=secret)
    assert rc == 0, err
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert "ANTHROPIC_API_KEY" in lines["anthropic"] and " yes " in lines["anthropic"]
    assert "OPENAI_API_KEY" in lines["openai"] and " no " in lines["openai"]
    assert "anthropic/claude-sonnet-4-5" in lines and "3" in lines["anthropic/claude-sonnet-4-5"]
    assert "2025-12" in lines["openai/gpt-5-mini"] and secret not in out + err
    _, only, _ = cli_run("models", "ollama")
    assert "OLLAMA_API_KEY" in only and "ANTHROPIC_API_KEY" not in only
    rc, _, err = cli_run("models", "acme")
    assert rc == 2 and "unknown provider 'acme'" in err and "Traceback" not in err


def test_dry_run_of_three_providers_needs_no_key_and_dates_its_prices(cli_run, tmp_path):
    root = tmp_path
    data = make_data_dir(root / "data")
    rc, out, err = cli_run("--data", str(data), "--cache-dir", str(root / "cache-dry"), "--out", str(root / "dry"),
                           "--model", ANTHROPIC, "--runs", "2", "--no-progress", "--no-extras", "--model",
                           "openai/gpt-5-mini", "--model", "google/gemini-2.5-flash", "--model",
                           "anthropic/claude-unreleased-9", "--dry-run")
    assert rc == 0, err
    for model, source in ((ANTHROPIC, "docs.anthropic.com"), ("openai/gpt-5-mini", "openai.com/api"),
                          ("google/gemini-2.5-flash", "ai.google.dev")):
        block = out.split(f"{model}: ")[1].split("\n  time floor")[0]
        assert "calls" in block and "tokens to send" in block and "$" in block.split("cost:")[1].split("\n")[0]
        assert f"as of 2025-12 (https://{source}" in block and "check them" in block
    unknown = out.split("anthropic/claude-unreleased-9: ")[1]
    assert "cost: unknown ('claude-unreleased-9' is not in the price table of anthropic" in unknown
    plan = json.loads((root / "dry" / "plan.json").read_text())["models"]
    assert plan["openai/gpt-5-mini"]["usd_online"] > 0 and plan["anthropic/claude-unreleased-9"]["usd_online"] is None
    assert plan["openai/gpt-5-mini"]["prompt_tokens"] > 0 and plan["openai/gpt-5-mini"]["completion_tokens"] > 0


def test_cached_input_tokens_read_from_each_providers_usage_and_priced_at_the_cached_rate():
    def usage(u: dict) -> dict:
        return {"choices": [{"message": {"content": "x"}, "finish_reason": "stop"}], "usage": u}

    openai = read_reply(usage({"prompt_tokens": 2000, "completion_tokens": 5,
                               "prompt_tokens_details": {"cached_tokens": 1536, "audio_tokens": 0}}))
    deepseek = read_reply(usage({"prompt_tokens": 2000, "completion_tokens": 5, "prompt_cache_hit_tokens": 1920,
                                 "prompt_cache_miss_tokens": 80}))
    gemini = read_reply(gemini_to_completion({"candidates": [{"content": {"parts": [{"text": "x"}]}}],
                                              "usageMetadata": {"promptTokenCount": 2000, "candidatesTokenCount": 5,
                                                                "cachedContentTokenCount": 1024}}, "gemini-2.5-flash"))
    assert (openai.cached_tokens, deepseek.cached_tokens, gemini.cached_tokens) == (1536, 1920, 1024)
    p = load_profile("openai/gpt-4o-mini", require_key=False, env={})
    # 464 fresh tokens at $0.15, 1,536 cached at $0.075, 5 out at $0.60 (per 1M)
    assert cost_usd(p.prices, 2000, 5, cached=1536) == pytest.approx((464 * 0.15 + 1536 * 0.075 + 5 * 0.6) / 1e6)
    assert cost_usd(p.prices, 2000, 5, cached=1536, batch=True) == pytest.approx(cost_usd(p.prices, 2000, 5, cached=1536) / 2)


def test_the_dry_run_estimates_cached_tokens_by_the_providers_minimum():
    long_system = "x" * 8000  # ~2,000 tokens: over every minimum
    bodies = [{"messages": [{"role": "system", "content": s}, {"role": "user", "content": f"q{i}"}]}
              for i, s in enumerate([long_system] * 3 + ["short"] * 3)]
    claude = load_profile(ANTHROPIC, require_key=False, env={})
    read, write = cache_estimate(claude, bodies)
    assert read == 2 * write and write > 1024  # written once, read by the two other calls; "short" under 1,024
    gpt = load_profile("openai/gpt-4o-mini", require_key=False, env={})
    assert cache_estimate(gpt, bodies) == (read, 0)  # automatic caching: no write surcharge
    assert cache_estimate(load_profile("sim"), bodies) == (0, 0)  # a profile that names no caching


def test_a_budget_refuses_an_unpriced_model_and_takes_a_priced_one():
    with pytest.raises(ConfigError, match="--budget needs prices: 'claude-unreleased-9' is not in the price table of "
                                          "anthropic .*provider = \"anthropic\""):
        check_priced({"x": load_profile("anthropic/claude-unreleased-9", require_key=False, env={})})
    check_priced({"a": load_profile(ANTHROPIC, require_key=False, env={}),
                  "v": load_profile("vllm/m", base_url="http://h:1/v1", require_key=False, env={})})  # $0 is a price
