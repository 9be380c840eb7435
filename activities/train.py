"""The trainer worker's activities (task queue `trainer`): a campaign's step 0 and its
train steps.

An agent campaign trains for real (`heddle.grpo`: torch on CPU, in a thread, the
micro-batch index heartbeated); a simulated one waits the step time the cost model gives
the batch's tokens on the cluster, scaled to the stack's clock, and commits a checkpoint
that holds only the trainer's record. Either way the step's folder is renamed into place
when complete, and a step found committed is returned without training again.
"""

from __future__ import annotations

import asyncio
import logging
import math
from pathlib import Path

from temporalio import activity

from activities.heartbeat import heartbeating
from engines.costmodel import train_join_s, train_tokens_per_gpu_s
from heddle import activity_names as names
from heddle.campaign import (
    CampaignSpec,
    SliceResult,
    TrainProgress,
    TrainRequest,
    TrainResult,
    TrainSlice,
)
from heddle.checkpoints import (
    CheckpointRef,
    base_checkpoint,
    commit,
    committed,
    staging_dir,
    trainer_info,
)
from heddle.grpo import GrpoConfig, train_step
from heddle.hardware import GPUS, MODELS, ClusterShape
from heddle.store import TrajectoryStore
from heddle.training import training_batch

log = logging.getLogger(__name__)


class TrainerActivities:
    def __init__(self, *, store: TrajectoryStore, shape: ClusterShape, time_scale: float) -> None:
        self.store = store
        self.shape = shape
        self.time_scale = time_scale

    @activity.defn(name=names.PREPARE_CAMPAIGN)
    async def prepare_campaign(self, spec: CampaignSpec) -> CheckpointRef:
        """Step 0: the base model untied (agent), or an empty record (simulated)."""
        root = Path(spec.checkpoint_root)
        if spec.mode == "agent":
            return await asyncio.to_thread(base_checkpoint, Path(spec.model_path), root)
        return committed(root, 0) or commit(staging_dir(root, 0), root, 0, {"simulated": True})

    @activity.defn(name=names.TRAIN_STEP)
    async def train_step(self, request: TrainRequest) -> TrainResult:
        if request.spec.mode == "agent":
            return await self._train(request)
        return await self._model_step(request)

    async def _train(self, request: TrainRequest) -> TrainResult:
        spec = request.spec
        samples = await asyncio.to_thread(
            training_batch, self.store, request.batch_id, request.oldest_version,
            spec.on_stale,
        )  # fmt: skip
        micro_batch = [0]
        config = GrpoConfig(lr=spec.lr, micro_batch=spec.micro_batch)
        step = request.start.step + 1

        def at(index: int) -> None:
            micro_batch[0] = index
            log.info("train step %d: micro-batch %d", step, index)

        async with heartbeating(lambda: micro_batch[0]):
            ref, metrics = await asyncio.to_thread(
                train_step,
                request.start,
                samples,
                Path(spec.checkpoint_root),
                config,
                seed=spec.seed,
                on_micro_batch=at,
            )
        return TrainResult(
            ref, metrics.samples, metrics.tokens, metrics.loss, metrics.logprob_gap, metrics.seconds
        )

    @activity.defn(name=names.TRAIN_SLICE)
    async def train_slice(self, piece: TrainSlice) -> SliceResult:
        """A simulated step's next slice on the GPUs lent to it; the slice that ends the
        step commits its checkpoint. During the rollout's tail (`TrainRequest.tail`) it
        trains only the trajectories finished so far, and never commits."""
        request, progress = piece.request, piece.progress
        root = Path(request.spec.checkpoint_root)
        step = request.start.step + 1
        model, gpu = MODELS[self.shape.model], GPUS[self.shape.gpu]
        per_gpu = train_tokens_per_gpu_s(model, gpu)
        done = committed(root, step)
        if done is None:
            tokens = await asyncio.to_thread(self._batch_tokens, request.batch_id)
            ready = None
            if request.tail:
                ready = await asyncio.to_thread(self._batch_tokens, request.batch_id, "completed")
            join_s = train_join_s(model, progress.gpus + progress.joining_gpus)
            progress, seconds = advance(progress, piece.slice_s, tokens, per_gpu, join_s, ready)
            async with heartbeating():
                await asyncio.sleep(seconds * self.time_scale)
            if request.tail or progress.tokens_done < tokens:
                # The GPUs lent are the same after the slice (joined or joining): a
                # block lent now joins after `join_s` too.
                _, left_s = advance(progress, 0.0, tokens, per_gpu, join_s)
                return SliceResult(progress, left_s, join_s)
            info = {"tokens": tokens, "train_s": progress.elapsed_s, "gpus": progress.gpus,
                    "lent_at_start": request.gpus,
                    "tokens_before_end": request.tokens_done}  # fmt: skip
            done = commit(staging_dir(root, step), root, step, {"simulated": True, **info})
        info = trainer_info(done.path)
        trained = TrainResult(done, 0, int(info["tokens"]), 0.0, 0.0, info["train_s"])
        return SliceResult(progress, 0.0, 0.0, trained)

    async def _model_step(self, request: TrainRequest) -> TrainResult:
        """A simulated cluster's step: its modelled time on the cluster's GPUs (or on
        those lent to it, after they join), waited out on the stack's clock."""
        whole = TrainProgress(gpus=self.shape.num_gpus, tokens_done=request.tokens_done)
        if request.gpus:  # engine GPUs lent to it join the trainer first (Libra)
            whole = TrainProgress(joining_gpus=request.gpus)
        done = await self.train_slice(TrainSlice(request, whole))
        while done.trained is None:  # the lent GPUs have joined
            done = await self.train_slice(TrainSlice(request, done.progress))
        return done.trained

    def _batch_tokens(self, batch_id: str, status: str = "") -> int:
        """The tokens the trainer's forward passes read: every trajectory's prompt,
        outputs and tool results, as the simulated batch's trace gives them (only those
        of `status`, if given)."""
        specs = self.store.load_specs(batch_id, 0, 10**9, status=status)
        return sum(s.sequence_tokens for s in specs)


