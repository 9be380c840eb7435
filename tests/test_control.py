"""The cluster plan: changes checked before they run, a reshape during a rollout that
loses and duplicates nothing, and a plan that outlives the worker."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
from pathlib import Path

import pytest
from temporalio.client import WorkflowUpdateFailedError

from heddle.client import HeddleClient
from heddle.queues import trajectories_queue
from heddle.trace import TraceRecord
from heddle.types import (
    BlockMove,
    InstancePlan,
    PlanChange,
    RolloutOptions,
    StepSpec,
    TrajectorySpec,
)
from scheduler.plan import (
    TRAINING,
    active_instances,
    check_change,
    check_move,
    engine_instances,
    initial_plan,
    mark,
    mark_active,
    mark_draining,
    swap_instances,
)
from tests.live import (
    count_workflows,
    kill_process,
    live_client,
    scheduled_activities,
    wait_for_poller,
    worker_process,
)

TWO_FROM_TWO = PlanChange(["i2", "i3"], [InstancePlan("w0", 2, 2)], "test: merge for the tail")


def test_a_change_must_start_instances_on_exactly_the_gpus_it_frees() -> None:
    plan = initial_plan(["i0", "i1", "i2", "i3"], [1, 1, 1, 1], 4, [1, 2, 4])
    assert [(i.instance_id, i.first_gpu) for i in plan.instances] == [
        ("i0", 0), ("i1", 1), ("i2", 2), ("i3", 3)]  # fmt: skip
    bad = {
        "no instance 'i9'": PlanChange(["i9"], [InstancePlan("x", 1, 3)]),
        "free \\[2, 3\\]": PlanChange(["i2", "i3"], [InstancePlan("x", 1, 2)]),
        "not a multiple": PlanChange(["i1", "i2"], [InstancePlan("x", 2, 1)]),
        "not in": PlanChange(["i0", "i1", "i2"], [InstancePlan("x", 3, 0)]),
        "already taken": PlanChange(["i2", "i3"], [InstancePlan("i0", 2, 2)]),
        "nothing": PlanChange([], []),
    }
    for message, change in bad.items():
        with pytest.raises(ValueError, match=message):
            check_change(plan, change)
    plan = dataclasses.replace(plan, owner="batch-a", scheduler_address="10.0.0.1:7000")
    draining = mark_draining(plan, TWO_FROM_TWO.retire)
    assert active_instances(draining) == {"i0": 1, "i1": 1}
    with pytest.raises(ValueError, match="one reshape at a time"):
        check_change(draining, PlanChange(["i0", "i1"], [InstancePlan("x", 2, 0)]))
    swapped = swap_instances(draining, TWO_FROM_TWO)
    assert active_instances(swapped) == {"i0": 1, "i1": 1}  # w0 is starting
    after = mark_active(swapped, ["w0"])
    assert after.version == 3
    assert active_instances(after) == {"i0": 1, "i1": 1, "w0": 2}
    # A reshape keeps who holds the split and where the scheduler listens: a plan that
    # lost the address left every worker but the engine host unable to decide.
    for p in (draining, swapped, after):
        assert (p.owner, p.scheduler_address) == ("batch-a", "10.0.0.1:7000")


def test_instances_lent_to_the_trainer_run_no_engine_and_hold_off_a_reshape() -> None:
    plan = initial_plan(["i0", "i1", "i2", "i3"], [1, 1, 1, 1], 4, [1, 2, 4])
    bad = {
        "lends and gives back nothing": BlockMove(),
        "no instance 'i9'": BlockMove(to_trainer=["i9"]),
        "named twice": BlockMove(to_trainer=["i1"], to_rollout=["i1"]),
        "'i2' is active, not training": BlockMove(to_rollout=["i2"]),
        "keeps at least one": BlockMove(to_trainer=["i0", "i1", "i2", "i3"]),
    }
    for message, move in bad.items():
        with pytest.raises(ValueError, match=message):
            check_move(plan, move)
    check_move(plan, BlockMove(to_trainer=["i2", "i3"]))
    lent = mark(plan, ["i2", "i3"], TRAINING)
    assert active_instances(lent) == {"i0": 1, "i1": 1}
    assert [i.instance_id for i in engine_instances(lent)] == ["i0", "i1"]
    with pytest.raises(ValueError, match="lent to the trainer"):
        check_change(lent, PlanChange(["i0", "i1"], [InstancePlan("x", 2, 0)]))
    with pytest.raises(ValueError, match="'i2' is training, not active"):
        check_move(lent, BlockMove(to_trainer=["i2"]))
    with pytest.raises(ValueError, match="keeps at least one"):
        check_move(lent, BlockMove(to_trainer=["i0", "i1"]))
    check_move(lent, BlockMove(to_trainer=["i1"], to_rollout=["i2", "i3"]))
    with pytest.raises(ValueError, match="still changing"):
        check_move(mark_draining(lent, ["i0"]), BlockMove(to_trainer=["i1"]))


def _records(n: int, tool_s: float = 0.4) -> list[TraceRecord]:
    steps = (*(StepSpec(60, "python", tool_s, "ok", 20) for _ in range(5)), StepSpec(60))
    return [TraceRecord(TrajectorySpec(f"t{k}", f"g{k // 4}", 100, steps, "coding"))
            for k in range(n)]  # fmt: skip


def test_a_reshape_during_a_rollout_loses_and_duplicates_nothing(
    temporal_address: str, store_url: str, queue_prefix: str
) -> None:
    # Tools of 30 s (1.5 s wall): the batch outlasts the reshape (drain + restart).
    records = _records(16, tool_s=30.0)

    async def run() -> None:
        async with live_client(temporal_address, store_url, queue_prefix, time_scale=0.05) as c:
            plan = await _plan_when_up(c)
            assert [i.instance_id for i in plan.instances] == ["i0", "i1", "i2", "i3"]
            # Refused by the validator: nothing runs, the plan stays.
            with pytest.raises(WorkflowUpdateFailedError):
                await c.reshape(PlanChange(["i3"], [InstancePlan("w0", 2, 2)]))
            assert (await c.cluster_plan()).version == 0
            handle = await c.start_rollout(records=records, options=RolloutOptions())
            await asyncio.sleep(1.0)  # the batch is under way
            reshaped = await c.reshape(TWO_FROM_TWO)
            progress = await handle.progress()
            assert progress["completed"] < 16, "the reshape ran while the batch was running"
            assert [(i.instance_id, i.tp, i.state) for i in reshaped.instances] == [
                ("i0", 1, "active"), ("i1", 1, "active"), ("w0", 2, "active")]  # fmt: skip
            report = await asyncio.wait_for(handle.report(), 180)
            assert report.completed == 16
            assert report.generated_tokens == sum(r.spec.generated_tokens for r in records)
            steps = _steps(c, handle.batch_id, records)
            # Every step once, each generated in one piece (no retry after the reshape).
            assert len(steps) == 16 * 6
            assert {s["attempt"] for s in steps} == {1}
            assert {s["resumed_tokens"] for s in steps} == {0}
            on_new = [s for s in steps if s["instance_id"] == "w0"]
            assert on_new, "steps after the reshape ran on the new instance"
            first_on_new = min(s["gen_started_at"] for s in on_new)
            late_on_old = [s for s in steps if s["instance_id"] in ("i2", "i3")
                           and s["gen_started_at"] > first_on_new]  # fmt: skip
            assert late_on_old == []

    asyncio.run(run())


def _steps(client: HeddleClient, batch_id: str, records: list[TraceRecord]) -> list[dict]:  # type: ignore[type-arg]
    steps = []
    for r in records:
        row = client.store.get_trajectory(batch_id, r.spec.trajectory_id)
        assert row is not None
        steps += row["steps"]
    return steps


async def _plan_when_up(client: HeddleClient, timeout_s: float = 30):  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            return await client.cluster_plan()
        except Exception:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.2)


def test_the_plan_outlives_a_worker_restart(
    temporal_address: str, store_url: str, queue_prefix: str, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"

    async def run() -> None:
        worker = worker_process(temporal_address, store_url, queue_prefix, log, time_scale=0.02)
        client = await HeddleClient.connect(
            temporal_address, store_url=store_url, queue_prefix=queue_prefix
        )
        async with client:
            try:
                await _plan_when_up(client)
                await client.reshape(TWO_FROM_TWO)
                kill_process(worker)
                worker = worker_process(
                    temporal_address, store_url, queue_prefix, log, time_scale=0.02
                )
                plan = await _plan_when_up(client, timeout_s=60)  # the new worker answers
                assert plan.version == 3  # drain, swap, activate
                assert [i.instance_id for i in plan.instances] == ["i0", "i1", "w0"]
                handle = await client.start_rollout(records=_records(8), options=RolloutOptions())
                report = await asyncio.wait_for(handle.report(), 120)
                assert report.completed == 8
                used = {s["instance_id"] for s in _steps(client, handle.batch_id, _records(8))}
                assert used <= {"i0", "i1", "w0"}
            finally:
                kill_process(worker)

    asyncio.run(run())


def test_the_control_workflow_continues_as_new_with_its_plan(
    temporal_address: str, store_url: str, queue_prefix: str
) -> None:
    from temporalio.client import Client

    from heddle.queues import control_workflow_id
    from heddle.types import ControlInput
    from tests.live import SMALL_CLUSTER
    from workflows.control import ClusterControlWorkflow

    async def run() -> None:
        temporal = await Client.connect(temporal_address)
        ids = SMALL_CLUSTER.instance_ids()
        initial = initial_plan(ids, [1] * len(ids), 4, SMALL_CLUSTER.tp_choices)
        first = await temporal.start_workflow(
            ClusterControlWorkflow.run,
            ControlInput(initial, queue_prefix, changes_per_run=1),
            id=control_workflow_id(queue_prefix),
            task_queue=trajectories_queue(queue_prefix),
        )
        async with live_client(temporal_address, store_url, queue_prefix) as client:
            await client.reshape(TWO_FROM_TWO)
            latest = temporal.get_workflow_handle(control_workflow_id(queue_prefix))
            for _ in range(50):  # the new run starts right after the reshape
                if (await latest.describe()).run_id != first.result_run_id:
                    break
                await asyncio.sleep(0.1)
            assert (await latest.describe()).run_id != first.result_run_id
            plan = await client.cluster_plan()
            assert plan.version == 3
            assert active_instances(plan) == {"i0": 1, "i1": 1, "w0": 2}

    asyncio.run(run())


def test_a_policy_reshapes_the_cluster_during_its_rollout(
    temporal_address: str, store_url: str, queue_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import heddle.client
    from scheduler import registry
    from scheduler.interface import Policy
    from scheduler.order import FirstComeFirstServed
    from tests.reshaping_policy import MergeIdlePair, OnMergedWhenUp

    split = MergeIdlePair()
    monkeypatch.setitem(
        registry.POLICIES,
        "test-merge",
        lambda ctx: Policy("test-merge", FirstComeFirstServed(), OnMergedWhenUp(), split),
    )
    monkeypatch.setattr(heddle.client, "PLANS_SPLIT", registry.PLANS_SPLIT | {"test-merge"})
    long = TrajectorySpec(
        "long", "g", 100, (*(StepSpec(50, "python", 20.0, "ok", 10) for _ in range(6)),
                           StepSpec(50)), "coding")  # fmt: skip

    async def run() -> None:
        async with live_client(temporal_address, store_url, queue_prefix, time_scale=0.05) as c:
            await (await c.start_rollout(records=_records(2))).report()  # a history
            handle = await c.start_rollout(
                records=[TraceRecord(long)], options=RolloutOptions(policy="test-merge")
            )
            report = await asyncio.wait_for(handle.report(), 120)
            assert report.completed == 1
            assert report.generated_tokens == long.generated_tokens
            tag = handle.batch_id.rsplit("-", 1)[-1][:8]
            plan = await c.cluster_plan()
            assert active_instances(plan) == {f"{tag}-a": 1, f"{tag}-b": 1, f"{tag}-m": 2}
            row = c.store.get_trajectory(handle.batch_id, "long")
            assert row is not None
            on = [st["instance_id"] for st in row["steps"]]
            assert on[0] == f"{tag}-a"
            assert on[-1] == f"{tag}-m"  # once up, the merged instance took the steps
            assert split.ready[-1] == "m"  # told when its instance came up

    asyncio.run(run())


def test_planned_batches_take_turns_with_the_cluster(
    temporal_address: str, store_url: str, queue_prefix: str
) -> None:
    """Two Heddle batches started together: the second plans and reshapes the cluster
    only once the first has finished, so neither runs on the other's split."""
    from heddle.workloads import generate

    async def run() -> None:
        async with live_client(
            temporal_address, store_url, queue_prefix, time_scale=0.02
        ) as client:
            earlier = await client.start_rollout(
                records=generate("math", prompts=1, samples=6, seed=4, iteration=0)
            )
            await asyncio.wait_for(earlier.report(), 120)
            batches = [
                await client.start_rollout(
                    records=generate("math", prompts=1, samples=6, seed=4, iteration=k),
                    options=RolloutOptions(policy="heddle"),
                )
                for k in (1, 2)
            ]
            reports = [await asyncio.wait_for(b.report(), 180) for b in batches]
            assert [r.completed for r in reports] == [6, 6]
            # Heddle's decisions carry its forecast; an ended trajectory has none left.
            for b in batches:
                query = f'HeddleBatch="{b.batch_id}" AND HeddlePredictedRemaining = 0'
                assert await count_workflows(client.temporal, query, 6) == 6
            # Whichever claimed the cluster first ran first; the other started after it.
            first, second = sorted(reports, key=lambda r: r.finished_at)
            rows = await client.list_trajectories(second.batch_id)
            assert min(r["started_at"] for r in rows) >= first.finished_at
            plan = await client.cluster_plan()
            assert plan.owner == ""  # the last one released it
            tag = second.batch_id.rsplit("-", 1)[-1][:8]
            assert all(i.instance_id.startswith(f"{tag}-") for i in plan.instances)

    asyncio.run(run())


