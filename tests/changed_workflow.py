"""A deliberately changed trajectory workflow, for the replay test (its own module: the
workflow sandbox re-imports it, and the test module imports what the sandbox forbids)."""

from __future__ import annotations

from temporalio import workflow

from heddle.types import TrajectoryInput, TrajectorySummary
from workflows.trajectory import TrajectoryWorkflow


@workflow.defn(name="TrajectoryWorkflow")
class ChangedTrajectoryWorkflow(TrajectoryWorkflow):
    """A deploy that sleeps before the first activity: its replay issues a timer where
    the recorded history has a local activity."""

    @workflow.run
    async def run(self, inp: TrajectoryInput) -> TrajectorySummary:
        await workflow.sleep(1)
        return await super().run(inp)
