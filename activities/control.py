"""Activities of the process that hosts the engines (task queue `control`): the control
workflow's waits (retiring instances drained, new ones up), a batch's plan and the
reshape to its split, a trajectory's KV moved between instances, and engine instances
lent to a campaign's trainer and given back."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Protocol

from temporalio import activity
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from activities.heartbeat import heartbeating
from engines.pool import EnginePool
from heddle import activity_names as names
from heddle import metrics
from heddle.campaign import IdleLend, SyncRequest, TailLend
from heddle.queues import control_workflow_id
from heddle.store import TrajectoryStore
from heddle.types import (
    BatchPlanRequest,
    BlockMove,
    ClusterPlan,
    InstancePlan,
    MigrateRequest,
    PlanChange,
    TrajectoryDone,
)
from scheduler import plan as plans
from scheduler.reallocation import Block, blocks_for_trainer
from scheduler.service import SchedulerService
from workflows.control import ClusterControlWorkflow

# Specs a batch plan reads at once from the store (a batch is at most this large), and
# the batches it looks back over for the one before it.
MAX_BATCH = 1_000_000

# How often every worker reads the cluster plan (the engine host's reconcile loop).
RECONCILE_EVERY_S = 0.5
POLL_S = 0.1
CLAIM_POLL_S = 1.0
# Idle this long before an instance counts as drained: every process has then read the
# plan that marks it draining, so no new step is decided for it.
SETTLE_S = 4 * RECONCILE_EVERY_S
# The longest a train step's lend waits for a rollout's trajectories to stop starting.
LEND_SETTLE_MAX_S = 10 * SETTLE_S


class Host(Protocol):
    """What the control activities use of the engine host (`heddle.runtime.engine_host`)."""

    service: SchedulerService
    pool: EnginePool | None
    prefix: str

    def load(self, instance_id: str) -> int: ...

    def is_up(self, instance_id: str) -> bool: ...


async def plan_from_store(
    store: TrajectoryStore, service: SchedulerService, policy: str, batch_id: str
) -> list[InstancePlan]:
    """Plan a batch in `service` from its specs and the batch created just before it."""
    specs = await asyncio.to_thread(store.load_specs, batch_id, 0, MAX_BATCH)
    before = await asyncio.to_thread(store.batch_before, batch_id)
    history = await asyncio.to_thread(store.history_specs, before, MAX_BATCH) if before else []
    return await asyncio.to_thread(service.plan_batch, policy, batch_id, specs, history)


class Replanner:
    """A restarted scheduler service has lost its planned batches: the first decide of
    one plans it again from the store (planning is deterministic: the same split the
    cluster runs), and its finished trajectories leave the plan's ranking."""

    def __init__(self, store: TrajectoryStore, service: SchedulerService) -> None:
        self.store = store
        self.service = service
        self._lock = asyncio.Lock()

    async def __call__(self, policy: str, batch_id: str) -> None:
        async with self._lock:
            if self.service.is_planned(policy, batch_id):
                return
            await plan_from_store(self.store, self.service, policy, batch_id)
            rows = await asyncio.to_thread(self.store.list_trajectories, batch_id, limit=MAX_BATCH)
            for row in rows:
                if row["status"] in ("completed", "failed"):
                    self.service.finished(
                        TrajectoryDone(
                            row["trajectory_id"], row["group_id"], row["generated_tokens"],
                            row["turns"], policy, batch_id,
                        )
                    )  # fmt: skip
            activity.logger.info("batch %s (%s) planned again after a restart", batch_id, policy)


