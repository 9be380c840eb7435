"""The cluster's engine plan, held durably: which instances run, at which TP degree.

Workers follow the plan (`heddle/runtime/engine_host.py` reconciles engines and the scheduler's
instance set to it). A reshape arrives as an update, is checked by its validator before
it is accepted, and runs in three phases so no step is lost: the retiring instances
drain (take no new steps, finish theirs), then they stop and the new instances start on
their GPUs, then the new ones take steps. The workflow continues as new every
`changes_per_run` reshapes, or when Temporal suggests it, between reshapes.

An asynchronous campaign with Libra's lever lends instances to its trainer for a train
step and gives them back before the sync (`move_blocks`): a lent instance drains, then
its engine stops ("training"); given back, it starts again. A reshape waits until every
lent instance is back (its validator refuses while one is out).
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from heddle import activity_names as names
    from heddle.queues import control_queue
    from heddle.types import BlockMove, ClusterPlan, ControlInput, PlanChange
    from scheduler import plan as plans

# Draining waits for the longest step on the instance; starting for a weight load.
DRAIN_TIMEOUT = timedelta(hours=2)
START_TIMEOUT = timedelta(minutes=30)
WAIT_HEARTBEAT = timedelta(seconds=30)


@workflow.defn(name="ClusterControlWorkflow")
class ClusterControlWorkflow:
    @workflow.init
    def __init__(self, inp: ControlInput) -> None:
        # Set before any handler runs: an update or query may come in the first task.
        self._plan = inp.plan
        self._show()
        self._prefix = inp.queue_prefix
        self._lock = asyncio.Lock()
        self._changes = 0

    @workflow.run
    async def run(self, inp: ControlInput) -> None:
        await workflow.wait_condition(
            lambda: (
                not self._lock.locked()
                and workflow.all_handlers_finished()
                and (
                    self._changes >= inp.changes_per_run
                    or workflow.info().is_continue_as_new_suggested()
                )
            )
        )
        workflow.continue_as_new(ControlInput(self._plan, inp.queue_prefix, inp.changes_per_run))

    def _show(self) -> None:
        """The plan on the workflow's page in the UI (current details: not a command, so
        histories replay unchanged)."""
        p = self._plan
        head = f"plan v{p.version} on {p.num_gpus} GPUs, held by {p.owner or 'no batch'}"
        if p.scheduler_address:
            head += f", scheduler at {p.scheduler_address}"
        rows = [
            f"- {i.instance_id}: TP {i.tp}, GPUs {i.first_gpu}-{i.first_gpu + i.tp - 1}, {i.state}"
            for i in p.instances
        ]
        workflow.set_current_details("\n".join([head, *rows]))

    @workflow.query
    def plan(self) -> ClusterPlan:
        return self._plan

    @workflow.update
    async def reshape(self, change: PlanChange) -> ClusterPlan:
        async with self._lock:
            plans.check_change(self._plan, change)  # the plan may have moved since validation
            self._plan = plans.mark_draining(self._plan, change.retire)
            self._show()
            await self._drained(change.retire)
            self._plan = plans.swap_instances(self._plan, change)
            self._show()
            created = [c.instance_id for c in change.create]
            await self._started(created)
            self._plan = plans.mark_active(self._plan, created)
            self._show()
            self._changes += 1
            workflow.logger.info("cluster reshaped: %s (%s)", change, change.reason)
            return self._plan

    @workflow.update
    async def move_blocks(self, move: BlockMove) -> ClusterPlan:
        """Lend instances to the trainer (they drain, then their engines stop) and give
        lent ones back (their engines start, then take steps): Libra's lever."""
        async with self._lock:
            plans.check_move(self._plan, move)
            lent, back = move.to_trainer, move.to_rollout
            if lent:
                self._plan = plans.mark_draining(self._plan, lent)
                self._show()
                await self._drained(lent)
                self._plan = plans.mark(self._plan, lent, plans.TRAINING)
            if back:
                self._plan = plans.mark(self._plan, back, plans.STARTING)
                self._show()
                await self._started(back)
                self._plan = plans.mark_active(self._plan, back)
            self._show()
            self._changes += 1
            workflow.logger.info("blocks moved: %s (%s)", move, move.reason)
            return self._plan

    async def _drained(self, instance_ids: list[str]) -> None:
        """Until the instances run no step (they take no new ones already)."""
        await workflow.execute_activity(
            names.WAIT_DRAINED,
            instance_ids,
            task_queue=control_queue(self._prefix),
            start_to_close_timeout=DRAIN_TIMEOUT,
            heartbeat_timeout=WAIT_HEARTBEAT,
        )

    async def _started(self, instance_ids: list[str]) -> None:
        """Until the instances' engines are up."""
        await workflow.execute_activity(
            names.WAIT_STARTED,
            instance_ids,
            task_queue=control_queue(self._prefix),
            start_to_close_timeout=START_TIMEOUT,
            heartbeat_timeout=WAIT_HEARTBEAT,
        )

    @move_blocks.validator
    def check_move(self, move: BlockMove) -> None:
        plans.check_move(self._plan, move)

    @workflow.update
    def claim(self, batch_id: str) -> str:
        """A planning batch asks for the cluster's split; returns who holds it now (the
        caller holds it if that is itself). It does not wait: the caller polls, and frees
        the split of a holder that is no longer running."""
        if not self._plan.owner:
            self._plan = dataclasses.replace(self._plan, owner=batch_id)
            self._show()
        return self._plan.owner

    @workflow.update
    def announce_scheduler(self, address: str) -> None:
        """The engine host's scheduler service listens at `address` (HOST:PORT): every
        worker's decide goes there. A restarted host announces its new address."""
        self._plan = dataclasses.replace(self._plan, scheduler_address=address)
        self._show()

    @workflow.update
    def release(self, batch_id: str) -> None:
        if self._plan.owner == batch_id:
            self._plan = dataclasses.replace(self._plan, owner="")
            self._show()

    @reshape.validator
    def check(self, change: PlanChange) -> None:
        """Refused changes never enter the history."""
        plans.check_change(self._plan, change)
