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
        step commits its checkpoint."""
        request, progress = piece.request, piece.progress
        root = Path(request.spec.checkpoint_root)
        step = request.start.step + 1
        model, gpu = MODELS[self.shape.model], GPUS[self.shape.gpu]
        per_gpu = train_tokens_per_gpu_s(model, gpu)
        done = committed(root, step)
        if done is None:
            tokens = await asyncio.to_thread(self._batch_tokens, request.batch_id)
            join_s = train_join_s(model, progress.gpus + progress.joining_gpus)
            progress, seconds = advance(progress, piece.slice_s, tokens, per_gpu, join_s)
            async with heartbeating():
                await asyncio.sleep(seconds * self.time_scale)
            if progress.tokens_done < tokens:
                lent = progress.gpus + progress.joining_gpus
                _, left_s = advance(progress, 0.0, tokens, per_gpu, join_s)
                return SliceResult(progress, left_s, train_join_s(model, lent))
            info = {"tokens": tokens, "train_s": progress.elapsed_s, "gpus": progress.gpus,
                    "lent_at_start": request.gpus}  # fmt: skip
            done = commit(staging_dir(root, step), root, step, {"simulated": True, **info})
        info = trainer_info(done.path)
        trained = TrainResult(done, 0, int(info["tokens"]), 0.0, 0.0, info["train_s"])
        return SliceResult(progress, 0.0, 0.0, trained)

    async def _model_step(self, request: TrainRequest) -> TrainResult:
        """A simulated cluster's step: its modelled time on the cluster's GPUs (or on
        those lent to it, after they join), waited out on the stack's clock."""
        whole = TrainProgress(gpus=self.shape.num_gpus)
        if request.gpus:  # engine GPUs lent to it join the trainer first (Libra)
            whole = TrainProgress(joining_gpus=request.gpus)
        done = await self.train_slice(TrainSlice(request, whole))
        while done.trained is None:  # the lent GPUs have joined
            done = await self.train_slice(TrainSlice(request, done.progress))
        return done.trained

    def _batch_tokens(self, batch_id: str) -> int:
        """The tokens the trainer's forward passes read: every trajectory's prompt,
        outputs and tool results, as the simulated batch's trace gives them."""
        return sum(s.sequence_tokens for s in self.store.load_specs(batch_id, 0, 10**9))


def advance(
    progress: TrainProgress, slice_s: float, tokens: float, tokens_per_gpu_s: float,
    join_s: float,
) -> tuple[TrainProgress, float]:  # fmt: skip
    """A modelled step's progress after a slice, and the slice's seconds. The slice ends
    after `slice_s` seconds (0: no limit), at the step's end, or when the GPUs joining
    have joined (the campaign may then lend more). The joined GPUs train meanwhile;
    `join_s` is the join's time if it starts now."""
    gpus, joining, join_left = progress.gpus, progress.joining_gpus, progress.join_left_s
    if not gpus + joining:
        raise ValueError("a train step needs GPUs, joined or joining")
    if joining and join_left < 0:
        join_left = join_s
    left = tokens - progress.tokens_done
    limit = slice_s or math.inf
    seconds = 0.0
    while left > 0 and seconds < limit:
        rate = gpus * tokens_per_gpu_s
        span = min(join_left if joining else math.inf, limit - seconds)
        if rate > 0 and left <= rate * span:
            seconds, left = seconds + left / rate, 0.0
            break
        seconds, left = seconds + span, left - rate * span
        if not joining:
            break  # the slice's limit
        join_left -= span
        if join_left > 0:
            break  # the slice's limit, mid-join
        gpus, joining, join_left = gpus + joining, 0, -1.0
        break  # joined: the campaign may lend more
    progress = TrainProgress(gpus, joining, join_left, tokens - left, progress.elapsed_s + seconds)
    return progress, seconds
