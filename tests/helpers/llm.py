"""The LLM simulator for the engine's tests, as fixtures (a plugin: tests/conftest.py) and helpers.

Two simulators with one interface (`configure`, `stats`, `reset_stats`, `base_url`, `engine(profile)`):
`local_sim`, the simulator's handlers in this process behind the engine's in-process `MockTransport` (no
socket: the unit tests), and `socket_sim`, one simulator process serving the whole session over
loopback through the engine's aiohttp transport, handed back to each test with default knobs and zeroed
stats (`sim`, the same process, for tests that talk to it directly). A test written against `any_sim` runs on
the in-process one (tests/unit) and again on the socket (tests/integration/test_transport_parity.py).
Also the child program that the resume and shared-cache tests run in subprocesses (`spawn_child`).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from evaluator.llm import LLMEngine, ModelProfile, load_profile, revised
from evaluator.llm.limiters import RequestPacer
from evaluator.llm.transport import MockTransport, NoReply, Request, Response
from helpers.procs import PYTHON, REPO, child_env, simulator, start
from simulator.harness import SimHandle
from simulator.inprocess import InProcessSimulator

FAKE_KEY = "sk-test-FAKEKEY-0123456789abcdef"


@pytest.fixture(scope="session")
def sim_server() -> Iterator[SimHandle]:
    with simulator() as handle:
        yield handle


@pytest.fixture
def sim(sim_server: SimHandle) -> SimHandle:
    sim_server.configure(reset=True)
    sim_server.reset_stats()
    return sim_server


class LocalSim(InProcessSimulator):
    """The simulator in this process; its engines send through a `MockTransport` (no socket)."""

    async def answer(self, request: Request) -> Response:
        """The `MockTransport` handler: the server's answer, its connection cut as the transport's `NoReply`."""
        try:
            status, headers, body = await self.handle(request.method, request.url, request.headers, request.body)
        except ConnectionResetError as e:
            raise NoReply("connection", type(e).__name__) from None
        return Response(status, body, headers)

    def engine(self, profile: ModelProfile, **kw: Any) -> LLMEngine:
        # the default pacer's clock, looked up at each call: a test's virtual clock (helpers/clock.py) moves it too
        kw.setdefault("pacer_factory", lambda _profile, rpm: RequestPacer(rpm, clock=lambda: time.monotonic()))
        return LLMEngine(profile, transport=MockTransport(self.answer), **kw)


class SocketSim:
    """The session's simulator process seen through the same interface; its engines use aiohttp."""

    def __init__(self, handle: SimHandle) -> None:
        self.handle = handle
        self.base_url = handle.base_url
        self.configure, self.stats, self.reset_stats = handle.configure, handle.stats, handle.reset_stats

    def engine(self, profile: ModelProfile, **kw: Any) -> LLMEngine:
        return LLMEngine(profile, **kw)


@pytest.fixture
def local_sim() -> LocalSim:
    return LocalSim()


@pytest.fixture
def socket_sim(sim_server: SimHandle) -> SocketSim:
    sim_server.configure(reset=True)
    sim_server.reset_stats()
    return SocketSim(sim_server)


@pytest.fixture
def any_sim() -> LocalSim | SocketSim:
    """A test that must pass on either transport (the fake answers as the real one does): the in-process one
    here; tests/integration/test_transport_parity.py runs such tests again with `any_sim` on the socket."""
    return LocalSim()


def sim_profile(sim: SimHandle | LocalSim | SocketSim | Any, **overrides: Any) -> ModelProfile:
    """The sim profile pointed at `sim`, with fast backoff so retry tests take milliseconds."""
    base = load_profile("sim", base_url=sim.base_url)
    fast = {"backoff_base_s": 0.01, "backoff_max_s": 0.05, "timeout_s": 5.0, "max_retries": 4}
    return revised(base, **{**fast, **overrides})


def msgs(i: int, text: str = "find the weather in city") -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are the planning step of an LLM agent."},
        {"role": "user", "content": f"User request:\n{text} #{i}"},
    ]


# -- child program for the subprocess tests -------------------------------------------------------------
async def _child(base_url: str, cache_root: str, start: int, n: int, concurrency: int, out: str) -> None:
    profile = revised(load_profile("sim", base_url=base_url), concurrency=concurrency)
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


def spawn_child(base_url: str, cache_root: Path, out: Path, *, first: int = 0, n: int,
                concurrency: int) -> subprocess.Popen[bytes]:
    """`child_main` in a child process (its own process group): `n` calls from `first` on, rows written to `out`."""
    args = ["--base_url", base_url, "--cache_root", str(cache_root), "--out", str(out),
            "--start", str(first), "--n", str(n), "--concurrency", str(concurrency)]
    return start([PYTHON, "-m", "helpers.llm", *args], cwd=REPO, env=child_env(tests=True), text=False,
                  stdout=None, stderr=None)


if __name__ == "__main__":
    child_main()
