"""Trajectory-store writes and reads for the workflows (task queue `trajectories`).

The store is synchronous SQLAlchemy; each call runs in a thread so the worker's event loop
keeps serving workflow tasks. Each write is its own transaction: committing the writes
that wait together (a group commit) cut the CPU of tiny two-step trajectories, but held
the worker's GIL in long stretches and made a latency-bound 512-trajectory batch 13-20%
slower live (docs/notes/issue-26-live-path.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from temporalio import activity
from temporalio.exceptions import ApplicationError

from heddle import activity_names as names
from heddle.store import TrajectoryStore
from heddle.types import (
    BatchReport,
    BatchStart,
    SpecPage,
    SpecPageRequest,
    StepRecord,
    TrajectoryStarted,
    TrajectorySummary,
)


class StoreActivities:
    def __init__(
        self,
        *,
        store: TrajectoryStore,
        time_scale: float,
        instance_ids: Callable[[], list[str]] = list,
    ) -> None:
        self.store = store
        self.time_scale = time_scale
        self.instance_ids = instance_ids  # the engine instances taking steps now

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

    @activity.defn(name=names.FINISH_BATCH)
    async def finish_batch(self, report: BatchReport) -> None:
        await asyncio.to_thread(self.store.finish_batch, report)
