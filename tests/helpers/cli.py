"""The command line in a child process, as a user runs it: `run_cli` (to its end) and `start_cli` (running).

Every call runs `python -m evaluator ARGS` with the worktree's code, without a data folder from the environment
(`EVALUATOR_DATA`), in its own process group (helpers/procs.py), stopped by that group on timeout.

`run_cli` forks the command from a warm interpreter (helpers/forkserver.py: the imports done once per test
process, not once per call; the child is otherwise the process a cold start makes). It starts cold instead where
the call sets a variable that is read when the libraries load (`_READ_AT_IMPORT`), when asked (`cold=True`, or
`EVALUATOR_TEST_COLD_CLI=1` for every call), or where the fork server could not start. `start_cli` always starts
cold: the tests that signal or kill a running command get the process `python -m evaluator` is.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import selectors
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from helpers.forkserver import HEADER
from helpers.procs import PYTHON, REPO, child_env, run, start, stop, stop_group

CLI = (PYTHON, "-m", "evaluator")
COLD_ENV = "EVALUATOR_TEST_COLD_CLI"
# Variables read when a library loads (OpenMP and BLAS pools, the interpreter, matplotlib's folders, the thread
# sizing of evaluator/core/threads.py): a call that changes one starts cold, since the fork server loaded them
# with its own.
_READ_AT_IMPORT = ("EVALUATOR_THREADS", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "GOTO", "PYTHON", "LD_", "MALLOC",
                   "TOKENIZERS", "CUDA", "OV_", "MPL", "HOME", "XDG_", "TMP", "TEMP", "LANG", "LC_")
START_TIMEOUT_S = 120.0  # the fork server's imports, on a loaded machine


def run_cli(*args: str, cwd: Path | str = REPO, env: Mapping[str, str | None] | None = None,
            timeout: float = 600, cold: bool = False) -> subprocess.CompletedProcess[str]:
    """`python -m evaluator ARGS` to its end (stdout and stderr as text); `env` sets variables (None removes one)."""
    full = child_env(env)
    server = None if cold or os.environ.get(COLD_ENV) else _server()
    if server is None or not server.fits(full):
        return run([*CLI, *args], cwd=cwd, env=full, timeout=timeout)
    return server.run(list(args), Path(cwd), full, timeout)


def start_cli(*args: str, cwd: Path | str = REPO, env: Mapping[str, str | None] | None = None,
              **kw: Any) -> subprocess.Popen[str]:
    """`python -m evaluator ARGS` started (pipes for stdout and stderr unless given); stop it with `procs.stop`,
    or let the test's end do it."""
    return start([*CLI, *args], cwd=cwd, env=child_env(env), **kw)


def one_line(err: str) -> str:
    """The one non-blank line of a CLI's stderr (a user's mistake, a stop): fails when there are more or none."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


class ForkServer:
    """This test process's fork server (helpers/forkserver.py), in its own process group."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="evaluator-fork-")
        self.path = os.path.join(self.folder, "s")
        self.env = child_env(tests=True)
        self.proc = start([PYTHON, "-c", "from helpers.forkserver import serve; serve()", self.path], env=self.env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, kept=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not os.path.exists(self.path):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise OSError("the fork server did not start")
            time.sleep(0.02)

    def fits(self, env: Mapping[str, str]) -> bool:
        """Whether a call with `env` may be forked: it changes no variable read when the libraries loaded."""
        keys = {k for k in (*env, *self.env) if k.startswith(_READ_AT_IMPORT)}
        return all(env.get(k) == self.env.get(k) for k in keys if k != "PYTHONPATH") and \
            env.get("PYTHONPATH", "").split(os.pathsep)[:1] == [str(REPO)]

    def run(self, args: list[str], cwd: Path, env: Mapping[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
        """As `procs.run([*CLI, *args])`: to its end, its group stopped on timeout (the test fails) and once it
        ended."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        pid: int | None = None
        code: int | None = None
        chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
        try:
            conn.connect(self.path)
            body = json.dumps({"args": args, "cwd": str(cwd), "env": dict(env)}).encode()
            socket.send_fds(conn, [HEADER.pack(len(body)) + body], [null, out_w, err_w])
            for fd in (null, out_w, err_w):
                os.close(fd)
            null = out_w = err_w = -1
            deadline = time.monotonic() + timeout
            replies = b""
            with selectors.DefaultSelector() as sel:
                for fd in (out_r, err_r):
                    sel.register(fd, selectors.EVENT_READ)
                sel.register(conn, selectors.EVENT_READ)
                while len(sel.get_map()) > 0:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        if pid is not None:
                            stop_group(pid)
                        tail = b"".join(chunks[err_r]).decode(errors="replace")[-2000:]
                        pytest.fail(f"evaluator {' '.join(args)[:300]} did not end in {timeout:.0f} s; stopped. "
                                    f"stderr: {tail}")
                    for key, _ in sel.select(left):
                        if key.fileobj is conn:
                            got = conn.recv(1 << 12)
                            replies += got
                            if not got:
                                sel.unregister(conn)
                            continue
                        fd = key.fd
                        data = os.read(fd, 1 << 16)
                        if data:
                            chunks[fd].append(data)
                        else:
                            sel.unregister(fd)
                    for line in replies.split(b"\n"):
                        if line.strip():
                            msg = json.loads(line)
                            pid = msg.get("pid", pid)
                            code = msg.get("exit", code)
        finally:
            if pid is not None:
                stop_group(pid, grace_s=0)  # anything the command left in its group
            for fd in (null, out_w, err_w, out_r, err_r):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            conn.close()
        if code is None:
            raise OSError(f"the fork server gave no exit code for evaluator {' '.join(args)[:200]}")
        return subprocess.CompletedProcess([*CLI, *args], code, _text(chunks[out_r]), _text(chunks[err_r]))

    def close(self) -> None:
        stop(self.proc)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.rmdir(self.folder)


def _text(chunks: list[bytes]) -> str:
    """As `subprocess` decodes a text pipe: the locale's encoding, universal newlines."""
    return io.TextIOWrapper(io.BytesIO(b"".join(chunks)), newline=None).read()


_SERVER: list[ForkServer | None] = []  # this process's, once asked for; [None] where it could not start
_STARTING = threading.Lock()  # two threads' first calls start one server


def _server() -> ForkServer | None:
    with _STARTING:
        if not _SERVER:
            try:
                _SERVER.append(ForkServer())
            except OSError:
                _SERVER.append(None)
        return _SERVER[0]


def close_server() -> None:
    """Stops this process's fork server, if it started (at the end of the session: `pytest_sessionfinish`)."""
    if _SERVER and _SERVER[0] is not None:
        _SERVER[0].close()
    _SERVER[:] = [None]


def pytest_sessionfinish(session: pytest.Session) -> None:  # noqa: ARG001 - the hook's signature
    close_server()
