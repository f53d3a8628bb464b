"""asyncio helpers shared by the fan-outs (pipeline, request files), and the stop signals.

SIGTERM and SIGHUP (a `kill`, a closed terminal, a container stop) end a run the way Ctrl-C does:
`interrupt_on_stop_signals` hands them to the current SIGINT handler. Under `asyncio.run` that handler
cancels the main task, so the fan-outs cancel their calls, and a call whose request is already on the
wire gets the engine's short grace period to receive and store its reply (llm/engine.py) before the
run ends with KeyboardInterrupt (the CLI's one line, exit code 130).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Sequence
from types import FrameType
from typing import Any

STOP_SIGNALS = ("SIGTERM", "SIGHUP")
_received: list[str] = []


async def cancel_all(tasks: Sequence[asyncio.Task[Any]]) -> None:
    """Cancel every task and wait until each has finished, so no call outlives the run that made it."""
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def interrupt_on_stop_signals() -> None:
    """Make SIGTERM and SIGHUP behave as SIGINT (Ctrl-C) for the rest of the process (main thread only)."""
    for name in STOP_SIGNALS:
        sig = getattr(signal, name, None)
        if sig is not None:  # no SIGHUP on Windows
            signal.signal(sig, _as_interrupt)


def _as_interrupt(signum: int, frame: FrameType | None) -> None:
    _received.append(signal.Signals(signum).name)
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):  # asyncio.run's (cancels the main task) or Python's default (KeyboardInterrupt)
        handler(signal.SIGINT, frame)
    else:  # SIGINT ignored (a background job): still stop
        raise KeyboardInterrupt


def stop_signal() -> str | None:
    """The name of the last stop signal received ("SIGTERM", "SIGHUP"), or None (Ctrl-C or none)."""
    return _received[-1] if _received else None
