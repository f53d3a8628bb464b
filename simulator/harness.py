"""Start the simulator in a subprocess on a free loopback port and talk to its admin endpoints.

    with start_simulator(latency_s=0.01, rpm=600) as sim:
        profile = load_profile("sim", base_url=sim.base_url)
        ...; sim.stats()["by_status"]

The admin calls are synchronous (urllib): the simulator is another process, so calling them from
inside a running event loop blocks that loop only for the few milliseconds of the exchange.
"""

from __future__ import annotations

import dataclasses
import os
import selectors
import subprocess
import sys
import time
import urllib.error
import urllib.request
from types import TracebackType
from typing import Any

import orjson

from evaluator.core.paths import REPO_ROOT
from simulator.server import SimConfig, config_from

# Loopback only: never route admin calls through an HTTP(S)_PROXY from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def admin_call(root: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """One JSON call to a running simulator's admin/stats routes (`root` without /v1), from tests and benches."""
    data = orjson.dumps(body) if body is not None else (b"" if method == "POST" else None)
    req = urllib.request.Request(root.removesuffix("/v1") + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with _OPENER.open(req, timeout=10) as r:
            return orjson.loads(r.read())
    except urllib.error.HTTPError as e:
        raise ValueError(f"simulator refused {path}: {e.read().decode(errors='replace')}") from e


def configure_batch(base_url: str, *, reset: bool = False, **knobs: Any) -> dict[str, Any]:
    """Set the batch APIs' `BatchConfig` knobs of the simulator at `base_url` (a SimHandle's base_url)."""
    return admin_call(base_url, "POST", "/admin/batch", {"reset": reset, **knobs})


def batch_stats(base_url: str) -> dict[str, Any]:
    return admin_call(base_url, "GET", "/batch/stats")


def reset_batch_stats(base_url: str) -> dict[str, Any]:
    return admin_call(base_url, "POST", "/batch/stats/reset")


class SimHandle:
    """A simulator process; its address is known once it listens (`base_url` waits for that)."""

    def __init__(self, proc: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
        self.proc = proc
        self.timeout_s = timeout_s
        self._base_url: str | None = None

    @property
    def base_url(self) -> str:
        """Ends in /v1, like a provider's OpenAI-compatible base; waits until `/v1/models` answers."""
        return self.wait()._base_url or ""

    def wait(self) -> SimHandle:
        """Returns once the simulator answers `/v1/models`."""
        if self._base_url is None:
            self._base_url = self._wait_ready()
        return self

    @property
    def root(self) -> str:
        return self.base_url.removesuffix("/v1")

    def _wait_ready(self) -> str:
        assert self.proc.stdout is not None
        # The server prints its address once it is listening; don't block forever if it never does.
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            ready = sel.select(self.timeout_s)
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"simulator exited with code {self.proc.returncode} before listening")
        base_url = orjson.loads(line)["base_url"]
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                with _OPENER.open(base_url + "/models", timeout=2):
                    return base_url
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"simulator at {base_url} did not answer /v1/models") from None
                time.sleep(0.05)

    def __repr__(self) -> str:
        return f"SimHandle(base_url={self._base_url or '(starting)'!r}, pid={self.proc.pid})"

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        return admin_call(self.root, method, path, body)

    def stats(self) -> dict[str, Any]:
        return self._call("GET", "/stats")

    def reset_stats(self) -> dict[str, Any]:
        return self._call("POST", "/stats/reset")

    def configure(self, *, reset: bool = False, **knobs: Any) -> dict[str, Any]:
        """Change knobs at runtime; `reset=True` starts again from the defaults."""
        return self._call("POST", "/admin/config", {"reset": reset, **knobs})

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> SimHandle:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def start_simulator(config: SimConfig | None = None, *, host: str = "127.0.0.1", timeout_s: float = 20.0,
                    wait: bool = True, **knobs: Any) -> SimHandle:
    """Launch `python -m simulator` on a free port of `host`; returns once `/v1/models` answers, or
    at once with `wait=False` (the first use of `base_url` waits: the simulator's ~0.5 s start then
    overlaps the caller's own work)."""
    cfg = config_from(config, **knobs)
    cmd = [
        sys.executable, "-m", "simulator", "--host", host, "--port", "0", "--exit-with-parent",
        "--config-json", orjson.dumps(dataclasses.asdict(cfg)).decode(),
    ]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    handle = SimHandle(subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env), timeout_s)
    return handle.wait() if wait else handle
