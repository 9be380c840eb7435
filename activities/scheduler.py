"""The scheduler service's API as local activities of the trajectory workflow: whichever
worker runs the workflow calls the engine host's service (in its own process, or over
the host's socket), so a decide costs no Temporal round trip.

`anticipate` and `report_step` serve trajectories started before the lean step path
(their engine host now does both itself), also as activities on the control queue.
"""

from __future__ import annotations

from typing import Protocol

from temporalio import activity

from heddle import activity_names as names
from heddle.types import DecideRequest, Decision, StepReport, TrajectoryDone


class Scheduler(Protocol):
    """What a trajectory's activities ask of the scheduler service: `heddle.runtime.
    scheduler_link` gives the engine host's, in its process or over its socket."""

    async def decide(self, request: DecideRequest) -> Decision: ...

    async def anticipate(self, request: DecideRequest) -> Decision | None: ...

    async def report(self, report: StepReport) -> None: ...

    async def finished(self, done: TrajectoryDone) -> None: ...


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
