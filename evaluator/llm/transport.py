"""How the engine's requests reach a server: the `Transport` protocol, its aiohttp implementation, and an
in-process fake.

A transport sends one prepared HTTP request (`Request`: method, URL, headers, body, the attempt's timeout)
and returns what came back (`Response`: status, headers, body), or raises `NoReply` when nothing did
(a timeout, nothing listening, a connection cut, a TLS handshake that failed: a certificate not trusted says so in
plain words). It decides nothing: statuses, retries and pacing are the engine's (engine.py, decide.py).

`MockTransport(handler)` answers each request with `handler(request)` (a plain or async function) in this
process, without a socket — in the spirit of httpx's `MockTransport`. A handler simulates a lost
connection by raising `NoReply`; the request's timeout is applied as aiohttp applies it, so a handler
that takes too long is a timeout. The engine tests use it with the simulator's own handlers
(simulator/inprocess.py); the real socket is tested against the simulator's server.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy

from evaluator.core.errors import InternalSignal
from evaluator.llm.decide import TransportFailure


@dataclass(frozen=True)
class Request:
    """One HTTP request as the engine prepared it (no secret is logged from here: headers hold the key)."""

    method: Literal["GET", "POST"]
    url: str
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    timeout_s: float = 60.0  # the whole exchange, from the moment it is sent


@dataclass(frozen=True)
class Response:
    """What the server answered: any status (errors are the engine's to read), its headers and body.

    Header names are case-insensitive, as HTTP's are (a handler's plain dict is made so here).
    """

    status: int
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.headers, CIMultiDictProxy | CIMultiDict):
            object.__setattr__(self, "headers", CIMultiDictProxy(CIMultiDict(self.headers)))


class NoReply(InternalSignal):
    """No HTTP answer came back; `error` says which way (decide.py reads it). Internal: the engine (and the server
    facts' probe) catches it and turns it into a `TransportFailure` value, then a retry or a failed call; it
    never reaches a user as an exception."""

    def __init__(self, kind: Literal["timeout", "connect", "connection", "tls"], detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.error = TransportFailure(kind, detail)


def tls_problem(e: aiohttp.ClientSSLError) -> str:
    """A failed TLS handshake in plain words: "certificate not trusted: self-signed certificate", or "TLS handshake
    failed: ..." (the one wording, for the engine and the batch APIs)."""
    if isinstance(e, aiohttp.ClientConnectorCertificateError):
        return f"certificate not trusted: {getattr(e.certificate_error, 'verify_message', None) or e.certificate_error}"
    return f"TLS handshake failed: {getattr(e, 'strerror', None) or e}"


class Transport(Protocol):
    """Sends one request, returns its response or raises `NoReply`; `aclose` ends what it holds open."""

    async def send(self, request: Request) -> Response: ...

    async def aclose(self) -> None: ...


class AiohttpTransport:
    """The real one: one pooled aiohttp session per engine (`limit` connections), per-request timeouts.

    `trust_env` honours HTTP(S)_PROXY from the environment (real providers; never for local servers).
    """

    def __init__(self, *, limit: int, trust_env: bool) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=limit, ttl_dns_cache=300), trust_env=trust_env,
        )

    async def send(self, request: Request) -> Response:
        # Per attempt: the clock starts when the request is sent (after the slot and pacing).
        timeout = aiohttp.ClientTimeout(total=request.timeout_s)
        try:
            async with self._session.request(request.method, request.url, data=request.body or None,
                                             headers=dict(request.headers), timeout=timeout) as resp:
                return Response(resp.status, await resp.read(), resp.headers)
        except TimeoutError:
            raise NoReply("timeout") from None
        except aiohttp.ClientSSLError as e:  # before ClientConnectorError, of which it is one
            raise NoReply("tls", tls_problem(e)) from None
        except aiohttp.ClientConnectorError as e:
            raise NoReply("connect", type(e).__name__) from None
        except aiohttp.ClientError as e:
            raise NoReply("connection", type(e).__name__) from None

    async def aclose(self) -> None:
        await self._session.close()


Handler = Callable[[Request], Response | Awaitable[Response]]


class MockTransport:
    """Answers every request with `handler(request)` in this process (no socket); see the module doc."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self.closed = False

    async def send(self, request: Request) -> Response:
        if self.closed:
            raise RuntimeError("MockTransport used after aclose()")
        try:
            async with asyncio.timeout(request.timeout_s):
                got = self._handler(request)
                return await got if inspect.isawaitable(got) else got
        except TimeoutError:
            raise NoReply("timeout") from None

    async def aclose(self) -> None:
        self.closed = True
