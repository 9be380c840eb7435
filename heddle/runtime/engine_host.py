"""A worker process's side of the cluster plan: it follows the control workflow's plan.

Every `RECONCILE_EVERY_S` it reads the plan (a query) and brings the process in line:
the scheduler service offers the active instances only; a process that hosts engines
starts the instances the plan names (a "starting" one after its modelled restart) and
stops those the plan dropped, each an engine in the pool with a Temporal worker on its
`engine.<id>` queue. The plan is the truth; the process keeps none of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import timedelta

from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import Worker

from activities.agent import AgentTurns
from activities.control import RECONCILE_EVERY_S
from activities.engine import EngineActivities
from engines.disaggregation import PrefillPool
from engines.pool import EnginePool
from heddle import metrics
from heddle.queues import control_workflow_id, engine_queue, trajectories_queue
from heddle.types import ClusterPlan, ControlInput, InstancePlan, PlanChange
from scheduler.interface import REVIEW_EVERY_S
from scheduler.plan import active_instances, engine_instances
from scheduler.roles import DECODE, PREFILL, PrefillForecast, RoleInstance, prefill_instances
from scheduler.service import SchedulerService
from workflows import policy
from workflows.control import ClusterControlWorkflow

log = logging.getLogger(__name__)

# The engine is the queue: a worker takes every step sent to its instance and the engine
# core orders them, so this bound only guards memory.
MAX_STEPS_PER_ENGINE = 8192
# A stopped instance's steps get this long to end (a dead engine's fail at once with
# EngineDead, which the workflow must see: a step cancelled by the shutdown would be
# retried on the same instance instead of decided again).
STOP_GRACE = timedelta(seconds=10)
# The least wall time between two mid-step reviews: a step the review moves has to run
# on for longer than this for the move to pay.
MIN_REVIEW_WALL_S = 0.05


async def ensure_control_workflow(
    client: Client, initial: ClusterPlan, prefix: str
) -> WorkflowHandle[ClusterControlWorkflow, None]:
    """Start the control workflow with `initial` unless it already runs: its plan
    outlives worker restarts. A plan for another cluster shape (GPU count or TP choices
    changed in the cluster file) is replaced by `initial`. Needs this process's workflow
    worker running (the plan is read by a query)."""

    async def start() -> WorkflowHandle[ClusterControlWorkflow, None]:
        return await client.start_workflow(
            ClusterControlWorkflow.run,
            ControlInput(initial, prefix),
            id=control_workflow_id(prefix),
            task_queue=trajectories_queue(prefix),
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )

    handle = await start()
    plan = await handle.query(ClusterControlWorkflow.plan)
    if plan.num_gpus != initial.num_gpus or sorted(plan.tp_choices) != sorted(initial.tp_choices):
        log.warning(
            "the cluster plan is for %d GPUs with TP %s; the cluster file says %d with %s: "
            "starting over from the file",
            plan.num_gpus, plan.tp_choices, initial.num_gpus, initial.tp_choices,
        )  # fmt: skip
        await handle.terminate("cluster file changed")
        handle = await start()
    return handle


def _reshaped(began: float) -> Callable[[asyncio.Task[ClusterPlan]], None]:
    """What ends a reshape asked for during rollout: its outcome counted (and a refusal
    logged), its time from the ask to its new instances up measured."""

    def done(task: asyncio.Task[ClusterPlan]) -> None:
        if task.cancelled() or task.exception() is not None:
            metrics.RESHAPES.labels("rollout", "refused").inc()
            if not task.cancelled():
                log.warning("a reshape during rollout was refused: %s", task.exception())
            return
        metrics.RESHAPES.labels("rollout", "done").inc()
        metrics.RESHAPE_SECONDS.labels("rollout").observe(time.monotonic() - began)

    return done


class EngineHost:
    def __init__(
        self,
        client: Client,
        service: SchedulerService,
        pool: EnginePool | None,
        prefix: str,
        time_scale: float,
        agent: AgentTurns | None = None,
    ) -> None:
        self.client = client
        self.agent = agent  # agent turns' contexts, shared by the host's vLLM instances
        self.service = service
        self.pool = pool  # None: this process hosts no engines
        self.prefix = prefix
        self.time_scale = time_scale
        self._workers: dict[str, tuple[Worker, asyncio.Task[None]]] = {}
        # The workers of instances whose engine died, kept polling until the instance is
        # back: a step sent there meanwhile fails at once with EngineDead and is decided
        # again, instead of waiting in the queue for the restart.
        self._dead_workers: dict[str, tuple[Worker, asyncio.Task[None]]] = {}
        self._starting: dict[str, asyncio.Task[None]] = {}
        self._reshaping: set[asyncio.Task[ClusterPlan]] = set()
        self.plan: ClusterPlan | None = None
        # Instances whose engine died: not offered to the scheduler until restarted.
        self.down: set[str] = set()

    def mark_down(self, instance_id: str) -> None:
        """An instance's engine died: the scheduler stops offering it at once (its steps
        are decided again), and the next reconcile restarts it."""
        if instance_id not in self.down:
            log.warning("engine instance %s died; restarting it", instance_id)
            self.down.add(instance_id)
        if self.plan is not None:
            self._offer(self.plan)

    def _offer(self, plan: ClusterPlan) -> None:
        """The scheduler places steps on the active instances that are up and decode."""
        active = active_instances(plan)
        closed = self.down | (
            self.pool.prefills.serving if self.pool and self.pool.prefills else set()
        )
        self.service.set_instances({i: tp for i, tp in active.items() if i not in closed})

    async def plan_roles(self, prefills: PrefillPool, forecast: PrefillForecast) -> None:
        """Switch the hosted instances between prefill and decode every half horizon
        (scaled), as `scheduler.roles` says from the forecast demand; the scheduler is
        offered the decode instances only. A static pool is chosen once."""
        config = prefills.config
        while True:
            if self.pool is None or self.plan is None:
                await asyncio.sleep(MIN_REVIEW_WALL_S)  # the plan comes first
                continue
            if config.roles == "forecast" or not prefills.serving:
                try:
                    self._switch_roles(prefills, forecast)
                except Exception:  # the roles stay as they are; the next round tries again
                    log.exception("planning prefill and decode roles failed")
            await asyncio.sleep(max(MIN_REVIEW_WALL_S, config.horizon_s / 2 * self.time_scale))

    def _switch_roles(self, prefills: PrefillPool, forecast: PrefillForecast) -> None:
        assert self.pool is not None
        assert self.plan is not None
        hosted = [i for i in self._workers if i in self.pool.engines]
        load = self.service.load_by_instance()
        views = [
            RoleInstance(
                iid, self.pool.tps[iid], PREFILL if iid in prefills.serving else DECODE,
                load=load.get(iid, 0) + self.pool[iid].load,
                prefill_tokens_per_s=prefills.rate(iid),
                kv_capacity_tokens=self.pool.shape.cost(self.pool.tps[iid]).kv_capacity_tokens,
            )
            for iid in hosted
        ]  # fmt: skip
        decoding = sum(
            self.pool[i].core.num_running_kv_tokens  # type: ignore[attr-defined]
            for i in hosted
            if i not in prefills.serving
        )
        wanted = prefill_instances(
            views,
            demand_tokens=forecast.demand_tokens([], self.service.tool_users()),
            decoding_kv_tokens=decoding,
            config=prefills.config,
        )
        if wanted != prefills.serving:
            log.info("instances serving prefill: %s", sorted(wanted) or "none")
            prefills.serving = wanted
            metrics.PREFILL_INSTANCES.set(len(wanted))
            self._offer(self.plan)

    def is_up(self, instance_id: str) -> bool:
        return instance_id in self._workers

    def load(self, instance_id: str) -> int:
        """Steps on a hosted instance's engine (waiting or running)."""
        if self.pool is None or instance_id not in self.pool.engines:
            return 0
        return self.pool[instance_id].load

    async def review(self) -> None:
        """Show the scheduler the decodes in progress, and the queued steps on instances
        it is emptying, every `REVIEW_EVERY_S` (scaled), and stop the ones it moves; each
        continues on its new instance (the trajectory workflow moves the KV and resumes
        the step from the tokens made). At least `MIN_REVIEW_WALL_S` apart: at a fast
        time scale a review every 5 s of stack time came every half millisecond and
        took a good part of the worker's CPU."""
        while True:
            await asyncio.sleep(max(MIN_REVIEW_WALL_S, REVIEW_EVERY_S * self.time_scale))
            if self.pool is None or not self.service.reviews():
                continue
            emptying = self.service.emptying()
            running = {
                r.prefix_key: (iid, r.request_id, r.context_tokens + r.num_output_tokens)
                for iid, engine in self.pool.engines.items()
                for r in engine.running_decodes()
                + (engine.queued_steps() if iid in emptying else [])
            }
            try:
                moves = self.service.review(
                    [(iid, tid, ctx) for tid, (iid, _, ctx) in running.items()], time.time()
                )
            except Exception:
                log.exception("mid-step review failed")
                continue
            for tid, source, target in moves:
                if source in self.pool.engines and self.pool[source].stop_to_move(
                    running[tid][1], target
                ):
                    metrics.MIGRATIONS.labels("mid_step").inc()

    async def follow(self, handle: WorkflowHandle[ClusterControlWorkflow, None]) -> None:
        """Reconcile with the plan until cancelled; a failed query is retried. The
        process that hosts the engines also asks the control workflow for the reshapes
        the scheduler's policies want during rollout."""
        while True:
            try:
                plan = await handle.query(
                    ClusterControlWorkflow.plan, rpc_timeout=timedelta(seconds=5)
                )
                await self.reconcile(plan)
                if self.pool is not None:
                    self._request_reshapes(handle, plan)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("could not follow the cluster plan: %s", exc)
            await asyncio.sleep(RECONCILE_EVERY_S)

    def _request_reshapes(
        self, handle: WorkflowHandle[ClusterControlWorkflow, None], plan: ClusterPlan
    ) -> None:
        first_gpu = {i.instance_id: i.first_gpu for i in plan.instances}
        for retire, new_id, tp in self.service.reshapes(time.time()):
            if not all(i in first_gpu for i in retire):
                log.warning("reshape %s -> %s names instances not in the plan", retire, new_id)
                continue
            change = PlanChange(
                retire,
                [InstancePlan(new_id, tp, min(first_gpu[i] for i in retire))],
                "merge idle instances for the tail",
            )
            task = asyncio.create_task(
                handle.execute_update(ClusterControlWorkflow.reshape, change)
            )
            task.add_done_callback(_reshaped(time.monotonic()))
            self._reshaping.add(task)
            task.add_done_callback(self._reshaping.discard)

    async def reconcile(self, plan: ClusterPlan) -> None:
        self.plan = plan
        if self.pool is not None:
            for iid in self.pool.unhealthy():
                self.mark_down(iid)
                if iid in self._workers:
                    self._dead_workers[iid] = self._workers.pop(iid)
                await self.pool.remove(iid)
        self._offer(plan)
        if self.pool is None:
            return
        hosted = [i for i in self._workers if i in self.pool.engines]
        self.service.observe_loads(
            {i: self.pool[i].load for i in hosted}, {i: self.pool[i].kv_usage for i in hosted}
        )
        wanted = {i.instance_id: i for i in engine_instances(plan)}
        for iid in [i for i in self._workers if i not in wanted]:
            await self._stop(iid)
        for iid in [i for i in self._dead_workers if i not in wanted]:
            await _shutdown(*self._dead_workers.pop(iid))  # dropped by the plan: no restart
        for iid, inst in wanted.items():
            if iid in self._workers or iid in self._starting:
                continue
            # An instance the plan is starting pays its restart; one that is already
            # active (this process restarted) comes back at once.
            delay = (
                self.pool.restart_s(inst.tp) * self.time_scale if inst.state == "starting" else 0
            )
            self._starting[iid] = asyncio.create_task(
                self._start(iid, inst.tp, inst.first_gpu, delay)
            )

    async def _start(self, instance_id: str, tp: int, first_gpu: int, delay_s: float) -> None:
        assert self.pool is not None
        try:
            await asyncio.sleep(delay_s)
            engine = await self.pool.add(instance_id, tp, first_gpu)
            acts = EngineActivities(
                engine=engine,
                on_dead=self.mark_down,
                pool=self.pool,
                service=self.service,
                agent=self.agent,
            )
            if instance_id in self._dead_workers:
                # One worker per task queue in a process: the dead one goes first.
                await _shutdown(*self._dead_workers.pop(instance_id))
            worker = Worker(
                self.client,
                task_queue=engine_queue(instance_id, self.prefix),
                activities=[acts.generate],
                max_concurrent_activities=MAX_STEPS_PER_ENGINE,
                max_heartbeat_throttle_interval=policy.HEARTBEAT_THROTTLE,
                graceful_shutdown_timeout=STOP_GRACE,
            )
            self._workers[instance_id] = (worker, asyncio.create_task(worker.run()))
            log.info("engine instance %s up at TP %d", instance_id, tp)
            if instance_id in self.down:
                self.down.discard(instance_id)
                if self.plan is not None:
                    self._offer(self.plan)
        except Exception:
            # The next reconcile tries again; the plan keeps naming the instance.
            log.exception("engine instance %s (TP %d) failed to start", instance_id, tp)
        finally:
            self._starting.pop(instance_id, None)

    async def _stop(self, instance_id: str) -> None:
        await _shutdown(*self._workers.pop(instance_id))
        if self.pool is not None:
            await self.pool.remove(instance_id)
        log.info("engine instance %s stopped", instance_id)

    async def close(self) -> None:
        # Instances still starting, and reshapes asked of the control workflow (each
        # waits for a workflow worker to take it, and the workers are stopping): all are
        # cancelled and awaited, so none outlives the host.
        pending = [*self._starting.values(), *self._reshaping]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for iid in list(self._workers):
            await self._stop(iid)
        for iid in list(self._dead_workers):
            await _shutdown(*self._dead_workers.pop(iid))


async def _shutdown(worker: Worker, task: asyncio.Task[None]) -> None:
    await worker.shutdown()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
