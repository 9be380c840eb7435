"""The control workflow's waits, run by the process that hosts the engines (task queue
`control`): until retiring instances hold no step, and until new ones are up."""

from __future__ import annotations

import asyncio

from temporalio import activity

from activities.heartbeat import heartbeating
from heddle import activity_names as names
from heddle.engine_host import RECONCILE_EVERY_S, EngineHost

POLL_S = 0.1
# Idle this long before an instance counts as drained: every process has then read the
# plan that marks it draining, so no new step is decided for it.
SETTLE_S = 4 * RECONCILE_EVERY_S


class ControlActivities:
    def __init__(self, *, host: EngineHost) -> None:
        self.host = host

    @activity.defn(name=names.WAIT_DRAINED)
    async def wait_drained(self, instance_ids: list[str]) -> None:
        host = self.host
        idle_since: float | None = None
        loop = asyncio.get_running_loop()
        async with heartbeating():
            while True:
                busy = any(host.load(i) or host.service.in_flight.get(i, 0) for i in instance_ids)
                if busy:
                    idle_since = None
                elif idle_since is None:
                    idle_since = loop.time()
                elif loop.time() - idle_since >= SETTLE_S:
                    return
                await asyncio.sleep(POLL_S)

    @activity.defn(name=names.WAIT_STARTED)
    async def wait_started(self, instance_ids: list[str]) -> None:
        async with heartbeating():
            while not all(self.host.is_up(i) for i in instance_ids):  # noqa: ASYNC110 (polls the host)
                await asyncio.sleep(POLL_S)
