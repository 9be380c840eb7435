"""Keep an activity's heartbeat going while it waits, so a dead worker is noticed within
the heartbeat timeout instead of the (long) start-to-close timeout."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from temporalio import activity

HEARTBEAT_EVERY_S = 1.0


@contextlib.asynccontextmanager
async def heartbeating(details: Callable[[], Any] | None = None) -> AsyncIterator[None]:
    """Heartbeat every second with `details()` (progress to resume from) while inside.
    The first beat comes after a second, not at once: a short step then costs the server
    no heartbeat at all."""

    async def beat() -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_EVERY_S)
            if details is None:
                activity.heartbeat()
            else:
                activity.heartbeat(details())

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
