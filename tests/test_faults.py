"""Fault injection on the embedded stack (`pytest -m faults`): the Temporal server
(file state) SIGKILLed mid-batch and restarted, the PostgreSQL store stopped and started
again mid-batch, a chaos loop killing random workers (the engine host among them) for a
minute. Every batch carries one poison trajectory whose tool is always down.

After each: every trajectory ended exactly once (one workflow, closed, one row in the
store), the store matches the report, each trajectory made exactly its trace's tokens,
and the poison trajectory alone failed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from heddle.client import HeddleClient, RolloutHandle
from heddle.runtime.stack import EmbeddedStack, free_port
from heddle.trace import TraceRecord
from heddle.types import BatchReport, RolloutOptions
from heddle.workloads import generate
from tests.live import SMALL_CLUSTER, PostgresServer, count_workflows, pg_bindir

pytestmark = [pytest.mark.faults, pytest.mark.slow]

POISON = "poison"
# Real tools from tests/crashing_tool.py: `echo` answers, `down` is never available.
TOOLS = ("--tool", "echo=tests.crashing_tool:echo", "--tool", "down=tests.crashing_tool:down")


def records_with_poison(prompts: int, seed: int) -> list[TraceRecord]:
    """A coding trace whose tool calls go to `echo`, plus one trajectory whose every
    tool call goes to `down`."""
    records = generate("coding", prompts=prompts, samples=16, seed=seed)

    def retool(rec: TraceRecord, tool: str, tid: str | None = None) -> TraceRecord:
        steps = [
            dataclasses.replace(s, tool=tool, tool_input="x") if s.tool else s
            for s in rec.spec.steps
        ]
        spec = dataclasses.replace(
            rec.spec, steps=steps, trajectory_id=tid or rec.spec.trajectory_id
        )
        return dataclasses.replace(rec, spec=spec)

    with_tool = next(r for r in records if any(s.tool for s in r.spec.steps))
    return [*(retool(r, "echo") for r in records), retool(with_tool, "down", POISON)]


def stack_for(tmp_path: Path, **kwargs: object) -> EmbeddedStack:
    return EmbeddedStack(
        state_dir=tmp_path / "stack", port=free_port(), headless=True, cluster=SMALL_CLUSTER,
        worker_args=TOOLS, metrics=False, **kwargs,  # type: ignore[arg-type]
    )  # fmt: skip


async def until_mid_batch(handle: RolloutHandle, completed: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while (p := await handle.progress())["completed"] < completed:
        assert time.monotonic() < deadline, f"the batch made no progress: {p}"
        await asyncio.sleep(0.2)


def restart_dead_workers(stack: EmbeddedStack) -> int:
    """What a supervisor (systemd, Kubernetes) does: a worker that exited is started
    again. Returns how many were."""
    dead = [i for i, w in enumerate(stack.workers) if w.poll() is not None]
    for i in reversed(dead):
        stack.workers.pop(i)
    for _ in dead:
        stack.start_worker()
    return len(dead)


async def check_batch(
    client: HeddleClient, handle: RolloutHandle, report: BatchReport, records: list[TraceRecord]
) -> None:
    expected = {r.spec.trajectory_id: r.spec for r in records}
    rows = await client.list_trajectories(handle.batch_id, limit=10 * len(records))
    assert sorted(r["trajectory_id"] for r in rows) == sorted(expected)  # each once
    assert report.trajectories == len(records)
    assert report.failed_ids == [POISON]
    assert (report.completed, report.failed) == (len(records) - 1, 1)
    for row in rows:
        spec = expected[row["trajectory_id"]]
        if row["trajectory_id"] == POISON:
            assert row["status"] == "failed"
            assert "down" in row["error"] or "ToolUnavailable" in row["error"], row["error"]
        else:
            assert row["status"] == "completed", row
            assert row["generated_tokens"] == spec.generated_tokens, row
    assert report.generated_tokens == sum(r["generated_tokens"] for r in rows)
    # One workflow a trajectory, every one closed.
    query = f'HeddleBatch="{handle.batch_id}" AND WorkflowType="TrajectoryWorkflow"'
    assert await count_workflows(client.temporal, query, len(records)) == len(records)
    closed = f'{query} AND ExecutionStatus="Completed"'
    assert await count_workflows(client.temporal, closed, len(records)) == len(records)


async def run_with_fault(
    stack: EmbeddedStack,
    records: list[TraceRecord],
    fault: Callable[[HeddleClient, RolloutHandle], Awaitable[None]],
) -> None:
    await stack.start()
    try:
        client = await HeddleClient.connect(stack.address, store_url=stack.store_url)
        async with client:
            options = RolloutOptions(tools="real", max_attempts=4)
            handle = await client.start_rollout(records=records, options=options)
            await fault(client, handle)
            report = await asyncio.wait_for(handle.report(), 300)
            await check_batch(client, handle, report, records)
    finally:
        stack.stop()


def test_the_temporal_server_killed_mid_batch_and_restarted(tmp_path: Path) -> None:
    stack = stack_for(tmp_path, time_scale=0.1, num_workers=2)
    records = records_with_poison(prompts=4, seed=31)

    async def fault(client: HeddleClient, handle: RolloutHandle) -> None:
        await until_mid_batch(handle, completed=8)
        stack.kill_server()
        await asyncio.sleep(2.0)
        await stack.restart_server()
        await asyncio.sleep(3.0)
        restart_dead_workers(stack)

    asyncio.run(run_with_fault(stack, records, fault))


@pytest.mark.skipif(pg_bindir() is None, reason="needs Debian's postgresql")
def test_the_postgresql_store_stopped_mid_batch_and_started_again(tmp_path: Path) -> None:
    pg = PostgresServer()
    try:
        stack = stack_for(tmp_path, time_scale=0.1, num_workers=2, store_url=pg.url)
        records = records_with_poison(prompts=4, seed=32)

        async def fault(client: HeddleClient, handle: RolloutHandle) -> None:
            await until_mid_batch(handle, completed=8)
            await asyncio.to_thread(pg.stop, "fast")  # every connection cut
            await asyncio.sleep(4.0)  # writes fail meanwhile, and are retried
            await asyncio.to_thread(pg.start)

        asyncio.run(run_with_fault(stack, records, fault))
    finally:
        pg.close()


def test_a_chaos_loop_kills_random_workers_for_a_minute(tmp_path: Path) -> None:
    """Every few seconds a random worker (the engine host among them) is SIGKILLed and a
    new one started, for 60 s or until the batch ends."""
    rng = random.Random(29)
    stack = stack_for(tmp_path, time_scale=0.4, num_workers=3)
    records = records_with_poison(prompts=4, seed=33)
    kills: list[bool] = []  # whether each killed the engine host

    async def fault(client: HeddleClient, handle: RolloutHandle) -> None:
        await until_mid_batch(handle, completed=1)
        report = asyncio.ensure_future(handle.report())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not report.done():
            await asyncio.sleep(rng.uniform(2.0, 5.0))
            index = rng.randrange(len(stack.workers))
            kills.append(stack.workers[index] is stack._engine_host)
            stack.kill_worker(index)
            await asyncio.sleep(0.5)
            stack.start_worker()
        report.cancel()

    asyncio.run(run_with_fault(stack, records, fault))
    print(f"chaos: {len(kills)} kills, {sum(kills)} of them the engine host")
    assert len(kills) >= 8, kills
    assert any(kills), "the engine host was never killed"
