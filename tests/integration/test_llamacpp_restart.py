"""The bundled server restarted after a crash while another process took its port (issue 38): the calls reach the
new server on a free port, never the other listener.

Before the fix the watchdog started the server again on the same port, which failed ("Failed to init server",
4 times), while the engine's calls went to whatever now listened on that port for minutes. The llama.cpp child is
replaced here by a stub server of the same handshake (one JSON line once it listens, `/health`, a chat reply
naming its pid): what is tested is the harness and the engine, not llama.cpp. Every stub is started in its own
process group and stopped by it (helpers/procs.py), also on failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers.procs import PYTHON, start, wait_until

from evaluator.llamacpp import llama_server
from evaluator.llamacpp.weights import WEIGHTS
from evaluator.llm import LLMEngine, load_profile
from evaluator.llm.transport import NoReply

STUB = r"""
import json, os, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class H(BaseHTTPRequestHandler):
    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send(200 if self.path == "/health" else 404, {"status": "ok"})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(200, {"choices": [{"message": {"role": "assistant", "content": f"stub {os.getpid()}"},
                                      "finish_reason": "stop"}], "usage": {"prompt_tokens": 1, "completion_tokens": 2}})

    def log_message(self, *a):
        pass

try:
    srv = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H)  # the port the harness asks for
except OSError as e:
    print(json.dumps({"error": f"Failed to init server: {e}"}), flush=True)
    sys.exit(1)
port = srv.server_address[1]
threading.Thread(target=srv.serve_forever, daemon=True).start()
print(json.dumps({"base_url": f"http://127.0.0.1:{port}/v1", "port": port, "pid": os.getpid()}), flush=True)
parent = os.getppid()
while os.getppid() == parent:
    time.sleep(0.1)
"""


class Impostor(BaseHTTPRequestHandler):
    """Another process's server on the old port: it answers like a server would, and counts what reaches it."""

    hits = 0

    def do_POST(self):  # noqa: N802
        type(self).hits += 1
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": "impostor"},
                                        "finish_reason": "stop"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST  # noqa: N815

    def log_message(self, *a):
        pass


class StubHandle(llama_server.LlamaHandle):
    started: list[int] = []

    def _spawn(self) -> subprocess.Popen[bytes]:
        cmd = self.command()
        port = cmd[cmd.index("--port") + 1]
        proc = start([PYTHON, "-c", STUB, port], text=False, stderr=None)  # its own process group
        self.started.append(proc.pid)
        return proc


async def _ask(engine: LLMEngine, text: str) -> str:
    r = await engine.chat([{"role": "user", "content": text}], run=0, prompt_version="t")
    assert r.error is None, r.error
    return r.content or ""


@pytest.fixture
def handle(tmp_path):
    StubHandle.started = []
    h = StubHandle(WEIGHTS["qwen2.5-coder-0.5b"], tmp_path, slots=1, threads=1, ctx=512, timeout_s=60)
    try:
        yield h
    finally:
        h.stop()
        for pid in StubHandle.started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_restart_goes_to_a_free_port_and_no_call_reaches_the_listener_on_the_old_one(handle, tmp_path):
    first_url = handle.wait().locate()
    old_port = int(first_url.rsplit(":", 1)[1].split("/")[0])
    profile = load_profile("local", base_url=first_url, env={}, max_retries=20, backoff_base_s=0.05,
                           backoff_max_s=0.2, adaptive_concurrency=False, concurrency=1)

    async def scenario() -> tuple[str, str]:
        async with LLMEngine(profile, cache_root=tmp_path / "cache", api_key="", locate=handle.locate) as engine:
            before = await _ask(engine, "one")
            first = handle.proc
            first.kill()  # the server dies mid-run...
            first.wait()
            # ...and another process takes its port at once, before the watchdog notices
            impostor = ThreadingHTTPServer(("127.0.0.1", old_port), Impostor)
            threading.Thread(target=impostor.serve_forever, daemon=True).start()
            try:
                with pytest.raises(NoReply):  # no URL while the server is down: nothing sent to the old port
                    handle.locate()
                after = await _ask(engine, "two")  # retried until the new server answers
            finally:
                impostor.shutdown()
                impostor.server_close()
            return before, after

    before, after = asyncio.run(scenario())
    assert before == f"stub {StubHandle.started[0]}"
    assert after == f"stub {StubHandle.started[1]}" and Impostor.hits == 0
    assert handle.restarts == 1 and handle.locate() != first_url
    assert handle.stats()["restarts"] == 1


def test_a_stopped_server_has_no_url(handle):
    handle.wait()
    handle.stop()
    with pytest.raises(NoReply):
        handle.locate()
    wait_until(lambda: handle.proc.poll() is not None, what="the stopped server's exit")
