"""The Python client: start rollouts, follow them, read their trajectories.

async with await HeddleClient.connect("127.0.0.1:7233") as heddle:
    handle = await heddle.start_rollout(trace="trace.jsonl")
    report = await handle.report()
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from activities.campaign import in_start_order
from heddle.campaign import CampaignInput, CampaignSpec, CampaignState, campaign_spec, check_spec
from heddle.config import BatchSpec
from heddle.history import load_history
from heddle.queues import campaign_workflow_id, control_workflow_id, trajectories_queue
from heddle.runtime.payloads import DATA_CONVERTER
from heddle.store import TrajectoryStore
from heddle.store.db import default_url
from heddle.tasks import Task, agent_records, load_tasks
from heddle.trace import TraceRecord, load_trace
from heddle.training import TrainingSample, training_batch
from heddle.types import (
    BatchInput,
    BatchReport,
    BlockMove,
    ClusterPlan,
    PlanChange,
    RolloutOptions,
)
from heddle.workloads import generate
from scheduler.registry import PLANS_SPLIT, learns_from_history, policy_names
from workflows.batch import RolloutBatchWorkflow
from workflows.campaign import TrainingCampaignWorkflow
from workflows.control import ClusterControlWorkflow

log = logging.getLogger(__name__)

TOOL_MODES = ("replay", "real")


def new_batch_id() -> str:
    return f"batch-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def validate_options(options: RolloutOptions) -> None:
    """Reject bad options before anything is written or started."""
    if options.policy not in policy_names():
        raise ValueError(f"unknown policy {options.policy!r}; valid policies: {policy_names()}")
    if options.tools not in TOOL_MODES:
        raise ValueError(f"tools must be one of {list(TOOL_MODES)}, got {options.tools!r}")
    for name in ("max_turns", "max_tokens", "max_in_flight", "max_attempts"):
        if getattr(options, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(options, name)}")


@dataclass
class RolloutHandle:
    batch_id: str
    workflow: WorkflowHandle[Any, BatchReport]
    store: TrajectoryStore

    async def progress(self) -> dict[str, int]:
        """Started, running, completed and failed trajectories and the tokens of the
        ended ones, from the store (each trajectory writes there as it starts and ends,
        whichever slice of the batch runs it)."""
        return await asyncio.to_thread(self.store.batch_progress, self.batch_id)

    async def report(self) -> BatchReport:
        """Wait for the batch's report. A server too busy to answer the long poll in time
        (a deadline exceeded, unavailable) is asked again: the batch goes on regardless."""
        while True:
            try:
                return await self.workflow.result()
            except RPCError as exc:
                if exc.status not in (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.UNAVAILABLE):
                    raise
                log.warning("waiting for batch %s: %s; asking again", self.batch_id, exc)
                await asyncio.sleep(1.0)


class HeddleClient:
    def __init__(self, *, temporal: Client, store: TrajectoryStore, queue_prefix: str = "") -> None:
        self.temporal = temporal
        self.store = store
        self.queue_prefix = queue_prefix

    @classmethod
    async def connect(
        cls,
        address: str = "127.0.0.1:7233",
        *,
        namespace: str = "default",
        store_url: str | None = None,
        queue_prefix: str = "",
    ) -> HeddleClient:
        temporal = await Client.connect(address, namespace=namespace, data_converter=DATA_CONVERTER)
        store = await asyncio.to_thread(TrajectoryStore.open, store_url or default_url())
        return cls(temporal=temporal, store=store, queue_prefix=queue_prefix)

    async def __aenter__(self) -> HeddleClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.store.close()

    async def start_rollout(
        self,
        *,
        trace: str | Path | None = None,
        records: list[TraceRecord] | None = None,
        spec: BatchSpec | None = None,
        tasks: str | Path | list[Task] | None = None,
        samples: int = 1,
        options: RolloutOptions | None = None,
        batch_id: str | None = None,
        history: str | Path | list[TraceRecord] | None = None,
    ) -> RolloutHandle:
        """Validate the input and options, store the batch, then start its workflow.

        The batch comes from a trace file, from trace records, from a batch spec (a
        synthetic workload), or from tasks (a task file or list): `samples` agent
        trajectories of each, which the model writes. A bad trace or task file raises
        `TraceError` or `TaskError` before the store or Temporal is touched.

        `history` (a trace or a training export: `heddle.history`) is the earlier
        iteration a learning policy starts from, in place of the store's latest batch;
        it is stored as a batch of status "history", just before this one.
        """
        if sum(x is not None for x in (trace, records, spec, tasks)) != 1:
            raise ValueError("pass exactly one of trace=, records=, spec= or tasks=")
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        source = "records"
        task_list: list[Task] = []
        if tasks is not None:
            if isinstance(tasks, list):
                task_list, source = tasks, "tasks"
            else:
                task_list, source = await asyncio.to_thread(load_tasks, tasks), str(tasks)
            records = agent_records(task_list, samples)
        elif trace is not None:
            records = await asyncio.to_thread(load_trace, trace)
            source = str(trace)
        elif spec is not None:
            records = generate(
                spec.workload,
                prompts=spec.prompts,
                samples=spec.samples,
                seed=spec.seed,
                iteration=spec.iteration,
            )
            source = f"spec:{spec.model_dump_json()}"
        batch: list[TraceRecord] = records or []
        options = replace(options or RolloutOptions(), queue_prefix=self.queue_prefix)
        validate_options(options)
        options = replace(options, plans_split=options.policy in PLANS_SPLIT)
        learns = learns_from_history(options.policy)
        earlier: list[TraceRecord] = []
        if history is not None:
            earlier = (
                history if isinstance(history, list)
                else await asyncio.to_thread(load_history, history)
            )  # fmt: skip
        # The earlier batch: what a learning policy plans from and the start order ranks by.
        before = await asyncio.to_thread(self.store.batch_before)
        if earlier:
            before = f"history-{new_batch_id().removeprefix('batch-')}"
            await asyncio.to_thread(
                lambda: self.store.create_batch(
                    batch_id=before, records=earlier, options=options, status="history",
                    source=f"history:{history if not isinstance(history, list) else 'records'}",
                    created_at=time.time() - 1e-3,  # strictly before this batch
                )
            )  # fmt: skip
        if learns and before is None:
            raise ValueError(
                f"policy {options.policy!r} learns from an earlier batch in the store: "
                "roll one out first (with any policy)"
            )
        batch_id = batch_id or new_batch_id()
        batch = await asyncio.to_thread(in_start_order, self.store, batch, before)
        await asyncio.to_thread(
            lambda: self.store.create_batch(
                batch_id=batch_id,
                records=batch,
                options=options,
                source=source,
                created_at=time.time(),
                tasks=task_list,
            )
        )
        handle = await self.temporal.start_workflow(
            RolloutBatchWorkflow.run,
            BatchInput(batch_id=batch_id, num_trajectories=len(batch), options=options),
            id=batch_id,
            task_queue=trajectories_queue(self.queue_prefix),
            static_summary=f"rollout of {len(batch)} trajectories ({options.policy})",
        )
        return RolloutHandle(batch_id=batch_id, workflow=handle, store=self.store)

    async def start_campaign(
        self,
        spec: CampaignSpec,
        *,
        tasks: str | Path | list[Task] | None = None,
    ) -> WorkflowHandle[TrainingCampaignWorkflow, CampaignState]:
        """Check the campaign, store it with its task set, and start its workflow (one per
        campaign: its id is the name). An agent campaign draws its batches from `tasks`;
        a simulated one generates them from `spec.workload`. Bad input raises before
        anything is stored or started."""
        check_spec(spec)
        task_list: list[Task] = []
        if spec.mode == "agent":
            if tasks is None or not spec.model_path:
                raise ValueError("an agent campaign needs tasks and a model")
            task_list = (
                tasks if isinstance(tasks, list) else await asyncio.to_thread(load_tasks, tasks)
            )
        elif spec.tasks_per_iteration < 1:
            raise ValueError("a simulated campaign needs tasks_per_iteration >= 1 (its prompts)")
        options = replace(spec.options, queue_prefix=self.queue_prefix)
        validate_options(options)
        options = replace(options, plans_split=options.policy in PLANS_SPLIT)
        spec = replace(spec, options=options)
        if not spec.checkpoint_root:
            raise ValueError("checkpoint_root is required: where the trainer commits")
        await asyncio.to_thread(
            self.store.create_campaign, spec.name, dataclasses.asdict(spec), task_list
        )
        return await self.temporal.start_workflow(
            TrainingCampaignWorkflow.run,
            CampaignInput(spec),
            id=campaign_workflow_id(spec.name, self.queue_prefix),
            task_queue=trajectories_queue(self.queue_prefix),
            static_summary=f"campaign {spec.name}: {spec.iterations} iterations ({spec.mode})",
        )

    def campaign(self, name: str) -> WorkflowHandle[TrainingCampaignWorkflow, CampaignState]:
        return self.temporal.get_workflow_handle_for(
            TrainingCampaignWorkflow.run, campaign_workflow_id(name, self.queue_prefix)
        )

    async def campaign_state(self, name: str) -> CampaignState:
        """The campaign's state, from its workflow (running or closed)."""
        return await self.campaign(name).query(TrainingCampaignWorkflow.state)

    async def stop_campaign(self, name: str) -> None:
        """Stop after the iteration in flight: its checkpoint committed and synced."""
        await self.campaign(name).signal(TrainingCampaignWorkflow.stop)

    async def resume_campaign(
        self, name: str
    ) -> WorkflowHandle[TrainingCampaignWorkflow, CampaignState]:
        """Start a stopped, failed or terminated campaign again from its last state (a
        running one is returned as it is)."""
        handle = self.campaign(name)
        desc = await handle.describe()
        if desc.status == WorkflowExecutionStatus.RUNNING:
            return handle
        stored = await asyncio.to_thread(self.store.get_campaign, name)
        if stored is None:
            raise ValueError(f"no campaign {name!r} in the store")
        state = await handle.query(TrainingCampaignWorkflow.state)
        spec = campaign_spec(stored)
        return await self.temporal.start_workflow(
            TrainingCampaignWorkflow.run,
            CampaignInput(spec, replace(state, phase="resumed")),
            id=handle.id,
            task_queue=trajectories_queue(self.queue_prefix),
            static_summary=f"campaign {name}, resumed at iteration {state.iteration}",
        )

    async def campaign_iterations(self, name: str) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.store.campaign_iterations, name)

    async def list_campaigns(self) -> list[str]:
        return await asyncio.to_thread(self.store.list_campaigns)

    def get_rollout(self, batch_id: str) -> RolloutHandle:
        return RolloutHandle(
            batch_id=batch_id,
            workflow=self.temporal.get_workflow_handle_for(RolloutBatchWorkflow.run, batch_id),
            store=self.store,
        )

    def _control(self) -> WorkflowHandle[ClusterControlWorkflow, None]:
        return self.temporal.get_workflow_handle_for(
            ClusterControlWorkflow.run, control_workflow_id(self.queue_prefix)
        )

    async def cluster_plan(self) -> ClusterPlan:
        """The engine instances the cluster runs now (the control workflow's plan)."""
        return await self._control().query(ClusterControlWorkflow.plan)

    async def reshape(self, change: PlanChange) -> ClusterPlan:
        """Apply a change to the plan and wait until it has run: the retired instances
        drained and stopped, the new ones up. An invalid change raises
        `WorkflowUpdateFailedError` and changes nothing."""
        return await self._control().execute_update(ClusterControlWorkflow.reshape, change)

    async def move_blocks(self, move: BlockMove) -> ClusterPlan:
        """Lend instances to a trainer or give lent ones back (Libra's lever), and wait
        until it has run. An invalid move raises `WorkflowUpdateFailedError`."""
        return await self._control().execute_update(ClusterControlWorkflow.move_blocks, move)

    async def list_batches(self, limit: int = 50) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.store.list_batches, limit)

    async def training_batch(self, batch_id: str) -> list[TrainingSample]:
        """Per completed agent trajectory: token ids, log-probs, loss mask, reward, group
        and GRPO advantage (`heddle.training`)."""
        return await asyncio.to_thread(training_batch, self.store, batch_id)

    async def list_trajectories(
        self, batch_id: str, *, status: str | None = None, limit: int = 1000
    ) -> list[dict[str, Any]]:
        return await asyncio.to_thread(
            self.store.list_trajectories, batch_id, status=status, limit=limit
        )

    async def inspect_trajectory(self, batch_id: str, trajectory_id: str) -> dict[str, Any] | None:
        """The stored record with its steps, plus the workflow's live state if it runs."""
        record = await asyncio.to_thread(self.store.get_trajectory, batch_id, trajectory_id)
        if record is None:
            return None
        handle = self.temporal.get_workflow_handle(f"{batch_id}/{trajectory_id}")
        try:
            desc = await handle.describe()
            record["workflow"] = {
                "workflow_id": desc.id,
                "run_id": desc.run_id,
                "status": desc.status.name if desc.status else None,
            }
        except RPCError:
            record["workflow"] = None
        return record
