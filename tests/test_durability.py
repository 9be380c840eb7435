"""A worker process killed mid-batch: after a restart the batch completes, nothing lost
or duplicated, and interrupted LLM steps resume from their heartbeated tokens."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from heddle.client import HeddleClient
from heddle.types import RolloutOptions
from heddle.workloads import generate
from tests.live import kill_process, worker_process


async def _mid_batch(handle: Any, *, completed: int, running: int) -> None:
    """Wait until some trajectories finished and many are still generating."""
    deadline = time.monotonic() + 120
    while True:
        p = await handle.progress()
        if p["completed"] >= completed and p["running"] >= running:
            return
        assert time.monotonic() < deadline, f"batch made no progress: {p}"
        await asyncio.sleep(0.2)


def test_worker_killed_mid_batch_and_restarted(
    temporal_address: str, store_url: str, queue_prefix: str, tmp_path: Path
) -> None:
    records = generate("coding", prompts=4, samples=16, seed=11)
    expected = {r.spec.trajectory_id: r.spec for r in records}
    log = tmp_path / "worker.log"
    # Scale so the batch runs ~20 s of wall time: long enough to be killed in the middle.
    time_scale = 0.12

    async def run() -> None:
        client = await HeddleClient.connect(
            temporal_address, store_url=store_url, queue_prefix=queue_prefix
        )
        worker = worker_process(
            temporal_address, store_url, queue_prefix, log, time_scale=time_scale
        )
        try:
            handle = await client.start_rollout(records=records, options=RolloutOptions())
            await _mid_batch(handle, completed=4, running=20)
            before = await handle.progress()
            kill_process(worker)
            await asyncio.sleep(1.0)
            worker = worker_process(
                temporal_address, store_url, queue_prefix, log, time_scale=time_scale
            )
            report = await asyncio.wait_for(handle.report(), 300)
        finally:
            kill_process(worker)

        assert before["completed"] < 64
        assert report.completed == 64
        assert report.failed == 0
        assert report.generated_tokens == sum(s.generated_tokens for s in expected.values())
        rows = await client.list_trajectories(handle.batch_id)
        assert sorted(r["trajectory_id"] for r in rows) == sorted(expected)
        steps_total = 0
        retried = 0
        for row in rows:
            spec = expected[row["trajectory_id"]]
            assert row["status"] == "completed"
            assert row["generated_tokens"] == spec.generated_tokens
            detail = await client.inspect_trajectory(handle.batch_id, row["trajectory_id"])
            assert detail is not None
            assert [s["step_index"] for s in detail["steps"]] == list(range(len(spec.steps)))
            assert [s["output_tokens"] for s in detail["steps"]] == [
                s.output_tokens for s in spec.steps
            ]
            steps_total += len(detail["steps"])
            retried += sum(1 for s in detail["steps"] if s["attempt"] > 1)
        assert steps_total == sum(len(s.steps) for s in expected.values())
        # The kill hit steps in flight: they were retried, not lost.
        assert retried > 0
        count = await client.temporal.count_workflows(
            f'HeddleBatch="{handle.batch_id}" AND WorkflowType="TrajectoryWorkflow"'
        )
        assert count.count == 64

    asyncio.run(run())


def test_heddle_batch_survives_its_engine_host_restart(
    temporal_address: str, store_url: str, queue_prefix: str, tmp_path: Path
) -> None:
    """The engine host holds a Heddle batch's plan in its scheduler service (soft state).
    Killed mid-batch and restarted, it plans the batch again from the store on the first
    decide (the same split the cluster runs) and the batch completes, nothing lost."""
    earlier = generate("coding", prompts=1, samples=16, seed=7, iteration=0)
    records = generate("coding", prompts=1, samples=16, seed=7, iteration=1)
    log = tmp_path / "worker.log"
    time_scale = 0.1

    async def run() -> None:
        client = await HeddleClient.connect(
            temporal_address, store_url=store_url, queue_prefix=queue_prefix
        )
        worker = worker_process(
            temporal_address, store_url, queue_prefix, log, time_scale=time_scale
        )
        try:
            first = await client.start_rollout(records=earlier)
            await asyncio.wait_for(first.report(), 180)
            handle = await client.start_rollout(
                records=records, options=RolloutOptions(policy="heddle")
            )
            await _mid_batch(handle, completed=2, running=4)
            kill_process(worker)
            worker = worker_process(
                temporal_address, store_url, queue_prefix, log, time_scale=time_scale
            )
            report = await asyncio.wait_for(handle.report(), 300)
            plan = await client.cluster_plan()
        finally:
            kill_process(worker)
        assert report.completed == len(records)
        assert report.generated_tokens == sum(r.spec.generated_tokens for r in records)
        assert "planned again after a restart" in log.read_text()
        tag = handle.batch_id.rsplit("-", 1)[-1][:8]
        assert all(i.instance_id.startswith(f"{tag}-") for i in plan.instances)

    asyncio.run(run())