def advance(
    progress: TrainProgress, slice_s: float, tokens: float, tokens_per_gpu_s: float,
    join_s: float, ready: float | None = None,
) -> tuple[TrainProgress, float]:  # fmt: skip
    """A modelled step's progress after a slice, and the slice's seconds. The slice ends
    after `slice_s` seconds (0: no limit), at the step's end, or when the GPUs joining
    have joined (the campaign may then lend more). The joined GPUs train meanwhile;
    `join_s` is the join's time if it starts now. With `ready` (Libra's tail: the tokens
    of the trajectories finished so far) the step trains no further, and waits."""
    gpus, joining, join_left = progress.gpus, progress.joining_gpus, progress.join_left_s
    if not gpus + joining:
        raise ValueError("a train step needs GPUs, joined or joining")
    if joining and join_left < 0:
        join_left = join_s
    done = progress.tokens_done
    cap = tokens if ready is None else min(ready, tokens)
    limit = slice_s or math.inf
    seconds = 0.0
    while seconds < limit and done < tokens:
        rate = gpus * tokens_per_gpu_s if done < cap else 0.0  # caught up: it waits
        to_cap = (cap - done) / rate if rate > 0 else math.inf
        to_join = join_left if joining else math.inf
        span = min(to_cap, to_join, limit - seconds)
        if span == math.inf:
            break  # caught up with the finished trajectories, no limit: nothing to wait for
        seconds = limit if span == limit - seconds else seconds + span
        done = cap if span == to_cap else done + rate * span
        if joining:
            join_left -= span
            if join_left <= 0:
                gpus, joining, join_left = gpus + joining, 0, -1.0
                break  # joined: the campaign may lend more
    progress = TrainProgress(gpus, joining, join_left, done, progress.elapsed_s + seconds)
    return progress, seconds