class ControlActivities:
    def __init__(self, *, host: Host, store: TrajectoryStore) -> None:
        self.host = host
        self.store = store

    @activity.defn(name=names.PLAN_BATCH)
    async def plan_batch(self, request: BatchPlanRequest) -> list[InstancePlan]:
        """The policy plans the batch from its specs, learning from the latest earlier
        batch in the store; returns the split it wants."""
        try:
            return await plan_from_store(
                self.store, self.host.service, request.policy, request.batch_id
            )
        except ValueError as exc:  # e.g. a learning policy with no earlier batch
            raise ApplicationError(str(exc), type="PlanError", non_retryable=True) from exc

    def _control(self) -> WorkflowHandle[ClusterControlWorkflow, None]:
        return activity.client().get_workflow_handle_for(
            ClusterControlWorkflow.run, control_workflow_id(self.host.prefix)
        )

    @activity.defn(name=names.CLAIM_SPLIT)
    async def claim_split(self, batch_id: str) -> None:
        """Wait until this batch holds the cluster's split. A holder that is no longer
        running (finished without releasing, failed, terminated) is freed."""
        handle = self._control()
        client = activity.client()
        async with heartbeating():
            while True:
                plan = await handle.query(ClusterControlWorkflow.plan)
                if plan.owner in ("", batch_id):
                    owner = await handle.execute_update(ClusterControlWorkflow.claim, batch_id)
                    if owner == batch_id:
                        return
                else:
                    owner = plan.owner
                holder = await client.get_workflow_handle(owner).describe()
                if holder.status != WorkflowExecutionStatus.RUNNING:
                    await handle.execute_update(ClusterControlWorkflow.release, owner)
                    continue
                await asyncio.sleep(CLAIM_POLL_S)

    @activity.defn(name=names.RELEASE_SPLIT)
    async def release_split(self, batch_id: str) -> None:
        await self._control().execute_update(ClusterControlWorkflow.release, batch_id)

    @activity.defn(name=names.APPLY_SPLIT)
    async def apply_split(self, instances: list[InstancePlan]) -> None:
        """Reshape the cluster to `instances` (every current instance retired), unless it
        already runs them; waits until the reshape has run."""
        handle = self._control()
        plan = await handle.query(ClusterControlWorkflow.plan)
        async with heartbeating():
            while any(i.state != plans.ACTIVE for i in plan.instances):
                # A campaign's train step holds some instances (Libra), or they are on
                # their way there or back: reshape once they are back. (Lent meanwhile,
                # the update is refused and this activity tried again.)
                await asyncio.sleep(CLAIM_POLL_S)
                plan = await handle.query(ClusterControlWorkflow.plan)
        now = sorted((i.instance_id, i.tp, i.first_gpu) for i in plan.instances)
        if now == sorted((i.instance_id, i.tp, i.first_gpu) for i in instances):
            return  # already running (and offered: the plan was read by a reconcile)
        change = PlanChange(
            [i.instance_id for i in plan.instances], instances, "the batch's planned split"
        )
        began = time.monotonic()
        async with heartbeating():
            await handle.execute_update(ClusterControlWorkflow.reshape, change)
            # Return once this process's scheduler offers them: the batch's first decides
            # would otherwise fail and back off until the next reconcile.
            wanted = {i.instance_id for i in instances}
            while not wanted <= set(self.host.service.tps):  # noqa: ASYNC110 (polls the host)
                await asyncio.sleep(POLL_S)
        metrics.RESHAPES.labels("batch_split", "done").inc()
        metrics.RESHAPE_SECONDS.labels("batch_split").observe(time.monotonic() - began)

    @activity.defn(name=names.MIGRATE_KV)
    async def migrate_kv(self, request: MigrateRequest) -> int:
        """Move the trajectory's cached context from `source` to `target` (the pool's
        `move_prefix`); returns the tokens moved (0 if none were cached)."""
        pool = self.host.pool
        if pool is None:
            return 0
        return await pool.move_prefix(request.trajectory_id, request.source, request.target)

    @activity.defn(name=names.SYNC_WEIGHTS)
    async def sync_weights(self, request: SyncRequest) -> float:
        """Every engine instance of this host onto the committed checkpoint; returns the
        sync's seconds (modelled, for simulated engines)."""
        pool = self.host.pool
        if pool is None:
            raise ApplicationError("this worker hosts no engines", non_retryable=True)
        ref = request.checkpoint
        async with heartbeating():
            seconds = await pool.sync_weights(ref.path, ref.step)
        if pool.vllm is not None:
            await asyncio.to_thread(
                self.store.record_engine_weights, self.host.prefix, ref.path, ref.step
            )
        return seconds

    @activity.defn(name=names.LEND_BLOCKS)
    async def lend_blocks(self, min_gpus: int) -> list[InstancePlan]:
        """Lend a train step the instances `scheduler.reallocation` picks: every one that
        holds no trajectory, and the least loaded up to `min_gpus`. Waits while the plan
        changes (a batch's reshape goes first). Instances already lent (this call, tried
        again) are returned as they are."""
        handle = self._control()
        async with heartbeating():
            settled = False
            while True:
                plan = await handle.query(ClusterControlWorkflow.plan)
                lent = plans.lent_instances(plan)
                if lent:
                    return lent
                if not settled:
                    await self._trajectories_settled()
                    settled = True
                    continue  # read the plan again
                if any(i.state != plans.ACTIVE for i in plan.instances):
                    await asyncio.sleep(CLAIM_POLL_S)
                    continue
                taken = blocks_for_trainer(
                    self._blocks(plan), trainer_gpus=0, min_gpus=min_gpus,
                    train_left_s=math.inf, join_s=0.0,
                )  # fmt: skip
                if not taken:
                    return []
                move = BlockMove(to_trainer=taken, reason="a train step borrows them")
                try:
                    plan = await handle.execute_update(ClusterControlWorkflow.move_blocks, move)
                except WorkflowUpdateFailedError:
                    continue  # the plan changed since it was read: read it again
                return [i for i in plan.instances if i.instance_id in taken]

    @activity.defn(name=names.LEND_IDLE_BLOCKS)
    async def lend_idle_blocks(self, request: IdleLend) -> list[InstancePlan]:
        """Between a train step's slices: lend it the instances that fell idle since it
        started, where the step outlasts their move both ways. Returns every instance
        lent now; while the plan changes, none more."""
        async with heartbeating():
            return await self._lend_idle(
                request.train_left_s, request.join_s, "idle while a train step runs"
            )

    @activity.defn(name=names.LEND_TAIL_BLOCKS)
    async def lend_tail_blocks(self, request: TailLend) -> list[InstancePlan]:
        """During a synchronous rollout (Libra's tail): once every trajectory of the
        batch has started, lend the trainer the instances that hold none; the rollout
        keeps one. Returns every instance lent now."""
        async with heartbeating():
            if self.host.service.started_by_batch[request.batch_id] < request.num_trajectories:
                plan = await self._control().query(ClusterControlWorkflow.plan)
                return plans.lent_instances(plan)
            return await self._lend_idle(math.inf, 0.0, "idle in the rollout's tail")

    async def _lend_idle(
        self, train_left_s: float, join_s: float, reason: str
    ) -> list[InstancePlan]:
        """Lend the instances `blocks_for_trainer` picks among the idle ones, beside those
        lent already; returns every instance lent. While the plan changes, none more."""
        handle = self._control()
        plan = await handle.query(ClusterControlWorkflow.plan)
        lent = plans.lent_instances(plan)
        if any(i.state not in (plans.ACTIVE, plans.TRAINING) for i in plan.instances):
            return lent
        taken = blocks_for_trainer(
            self._blocks(plan), trainer_gpus=sum(i.tp for i in lent), min_gpus=0,
            train_left_s=train_left_s, join_s=join_s,
        )  # fmt: skip
        if not taken:
            return lent
        try:
            move = BlockMove(to_trainer=taken, reason=reason)
            plan = await handle.execute_update(ClusterControlWorkflow.move_blocks, move)
        except WorkflowUpdateFailedError:
            plan = await handle.query(ClusterControlWorkflow.plan)
        return plans.lent_instances(plan)

    async def _trajectories_settled(self) -> None:
        """Until no trajectory has started here for `SETTLE_S` (at most `LEND_SETTLE_MAX_S`):
        the batches a campaign starts just before a step place their trajectories first,
        or the instances they are about to land on would look idle and be lent."""
        loop = asyncio.get_running_loop()
        began = since = loop.time()
        seen = self.host.service.trajectories_started
        while loop.time() - since < SETTLE_S and loop.time() - began < LEND_SETTLE_MAX_S:
            await asyncio.sleep(POLL_S)
            if self.host.service.trajectories_started != seen:
                seen, since = self.host.service.trajectories_started, loop.time()

    def _blocks(self, plan: ClusterPlan) -> list[Block]:
        """The plan's instances as the reallocation rule reads them: the trajectories
        each holds, the steps on their way to it and on it, its engine's restart."""
        loads = self.host.service.load_by_instance()
        pool = self.host.pool
        return [
            Block(i.instance_id, i.tp, training=i.state == plans.TRAINING,
                  load=loads.get(i.instance_id, 0) + self.host.load(i.instance_id),
                  restart_s=pool.restart_s(i.tp) if pool else 0.0)
            for i in plan.instances
        ]  # fmt: skip

    @activity.defn(name=names.GIVE_BACK_BLOCKS)
    async def give_back_blocks(self, instance_ids: list[str]) -> None:
        """The lent instances back to the rollout: their engines start again (before the
        sync, so they load the new weights with the rest)."""
        handle = self._control()
        async with heartbeating():
            plan = await handle.query(ClusterControlWorkflow.plan)
            lent = {i.instance_id for i in plans.lent_instances(plan)}
            back = [i for i in instance_ids if i in lent]
            if back:
                move = BlockMove(to_rollout=back, reason="the train step is done")
                await handle.execute_update(ClusterControlWorkflow.move_blocks, move)

    @activity.defn(name=names.WAIT_DRAINED)
    async def wait_drained(self, instance_ids: list[str]) -> None:
        host = self.host
        idle_since: float | None = None
        loop = asyncio.get_running_loop()
        async with heartbeating():
            while True:
                busy = any(host.load(i) or host.service.in_flight.get(i, 0) for i in instance_ids)
                if busy:
                    idle_since = None
                elif idle_since is None:
                    idle_since = loop.time()
                elif loop.time() - idle_since >= SETTLE_S:
                    return
                await asyncio.sleep(POLL_S)

    @activity.defn(name=names.WAIT_STARTED)
    async def wait_started(self, instance_ids: list[str]) -> None:
        async with heartbeating():
            while not all(self.host.is_up(i) for i in instance_ids):  # noqa: ASYNC110 (polls the host)
                await asyncio.sleep(POLL_S)
