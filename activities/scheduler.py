"""The scheduler service's API as local activities of the trajectory workflow: whichever
worker runs the workflow calls the engine host's service (in its own process, or over
the host's socket), so a decide costs no Temporal round trip.

`anticipate` and `report_step` serve trajectories started before the lean step path
(their engine host now does both itself), also as activities on the control queue.
"""

from __future__ import annotations

from temporalio import activity

from heddle import activity_names as names
from heddle.scheduler_link import Scheduler
from heddle.types import DecideRequest, Decision, StepReport, TrajectoryDone


class SchedulerActivities:
    def __init__(self, *, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    @activity.defn(name=names.DECIDE)
    async def decide(self, request: DecideRequest) -> Decision:
        return await self.scheduler.decide(request)

    @activity.defn(name=names.ANTICIPATE)
    async def anticipate(self, request: DecideRequest) -> Decision | None:
        return await self.scheduler.anticipate(request)

    @activity.defn(name=names.REPORT_STEP)
    async def report_step(self, report: StepReport) -> None:
        await self.scheduler.report(report)

    @activity.defn(name=names.REPORT_DONE)
    async def report_done(self, done: TrajectoryDone) -> None:
        await self.scheduler.finished(done)
