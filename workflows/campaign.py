"""A training campaign: rollout, train, sync, repeat, as one durable workflow per campaign.

Each iteration opens its batch in the store (the next tasks not consumed), runs it as a
child `RolloutBatchWorkflow`, has the trainer commit the next checkpoint from it, syncs
the engines to that checkpoint, and records the iteration. The state that matters (the
committed checkpoint, the consumed tasks, the iteration) changes only after the train
step has committed, so a crash anywhere repeats at most the unfinished phase, and every
phase is idempotent: the batch id is the iteration's, the trainer returns a step it has
already committed. A heddle-policy batch fits its predictor on the batch before and
re-plans the split through the control workflow as it starts (`workflows/batch.py`), so
the next iteration's rollout is where "retrain, re-plan" happens; the state names the
batch the predictor was fitted on. The workflow continues as new every
`iterations_per_run` iterations, carrying its state.

With `max_staleness` S above 0 the campaign is asynchronous: up to S later batches roll
out while one trains and syncs (`_pipelined`), each drawing the tasks the batches still
rolling did not, and the trainer leaves out tokens more than S versions old. With
`trainer_gpus` (Libra's lever) each train step borrows engine instances through the
control workflow, and more as they fall idle while it trains, and gives them back
before the sync (`_borrowed`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import deque
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import WorkflowIDReusePolicy
from temporalio.workflow import ChildWorkflowHandle, ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from heddle import activity_names as names
    from heddle import search_attributes as sa
    from heddle.campaign import (
        CampaignInput,
        CampaignState,
        IdleLend,
        IterationBatch,
        IterationRecord,
        OpenIteration,
        SliceResult,
        SyncRequest,
        TailLend,
        TrainProgress,
        TrainRequest,
        TrainResult,
        TrainSlice,
    )
    from heddle.checkpoints import CheckpointRef
    from heddle.queues import control_queue, trainer_queue, trajectories_queue
    from heddle.types import BatchInput, BatchReport, InstancePlan
    from workflows import policy
    from workflows.batch import RolloutBatchWorkflow

TRAIN_TIMEOUT = timedelta(hours=6)
TRAIN_HEARTBEAT = timedelta(seconds=60)
SYNC_TIMEOUT = timedelta(minutes=10)  # every sync has a deadline (TRL #6913, AReaL #1160)
SYNC_HEARTBEAT = timedelta(seconds=30)
PREPARE_TIMEOUT = timedelta(minutes=10)
# Campaigns started before this sync their engines to step 0 only after iteration 0.
START_SYNC_PATCH = "campaign-start-sync"
# Campaigns started before this train a lent step in one activity, lending at its start.
TRAIN_IN_SLICES_PATCH = "campaign-train-in-slices"
# A simulated step with lent GPUs trains in this many slices after they join; between
# slices it borrows the instances that fell idle (Libra's lever inside a step).
SLICES_PER_STEP = 4


# Libra's tail in a synchronous campaign: how often the rollout is checked for idle
# instances while none is lent (wall seconds), and the modelled seconds of each slice
# the lent ones train.
TAIL_POLL = timedelta(seconds=1)
TAIL_SLICE_S = 30.0

# What the rollout's tail trained: its tokens, and the instances lent to it.
_Tail = tuple[float, list["InstancePlan"]]

# A batch rolling out ahead: what it drew, its rollout, and the policy version it began on.
_Rolling = tuple[IterationBatch, ChildWorkflowHandle[Any, BatchReport], int]


@workflow.defn(name="TrainingCampaignWorkflow")
class TrainingCampaignWorkflow:
    @workflow.init
    def __init__(self, inp: CampaignInput) -> None:
        self._state = inp.state
        self._stop = False
        self._prefix = inp.spec.options.queue_prefix

    @workflow.query
    def state(self) -> CampaignState:
        return self._state

    @workflow.signal
    def stop(self) -> None:
        """Stop after the iteration in flight (its checkpoint committed and synced)."""
        self._stop = True

    @workflow.run
    async def run(self, inp: CampaignInput) -> CampaignState:
        spec, st = inp.spec, self._state
        if st.checkpoint is None:
            st.checkpoint = await workflow.execute_activity(
                names.PREPARE_CAMPAIGN,
                spec,
                task_queue=trainer_queue(spec.options.queue_prefix),
                start_to_close_timeout=PREPARE_TIMEOUT,
                result_type=CheckpointRef,
            )
            if spec.mode == "agent" and spec.sync_weights and workflow.patched(START_SYNC_PATCH):
                # The engines may run what an earlier campaign left them: the first
                # rollout samples this campaign's step 0.
                st.phase = "sync"
                await self._sync(st.checkpoint, spec.options.queue_prefix)
        self._upsert(spec.name)
        if spec.max_staleness:
            await self._pipelined(inp, min(spec.iterations, st.iteration + spec.iterations_per_run))
        else:
            for _ in range(spec.iterations_per_run):
                if st.iteration >= spec.iterations or self._stop:
                    break
                await self._iteration(inp)
        if st.iteration < spec.iterations and not self._stop:
            st.phase = "continuing"
            workflow.continue_as_new(CampaignInput(spec, st))
        st.phase = "done" if st.iteration >= spec.iterations else "stopped"
        return st

    async def _sync(self, checkpoint: CheckpointRef, prefix: str) -> float:
        """Every engine instance onto `checkpoint`; the sync's seconds."""
        return await workflow.execute_activity(
            names.SYNC_WEIGHTS,
            SyncRequest(checkpoint),
            task_queue=control_queue(prefix),
            start_to_close_timeout=SYNC_TIMEOUT,
            heartbeat_timeout=SYNC_HEARTBEAT,
            result_type=float,
        )

    async def _pipelined(self, inp: CampaignInput, run_end: int) -> None:
        """Asynchronous: batch j starts once steps up to j - S are committed, so up to S
        batches roll out while the one before them trains and syncs, and every token a
        step learns from is at most S versions old (the trainer leaves older ones out:
        `TrainRequest.oldest_version`). The pipeline drains before continue-as-new, so no
        rollout is in flight across runs."""
        spec, st = inp.spec, self._state
        rolling: deque[_Rolling] = deque()
        started = st.iteration
        while st.iteration < run_end:
            while (
                not self._stop
                and started < run_end
                and started - st.iteration <= spec.max_staleness
            ):
                rolling.append(await self._start_rollout(inp, started, rolling))
                started += 1
            if not rolling:
                break  # stopped
            opened, handle, began_on = rolling.popleft()
            st.phase, st.open_batch = "rollout", opened.batch_id
            report: BatchReport = await handle
            await self._train_and_record(inp, opened, report, began_on)

    async def _start_rollout(
        self,
        inp: CampaignInput,
        iteration: int,
        rolling: deque[_Rolling],
    ) -> _Rolling:
        """Open iteration `iteration`'s batch and start its rollout. Its draw leaves out
        the tasks of the batches still rolling, as if they were trained on already."""
        spec, st = inp.spec, self._state
        consumed, epoch = list(st.consumed_task_ids), st.epoch
        for earlier, _, _ in rolling:
            if earlier.epoch != epoch:
                consumed, epoch = [], earlier.epoch
            consumed += earlier.task_ids
        opened: IterationBatch = await workflow.execute_activity(
            names.OPEN_ITERATION,
            OpenIteration(spec, iteration, consumed, epoch),
            start_to_close_timeout=policy.STORE_TIMEOUT,
            retry_policy=policy.STORE_RETRY,
            result_type=IterationBatch,
        )
        handle = await workflow.start_child_workflow(
            RolloutBatchWorkflow.run,
            BatchInput(opened.batch_id, opened.num_trajectories, opened.options),
            id=opened.batch_id,
            task_queue=trajectories_queue(spec.options.queue_prefix),
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
            parent_close_policy=ParentClosePolicy.REQUEST_CANCEL,
            static_summary=f"{spec.name}: iteration {iteration}",
        )
        return opened, handle, st.policy_version

    async def _iteration(self, inp: CampaignInput) -> None:
        spec, st = inp.spec, self._state
        prefix = spec.options.queue_prefix
        st.phase = "rollout"
        opened: IterationBatch = await workflow.execute_activity(
            names.OPEN_ITERATION,
            OpenIteration(spec, st.iteration, list(st.consumed_task_ids), st.epoch),
            start_to_close_timeout=policy.STORE_TIMEOUT,
            retry_policy=policy.STORE_RETRY,
            result_type=IterationBatch,
        )
        st.open_batch = opened.batch_id
        handle = await workflow.start_child_workflow(
            RolloutBatchWorkflow.run,
            BatchInput(opened.batch_id, opened.num_trajectories, opened.options),
            id=opened.batch_id,
            task_queue=trajectories_queue(prefix),
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
            parent_close_policy=ParentClosePolicy.REQUEST_CANCEL,
            static_summary=f"{spec.name}: iteration {st.iteration}",
        )
        tail = await self._tail(inp, opened, handle) if spec.libra_tail else None
        report: BatchReport = await handle
        await self._train_and_record(inp, opened, report, st.policy_version, tail)

    async def _tail(
        self,
        inp: CampaignInput,
        opened: IterationBatch,
        rollout: ChildWorkflowHandle[Any, BatchReport],
    ) -> _Tail:
        """Libra's lever in a synchronous campaign: while the rollout runs, once all its
        trajectories have started, the instances it leaves idle are lent to the trainer
        and train, a slice at a time, on the trajectories already finished."""
        spec, st = inp.spec, self._state
        assert st.checkpoint is not None
        request = TrainRequest(spec, st.checkpoint, opened.batch_id, tail=True)
        progress = TrainProgress()
        lent: list[InstancePlan] = []
        while not rollout.done():
            if not progress.joining_gpus:
                now_lent: list[InstancePlan] = await self._control(
                    names.LEND_TAIL_BLOCKS,
                    TailLend(opened.batch_id, opened.num_trajectories),
                    list[InstancePlan],
                )
                lent, progress = _joining(lent, now_lent, progress)
            if not lent:
                with contextlib.suppress(TimeoutError):  # the poll's end
                    await workflow.wait_condition(rollout.done, timeout=TAIL_POLL)
                continue
            progress = (await self._slice(TrainSlice(request, progress, TAIL_SLICE_S))).progress
        return progress.tokens_done, lent

    async def _train_and_record(
        self,
        inp: CampaignInput,
        opened: IterationBatch,
        report: BatchReport,
        rolled_version: int,
        tail: _Tail | None = None,
    ) -> None:
        """The iteration's train step, its commit, the sync and the record."""
        spec, st = inp.spec, self._state
        assert st.checkpoint is not None
        prefix = spec.options.queue_prefix
        st.phase = "train"
        if spec.trainer_gpus:
            trained = await self._borrowed(inp, opened)
        elif tail is not None:  # what the tail left, on every GPU; then the lent go back
            tokens_done, lent = tail
            request = TrainRequest(spec, st.checkpoint, opened.batch_id, tokens_done=tokens_done)
            trained = await self._train(request)
            if lent:
                await self._control(names.GIVE_BACK_BLOCKS, [i.instance_id for i in lent], None)
        else:
            trained = await self._train(TrainRequest(spec, st.checkpoint, opened.batch_id))
        # The commit: from here the iteration's tasks are trained on.
        if opened.epoch != st.epoch:
            st.epoch, st.consumed_task_ids = opened.epoch, []
        st.consumed_task_ids = [*st.consumed_task_ids, *opened.task_ids]
        st.checkpoint = trained.checkpoint
        st.open_batch = ""
        sync_s = 0.0
        if spec.sync_weights:
            st.phase = "sync"
            sync_s = await self._sync(trained.checkpoint, prefix)
            st.policy_version = trained.checkpoint.step
        st.predictor_version = opened.batch_id
        await workflow.execute_activity(
            names.RECORD_ITERATION,
            IterationRecord(
                campaign=spec.name,
                iteration=st.iteration,
                batch_id=opened.batch_id,
                policy_version=rolled_version,
                trajectories=report.trajectories,
                completed=report.completed,
                reward_mean=0.0,  # the activity reads the batch's rewards
                pass_rate=0.0,
                makespan_s=report.makespan_s,
                train_s=trained.train_s,
                sync_s=sync_s,
                logprob_gap=trained.logprob_gap,
                checkpoint=trained.checkpoint.path,
                finished_at=workflow.now().timestamp(),
            ),
            start_to_close_timeout=policy.STORE_TIMEOUT,
            retry_policy=policy.STORE_RETRY,
            result_type=IterationRecord,
        )
        st.iteration += 1
        st.phase = "between"
        self._upsert(spec.name)

    async def _train(self, request: TrainRequest) -> TrainResult:
        return await self._trainer(names.TRAIN_STEP, request, TrainResult)

    async def _slice(self, piece: TrainSlice) -> SliceResult:
        return await self._trainer(names.TRAIN_SLICE, piece, SliceResult)

    async def _trainer(self, activity: str, arg: Any, result_type: Any) -> Any:
        """A train activity on the trainer's queue."""
        return await workflow.execute_activity(
            activity,
            arg,
            task_queue=trainer_queue(self._prefix),
            start_to_close_timeout=TRAIN_TIMEOUT,
            heartbeat_timeout=TRAIN_HEARTBEAT,
            result_type=result_type,
        )

    async def _borrowed(self, inp: CampaignInput, opened: IterationBatch) -> TrainResult:
        """Libra's lever: the step borrows engine instances through the control
        workflow at its start (at least its floor) and, while it trains, those that fall
        idle (`_in_slices`); all go back to the rollout before the sync, so they load
        the new weights with the rest."""
        spec, st = inp.spec, self._state
        assert st.checkpoint is not None
        lent: list[InstancePlan] = await self._control(
            names.LEND_BLOCKS, spec.trainer_gpus, list[InstancePlan]
        )
        request = TrainRequest(spec, st.checkpoint, opened.batch_id, sum(i.tp for i in lent))
        if not lent:  # the rollout's last instance: the step trains on the cluster's GPUs
            return await self._train(request)
        if spec.mode == "simulated" and workflow.patched(TRAIN_IN_SLICES_PATCH):
            trained, lent = await self._in_slices(request, lent)
        else:
            trained = await self._train(request)
        await self._control(names.GIVE_BACK_BLOCKS, [i.instance_id for i in lent], None)
        return trained

    async def _in_slices(
        self, request: TrainRequest, lent: list[InstancePlan]
    ) -> tuple[TrainResult, list[InstancePlan]]:
        """A modelled step a slice at a time: the first while the instances lent at its
        start join, then `SLICES_PER_STEP` of what was left; between slices the control
        workflow lends it the instances that fell idle. Returns the result and every
        instance lent."""
        progress = TrainProgress(joining_gpus=request.gpus)
        slice_s = 0.0  # the first slice ends when those GPUs have joined
        while True:
            done = await self._slice(TrainSlice(request, progress, slice_s))
            if done.trained is not None:
                return done.trained, lent
            progress = done.progress
            slice_s = slice_s or done.left_s / SLICES_PER_STEP
            if progress.joining_gpus:
                continue  # one move at a time: lend more once these have joined
            now_lent: list[InstancePlan] = await self._control(
                names.LEND_IDLE_BLOCKS, IdleLend(done.left_s, done.join_s), list[InstancePlan]
            )
            lent, progress = _joining(lent, now_lent, progress)

    async def _control(self, activity: str, arg: Any, result_type: Any) -> Any:
        """A reallocation activity on the engine host's control queue."""
        return await workflow.execute_activity(
            activity,
            arg,
            task_queue=control_queue(self._prefix),
            start_to_close_timeout=policy.RESHAPE_TIMEOUT,
            heartbeat_timeout=policy.RESHAPE_HEARTBEAT,
            result_type=result_type,
        )

    def _upsert(self, name: str) -> None:
        st = self._state
        workflow.upsert_search_attributes(
            [
                sa.CAMPAIGN.value_set(name),
                sa.ITERATION.value_set(float(st.iteration)),
                sa.POLICY_VERSION.value_set(float(st.policy_version)),
            ]
        )
        workflow.set_current_details(
            f"**{name}**: iteration {st.iteration}, policy version {st.policy_version}, "
            f"checkpoint `{st.checkpoint.path if st.checkpoint else ''}`"
        )


def _joining(
    lent: list[InstancePlan], now_lent: list[InstancePlan], progress: TrainProgress
) -> tuple[list[InstancePlan], TrainProgress]:
    """The instances lent with those just lent added, and the step's progress with their
    GPUs joining (none joins while an earlier move is joining: the callers wait)."""
    known = {i.instance_id for i in lent}
    new = [i for i in now_lent if i.instance_id not in known]
    if not new:
        return lent, progress
    return [*lent, *new], dataclasses.replace(progress, joining_gpus=sum(i.tp for i in new))
