"""asyncio helpers shared by the fan-outs (pipeline, request files), and the stop signals.

SIGTERM, SIGHUP and SIGINT (a `kill`, a scheduler's stop, a closed terminal, Ctrl-C) end a command the same
way, in the foreground and in the background: `run` (the one entry into asyncio) cancels the main task
at the first one, so the fan-outs cancel their calls, and a call whose request is already on the wire
gets the engine's grace period (`--stop-grace`, llm/engine.py) to receive and store its reply before
the command ends with KeyboardInterrupt (the CLI's one line, exit code 130). A second signal ends the wait
at once. `interrupt_on_stop_signals` installs the handler for SIGTERM and SIGHUP; SIGINT is handled by
asyncio's own runner when it is at its default, and stays ignored when the process was started with it
ignored (`nohup`, `cmd &` in a script): that job is stopped by SIGTERM or SIGHUP, never by a terminal's
Ctrl-C. We first routed SIGTERM through SIGINT's handler; with SIGINT ignored there was none, the signal
raised KeyboardInterrupt wherever the loop happened to be, and no call on the wire was kept.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Coroutine, Sequence
from types import FrameType
from typing import Any, TypeVar

STOP_SIGNALS = ("SIGTERM", "SIGHUP")
_received: list[str] = []
_main: list[tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = []  # the running `run`'s loop and main task
T = TypeVar("T")


async def cancel_all(tasks: Sequence[asyncio.Task[Any]]) -> None:
    """Cancel every task and wait until each has finished, so no call outlives the command that made it.
    (Cancelled again meanwhile, it still returns only once every task is done: `gather` with
    `return_exceptions` waits for all of its children before it raises.)"""
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def gather_all(*aws: Awaitable[T]) -> list[T]:
    """`asyncio.gather(*aws)` that, when cancelled or when one fails, waits for every sibling to finish.

    Plain `gather` raises as soon as its first child ends cancelled: the other children go on alone, and
    the command closes the HTTP session under a call still inside its grace period (a PtR call beside an RtP
    one was dropped so, issue 31).
    """
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        await cancel_all(tasks)
        raise


def run(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)`, stopped by a stop signal as by Ctrl-C: the main task is cancelled (the calls on
    the wire get their grace), then KeyboardInterrupt is raised."""
    async def main() -> T:
        task = asyncio.current_task()
        assert task is not None
        _main.append((asyncio.get_running_loop(), task))
        try:
            return await coro
        finally:
            _main.pop()

    stops = len(_received)
    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        if len(_received) > stops:  # cancelled by a stop signal: the same end as Ctrl-C
            raise KeyboardInterrupt from None
        raise


def interrupt_on_stop_signals() -> None:
    """Make SIGTERM and SIGHUP stop the process as Ctrl-C does (main thread only)."""
    for name in STOP_SIGNALS:
        sig = getattr(signal, name, None)
        if sig is not None:  # no SIGHUP on Windows
            signal.signal(sig, _on_stop)


def _on_stop(signum: int, frame: FrameType | None) -> None:
    first = not _received
    _received.append(signal.Signals(signum).name)
    if _main and first:
        loop, task = _main[-1]
        loop.call_soon_threadsafe(task.cancel)  # the handler runs between bytecodes: cancel from the loop
        return
    raise KeyboardInterrupt  # outside the loop (loading, embedding), or a second signal: stop now


def stop_signal() -> str | None:
    """The name of the last stop signal received ("SIGTERM", "SIGHUP"), or None (Ctrl-C or none)."""
    return _received[-1] if _received else None
