"""The workflows replay deterministically from the histories a real rollout recorded: a
code change that alters their commands would break running batches on deploy, and
`Replayer` is what catches it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from heddle import activity_names as names
from heddle.trace import TraceRecord
from heddle.types import (
    RolloutOptions,
    StepSpec,
    TrajectorySpec,
)
from tests.changed_workflow import ChangedTrajectoryWorkflow
from tests.live import live_client
from workflows.batch import RolloutBatchWorkflow, RolloutSliceWorkflow
from workflows.control import ClusterControlWorkflow
from workflows.trajectory import TrajectoryWorkflow

HISTORIES = Path(__file__).parent / "histories"
WORKFLOWS = [TrajectoryWorkflow, RolloutBatchWorkflow, RolloutSliceWorkflow, ClusterControlWorkflow]


def _spec(tid: str, statuses: list[str]) -> TrajectorySpec:
    steps = [StepSpec(30 + 10 * i, "python", 0.2, status, 15) for i, status in enumerate(statuses)]
    return TrajectorySpec(tid, "g0", 80, (*steps, StepSpec(40)), workload="coding")


async def _recorded_histories(
    temporal_address: str, store_url: str, queue_prefix: str
) -> list[WorkflowHistory]:
    specs = [_spec("ok", ["ok", "ok"]), _spec("err", ["error", "timeout"]), _spec("one", [])]
    async with live_client(temporal_address, store_url, queue_prefix, time_scale=0.02) as client:
        handle = await client.start_rollout(
            records=[TraceRecord(spec=s) for s in specs], options=RolloutOptions()
        )
        report = await asyncio.wait_for(handle.report(), 120)
        assert report.completed == len(specs)
        ids = [handle.batch_id] + [f"{handle.batch_id}/{s.trajectory_id}" for s in specs]
        return [await client.temporal.get_workflow_handle(wid).fetch_history() for wid in ids]


def test_recorded_histories_replay_and_a_changed_workflow_does_not(
    temporal_address: str, store_url: str, queue_prefix: str
) -> None:
    histories = asyncio.run(_recorded_histories(temporal_address, store_url, queue_prefix))
    assert len(histories) == 4

    trajectories = [h for h in histories if "/" in h.workflow_id]

    async def replay(workflows: list[type], recorded: list[WorkflowHistory]) -> None:
        replayer = Replayer(workflows=workflows)
        for history in recorded:
            await replayer.replay_workflow(history)

    asyncio.run(replay(WORKFLOWS, histories))

    # The check can fail: see ChangedTrajectoryWorkflow.
    with pytest.raises(Exception, match=r"[Nn]ondetermin"):
        asyncio.run(replay([ChangedTrajectoryWorkflow], trajectories))


def test_llm_steps_carry_a_task_queue_priority(
    temporal_address: str, store_url: str, queue_prefix: str
) -> None:
    histories = asyncio.run(_recorded_histories(temporal_address, store_url, queue_prefix))
    keys = [
        event.activity_task_scheduled_event_attributes.priority.priority_key
        for history in histories
        if "/" in history.workflow_id
        for event in history.events
        if event.HasField("activity_task_scheduled_event_attributes")
        and event.activity_task_scheduled_event_attributes.activity_type.name == names.GENERATE
    ]
    assert len(keys) == 3 + 3 + 1  # one per LLM step of the three trajectories
    assert all(1 <= k <= 5 for k in keys)


@pytest.mark.parametrize("recorded", sorted(HISTORIES.glob("*.json")), ids=lambda p: p.stem)
def test_histories_recorded_before_a_change_still_replay(recorded: Path) -> None:
    """Histories recorded by earlier code (`python -m tests.histories.record`): the
    workflows still in flight when a deploy lands must go on. 1f142af is the step path
    before the lean one: scheduler calls as activities, the workflow moving KV."""
    histories = [
        WorkflowHistory.from_json(f"{recorded.stem}-{k}", h)
        for k, h in enumerate(json.loads(recorded.read_text()))
    ]

    async def replay() -> None:
        replayer = Replayer(workflows=WORKFLOWS)
        for history in histories:
            await replayer.replay_workflow(history)

    asyncio.run(replay())
