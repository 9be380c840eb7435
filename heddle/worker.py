"""A Heddle worker process: the trajectory workflows, their store and scheduler
activities, the tools, and one engine worker per simulated engine instance.

Run it as `heddle worker --address HOST:PORT`; the embedded stack starts one.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass, field

from temporalio.client import Client
from temporalio.worker import Worker

from activities.engine import EngineActivities
from activities.scheduler import SchedulerActivities
from activities.store import StoreActivities
from activities.toolkit import default_registry
from activities.tools import ToolActivities
from engines.pool import EnginePool
from heddle.config import ClusterConfig
from heddle.queues import engine_queue, tools_queue, trajectories_queue
from heddle.stack import ensure_search_attributes
from heddle.store import TrajectoryStore
from scheduler.interface import PolicyContext
from scheduler.service import SchedulerService
from workflows.batch import RolloutBatchWorkflow
from workflows.trajectory import TrajectoryWorkflow

log = logging.getLogger(__name__)

# The engine is the queue: a worker takes every step sent to its instance and the engine
# core orders them, so this bound only guards memory.
MAX_STEPS_PER_ENGINE = 8192


@dataclass(frozen=True)
class WorkerOptions:
    address: str
    store_url: str
    namespace: str = "default"
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    time_scale: float = 1.0
    queue_prefix: str = ""
    engine_policy: str = "fcfs"


async def run_worker(opts: WorkerOptions, stop: asyncio.Event | None = None) -> None:
    """Serve until `stop` is set (or SIGINT/SIGTERM when it is None)."""
    client = await Client.connect(opts.address, namespace=opts.namespace)
    try:
        await ensure_search_attributes(client, opts.namespace)
    except Exception as exc:  # e.g. no operator permission on a managed cluster
        log.warning("could not register Heddle's search attributes: %s", exc)
    store = TrajectoryStore.open(opts.store_url)
    cluster = opts.cluster
    pool = EnginePool.simulated(
        instance_ids=cluster.instance_ids(),
        model=cluster.model,
        gpu=cluster.gpu,
        tp=cluster.default_tp,
        max_num_seqs=cluster.max_num_seqs,
        max_num_batched_tokens=cluster.max_num_batched_tokens,
        gpu_memory_utilization=cluster.gpu_memory_utilization,
        policy=opts.engine_policy,
        time_scale=opts.time_scale,
    )
    await pool.start()
    service = SchedulerService(
        instance_ids=pool.instance_ids,
        context=PolicyContext.for_cluster(cluster),
        tps=dict.fromkeys(pool.instance_ids, cluster.default_tp),
    )
    store_acts = StoreActivities(
        store=store, time_scale=opts.time_scale, instance_ids=pool.instance_ids
    )
    sched_acts = SchedulerActivities(service=service)
    tool_acts = ToolActivities(registry=default_registry(), store=store, time_scale=opts.time_scale)
    prefix = opts.queue_prefix
    workers = [
        Worker(
            client,
            task_queue=trajectories_queue(prefix),
            workflows=[TrajectoryWorkflow, RolloutBatchWorkflow],
            activities=[
                store_acts.begin_batch,
                store_acts.load_specs,
                store_acts.mark_started,
                store_acts.record_step,
                store_acts.finish_trajectory,
                store_acts.finish_batch,
                sched_acts.decide,
                sched_acts.report_step,
                sched_acts.report_done,
            ],
            max_concurrent_workflow_tasks=200,
            max_concurrent_local_activities=200,
        ),
        Worker(
            client,
            task_queue=tools_queue(prefix),
            activities=[tool_acts.run_tool, tool_acts.reward],
            max_concurrent_activities=512,
        ),
    ]
    for iid in pool.instance_ids:
        acts = EngineActivities(engine=pool[iid])
        workers.append(
            Worker(
                client,
                task_queue=engine_queue(iid, prefix),
                activities=[acts.generate],
                max_concurrent_activities=MAX_STEPS_PER_ENGINE,
            )
        )
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    log.info(
        "worker serving %s with %d engine instances", trajectories_queue(prefix), len(pool.engines)
    )
    runs = [asyncio.create_task(w.run()) for w in workers]
    waiter = asyncio.create_task(stop.wait())
    try:
        # A worker that dies (e.g. the server went away) ends the process too.
        done, _ = await asyncio.wait([waiter, *runs], return_when=asyncio.FIRST_COMPLETED)
        await asyncio.gather(*(w.shutdown() for w in workers), return_exceptions=True)
        for task in done:
            if task is not waiter and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        waiter.cancel()
        await pool.stop()
        store.close()
