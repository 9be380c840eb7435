"""A campaign's store side (task queue `trajectories`): each iteration's batch opened from
the campaign's task set (or generated, for a simulated campaign), and each finished
iteration recorded.

Both are idempotent, so a retry, a replay or a resumed campaign never makes a second
batch for an iteration or a second record: the batch id is the campaign's name and the
iteration, and the tasks an iteration draws are a function of what the campaign state
says was consumed, which only a committed train step changes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time

from temporalio import activity

from heddle import activity_names as names
from heddle.campaign import IterationBatch, IterationRecord, OpenIteration
from heddle.store import TrajectoryStore
from heddle.tasks import Task, agent_records
from heddle.trace import TraceRecord
from heddle.workloads import generate
from scheduler.registry import PLANS_SPLIT, policy_without_history
from scheduler.start_order import longest_expected_first

# The most trajectories of the batch before that the start order reads.
MAX_HISTORY = 1_000_000


def in_start_order(
    store: TrajectoryStore, records: list[TraceRecord], before: str | None
) -> list[TraceRecord]:
    """A batch as it will be stored and started: longest expected first, by the batch
    `before` it (`scheduler.start_order`)."""
    history = store.history_specs(before, MAX_HISTORY) if before else []
    order = longest_expected_first([r.spec for r in records], history)
    return [records[i] for i in order]


def iteration_batch_id(campaign: str, iteration: int) -> str:
    return f"{campaign}-it{iteration:04d}"


def draw_tasks(
    tasks: list[Task], count: int, consumed: list[str], epoch: int, seed: int
) -> tuple[list[Task], int]:
    """The next `count` tasks (0: all) of the epoch's order that were not consumed, and
    the epoch they belong to. Each epoch orders the set anew from the seed; when every
    task of an epoch was consumed the next epoch begins, so within an epoch no task is
    drawn twice and none is skipped."""
    done = set(consumed)
    for this_epoch in (epoch, epoch + 1):
        order = sorted(tasks, key=lambda t: t.task_id)
        random.Random(f"{seed}/{this_epoch}").shuffle(order)
        left = [t for t in order if t.task_id not in done]
        if left:
            return left[: count or len(left)], this_epoch
        done = set()
    raise ValueError("the campaign has no tasks")


class CampaignActivities:
    def __init__(self, *, store: TrajectoryStore) -> None:
        self.store = store

    @activity.defn(name=names.OPEN_ITERATION)
    async def open_iteration(self, request: OpenIteration) -> IterationBatch:
        return await asyncio.to_thread(self._open, request)

    def _open(self, request: OpenIteration) -> IterationBatch:
        spec = request.spec
        batch_id = iteration_batch_id(spec.name, request.iteration)
        tasks: list[Task] = []
        epoch = request.epoch
        if spec.mode == "agent":
            everything = self.store.campaign_tasks(spec.name)
            tasks, epoch = draw_tasks(
                everything, spec.tasks_per_iteration, request.consumed_task_ids, epoch, spec.seed
            )
            records = agent_records(tasks, spec.samples)
        else:
            records = generate(
                spec.workload,
                prompts=spec.tasks_per_iteration,
                samples=spec.samples,
                seed=spec.seed,
                iteration=request.iteration,
            )
        options = dataclasses.replace(spec.options, seed=spec.seed * 100_003 + request.iteration)
        opened = self.store.get_batch(batch_id) is not None
        # The batch before this one, for its start order (and, for a learning policy,
        # its plan: the store's latest batch before it). With none, a learning policy's
        # batch runs the policy that needs no history.
        before = self.store.batch_before(batch_id if opened else None)
        fallback = policy_without_history(options.policy)
        if before is None and fallback != options.policy:
            options = dataclasses.replace(
                options, policy=fallback, plans_split=fallback in PLANS_SPLIT
            )
        batch = IterationBatch(batch_id, len(records), [t.task_id for t in tasks], epoch, options)
        if opened:
            return batch  # opened before a crash or a retry: the same draw
        records = in_start_order(self.store, records, before)
        self.store.create_batch(
            batch_id=batch_id,
            records=records,
            options=options,
            source=f"campaign:{spec.name}",
            created_at=time.time(),
            tasks=tasks,
        )
        return batch

    @activity.defn(name=names.RECORD_ITERATION)
    async def record_iteration(self, record: IterationRecord) -> IterationRecord:
        """Store the iteration with its batch's rewards (mean, pass rate) filled in."""

        def write() -> IterationRecord:
            outcomes = self.store.batch_outcomes(record.batch_id)
            done = dataclasses.replace(
                record,
                reward_mean=outcomes["mean_reward"] or 0.0,
                pass_rate=outcomes["pass_rate"] or 0.0,
            )
            self.store.record_iteration(dataclasses.asdict(done))
            return done

        return await asyncio.to_thread(write)
