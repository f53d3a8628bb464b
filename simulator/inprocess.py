"""The simulator answered in this process, without a socket: the same routes, replies and faults.

    sim = InProcessSimulator(latency_s=0.01)
    status, headers, body = await sim.handle("POST", url, headers, body)   # from a client's fake transport

The handlers are the server's own (server.py); only the socket is left out. So a fault that the server
serves by cutting the connection (`drop`) raises `ConnectionResetError` here, and a `hang` is a handler
that takes `hang_s` (the client's timeout ends it). `configure`, `stats` and `reset_stats` are those of
the subprocess's `SimHandle` (harness.py), so a test can use either. The engine's tests put it behind
their in-process transport (evaluator/llm/transport.py `MockTransport`); the socket, the subprocess and
the admin routes are tested with the real server.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from simulator import anthropic_wire
from simulator.batch import BatchSim
from simulator.server import SimConfig, Simulator, _Stats, config_from


class _Request:
    """What the server's handlers read of an aiohttp request: headers, the body, no transport."""

    transport = None  # nothing to abort: `drop` raises ConnectionResetError instead

    def __init__(self, headers: Mapping[str, str], body: bytes) -> None:
        self.headers = headers
        self._body = body

    async def read(self) -> bytes:
        return self._body


class InProcessSimulator:
    """One simulator, its knobs and its stats, called as a function (see the module doc)."""

    base_url = "http://simulator.invalid/v1"  # never resolved: nothing leaves the process

    def __init__(self, config: SimConfig | None = None, **knobs: Any) -> None:
        self.server = Simulator(config_from(config, **knobs))
        s = self.server
        anthropic = anthropic_wire.MessagesRoutes(s, BatchSim(s))
        self._routes: dict[tuple[str, str], Callable[[Any], Awaitable[web.StreamResponse]]] = {
            ("POST", "/v1/chat/completions"): s.chat, ("GET", "/v1/models"): s.models,
            ("GET", "/props"): s.props, ("GET", "/slots"): s.slots, ("POST", "/v1/messages"): anthropic.messages,
        }

    async def handle(self, method: str, url: str, headers: Mapping[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        """The server's answer to one request; raises `ConnectionResetError` where it cuts the connection."""
        route = self._routes.get((method, urlsplit(url).path))
        if route is None:
            return 404, {"Content-Type": "text/plain; charset=utf-8"}, b"404: Not Found"  # aiohttp's own
        resp = await route(_Request(headers, body))
        assert isinstance(resp, web.Response)
        raw = resp.body
        return resp.status, dict(resp.headers), raw if isinstance(raw, bytes) else b""

    def stats(self) -> dict[str, Any]:
        return self.server.stats.as_dict()

    def reset_stats(self) -> dict[str, Any]:
        self.server.stats = _Stats(in_flight=self.server.stats.in_flight)
        return self.stats()

    def configure(self, *, reset: bool = False, **knobs: Any) -> dict[str, Any]:
        """Change knobs at runtime; `reset=True` starts again from the defaults (as `/admin/config`)."""
        self.server.apply(config_from(SimConfig() if reset else self.server.cfg, **knobs))
        return dataclasses.asdict(self.server.cfg)
