"""Shared fixtures and helpers for the LLM engine and simulator tests (imported by those tests only).

One simulator process serves the whole session; each test gets it back with default knobs and
zeroed stats. Also the child program that the resume and shared-cache tests run in subprocesses.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from evaluator.llm import LLMEngine, ModelProfile, load_profile  # noqa: E402
from simulator.harness import SimHandle, start_simulator  # noqa: E402

FAKE_KEY = "sk-test-FAKEKEY-0123456789abcdef"


@pytest.fixture(scope="session")
def sim_server() -> Iterator[SimHandle]:
    with start_simulator() as handle:
        yield handle


@pytest.fixture
def sim(sim_server: SimHandle) -> SimHandle:
    sim_server.configure(reset=True)
    sim_server.reset_stats()
    return sim_server


def sim_profile(sim: SimHandle, **overrides: Any) -> ModelProfile:
    """The sim profile pointed at `sim`, with fast backoff so retry tests take milliseconds."""
    base = load_profile("sim", base_url=sim.base_url)
    fast = {"backoff_base_s": 0.01, "backoff_max_s": 0.05, "timeout_s": 5.0, "max_retries": 4}
    return dataclasses.replace(base, **{**fast, **overrides})


def msgs(i: int, text: str = "find the weather in city") -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are the planning step of an LLM agent."},
        {"role": "user", "content": f"User request:\n{text} #{i}"},
    ]


# -- child program for the subprocess tests -------------------------------------------------------------
async def _child(base_url: str, cache_root: str, start: int, n: int, concurrency: int, out: str) -> None:
    profile = dataclasses.replace(load_profile("sim", base_url=base_url), concurrency=concurrency)
    async with LLMEngine(profile, cache_root=cache_root) as llm:
        results = await asyncio.gather(
            *(llm.chat(msgs(i), run=i % 4, prompt_version="v1") for i in range(start, start + n))
        )
    rows = [[r.content, r.finish_reason, r.prompt_tokens, r.completion_tokens, r.error] for r in results]
    Path(out).write_bytes(orjson.dumps({"rows": rows, "stats": llm.stats.as_dict()}))


def child_main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    for name in ("base_url", "cache_root", "out"):
        ap.add_argument(f"--{name}", required=True)
    for name in ("start", "n", "concurrency"):
        ap.add_argument(f"--{name}", type=int, required=True)
    a = ap.parse_args(argv)
    asyncio.run(_child(a.base_url, a.cache_root, a.start, a.n, a.concurrency, a.out))


def spawn_child(base_url: str, cache_root: Path, out: Path, *, start: int = 0, n: int, concurrency: int) -> subprocess.Popen[bytes]:
    code = f"import sys; sys.path.insert(0, {str(REPO / 'tests')!r}); from llm_fixtures import child_main; child_main()"
    args = [
        "--base_url", base_url, "--cache_root", str(cache_root), "--out", str(out),
        "--start", str(start), "--n", str(n), "--concurrency", str(concurrency),
    ]
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO)
