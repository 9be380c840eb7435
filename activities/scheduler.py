"""The scheduler service's API as local activities of the trajectory workflow."""

from __future__ import annotations

import time

from temporalio import activity

from heddle import activity_names as names
from heddle.types import DecideRequest, Decision, StepReport, TrajectoryDone
from scheduler.service import SchedulerService


class SchedulerActivities:
    def __init__(self, *, service: SchedulerService) -> None:
        self.service = service

    @activity.defn(name=names.DECIDE)
    async def decide(self, request: DecideRequest) -> Decision:
        return self.service.decide(request, time.time())

    @activity.defn(name=names.ANTICIPATE)
    async def anticipate(self, request: DecideRequest) -> Decision | None:
        return self.service.anticipate(request, time.time())

    @activity.defn(name=names.REPORT_STEP)
    async def report_step(self, report: StepReport) -> None:
        self.service.report(report)

    @activity.defn(name=names.REPORT_DONE)
    async def report_done(self, done: TrajectoryDone) -> None:
        self.service.finished(done)
