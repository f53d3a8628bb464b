"""asyncio helpers shared by the fan-outs (pipeline, request files)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any


async def cancel_all(tasks: Sequence[asyncio.Task[Any]]) -> None:
    """Cancel every task and wait until each has finished, so no call outlives the run that made it."""
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
