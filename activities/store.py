"""Trajectory-store writes and reads for the workflows (task queue `trajectories`).

The store is synchronous SQLAlchemy; each call runs in a thread so the worker's event loop
keeps serving workflow tasks. Each write is its own transaction: committing the writes
that wait together (a group commit) cut the CPU of tiny two-step trajectories, but held
the worker's GIL in long stretches and made a latency-bound 512-trajectory batch 13-20%
slower live (docs/notes/issue-26-live-path.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.scheduler import Scheduler
from heddle import activity_names as names
from heddle import metrics
from heddle.store import TrajectoryStore
from heddle.types import (
    BatchReport,
    BatchStart,
    RewardRequest,
    SpecPage,
    SpecPageRequest,
    StepRecord,
    TrajectoryEnd,
    TrajectoryStarted,
    TrajectorySummary,
)

T = TypeVar("T")


# A store call from an activity that is not the store's own (a tool's observation, an
# agent turn) rides out a store outage this long: retrying the whole activity would run
# the tool or the model again, and use up the attempts its own failures are meant for.
STORE_OUTAGE_S = 120.0
_RETRY_S = (0.2, 5.0)  # first wait, longest wait


async def in_store(call: Callable[..., T], *args: Any) -> T:
    """`call(*args)` in a thread, again while the store is unreachable (a connection
    refused or cut), up to `STORE_OUTAGE_S`; other errors are raised at once."""
    from sqlalchemy.exc import DBAPIError, OperationalError

    deadline = time.monotonic() + STORE_OUTAGE_S
    wait = _RETRY_S[0]
    while True:
        try:
            return await asyncio.to_thread(call, *args)
        except (OperationalError, DBAPIError) as exc:
            transient = isinstance(exc, OperationalError) or exc.connection_invalidated
            if not transient or time.monotonic() + wait > deadline:
                raise
            activity.logger.warning("the store is unreachable (%s); retrying", exc.orig)
            await asyncio.sleep(wait)
            wait = min(2 * wait, _RETRY_S[1])


def replay_reward(recorded: float | None, request: RewardRequest) -> float:
    """A replayed trajectory's reward: its trace's where it has one; else 1 for one that
    reached a final answer after a successful last tool call, 0 otherwise."""
    if recorded is not None:
        return recorded
    ok_tool = request.last_tool_status in (None, "ok")
    return 1.0 if request.finish_reason == "answer" and ok_tool else 0.0


class StoreActivities:
    def __init__(
        self,
        *,
        store: TrajectoryStore,
        time_scale: float,
        instance_ids: Callable[[], list[str]] = list,
        scheduler: Scheduler | None = None,
    ) -> None:
        self.store = store
        self.time_scale = time_scale
        self.instance_ids = instance_ids  # the engine instances taking steps now
        self.scheduler = scheduler  # told of each trajectory's end (`end_trajectory`)

    @activity.defn(name=names.BEGIN_BATCH)
    async def begin_batch(self, batch_id: str) -> BatchStart:
        if await asyncio.to_thread(self.store.get_batch, batch_id) is None:
            # Retrying cannot help: the client wrote the batch to another store.
            raise ApplicationError(
                f"batch {batch_id!r} is not in the store {self.store.url}", non_retryable=True
            )
        return BatchStart(time_scale=self.time_scale, instance_ids=self.instance_ids())

    @activity.defn(name=names.LOAD_SPECS)
    async def load_specs(self, request: SpecPageRequest) -> SpecPage:
        specs = await asyncio.to_thread(
            self.store.load_specs, request.batch_id, request.offset, request.limit, request.stride
        )
        return SpecPage(specs=specs)

    @activity.defn(name=names.MARK_STARTED)
    async def mark_started(self, started: TrajectoryStarted) -> None:
        await asyncio.to_thread(self.store.write, [started])

    @activity.defn(name=names.RECORD_STEP)
    async def record_step(self, record: StepRecord) -> None:
        await asyncio.to_thread(self.store.write, [record])

    @activity.defn(name=names.FINISH_TRAJECTORY)
    async def finish_trajectory(self, summary: TrajectorySummary) -> None:
        await asyncio.to_thread(self.store.write, [summary])
        metrics.TRAJECTORIES.labels(summary.status, summary.finish_reason).inc()

    @activity.defn(name=names.END_TRAJECTORY)
    async def end_trajectory(self, end: TrajectoryEnd) -> float:
        """The last step, the reward and the summary in one transaction, then the
        scheduler service told: one local activity where there were four. A retry
        writes the same rows again and tells the service again (it forgets twice)."""

        def write() -> float:
            summary = end.summary
            if end.reward is not None:
                recorded = self.store.trace_reward(summary.batch_id, summary.trajectory_id)
                summary = dataclasses.replace(summary, reward=replay_reward(recorded, end.reward))
            self.store.write([*([end.last_step] if end.last_step else []), summary])
            return summary.reward

        reward = await asyncio.to_thread(write)
        metrics.TRAJECTORIES.labels(end.summary.status, end.summary.finish_reason).inc()
        if self.scheduler is not None:
            await self.scheduler.finished(end.done)
        return reward

    @activity.defn(name=names.FINISH_BATCH)
    async def finish_batch(self, report: BatchReport) -> None:
        await asyncio.to_thread(self.store.finish_batch, report)
