"""The scheduler service's API as activities of the trajectory workflow: local ones (the
service of the worker process), or on the engine host's control queue (its service)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from temporalio import activity

from heddle import activity_names as names
from heddle.types import DecideRequest, Decision, StepReport, TrajectoryDone
from scheduler.service import BatchNotPlanned, SchedulerService


class SchedulerActivities:
    def __init__(
        self,
        *,
        service: SchedulerService,
        replan: Callable[[str, str], Awaitable[None]] | None = None,
    ) -> None:
        self.service = service
        self.replan = replan  # plans a batch again after a restart (the engine host's)

    async def _ensure_planned(self, request: DecideRequest) -> None:
        if request.planned and not self.service.is_planned(request.policy, request.batch_id):
            if self.replan is None:
                raise BatchNotPlanned(request.policy, request.batch_id)
            await self.replan(request.policy, request.batch_id)

    @activity.defn(name=names.DECIDE)
    async def decide(self, request: DecideRequest) -> Decision:
        await self._ensure_planned(request)
        return self.service.decide(request, time.time())

    @activity.defn(name=names.ANTICIPATE)
    async def anticipate(self, request: DecideRequest) -> Decision | None:
        await self._ensure_planned(request)
        return self.service.anticipate(request, time.time())

    @activity.defn(name=names.REPORT_STEP)
    async def report_step(self, report: StepReport) -> None:
        self.service.report(report)

    @activity.defn(name=names.REPORT_DONE)
    async def report_done(self, done: TrajectoryDone) -> None:
        self.service.finished(done)
