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
import time
from pathlib import Path

from temporalio import activity

from activities.heartbeat import heartbeating
from engines.costmodel import train_join_s, train_step_s
from heddle import activity_names as names
from heddle.campaign import CampaignSpec, TrainRequest, TrainResult
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

    async def _model_step(self, request: TrainRequest) -> TrainResult:
        """A simulated cluster's step: its modelled time on the cluster's GPUs (or on
        those lent to it, after they join), waited out on the stack's clock."""
        root = Path(request.spec.checkpoint_root)
        step = request.start.step + 1
        done = committed(root, step)
        if done is None:
            tokens = await asyncio.to_thread(self._batch_tokens, request.batch_id)
            model, gpu = MODELS[self.shape.model], GPUS[self.shape.gpu]
            gpus = request.gpus or self.shape.num_gpus
            modelled = train_step_s(model, gpu, gpus, tokens)
            if request.gpus:  # engine GPUs lent to it join the trainer first (Libra)
                modelled += train_join_s(model, gpus)
            began = time.monotonic()
            async with heartbeating():
                await asyncio.sleep(modelled * self.time_scale)
            info = {"tokens": tokens, "train_s": modelled, "gpus": gpus,
                    "wall_s": time.monotonic() - began}  # fmt: skip
            done = commit(staging_dir(root, step), root, step, {"simulated": True, **info})
        info = trainer_info(done.path)
        return TrainResult(done, 0, int(info["tokens"]), 0.0, 0.0, info["train_s"])

    def _batch_tokens(self, batch_id: str) -> int:
        """The tokens the trainer's forward passes read: every trajectory's prompt,
        outputs and tool results, as the simulated batch's trace gives them."""
        return sum(s.sequence_tokens for s in self.store.load_specs(batch_id, 0, 10**9))
