"""A warm interpreter that forks `python -m evaluator` for `helpers.cli.run_cli`: the test suite's fork server.

Each CLI call in a child process pays for its interpreter and its imports before it does anything (about 1 s of
CPU on 2 cores: the evaluator's modules, scipy.stats, OpenVINO, FAISS, matplotlib), and the suite makes a few
hundred of them. This process imports those once (`PRELOAD`), then, for each request on its Unix socket, forks a
child that becomes `python -m evaluator ARGS` as a fresh process would: a new session (its own process group),
the caller's stdin, stdout and stderr (passed as file descriptors), working directory, environment and
`sys.path`, the default signal handlers, then `evaluator/__main__.py` run as `__main__`. Nothing but imports
happened before the fork, so what the child does is what a cold start does after its imports.

Protocol, one connection per call: the client sends a 4-byte big-endian length and that many bytes of JSON
({"args", "cwd", "env"}) with three descriptors (stdin, stdout, stderr) on the first message; the server
answers `{"pid": N}` once the child is forked and `{"exit": CODE}` once it was reaped (CODE as
`subprocess` gives it: negative for a signal). The server ends when its parent (the test worker) is gone, or on
SIGTERM.

Started by `helpers.cli` as `python -c "from helpers.forkserver import serve; serve()" SOCKET`; imports no pytest.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import struct
import sys
from typing import Any

# What a study imports, in the order it imports them (the embedding and index modules set the OpenMP environment
# before FAISS is loaded: evaluator/core/threads.py).
PRELOAD = ("evaluator.cli.main", "evaluator.retrieval.embed", "evaluator.retrieval.index", "faiss", "openvino",
           "openvino.properties.hint", "scipy.stats", "evaluator.render.charts")
HEADER = struct.Struct(">I")
POLL_S = 0.05  # how often children are reaped and the parent checked


def _preload() -> None:
    for name in PRELOAD:
        with contextlib.suppress(ImportError):  # an optional extra not installed: the child imports it or not
            importlib.import_module(name)
    with contextlib.suppress(ImportError):
        from evaluator.render import charts

        charts.pyplot()  # matplotlib on Agg, as the first figure drawn would load it


def _read_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
    while len(data) < HEADER.size:
        more = conn.recv(1 << 16)
        if not more:
            raise ConnectionError("request cut short")
        data += more
    (size,) = HEADER.unpack_from(data)
    while len(data) < HEADER.size + size:
        more = conn.recv(1 << 16)
        if not more:
            raise ConnectionError("request cut short")
        data += more
    return json.loads(data[HEADER.size:HEADER.size + size]), list(fds)


def _send(conn: socket.socket, msg: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the client gave up (its timeout): the child is its to stop
        conn.sendall(json.dumps(msg).encode() + b"\n")


def _become_cli(req: dict[str, Any], fds: list[int], site: list[str]) -> None:
    """In the forked child: the process `python -m evaluator ARGS` would be, then that command; never returns."""
    code = 1
    try:
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # sys.path as `python -m` builds it: the working directory, then $PYTHONPATH, then the interpreter's own
        paths = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [os.getcwd(), *paths, *site]
        for name in [m for m in sys.modules if m == "helpers" or m.startswith("helpers.")]:
            del sys.modules[name]  # the suite's own modules are no part of the command
        sys.argv = ["evaluator", *req["args"]]
        runpy.run_module("evaluator", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:  # as the interpreter ends on it
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - what escapes is printed as the interpreter would, exit 1
        with contextlib.suppress(BaseException):
            sys.excepthook(*sys.exc_info())
        code = 1
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve(path: str | None = None) -> None:
    path = path or sys.argv[1]
    parent = os.getppid()
    zygote_paths = set(filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    site = [p for p in sys.path[1:] if p not in zygote_paths]  # sys.path[0] is `-c`'s '' (the working directory)
    _preload()
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    waiting: dict[int, socket.socket] = {}  # child pid -> the connection its exit code goes to
    with selectors.DefaultSelector() as sel:
        sel.register(listener, selectors.EVENT_READ)
        while os.getppid() == parent:
            if sel.select(POLL_S):
                conn, _ = listener.accept()
                try:
                    req, fds = _read_request(conn)
                except (OSError, ValueError):
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    for other in waiting.values():
                        other.close()
                    conn.close()
                    _become_cli(req, fds, site)
                for fd in fds:
                    os.close(fd)  # the child's now: the client sees end of file once the child closes them
                _send(conn, {"pid": pid})
                waiting[pid] = conn
            while waiting:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                if (conn := waiting.pop(pid, None)) is not None:
                    _send(conn, {"exit": os.waitstatus_to_exitcode(status)})
                    conn.close()
    os._exit(0)
