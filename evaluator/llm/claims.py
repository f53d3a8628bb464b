"""Cross-process claims: two processes on one response cache never send the same call twice.

Each fresh call holds a claim while it is on its way (an atomic diskcache row with a lease, cache.py),
renewed in the background while held. A process that finds a call claimed by another waits for that
one's reply to appear in the cache, or for the claim to be freed (given up, or its owner dead), and then
makes the call itself. Claims of calls cancelled with the engine are freed at once on close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from evaluator.llm.cache import ResponseCache, new_owner
from evaluator.llm.reply import ChatResult

log = logging.getLogger("evaluator.llm")

CLAIM_LEASE_S = 30.0  # a claim not renewed for this long is free for another process to take


class Claims:
    """The claims one engine holds on `cache` (`name`: the model, for warnings)."""

    def __init__(self, cache: ResponseCache, name: str, lease_s: float = CLAIM_LEASE_S) -> None:
        self._cache = cache
        self._name = name
        self._lease = lease_s
        self._owner = new_owner()
        self._held: set[str] = set()
        self._renewer: asyncio.Task[None] | None = None

    def holds(self, key: str) -> bool:
        return key in self._held

    def take(self, key: str) -> bool:
        """Claim `key`; False while another live process holds it. Raises the cache's error when the claim
        cannot be written (the command stops: without claims, processes could pay twice)."""
        if not self._cache.claim(key, self._owner, self._lease):
            return False
        self._held.add(key)
        return True

    def release(self, key: str) -> None:
        """Free `key`'s claim (never raises) once its call ended, however it ended."""
        if key in self._held:
            self._held.discard(key)
            self._cache.release([key], self._owner)

    def release_all(self) -> None:
        """Cancelled calls: let other processes take them at once rather than after the lease."""
        if self._held:
            self._cache.release(list(self._held), self._owner)
            self._held.clear()

    async def wait_for_other(self, key: str, lookup: Callable[[str], ChatResult | None],
                             stop: Callable[[], BaseException | None]) -> ChatResult | None:
        """Another process holds `key`: poll for its reply (`lookup`); None once the claim is free.
        `stop()` returns the engine's fatal error, raised at once when the command stops meanwhile."""
        delay = 0.02
        while True:
            if (fatal := stop()) is not None:
                raise fatal
            await asyncio.sleep(delay)
            delay = min(1.0, delay * 1.5)
            if (hit := lookup(key)) is not None:
                return hit
            if not self._cache.held_elsewhere(key, self._owner):
                return None

    def start(self) -> None:
        """Renew the held claims every third of a lease, until `stop`."""
        if self._renewer is None:
            self._renewer = asyncio.create_task(self._renew())

    async def stop(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
            self._renewer = None

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self._lease / 3)
            if self._held:
                try:
                    self._cache.renew(list(self._held), self._owner, self._lease)
                except Exception as e:  # noqa: BLE001 - a lost renewal costs at most a duplicate request
                    log.warning("%s: cannot renew in-flight claims in the cache (%s)", self._name, e)
