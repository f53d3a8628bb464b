"""The servers a command starts on this machine for its profiles, behind one protocol (`ModelServer`).

A simulated profile without an endpoint gets a simulator (`simulator.harness`), a profile with `local_model` and
no endpoint the bundled llama.cpp server (`llamacpp.llama_server`), each a child process started at once and ready
a moment later (the loading and embedding run meanwhile). Whatever the kind, the command points the profile at it
(`ready`, which waits), hands its engine `locate` (asked at every request: a restarted llama.cpp server listens on
another port), reads what it counted for meta.json (`stats`) and stops it (`stop`), so no use case tells the two
apart.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from evaluator.llamacpp import llama_server
from evaluator.llm import ModelProfile, revised
from evaluator.results.schema import LocalServer, SimulatorStats
from simulator.harness import SimHandle, start_simulator


@dataclass(frozen=True)
class ServerStats:
    """What one server counted, as meta.json's `runtime` keeps it: the simulator's own count of what it answered
    (`simulator_stats`), or the bundled model's file, hash, sizing and counters (`local_server`)."""

    simulator: SimulatorStats | None = None
    llamacpp: LocalServer | None = None


class ModelServer(Protocol):
    """A server this process started for one profile."""

    def ready(self, p: ModelProfile) -> ModelProfile:
        """`p` pointed at this server, once it answers (waits for that)."""
        ...

    def locate(self) -> str:
        """Its base URL now (ends in /v1); the engine asks at every request."""
        ...

    def stats(self) -> ServerStats: ...

    def stop(self) -> None:
        """Stopped (again: nothing)."""
        ...


@dataclass(frozen=True)
class Simulator:
    """`python -m simulator` on a free loopback port."""

    handle: SimHandle

    def ready(self, p: ModelProfile) -> ModelProfile:
        return revised(p, base_url=self.handle.base_url)

    def locate(self) -> str:
        return self.handle.base_url

    def stats(self) -> ServerStats:
        return ServerStats(simulator=SimulatorStats.from_dict(self.handle.stats()))

    def stop(self) -> None:
        self.handle.stop()


@dataclass(frozen=True)
class LlamaCpp:
    """The bundled llama.cpp server, restarted by its watchdog when it dies mid-run."""

    handle: llama_server.LlamaHandle

    def ready(self, p: ModelProfile) -> ModelProfile:
        return llama_server.use(p, self.handle)

    def locate(self) -> str:
        return self.handle.locate()

    def stats(self) -> ServerStats:
        return ServerStats(llamacpp=LocalServer(**self.handle.stats()))

    def stop(self) -> None:
        self.handle.stop()


def start_server(p: ModelProfile, cache_root: Path) -> ModelServer | None:
    """The server `p` needs started here, not waited for: none when it names an endpoint or is a provider's."""
    if p.connection.base_url:
        return None
    if p.server.simulated:
        return Simulator(start_simulator(wait=False))
    if p.server.local_model:
        return LlamaCpp(llama_server.start_llamacpp(p, cache_root))
    return None


def start_servers(stack: contextlib.ExitStack, profiles: dict[str, ModelProfile],
                  cache_root: Path) -> dict[str, ModelServer]:
    """The servers these profiles need, by profile name, started without waiting; each stops with `stack` (an
    error, Ctrl-C, SIGTERM) if not before."""
    out: dict[str, ModelServer] = {}
    for name, p in profiles.items():
        server = start_server(p, cache_root)
        if server is not None:
            stack.callback(server.stop)
            out[name] = server
    return out


def served(profiles: dict[str, ModelProfile], servers: dict[str, ModelServer]) -> dict[str, ModelProfile]:
    """The profiles, each with a server pointed at it once it answers (a new dict: the caller's profiles, as
    declared, are what meta.json states)."""
    return {n: servers[n].ready(p) if n in servers else p for n, p in profiles.items()}