def test_the_engine_hosts_scheduler_decides_for_workers_on_other_machines(
    temporal_address: str, store_url: str, queue_prefix: str, tmp_path: Path
) -> None:
    """Two worker processes, as on two machines: only one hosts the engines. Each
    decide is a local activity of the process that runs the trajectory (no Temporal
    round trip), and the engine host's service answers it: the other process reaches
    it at the address the host announced in the cluster plan."""
    from heddle.workloads import generate

    records = generate("math", prompts=2, samples=8, seed=2)
    host_log, other_log = tmp_path / "host.log", tmp_path / "other.log"

    async def run() -> None:
        host = worker_process(temporal_address, store_url, queue_prefix, host_log, time_scale=0.02)
        other = worker_process(
            temporal_address, store_url, queue_prefix, other_log, time_scale=0.02, engines=False
        )
        try:
            client = await HeddleClient.connect(
                temporal_address, store_url=store_url, queue_prefix=queue_prefix
            )
            async with client:
                # The plan exists once either process starts it; the host announces its
                # scheduler when it has started it.
                deadline = asyncio.get_running_loop().time() + 60
                while not (await _plan_when_up(client)).scheduler_address:
                    assert asyncio.get_running_loop().time() < deadline, "no announcement"
                    await asyncio.sleep(0.2)
                assert (await client.cluster_plan()).scheduler_address.startswith("127.0.0.1:")
                # Workflow tasks go only to processes already polling for them.
                await wait_for_poller(client.temporal, trajectories_queue(queue_prefix), other.pid)
                handle = await client.start_rollout(records=records)
                report = await asyncio.wait_for(handle.report(), 120)
                assert report.completed == len(records)
                elsewhere = 0  # decides made in the other process
                for r in records:
                    history = await client.temporal.get_workflow_handle(
                        f"{handle.batch_id}/{r.spec.trajectory_id}"
                    ).fetch_history()
                    assert "decide" not in scheduled_activities(history).values()
                    decides = [
                        e for e in history.events
                        if e.HasField("marker_recorded_event_attributes")
                        and e.marker_recorded_event_attributes.marker_name == "core_local_activity"
                    ]  # fmt: skip
                    runners = {
                        e.workflow_task_completed_event_attributes.identity
                        for e in history.events
                        if e.HasField("workflow_task_completed_event_attributes")
                    }
                    if all(not i.startswith(f"{host.pid}@") for i in runners):
                        elsewhere += len(r.spec.steps)
                        assert len(decides) >= len(r.spec.steps)
                assert elsewhere > 0, "every trajectory ran in the engine host's process"
        finally:
            kill_process(host, signal.SIGTERM)
            kill_process(other)
        served = [line for line in host_log.read_text().splitlines() if "served other" in line]
        assert served, host_log.read_text()[-2000:]
        calls = json.loads(served[-1].split("workers: ", 1)[1])
        assert calls.get("decide", 0) >= elsewhere

    asyncio.run(run())
