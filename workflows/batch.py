"""A rollout batch: one child workflow per trajectory, a bounded in-flight window."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.exceptions import ChildWorkflowError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from heddle import activity_names as names
    from heddle import search_attributes as sa
    from heddle.queues import control_queue, trajectories_queue
    from heddle.stats import percentile
    from heddle.types import (
        BatchInput,
        BatchPlanRequest,
        BatchReport,
        BatchStart,
        InstancePlan,
        SpecPage,
        SpecPageRequest,
        TrajectoryInput,
        TrajectorySpec,
        TrajectorySummary,
    )
    from workflows import policy
    from workflows.trajectory import TrajectoryWorkflow


# Batches started before planned batches took turns replay without the claim.
CLAIM_PATCH = "claim-split"


@workflow.defn(name="RolloutBatchWorkflow")
class RolloutBatchWorkflow:
    def __init__(self) -> None:
        self._started = 0
        self._completed = 0
        self._failed = 0
        self._generated = 0

    @workflow.query
    def progress(self) -> dict[str, int]:
        return {
            "started": self._started,
            "completed": self._completed,
            "failed": self._failed,
            "running": self._started - self._completed - self._failed,
            "generated_tokens": self._generated,
        }

    @workflow.run
    async def run(self, inp: BatchInput) -> BatchReport:
        opts = inp.options
        stack = await workflow.execute_activity(
            names.BEGIN_BATCH,
            inp.batch_id,
            start_to_close_timeout=policy.STORE_TIMEOUT,
            retry_policy=policy.STORE_RETRY,
            result_type=BatchStart,
        )
        claims = opts.plans_split and workflow.patched(CLAIM_PATCH)
        if claims:
            # One planned batch at a time: a second waits for the first to finish, then
            # plans from it.
            await workflow.execute_activity(
                names.CLAIM_SPLIT,
                inp.batch_id,
                task_queue=control_queue(opts.queue_prefix),
                start_to_close_timeout=policy.CLAIM_TIMEOUT,
                heartbeat_timeout=policy.RESHAPE_HEARTBEAT,
            )
        if opts.plans_split:
            # Heddle: the service plans the batch, the control workflow reshapes the
            # cluster to the planned split; steps start once it runs.
            split = await workflow.execute_activity(
                names.PLAN_BATCH,
                BatchPlanRequest(inp.batch_id, opts.policy),
                task_queue=control_queue(opts.queue_prefix),
                start_to_close_timeout=policy.PLAN_TIMEOUT,
                result_type=list[InstancePlan],
            )
            await workflow.execute_activity(
                names.APPLY_SPLIT,
                split,
                task_queue=control_queue(opts.queue_prefix),
                start_to_close_timeout=policy.RESHAPE_TIMEOUT,
                heartbeat_timeout=policy.RESHAPE_HEARTBEAT,
            )
        started_at = workflow.now().timestamp()
        buffered: list[TrajectorySpec] = []
        offset = 0
        pending: set[asyncio.Task[TrajectorySummary]] = set()
        completion_s: list[float] = []
        failed_ids: list[str] = []

        while offset < inp.num_trajectories or buffered or pending:
            while len(pending) < opts.max_in_flight and (buffered or offset < inp.num_trajectories):
                if not buffered:
                    page = await workflow.execute_activity(
                        names.LOAD_SPECS,
                        SpecPageRequest(inp.batch_id, offset, inp.page_size),
                        start_to_close_timeout=policy.STORE_TIMEOUT,
                        retry_policy=policy.STORE_RETRY,
                        result_type=SpecPage,
                    )
                    if not page.specs:
                        offset = inp.num_trajectories  # the store holds fewer than announced
                        break
                    offset += len(page.specs)
                    buffered = list(reversed(page.specs))
                pending.add(asyncio.ensure_future(self._start(inp, buffered.pop())))
            if not pending:
                break
            done, still = await workflow.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            pending = set(still)
            for task in done:
                summary = task.result()
                self._generated += summary.generated_tokens
                if summary.status == "completed":
                    self._completed += 1
                else:
                    self._failed += 1
                    failed_ids.append(summary.trajectory_id)
                completion_s.append(max(0.0, summary.finished_at - started_at))

        finished_at = workflow.now().timestamp()
        scale = stack.time_scale
        wall = finished_at - started_at
        makespan = wall / scale
        completion_s.sort()
        report = BatchReport(
            batch_id=inp.batch_id,
            trajectories=self._completed + self._failed,
            completed=self._completed,
            failed=self._failed,
            generated_tokens=self._generated,
            makespan_s=makespan,
            throughput_tok_s=self._generated / makespan if makespan > 0 else 0.0,
            completion_s={
                name: percentile(completion_s, q) / scale
                for name, q in (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))
            },
            started_at=started_at,
            finished_at=finished_at,
            policy=opts.policy,
            time_scale=scale,
            wall_s=wall,
            failed_ids=failed_ids[:100],
        )
        await workflow.execute_activity(
            names.FINISH_BATCH,
            report,
            start_to_close_timeout=policy.STORE_TIMEOUT,
            retry_policy=policy.STORE_RETRY,
        )
        if claims:
            await workflow.execute_activity(
                names.RELEASE_SPLIT,
                inp.batch_id,
                task_queue=control_queue(opts.queue_prefix),
                start_to_close_timeout=policy.STORE_TIMEOUT,
                retry_policy=policy.STORE_RETRY,
            )
        return report

    async def _start(self, inp: BatchInput, spec: TrajectorySpec) -> TrajectorySummary:
        """Run one trajectory as a child; a child that fails outright still yields a
        summary, so one bad trajectory never fails the batch."""
        self._started += 1
        opts = inp.options
        try:
            return await workflow.execute_child_workflow(
                TrajectoryWorkflow.run,
                TrajectoryInput(batch_id=inp.batch_id, spec=spec, options=opts),
                id=f"{inp.batch_id}/{spec.trajectory_id}",
                task_queue=trajectories_queue(opts.queue_prefix),
                parent_close_policy=ParentClosePolicy.TERMINATE,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                execution_timeout=timedelta(days=7),
                search_attributes=TypedSearchAttributes(
                    [
                        SearchAttributePair(sa.BATCH, inp.batch_id),
                        SearchAttributePair(sa.GROUP, spec.group_id),
                        SearchAttributePair(sa.WORKLOAD, spec.workload),
                        SearchAttributePair(sa.STATUS, "running"),
                        SearchAttributePair(sa.TURN, 0),
                    ]
                ),
                static_summary=(
                    f"{spec.trajectory_id}: {len(spec.steps)} steps, "
                    f"{spec.generated_tokens} tokens to generate ({spec.workload})"
                ),
            )
        except ChildWorkflowError as exc:
            now = workflow.now().timestamp()
            return TrajectorySummary(
                batch_id=inp.batch_id,
                trajectory_id=spec.trajectory_id,
                group_id=spec.group_id,
                status="failed",
                finish_reason="error",
                turns=0,
                generated_tokens=0,
                tool_calls=0,
                started_at=now,
                finished_at=now,
                error=str(exc.cause or exc)[:500],
            )
