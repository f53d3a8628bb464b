"""Studies against the simulator standing in for Anthropic (online and through Message Batches: identical
records), vLLM and Ollama with no profile file, with the cached input tokens the simulator reports in the report's
token and cost tables; the CLI in a child process with no provider key from the environment but those given."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers.cli import run_cli
from helpers.data import make_data_dir
from helpers.procs import simulator
from helpers.records import same_rows

from evaluator.core.redact import key_envs
from simulator.harness import batch_stats, configure_batch

# -- studies --------------------------------------------------------------------------------------------------------
KEYS = sorted(key_envs())
ANTHROPIC = "anthropic/claude-sonnet-4-5"


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("providers")
    data = make_data_dir(root / "data")
    with simulator(api_key="sk-ant-sim-0123456789") as sim:
        yield root, data, sim


def env(**given: str) -> dict[str, str | None]:
    """No provider key, endpoint or data folder from the environment, but those `given`."""
    gone = [k for k in os.environ if k in KEYS or k.endswith("_BASE_URL")]
    return {**dict.fromkeys(gone), **given}


def study(ws, model: str, name: str, *extra: str, runs: int = 2) -> list[str]:
    root, data, _ = ws
    return ["--data", str(data), "--cache-dir", str(root / f"cache-{name}"), "--out", str(root / name), "--model",
            model, "--runs", str(runs), "--no-progress", "--no-extras", *extra]


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "queries.jsonl").read_text().splitlines()]


def test_anthropic_study_online_and_through_message_batches_gives_identical_records(ws):
    root, _, sim = ws
    key = {"ANTHROPIC_API_KEY": "sk-ant-sim-0123456789"}
    online = run_cli(*study(ws, ANTHROPIC, "a-online", "--base-url", sim.base_url, "--rpm", "6000"), cwd=root,
                     env=env(**key))
    assert online.returncode == 0, online.stderr
    sim.reset_stats()
    configure_batch(sim.base_url, reset=True, turnaround_s=0.1)
    batch = run_cli(*study(ws, ANTHROPIC, "a-batch", "--base-url", sim.base_url, "--batch"), cwd=root,
                    env=env(**key))
    assert batch.returncode == 0, batch.stderr
    assert sim.stats()["requests"] == 0 and batch_stats(sim.base_url)["requests_ok"] == 30  # all of it batched
    got, want = records(root / "a-batch"), records(root / "a-online")
    assert same_rows(got, want) and len(want) == 10  # stub cosines to float noise (test_batch_study.py) and all(r["archs"]["rtp"]["plan"]["llm_error"] is None for r in want)
    meta = json.loads((root / "a-batch" / "meta.json").read_text())
    cost = meta["cost"][ANTHROPIC]
    assert cost["batch"]["usd"] == pytest.approx(cost["all_online_usd"] / 2, rel=1e-3)  # half price
    assert meta["batch"][ANTHROPIC]["stored"] == 30
    # the marked system prompts were read from the prompt cache: counted and priced at the cached rate
    online_meta = json.loads((root / "a-online" / "meta.json").read_text())
    c = online_meta["cost"][ANTHROPIC]["online"]
    assert c["cached_prompt_tokens"] > 0 and c["cache_write_tokens"] > 0
    fresh = c["prompt_tokens"] - c["cached_prompt_tokens"] - c["cache_write_tokens"]
    assert c["usd"] == pytest.approx((fresh * 3 + c["cached_prompt_tokens"] * 0.3 + c["cache_write_tokens"] * 3.75
                                      + c["completion_tokens"] * 15) / 1e6, abs=2e-6)
    report = (root / "a-online" / "report.md").read_text()
    accounting = report.split("## LLM accounting")[1].split("##")[0]
    head, row = (line for line in accounting.splitlines() if line.startswith("|") and "---" not in line)
    col = [h.strip() for h in head.split("|")].index("cached_prompt_tokens")
    assert int(row.split("|")[col]) == c["cached_prompt_tokens"]
    cost_table = report.split("## Cost and batch")[1]
    assert "cached input / cache writes" in cost_table and f"{c['cached_prompt_tokens']:,} / " in cost_table
    assert "as of 2025-12" in cost_table


def test_vllm_and_ollama_hosts_with_no_profile_file(ws):
    root, _, sim = ws
    key = "sk-ant-sim-0123456789"  # the simulator of this module wants one: the hosts' optional key variables
    vllm = run_cli(*study(ws, "vllm/Qwen/Qwen2.5-7B-Instruct", "vllm", "--base-url", sim.base_url, runs=1), cwd=root,
                   env=env(VLLM_API_KEY=key))
    assert vllm.returncode == 0, vllm.stderr
    ollama = run_cli(*study(ws, "ollama/llama3.2", "ollama", runs=1), cwd=root,
                     env=env(OLLAMA_BASE_URL=sim.base_url, OLLAMA_API_KEY=key))
    assert ollama.returncode == 0, ollama.stderr
    for name, model in (("vllm", "vllm/Qwen/Qwen2.5-7B-Instruct"), ("ollama", "ollama/llama3.2")):
        recs = records(root / name)
        assert len(recs) == 5 and all(r["model"] == model for r in recs)
        meta = json.loads((root / name / "meta.json").read_text())
        info = meta["models"][0]
        assert info["profile"]["provider"] == name and info["profile"]["structured"] == "json_schema"
        c = meta["cost"][model]["online"]
        assert c["usd"] == 0.0 and c["cached_prompt_tokens"] > 0  # self-hosted: no bill; the prefix cache reported
        report = (root / name / "report.md").read_text()
        assert "cached_prompt_tokens" in report and "self-hosted" in report
    missing = run_cli(*study(ws, "vllm/x", "vllm-missing", runs=1), cwd=root, env=env())
    assert missing.returncode == 2 and "vllm is self-hosted: pass --base-url" in missing.stderr
    assert "Traceback" not in missing.stderr
