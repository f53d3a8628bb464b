"""Every process a test starts: in its own process group (a new session), stopped by that group, also when the
test fails or a wait times out, so nothing it started (a CLI's simulator or llama.cpp server, a Ray head's
workers) outlives it.

    with started([PYTHON, "-m", "evaluator", ...]) as p:   # stopped by group when the block ends, however
        ...
    done = run([PYTHON, "-m", "evaluator", ...], timeout=600)   # a CompletedProcess; the group killed on timeout
    with simulator(latency_s=0.5) as sim:                   # `python -m simulator` in its own group

As a plugin (tests/conftest.py), it also stops whatever a test body started through `start()` and left running,
and at the end of the session lists every process the suite started that is still alive, by the session's
marker in their environment (`SESSION_ENV`, inherited by every child): the run then fails and they are killed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import selectors
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest

from helpers import REPO
from simulator.harness import SimHandle
from simulator.server import config_from

PYTHON = sys.executable
SESSION_ENV = "EVALUATOR_TEST_SESSION"  # every process the suite starts inherits it: how leftovers are found
LEFTOVER_GRACE_S = 15.0  # a process told to stop at the end of a test may take this long to go

_started: list[subprocess.Popen[Any]] = []  # by `start()`, in order; a test's share is stopped after its call


def child_env(extra: Mapping[str, str | None] | None = None, *, tests: bool = False) -> dict[str, str]:
    """This environment for a child: the worktree's code first on PYTHONPATH (and `tests/`, for a child that imports
    `helpers`), no data folder (`EVALUATOR_DATA`); `extra` sets variables, a None value removes one."""
    env = dict(os.environ)
    paths = [str(REPO), *([str(REPO / "tests")] if tests else []), *filter(None, [env.get("PYTHONPATH")])]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.pop("EVALUATOR_DATA", None)
    for k, v in (extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def start(cmd: Sequence[str], *, cwd: Path | str = REPO, env: Mapping[str, str] | None = None, text: bool = True,
          stdin: Any = subprocess.DEVNULL, stdout: Any = subprocess.PIPE, stderr: Any = subprocess.PIPE,
          kept: bool = False, **kw: Any) -> subprocess.Popen[Any]:
    """`cmd` in a new process group (its pid is the group's id); stdin is /dev/null unless given. Its environment
    (`child_env()` unless given) carries the session's marker, whatever else it holds. Stopped after the test that
    started it, unless `kept`: a process that serves the whole session (helpers/cli.py's fork server), stopped by
    its owner at the session's end."""
    env = dict(child_env() if env is None else env)
    if SESSION_ENV in os.environ:
        env.setdefault(SESSION_ENV, os.environ[SESSION_ENV])
    p = subprocess.Popen(list(cmd), cwd=cwd, env=env, text=text, stdin=stdin, stdout=stdout, stderr=stderr,
                         start_new_session=True, **kw)
    if not kept:
        _started.append(p)
    return p


def group_alive(pgid: int) -> bool:
    """Whether any process of group `pgid` is left (a zombie not yet reaped counts)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(pgid: int, grace_s: float = 5.0) -> None:
    """SIGTERM to group `pgid`, SIGKILL to what is left of it after `grace_s` (or at once): for a process this one
    did not start itself (the commands run_cli's fork server forks, each the leader of its group)."""
    if grace_s:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and group_alive(pgid):
            time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def stop(p: subprocess.Popen[Any], grace_s: float = 5.0) -> None:
    """SIGTERM to `p`'s whole group, SIGKILL to it after `grace_s`, `p` reaped and its pipes closed; the group's
    other members are killed too, also when `p` itself had already exited. Safe to call again."""
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)  # anything it started in its group and left behind
    for f in (p.stdin, p.stdout, p.stderr):
        if f is not None:
            with contextlib.suppress(OSError):
                f.close()


@contextlib.contextmanager
def started(cmd: Sequence[str], **kw: Any) -> Iterator[subprocess.Popen[Any]]:
    """`start(cmd)` for the block; stopped by group when it ends, whatever ended it."""
    p = start(cmd, **kw)
    try:
        yield p
    finally:
        stop(p)


def communicate(p: subprocess.Popen[Any], timeout: float, what: str = "") -> tuple[Any, Any]:
    """`p.communicate()`; past `timeout` the group is stopped and the test fails naming what hung."""
    try:
        return p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(p)
        out, err = p.communicate()
        tail = (err or "")[-2000:] if isinstance(err, str) else repr((err or b"")[-2000:])
        pytest.fail(f"{what or ' '.join(map(str, p.args))[:300]} did not end in {timeout:.0f} s; stopped. "
                    f"stderr: {tail}")


def read_line(p: subprocess.Popen[bytes], timeout_s: float = 300.0) -> str:
    """The next line `p` writes on stdout (started with `text=False, bufsize=0`: nothing read ahead into a buffer
    that a wait on the pipe would not see); the test fails if none comes within `timeout_s` (a hang, not a speed)."""
    assert p.stdout is not None
    line = b""
    with selectors.DefaultSelector() as sel:
        sel.register(p.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        while not line.endswith(b"\n"):
            if not sel.select(max(0.0, deadline - time.monotonic())):
                pytest.fail(f"{' '.join(map(str, p.args))[:200]} wrote no line in {timeout_s:.0f} s")
            byte = p.stdout.read(1)
            if not byte:
                break  # it closed its stdout (exited)
            line += byte
    return line.decode()


def run(cmd: Sequence[str], *, timeout: float = 600, input: str | bytes | None = None,
        **kw: Any) -> subprocess.CompletedProcess[Any]:
    """`cmd` to its end as `subprocess.run(capture_output=True)` does, in its own group, stopped by group on
    timeout (the test fails) and once it ended (nothing it started outlives it)."""
    p = start(cmd, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL, **kw)
    try:
        if input is not None:
            out, err = p.communicate(input, timeout=timeout)
        else:
            out, err = communicate(p, timeout)
    finally:
        stop(p)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def wait_until(done: Callable[[], Any], *alive: subprocess.Popen[Any], timeout_s: float = 300.0,
               what: str = "") -> Any:
    """Poll `done()` (every 20 ms) until it is true and return it: a state reached, never a time waited. Fails when
    a process of `alive` ends first (with its stderr) or after `timeout_s`, a bound for a hang, not a measure."""
    deadline = time.monotonic() + timeout_s
    while not (got := done()):
        for p in alive:
            if p.poll() is not None:
                out, err = p.communicate()
                pytest.fail(f"{' '.join(map(str, p.args))[:200]} ended (exit {p.returncode}) before "
                            f"{what or 'the state waited for'}: {(err or out or '')[-2000:]!s}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what or 'the state waited for'} not reached in {timeout_s:.0f} s")
        time.sleep(0.02)
    return got


class GroupSim(SimHandle):
    """A simulator in its own process group (`simulator()`), stopped by that group."""

    def stop(self) -> None:
        stop(self.proc)


def simulator(*, host: str = "127.0.0.1", timeout_s: float = 60.0, wait: bool = True, **knobs: Any) -> GroupSim:
    """`python -m simulator` with `knobs` (simulator/server.py `SimConfig`) on a free port, as
    `simulator.harness.start_simulator` starts it but in its own process group; a context manager."""
    cfg = orjson.dumps(dataclasses.asdict(config_from(None, **knobs))).decode()
    proc = start([PYTHON, "-m", "simulator", "--host", host, "--port", "0", "--exit-with-parent", "--config-json", cfg],
                 text=False, stderr=None)
    handle = GroupSim(proc, timeout_s)
    return handle.wait() if wait else handle  # type: ignore[return-value]


# -- as a plugin ----------------------------------------------------------------------------------------------
def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault(SESSION_ENV, uuid.uuid4().hex)  # xdist's workers inherit the controller's


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """What the test body started through `start()` and left running is stopped by group after it, pass or fail."""
    before = len(_started)
    try:
        return (yield)
    finally:
        for p in _started[before:]:
            stop(p)
        del _started[before:]


def leftovers(marker: str, *, exclude: set[int]) -> list[psutil.Process]:
    """Live processes (not zombies) whose environment carries `SESSION_ENV=marker`, other than `exclude`."""
    found = []
    for p in psutil.process_iter(["pid", "status"]):
        if p.pid in exclude or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if p.environ().get(SESSION_ENV) == marker:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """In the main process, once xdist's workers are gone: any process the suite started that is still alive fails
    the run, named with its command line, and is killed (with its group)."""
    if hasattr(session.config, "workerinput"):
        return
    marker = os.environ.get(SESSION_ENV)
    if not marker:
        return
    me = psutil.Process()
    # multiprocessing's resource tracker (a test's in-process embedder export starts one) ends when this process does
    trackers = {c.pid for c in me.children() if "multiprocessing.resource_tracker" in " ".join(_cmdline(c))}
    exclude = {me.pid, *(p.pid for p in me.parents()), *trackers}
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while (alive := _not_workers(leftovers(marker, exclude=exclude))) and time.monotonic() < deadline:
        time.sleep(0.5)
    if not alive:
        return
    lines = [f"  pid {p.pid} (group {_pgid(p)}): {' '.join(_cmdline(p))[:300]}" for p in alive]
    for p in alive:
        if _pgid(p) != os.getpgid(0):  # a leftover in this process's own group is killed alone, not with us
            with contextlib.suppress(ProcessLookupError, PermissionError, psutil.Error):
                os.killpg(_pgid(p), signal.SIGKILL)
        with contextlib.suppress(psutil.Error):
            p.kill()
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    text = f"{len(alive)} process(es) the suite started outlived it (now killed):\n" + "\n".join(lines)
    if reporter is not None:
        reporter.write_sep("=", "processes left behind", red=True)
        reporter.write_line(text)
    else:
        print(text, file=sys.stderr)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _not_workers(found: list[psutil.Process]) -> list[psutil.Process]:
    """Without xdist's workers (execnet's bootstrap command line), which may still be exiting."""
    return [p for p in found if _XDIST_WORKER not in " ".join(_cmdline(p))]


_XDIST_WORKER = "import sys;exec(eval(sys.stdin.readline()))"  # execnet's `popen_bootstrapline`


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return ["?"]


def _pgid(p: psutil.Process) -> int:
    try:
        return os.getpgid(p.pid)
    except ProcessLookupError:
        return p.pid
