"""A Heddle worker process: the trajectory workflows, their store and scheduler
activities, the tools, and one engine worker per simulated engine instance.

Run it as `heddle worker --address HOST:PORT`; the embedded stack starts one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.agent import AgentTurns
from activities.campaign import CampaignActivities
from activities.control import ControlActivities, Replanner
from activities.scheduler import Scheduler, SchedulerActivities
from activities.store import StoreActivities
from activities.toolkit import default_registry
from activities.tools import ToolActivities
from activities.train import TrainerActivities
from engines.disaggregation import PrefillPool
from engines.pool import EnginePool, EngineShape
from engines.trajectory_costs import allowed_costs
from engines.vllm import VllmSettings, engine_nice, lower_session
from heddle import metrics
from heddle.config import ClusterConfig
from heddle.queues import control_queue, tools_queue, trainer_queue, trajectories_queue
from heddle.runtime.engine_host import EngineHost, ensure_control_workflow
from heddle.runtime.payloads import DATA_CONVERTER
from heddle.runtime.scheduler_link import LocalScheduler, RemoteScheduler, SchedulerServer
from heddle.runtime.stack import ensure_search_attributes
from heddle.runtime.tracing import flush_traces, tracing_interceptor
from heddle.store import TrajectoryStore
from scheduler.interface import PolicyContext
from scheduler.plan import initial_plan
from scheduler.roles import PrefillForecast
from scheduler.service import SchedulerService
from workflows import policy
from workflows.batch import RolloutBatchWorkflow, RolloutSliceWorkflow
from workflows.campaign import TrainingCampaignWorkflow
from workflows.control import ClusterControlWorkflow
from workflows.trajectory import TrajectoryWorkflow

log = logging.getLogger(__name__)

# Every running trajectory stays in the worker's cache: an evicted one replays its whole
# history on its next task. A batch of thousands runs at once.
MAX_CACHED_WORKFLOWS = 20_000


@dataclass(frozen=True)
class WorkerOptions:
    address: str
    store_url: str
    namespace: str = "default"
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    time_scale: float = 1.0
    queue_prefix: str = ""
    engine_policy: str = "fcfs"
    # One process of a stack hosts the engines (and the control activities); others
    # run workflows and tools only, or each would add a copy of every instance.
    host_engines: bool = True
    # A process that polls the trainer queue runs campaigns' train steps (torch).
    host_trainer: bool = True
    # Where the engine host's scheduler service listens for the other workers' decides
    # (port 0: any free one); the host announces it in the cluster plan.
    scheduler_host: str = "127.0.0.1"
    scheduler_port: int = 0
    # HOST:PORT where this process serves Heddle's Prometheus metrics, and the Temporal
    # SDK's ("" for none); where its OpenTelemetry traces go ("otlp", a file, or "").
    metrics_address: str = ""
    sdk_metrics_address: str = ""
    traces: str = ""
    # The operator's own tools, name -> "module:function", beside the built-in ones.
    tools: dict[str, str] = field(default_factory=dict)


def vllm_settings(cluster: ClusterConfig) -> VllmSettings | None:
    """How the host starts vLLM instances, or None for simulated engines."""
    engine = cluster.engine
    if engine.kind != "vllm":
        return None
    assert engine.model_path is not None  # the config checked it
    shape = cluster.shape()
    spec = shape.speculation
    spec_limits: list[tuple[int, int]] = []
    if spec is not None:
        spec_limits = [
            (cost.tp, cost.speculation_max_batch(spec, shape.max_num_seqs))
            for cost in allowed_costs(shape)
        ]
    return VllmSettings(
        model_path=engine.model_path,
        max_model_len=engine.max_model_len,
        max_num_seqs=cluster.max_num_seqs,
        max_num_batched_tokens=cluster.max_num_batched_tokens,
        kv_cache_gib=engine.kv_cache_gib,
        enforce_eager=engine.enforce_eager,
        use_gpus=engine.use_gpus,
        nice=engine.nice,
        speculation=spec,
        speculation_max_batch=tuple(spec_limits),
    )


def on_synced_weights(settings: VllmSettings, store: TrajectoryStore, prefix: str) -> VllmSettings:
    """The settings with the checkpoint a campaign last synced this host's instances to,
    if any: a host restarted after a crash brings them back on it, not on the base."""
    synced = store.engine_weights(prefix)
    if synced is None or not Path(synced[0]).is_dir():
        return settings
    log.info("engines start on the synced checkpoint %s (version %d)", *synced)
    return dataclasses.replace(settings, model_path=synced[0], weight_version=synced[1])


def connect_ray(cluster: ClusterConfig) -> None:
    """Join the Ray cluster the engine config names, or start a local one."""
    import os

    import ray

    if ray.is_initialized():
        return
    engine = cluster.engine
    if engine.ray_address:
        ray.init(address=engine.ray_address)
    else:
        # A local Ray's actors, and the engines they start, stay in this session: it is
        # lowered as a local engine host's is (see `lower_session`).
        lower_session(engine_nice(engine.nice))
        # Placement groups count logical CPUs: at least one per instance.
        cpus = max(os.cpu_count() or 1, cluster.num_gpus)
        ray.init(num_cpus=cpus, include_dashboard=False, object_store_memory=256 * 2**20)


async def run_worker(opts: WorkerOptions, stop: asyncio.Event | None = None) -> None:
    """Serve until `stop` is set (or SIGINT/SIGTERM when it is None)."""
    if opts.metrics_address:
        metrics.serve(opts.metrics_address)
    interceptors = [tracing_interceptor(opts.traces)] if opts.traces else []
    client = await Client.connect(
        opts.address,
        namespace=opts.namespace,
        data_converter=DATA_CONVERTER,
        interceptors=interceptors,
        runtime=metrics.sdk_runtime(opts.sdk_metrics_address) if opts.sdk_metrics_address else None,
    )
    try:
        await ensure_search_attributes(client, opts.namespace)
    except Exception as exc:  # e.g. no operator permission on a managed cluster
        log.warning("could not register Heddle's search attributes: %s", exc)
    store = TrajectoryStore.open(opts.store_url)
    cluster = opts.cluster
    prefix = opts.queue_prefix
    shape = cluster.shape()
    service = SchedulerService(context=PolicyContext(shape))
    pool = None
    if opts.host_engines:
        settings = vllm_settings(cluster)
        if settings is not None:
            settings = on_synced_weights(settings, store, prefix)
        pool = EnginePool(
            EngineShape(shape, policy=opts.engine_policy, time_scale=opts.time_scale),
            settings,
            ray=cluster.engine.hosting == "ray",
        )
        if pool.ray:
            connect_ray(cluster)
        if shape.disaggregation is not None and settings is None:
            forecast = PrefillForecast(shape.disaggregation.min_prefill_tokens)
            pool.prefills = PrefillPool(pool, shape.disaggregation, forecast.observe)
    agent = None
    if pool is not None and pool.vllm is not None:
        agent = AgentTurns(store, pool.vllm.model_path, pool.vllm.max_model_len)
    host = EngineHost(client, service, pool, prefix, opts.time_scale, agent)
    # The cluster's one scheduler is the engine host's: in this process, or reached at
    # the address the host announced in the plan.
    local = LocalScheduler(service, Replanner(store, service))
    if pool is not None and opts.metrics_address:
        metrics.watch_engines(lambda: pool.engines, lambda: pool.tps)
        metrics.watch_forecasts(lambda: local.forecasts)
    server: SchedulerServer | None = None
    scheduler: Scheduler = local
    if pool is None:
        scheduler = RemoteScheduler(lambda: host.plan.scheduler_address if host.plan else "")
    store_acts = StoreActivities(
        store=store,
        time_scale=opts.time_scale,
        instance_ids=lambda: list(service.instance_ids),
        scheduler=scheduler,
    )
    sched_acts = SchedulerActivities(scheduler=scheduler)
    tool_acts = ToolActivities(
        registry=default_registry(custom=opts.tools), store=store, time_scale=opts.time_scale
    )
    campaign_acts = CampaignActivities(store=store)
    workers = [
        Worker(
            client,
            task_queue=trajectories_queue(prefix),
            workflows=[
                TrajectoryWorkflow,
                RolloutBatchWorkflow,
                RolloutSliceWorkflow,
                ClusterControlWorkflow,
                TrainingCampaignWorkflow,
            ],
            activities=[
                campaign_acts.open_iteration,
                campaign_acts.record_iteration,
                store_acts.begin_batch,
                store_acts.load_specs,
                store_acts.mark_started,
                store_acts.record_step,
                store_acts.finish_trajectory,
                store_acts.end_trajectory,
                store_acts.finish_batch,
                sched_acts.decide,
                sched_acts.anticipate,
                sched_acts.report_step,
                sched_acts.report_done,
                tool_acts.reward,  # a local activity on the lean path
            ],
            max_concurrent_workflow_tasks=200,
            max_concurrent_local_activities=200,
            max_cached_workflows=MAX_CACHED_WORKFLOWS,
            workflow_runner=UnsandboxedWorkflowRunner(),
        ),
        Worker(
            client,
            task_queue=tools_queue(prefix),
            activities=[tool_acts.run_tool, tool_acts.reward, tool_acts.verify],
            max_concurrent_activities=512,
            max_heartbeat_throttle_interval=policy.HEARTBEAT_THROTTLE,
        ),
    ]
    if pool is not None:
        control_acts = ControlActivities(host=host, store=store)
        workers.append(
            Worker(
                client,
                task_queue=control_queue(prefix),
                activities=[
                    control_acts.wait_drained,
                    control_acts.wait_started,
                    control_acts.claim_split,
                    control_acts.release_split,
                    control_acts.plan_batch,
                    control_acts.apply_split,
                    control_acts.migrate_kv,
                    control_acts.sync_weights,
                    control_acts.lend_blocks,
                    control_acts.lend_idle_blocks,
                    control_acts.lend_tail_blocks,
                    control_acts.give_back_blocks,
                    # The scheduler calls of batches whose policy planned them.
                    sched_acts.decide,
                    sched_acts.anticipate,
                    sched_acts.report_step,
                    sched_acts.report_done,
                ],
                max_heartbeat_throttle_interval=policy.HEARTBEAT_THROTTLE,
            )
        )
    if opts.host_trainer:
        trainer = TrainerActivities(store=store, shape=shape, time_scale=opts.time_scale)
        workers.append(
            Worker(
                client,
                task_queue=trainer_queue(prefix),
                activities=[trainer.prepare_campaign, trainer.train_step, trainer.train_slice],
                # One step at a time: a step uses the process's torch threads.
                max_concurrent_activities=1,
                max_heartbeat_throttle_interval=policy.HEARTBEAT_THROTTLE,
            )
        )
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    log.info(
        "worker serving %s (%s engines)", trajectories_queue(prefix),
        "hosting" if pool is not None else "no",
    )  # fmt: skip
    runs = [asyncio.create_task(w.run()) for w in workers]
    # The cluster plan: the control workflow keeps it across restarts; the first worker
    # of a cluster starts it with the configured split.
    initial = initial_plan(
        cluster.instance_ids(),
        [cluster.default_tp] * len(cluster.instance_ids()),
        cluster.num_gpus,
        cluster.tp_choices,
    )
    control = await ensure_control_workflow(client, initial, prefix)
    if pool is not None:
        server = SchedulerServer(local)
        address = await server.start(opts.scheduler_host, opts.scheduler_port)
        await control.execute_update(ClusterControlWorkflow.announce_scheduler, address)
        log.info("scheduler service at %s", address)
    # The host's loops run until cancelled; every one is cancelled and awaited before the
    # host closes, so none acts on the plan (starting engine workers) after it.
    loops = [asyncio.create_task(host.follow(control)), asyncio.create_task(host.review())]
    if pool is not None and pool.prefills is not None:
        loops.append(asyncio.create_task(host.plan_roles(pool.prefills, forecast)))
    runs.extend(loops)
    waiter = asyncio.create_task(stop.wait())
    try:
        # A worker that dies (e.g. the server went away) ends the process too.
        done, _ = await asyncio.wait([waiter, *runs], return_when=asyncio.FIRST_COMPLETED)
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        await host.close()
        await asyncio.gather(*(w.shutdown() for w in workers), return_exceptions=True)
        if server is not None:
            await server.close()
        if isinstance(scheduler, RemoteScheduler):
            await scheduler.close()
        for task in done:
            if task is not waiter and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        waiter.cancel()
        store.close()
        if opts.traces:
            flush_traces()
