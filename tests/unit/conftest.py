"""tests/unit: no process, no socket, no sleep. A test here that starts a process (subprocess, multiprocessing,
fork, spawn), connects or listens on a socket, or sleeps in `time.sleep` fails, naming what it did and where such a
test belongs (tests/integration), even when the code under test caught the error raised at that moment.
Waiting in asyncio is allowed; `clock` (helpers/clock.py) makes such waits virtual and exact.

The embedder's exports (ONNX, OpenVINO) are built in this process here (`ISOLATED_BUILD` off), not in the child
process a run builds them in (tests/integration covers that); the session shares them (tests/conftest.py).
"""

from __future__ import annotations

import _posixsubprocess
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from evaluator.retrieval import backends


class NotAUnitTest(RuntimeError):
    """Raised where a unit test starts a process, opens a socket or sleeps."""


@pytest.fixture(autouse=True)
def _unit_isolation(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[None]:
    done: list[str] = []

    def forbid(owner: Any, name: str, what: Callable[..., str]) -> None:
        def refused(*a: Any, **k: Any) -> Any:
            done.append(what(*a, **k))
            raise NotAUnitTest(f"{done[-1]} in a unit test: such a test belongs in tests/integration/")

        monkeypatch.setattr(owner, name, refused)

    def process(*a: Any, **_k: Any) -> str:
        return f"started a process ({' '.join(map(str, a[0] if a and isinstance(a[0], list) else a[:1]))[:200]})"

    forbid(subprocess.Popen, "_execute_child", lambda _self, args, *_a, **_k: process(args))
    forbid(_posixsubprocess, "fork_exec", lambda *a, **_k: process(a[0]))  # multiprocessing's spawn
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "execv", "execve"):
        if hasattr(os, name):
            forbid(os, name, lambda *a, _n=name, **_k: f"called os.{_n}")
    # connecting (a client) or listening (a server); a bare bind is not I/O (urllib3 probes IPv6 so at import)
    for name in ("connect", "connect_ex"):
        forbid(socket.socket, name, lambda _self, address, *_a, _n=name, **_k: f"socket.{_n}({address!r})")
    forbid(socket.socket, "listen", lambda _self, *_a, **_k: f"socket.listen() on {_self.getsockname()!r}")
    real_sleep = time.sleep

    def no_sleep(seconds: float) -> None:
        if seconds > 0:
            done.append(f"time.sleep({seconds})")
            raise NotAUnitTest(f"time.sleep({seconds}) in a unit test: wait on an event or the virtual clock "
                               "(helpers/clock.py), or move the test to tests/integration/")
        real_sleep(0)

    monkeypatch.setattr(time, "sleep", no_sleep)
    monkeypatch.setattr(backends, "ISOLATED_BUILD", False)
    # OpenVINO's model converter sends usage telemetry from a forked process unless it runs under CI (its
    # `disable_in_ci`): an export built here would start a process and try the network.
    monkeypatch.setenv("CI", "true")
    yield
    if done:
        pytest.fail(f"{request.node.nodeid}: {'; '.join(dict.fromkeys(done))}. tests/unit holds no process, socket "
                    "or sleep: move the test to tests/integration/ (or make it in-process).", pytrace=False)


def _integration_only(what: str) -> Any:
    def fixture() -> None:
        pytest.fail(f"{what} starts a process: a test that uses it belongs in tests/integration/", pytrace=False)

    return fixture


# The fixtures that start processes, refused here before they start anything.
sim_server = pytest.fixture(scope="session", name="sim_server")(_integration_only("sim_server (the simulator)"))
batch_sim_server = pytest.fixture(name="batch_sim_server")(_integration_only("batch_sim_server (the simulator)"))
_chromium = pytest.fixture(name="_chromium")(_integration_only("the browser"))
