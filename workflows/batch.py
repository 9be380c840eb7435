"""A rollout batch: one child workflow per trajectory, a bounded in-flight window; a
large batch fans out through slices of `SLICE_SIZE` trajectories."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
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
        RolloutOptions,
        SliceInput,
        SliceOutcome,
        SpecPage,
        SpecPageRequest,
        TrajectoryInput,
        TrajectorySpec,
        TrajectorySummary,
    )
    from workflows import policy
    from workflows.trajectory import LEAN_PATCH, TrajectoryWorkflow


# Batches started before planned batches took turns replay without the claim.
CLAIM_PATCH = "claim-split"
# Large batches started before slices replay their children from the batch itself.
SLICE_PATCH = "slices"
# Batches started before strided slices gave each slice a contiguous range.
STRIDE_PATCH = "strided-slices"
# Trajectories one slice (or a batch of at most this many) runs as its children: well
# under Temporal's 2,000 pending children a workflow, and a history far from its limits.
SLICE_SIZE = 64


@workflow.defn(name="RolloutBatchWorkflow")
class RolloutBatchWorkflow:
    def __init__(self) -> None:
        self._tally = Tally()

    @workflow.query
    def progress(self) -> dict[str, int]:
        """What the batch has seen end (a large batch: per slice, as each slice ends;
        the client's progress reads the store instead)."""
        t = self._tally
        return {
            "started": t.started,
            "completed": t.completed,
            "failed": t.failed,
            "running": t.started - t.completed - t.failed,
            "generated_tokens": t.generated_tokens,
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
        if workflow.patched(LEAN_PATCH):
            # Its trajectories replay tools as timers on the stack's clock.
            opts = dataclasses.replace(opts, time_scale=stack.time_scale)
            inp = dataclasses.replace(inp, options=opts)
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
        tally = self._tally
        tally.started_at = started_at
        n = inp.num_trajectories
        if n > SLICE_SIZE and workflow.patched(SLICE_PATCH):
            await self._run_slices(inp, started_at)
        else:
            await run_range(inp.batch_id, 0, n, opts, inp.page_size, opts.max_in_flight, tally)
        finished_at = workflow.now().timestamp()
        scale = stack.time_scale
        wall = finished_at - started_at
        makespan = wall / scale
        completion_s = sorted(tally.completion_s)
        report = BatchReport(
            batch_id=inp.batch_id,
            trajectories=tally.completed + tally.failed,
            completed=tally.completed,
            failed=tally.failed,
            generated_tokens=tally.generated_tokens,
            makespan_s=makespan,
            throughput_tok_s=tally.generated_tokens / makespan if makespan > 0 else 0.0,
            completion_s={
                name: percentile(completion_s, q) / scale
                for name, q in (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))
            },
            started_at=started_at,
            finished_at=finished_at,
            policy=opts.policy,
            time_scale=scale,
            wall_s=wall,
            failed_ids=tally.failed_ids[:100],
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

    async def _run_slices(self, inp: BatchInput, started_at: float) -> None:
        """A large batch starts its trajectories through slices of `SLICE_SIZE`, all at
        once: each slice's history stays small, and the server starts the children of
        many parents in parallel instead of serialising them on one. Slice k takes
        positions k, k + S, k + 2S, ... of the S slices, so the slices together start the
        batch in position order, which the client made the start order (longest
        expected first)."""
        n, opts = inp.num_trajectories, inp.options
        num_slices = -(-n // SLICE_SIZE)
        window = max(1, -(-opts.max_in_flight // num_slices))
        strided = workflow.patched(STRIDE_PATCH)

        def part(k: int) -> SliceInput:
            if strided:
                count = len(range(k, n, num_slices))
                return SliceInput(inp.batch_id, k, count, opts, inp.page_size, started_at,
                                  window, stride=num_slices)  # fmt: skip
            offset = k * SLICE_SIZE
            return SliceInput(inp.batch_id, offset, min(SLICE_SIZE, n - offset), opts,
                              inp.page_size, started_at, window)  # fmt: skip

        def summary(s: SliceInput) -> str:
            if s.stride > 1:
                return f"{s.count} trajectories: positions {s.offset}, {s.offset + s.stride}, ..."
            return f"trajectories {s.offset}..{s.offset + s.count - 1}"

        parts = [part(k) for k in range(num_slices)]
        slices = [
            workflow.execute_child_workflow(
                RolloutSliceWorkflow.run,
                s,
                id=f"{inp.batch_id}/slice-{k}",
                task_queue=trajectories_queue(opts.queue_prefix),
                parent_close_policy=ParentClosePolicy.TERMINATE,
                execution_timeout=timedelta(days=7),
                static_summary=summary(s),
            )
            for k, s in enumerate(parts)
        ]
        for outcome in await asyncio.gather(*slices):
            self._tally.add(outcome)


@workflow.defn(name="RolloutSliceWorkflow")
class RolloutSliceWorkflow:
    """A slice of a large batch: its trajectories as children, all started at once."""

    @workflow.run
    async def run(self, inp: SliceInput) -> SliceOutcome:
        tally = Tally(started_at=inp.started_at)
        await run_range(
            inp.batch_id, inp.offset, inp.count, inp.options, inp.page_size, inp.window, tally,
            inp.stride,
        )  # fmt: skip
        return SliceOutcome(
            completed=tally.completed,
            failed=tally.failed,
            generated_tokens=tally.generated_tokens,
            completion_s=tally.completion_s,
            failed_ids=tally.failed_ids[:100],
        )


@dataclass
class Tally:
    """A workflow's trajectories as they start and end; completion times count from
    the batch's start."""

    started_at: float = 0.0
    started: int = 0
    completed: int = 0
    failed: int = 0
    generated_tokens: int = 0
    completion_s: list[float] = field(default_factory=list)
    failed_ids: list[str] = field(default_factory=list)

    def ended(self, summary: TrajectorySummary) -> None:
        self.generated_tokens += summary.generated_tokens
        if summary.status == "completed":
            self.completed += 1
        else:
            self.failed += 1
            self.failed_ids.append(summary.trajectory_id)
        self.completion_s.append(max(0.0, summary.finished_at - self.started_at))

    def add(self, outcome: SliceOutcome) -> None:
        self.started += outcome.completed + outcome.failed
        self.completed += outcome.completed
        self.failed += outcome.failed
        self.generated_tokens += outcome.generated_tokens
        self.completion_s += outcome.completion_s
        self.failed_ids += outcome.failed_ids


async def run_range(
    batch_id: str,
    offset: int,
    count: int,
    opts: RolloutOptions,
    page_size: int,
    window: int,
    tally: Tally,
    stride: int = 1,
) -> None:
    """Run `count` of the batch's trajectories, at positions `offset`, `offset + stride`,
    ..., as child workflows in that order, at most `window` at a time, their specs read
    from the store a page at a time."""
    remaining = count
    buffered: list[TrajectorySpec] = []
    pending: set[asyncio.Task[TrajectorySummary]] = set()
    while remaining or buffered or pending:
        while len(pending) < window and (buffered or remaining):
            if not buffered:
                page = await workflow.execute_activity(
                    names.LOAD_SPECS,
                    SpecPageRequest(batch_id, offset, min(page_size, remaining), stride),
                    start_to_close_timeout=policy.STORE_TIMEOUT,
                    retry_policy=policy.STORE_RETRY,
                    result_type=SpecPage,
                )
                if not page.specs:
                    remaining = 0  # the store holds fewer than announced
                    break
                offset += len(page.specs) * stride
                remaining -= len(page.specs)
                buffered = list(reversed(page.specs))
            tally.started += 1
            pending.add(asyncio.ensure_future(_run_one(batch_id, opts, buffered.pop())))
        if not pending:
            break
        done, still = await workflow.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        pending = set(still)
        for task in done:
            tally.ended(task.result())


async def _run_one(batch_id: str, opts: RolloutOptions, spec: TrajectorySpec) -> TrajectorySummary:
    """Run one trajectory as a child; a child that fails outright still yields a
    summary, so one bad trajectory never fails the batch."""
    try:
        return await workflow.execute_child_workflow(
            TrajectoryWorkflow.run,
            TrajectoryInput(batch_id=batch_id, spec=spec, options=opts),
            id=f"{batch_id}/{spec.trajectory_id}",
            task_queue=trajectories_queue(opts.queue_prefix),
            parent_close_policy=ParentClosePolicy.TERMINATE,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            execution_timeout=timedelta(days=7),
            search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(sa.BATCH, batch_id),
                    SearchAttributePair(sa.GROUP, spec.group_id),
                    SearchAttributePair(sa.WORKLOAD, spec.workload),
                    SearchAttributePair(sa.STATUS, "running"),
                    SearchAttributePair(sa.TURN, 0),
                ]
            ),
            static_summary=_summary(spec),
        )
    except ChildWorkflowError as exc:
        now = workflow.now().timestamp()
        return TrajectorySummary(
            batch_id=batch_id,
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


def _summary(spec: TrajectorySpec) -> str:
    """What the Temporal UI shows of a trajectory in its parent's list."""
    if spec.task_id:
        return f"{spec.trajectory_id}: agent on task {spec.task_id} ({spec.workload})"
    return (
        f"{spec.trajectory_id}: {len(spec.steps)} steps, "
        f"{spec.generated_tokens} tokens to generate ({spec.workload})"
    )
