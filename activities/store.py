"""Trajectory-store writes and reads for the workflows (task queue `trajectories`).

The store is synchronous SQLAlchemy; each call runs in a thread so the worker's event loop
keeps serving workflow tasks. A running trajectory's writes (start, steps, end) go through
one `GroupCommit`: every trajectory of a batch writes at about the same pace, and one
transaction and one thread hand-off for all that are waiting costs far less than one each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from temporalio import activity
from temporalio.exceptions import ApplicationError

from heddle import activity_names as names
from heddle.store import TrajectoryStore
from heddle.store.db import TrajectoryWrite
from heddle.types import (
    BatchReport,
    BatchStart,
    SpecPage,
    SpecPageRequest,
    StepRecord,
    TrajectoryStarted,
    TrajectorySummary,
)

# The most writes one transaction takes: a long transaction holds SQLite's write lock.
MAX_WRITES_A_COMMIT = 512


class GroupCommit:
    """Writes committed together: whatever waits when a commit starts goes into the next
    one. A write returns once its transaction is committed (an activity that returned has
    written), and a failed transaction is retried write by write, so one bad write fails
    only its own caller. One commit runs at a time, in a thread."""

    def __init__(self, store: TrajectoryStore) -> None:
        self.store = store
        self._waiting: list[tuple[TrajectoryWrite, asyncio.Future[None]]] = []
        self._committing: asyncio.Task[None] | None = None
        self.commits = 0  # transactions, for tests and benchmarks

    async def write(self, write: TrajectoryWrite) -> None:
        done = asyncio.get_running_loop().create_future()
        self._waiting.append((write, done))
        if self._committing is None or self._committing.done():
            self._committing = asyncio.create_task(self._commit_waiting())
        await done

    async def _commit_waiting(self) -> None:
        while self._waiting:
            batch = self._waiting[:MAX_WRITES_A_COMMIT]
            del self._waiting[:MAX_WRITES_A_COMMIT]
            try:
                errors = await asyncio.to_thread(self.store.write_each, [w for w, _ in batch])
            except Exception as exc:  # the store itself is unreachable
                errors = [exc] * len(batch)
            self.commits += 1
            for (_, done), error in zip(batch, errors, strict=True):
                if done.done():  # its caller gave up (timed out, cancelled)
                    continue
                if error is None:
                    done.set_result(None)
                else:
                    done.set_exception(error)


class StoreActivities:
    def __init__(
        self,
        *,
        store: TrajectoryStore,
        time_scale: float,
        instance_ids: Callable[[], list[str]] = list,
    ) -> None:
        self.store = store
        self.writes = GroupCommit(store)
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
        await self.writes.write(started)

    @activity.defn(name=names.RECORD_STEP)
    async def record_step(self, record: StepRecord) -> None:
        await self.writes.write(record)

    @activity.defn(name=names.FINISH_TRAJECTORY)
    async def finish_trajectory(self, summary: TrajectorySummary) -> None:
        await self.writes.write(summary)

    @activity.defn(name=names.FINISH_BATCH)
    async def finish_batch(self, report: BatchReport) -> None:
        await asyncio.to_thread(self.store.finish_batch, report)
