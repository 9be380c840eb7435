"""An asynchronous training campaign in virtual time: the rollout of later batches
overlaps the training of earlier ones, within a staleness bound (`heddle.staleness`).

The cluster is split: `rollout_shape.num_gpus` GPUs run the engines (one `Simulator` the
whole campaign, trajectories admitted as the bound allows), the rest train. A train step
takes the first B trajectories whose groups have finished (GRPO needs a whole group), runs
for the cost model's time on the trainer's GPUs, then syncs the new weights into every
engine instance: the instances pause for the transfer and the KV the old weights computed
is void, so the steps under way prefill their contexts again. Every generated token is
tagged with the version that made it.

With `reallocate` (Libra's lever) the split moves: every GPU runs an engine, and a train
step takes engine blocks as `scheduler.reallocation` says (at least `trainer_gpus`, and
every block the rollout leaves idle while the step runs), each training once it has
joined (`engines.costmodel.train_join_s`); they go back to the rollout at the sync, after
an engine restart, but for the floor where the trainer's last wait for a batch was
shorter than those moves. The trainer works through the batch's tokens at its GPUs' rate
as they join, so neither side stops for the other.

The synchronous campaign it is measured against is `benchmarks/sim_campaign.py`: each
batch's rollout on every GPU, then its train step on the same GPUs.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from engines.costmodel import train_join_s, train_tokens_per_gpu_s, weight_sync_s
from heddle.hardware import GPUS, MODELS, ClusterShape
from heddle.sim.simulator import Simulator
from heddle.staleness import StalenessBound, VersionSpans, add_tokens
from heddle.types import TrajectorySpec
from scheduler.interface import Policy
from scheduler.reallocation import blocks_for_trainer, blocks_to_keep


@dataclass(frozen=True)
class TrainStep:
    """One train step of the campaign, from policy version `step` to `step + 1`."""

    step: int
    trajectory_ids: tuple[str, ...]  # whole groups, in the order they finished
    started_s: float  # the trainer took the batch
    committed_s: float  # its weights are in every engine (train step, then sync)
    trajectories: int
    generated_tokens: int
    trained_tokens: int  # generated tokens in the loss; the rest are too stale
    max_staleness: int  # the largest `step - version` over the tokens trained
    borrowed_gpus: int = 0  # engine GPUs that joined the trainer for this step (Libra)


@dataclass
class AsyncCampaignResult:
    steps: list[TrainStep]
    dropped_trajectories: int
    prefill_tokens: int  # the rollout's, re-prefills after each sync included
    rollout_gpus: int  # GPUs running engines (with `reallocate`: all of them)
    trainer_gpus: int  # GPUs only the trainer has (with `reallocate`: its floor)
    spans: dict[str, VersionSpans] = field(repr=False, default_factory=dict)

    @property
    def total_s(self) -> float:
        """The campaign's time: its last step committed."""
        return self.steps[-1].committed_s if self.steps else 0.0


@dataclass
class _TrainStepRun:
    """A train step under way: its tokens left, as of `since`, at the trainer's GPUs."""

    batch: list[TrajectorySpec]
    started_s: float
    tokens_left: float
    since: float
    gpus: int  # training now (the trainer's own, and the lent blocks that have joined)
    lent: dict[str, int] = field(default_factory=dict)  # blocks lent for it, and their TP
    colocated: bool = False  # nothing could be lent: it trains on every GPU, engines paused
    finish_version: int = 0  # bumps as its end moves


@dataclass
class _Group:
    members: list[TrajectorySpec]
    unfinished: int
    dropped: bool = False


class AsyncCampaign:
    """Drives one `Simulator` through a campaign: admits groups by the staleness bound,
    trains each batch as its groups finish, syncs, and drops stale groups by option."""

    def __init__(
        self,
        *,
        batches: Sequence[Sequence[TrajectorySpec]],
        policy: Policy,
        rollout_shape: ClusterShape,
        trainer_gpus: int,
        bound: StalenessBound,
        iterations: int,
        keep_kv: bool = False,
        reallocate: bool = False,
    ) -> None:
        if trainer_gpus < 1:
            raise ValueError("an asynchronous campaign needs GPUs of its own to train on")
        if reallocate and trainer_gpus >= rollout_shape.num_gpus:
            raise ValueError(
                f"the trainer's floor of {trainer_gpus} GPUs leaves the rollout none of "
                f"the cluster's {rollout_shape.num_gpus}"
            )
        self.reallocate = reallocate
        self.bound = bound
        self.iterations = iterations
        self.keep_kv = keep_kv  # a sync keeps the old weights' KV (`Simulator.pause`)
        self.trainer_gpus = trainer_gpus
        self.model = MODELS[rollout_shape.model]
        self.gpu = GPUS[rollout_shape.gpu]
        self.tokens_per_gpu_s = train_tokens_per_gpu_s(self.model, self.gpu)
        # GPUs that only train: none when the trainer borrows engine blocks instead.
        self.own_gpus = 0 if reallocate else trainer_gpus
        self.version = 0
        self.accepted = 0  # finished and kept: trained, or waiting to be
        self.running = 0
        self.dropped = 0
        self.trainer_busy = False
        self.training: _TrainStepRun | None = None
        # Libra: blocks the trainer kept through the last sync (`blocks_to_keep`), and
        # when it last fell idle and how long it then waited for a batch.
        self.kept: dict[str, int] = {}
        self.idle_since = 0.0
        self.last_wait_s = math.inf
        self.steps: list[TrainStep] = []
        self.spans: dict[str, VersionSpans] = {}
        self.recorded: dict[str, int] = {}  # tokens already put into `spans`
        self.group_of: dict[str, str] = {}
        self.groups: dict[str, _Group] = {}
        self.finished_groups: deque[str] = deque()  # whole groups, in finishing order
        self.stream: deque[list[TrajectorySpec]] = deque(_groups(batches))
        first = self._take_admissible()
        self.sim = Simulator(trace=first, policy=policy, cluster=rollout_shape)
        self.sim.on_finished = self._finished

    def run(self) -> AsyncCampaignResult:
        self.sim.run()
        if len(self.steps) < self.iterations:
            raise RuntimeError(
                f"the batches ran out after {len(self.steps)} of {self.iterations} train steps"
            )
        return AsyncCampaignResult(
            steps=self.steps,
            dropped_trajectories=self.dropped,
            prefill_tokens=self.sim.prefill_tokens,
            rollout_gpus=self.sim.num_gpus,
            trainer_gpus=self.trainer_gpus,
            spans=self.spans,
        )

    # ---- admission -----------------------------------------------------------------------
    def _take_admissible(self) -> list[TrajectorySpec]:
        """The next groups the bound lets start now, counted as running."""
        taken: list[TrajectorySpec] = []
        while self.stream:
            group = self.stream[0]
            if len(group) > self.bound.room(self.version, self.accepted, self.running):
                break
            self.stream.popleft()
            gid = group[0].group_id
            self.groups[gid] = _Group(group, len(group))
            for spec in group:
                self.group_of[spec.trajectory_id] = gid
                self.spans[spec.trajectory_id] = []
                self.recorded[spec.trajectory_id] = 0
            self.running += len(group)
            taken += group
        return taken

    def _admit(self) -> None:
        if len(self.steps) < self.iterations:
            self.sim.admit(self._take_admissible())

    # ---- the rollout's side ----------------------------------------------------------------
    def _record(self, tid: str) -> None:
        made = self.sim.tokens_made(tid)
        add_tokens(self.spans[tid], self.version, made - self.recorded[tid])
        self.recorded[tid] = made

    def _finished(self, tid: str) -> None:
        self._record(tid)
        self.running -= 1
        self.accepted += 1
        group = self.groups[self.group_of[tid]]
        group.unfinished -= 1
        if not group.unfinished:
            self.finished_groups.append(self.group_of[tid])
        self._try_train()
        self._admit()
        self._borrow()

    # ---- the trainer's side ----------------------------------------------------------------
    def _drop_group(self, gid: str) -> None:
        group = self.groups[gid]
        group.dropped = True
        for spec in group.members:
            traj = self.sim.trajectories[spec.trajectory_id]
            if traj.finished_at >= 0 and not traj.dropped:
                self.accepted -= 1
            else:
                self.running -= 1
                self.sim.drop(spec.trajectory_id)
            self.dropped += 1

    def _try_train(self) -> None:
        if self.trainer_busy or len(self.steps) >= self.iterations:
            return
        if self.bound.on_stale == "drop":
            for gid in [g for g in self.finished_groups if self._stale(g)]:
                self.finished_groups.remove(gid)
                self._drop_group(gid)
        ready = sum(len(self.groups[g].members) for g in self.finished_groups)
        last = not self.stream and not self.running  # nothing more will come: a short batch
        if not ready or (ready < self.bound.batch_size and not last):
            return
        batch: list[TrajectorySpec] = []
        while self.finished_groups and len(batch) < self.bound.batch_size:
            batch += self.groups[self.finished_groups.popleft()].members
        self.trainer_busy = True
        now = self.sim.now
        tokens = sum(s.sequence_tokens for s in batch)
        self.last_wait_s = now - self.idle_since
        kept = sum(self.kept.values())
        self.training = _TrainStepRun(batch, now, float(tokens), now, self.own_gpus + kept,
                                      lent=self.kept)  # fmt: skip
        self.kept = {}
        self._borrow()
        run = self.training
        if self.reallocate and not run.lent:
            # Nothing to lend (the rollout keeps its one instance): the step trains on
            # every GPU while the engines wait, keeping their KV, as a colocated one does.
            run.colocated = True
            run.gpus = self.sim.num_gpus
            self.sim.pause(self._left_s(run), void_kv=False)
        self._reschedule_end()

    # ---- the trainer's GPUs (its own, and with `reallocate` the engine blocks it borrows)
    def _advance(self, run: _TrainStepRun) -> None:
        now = self.sim.now
        run.tokens_left = max(
            0.0, run.tokens_left - run.gpus * self.tokens_per_gpu_s * (now - run.since)
        )
        run.since = now

    def _left_s(self, run: _TrainStepRun) -> float:
        rate = run.gpus * self.tokens_per_gpu_s
        return run.tokens_left / rate if rate > 0 else math.inf

    def _reschedule_end(self) -> None:
        run = self.training
        assert run is not None
        run.finish_version += 1
        left = self._left_s(run)
        if left < math.inf:
            version = run.finish_version
            self.sim.call_at(self.sim.now + left, lambda: self._maybe_trained(run, version))

    def _maybe_trained(self, run: _TrainStepRun, version: int) -> None:
        if run is self.training and version == run.finish_version:
            self._trained(run)

    def _borrow(self) -> None:
        """Lend the trainer the engine blocks `scheduler.reallocation` picks."""
        run = self.training
        if not self.reallocate or run is None or run.colocated:
            return
        self._advance(run)
        lent_gpus = self.own_gpus + sum(run.lent.values())
        join_s = self._join_s(lent_gpus)
        blocks = {b.instance_id: b for b in self.sim.blocks()}
        taken = blocks_for_trainer(
            list(blocks.values()), trainer_gpus=lent_gpus, min_gpus=self.trainer_gpus,
            train_left_s=self._left_s(run), join_s=join_s,
        )  # fmt: skip
        for iid in taken:
            self.sim.lend(iid)
            run.lent[iid] = blocks[iid].tp
            self.sim.call_at(self.sim.now + join_s, lambda i=iid: self._joined(run, i))

    def _join_s(self, trainer_gpus: int) -> float:
        return train_join_s(self.model, max(trainer_gpus, self.trainer_gpus))

    def _joined(self, run: _TrainStepRun, iid: str) -> None:
        if run is not self.training:
            return  # the step ended before the block joined
        self._advance(run)
        run.gpus += run.lent[iid]
        self._reschedule_end()

    def _stale(self, gid: str) -> bool:
        return any(self.bound.is_stale(self.spans[s.trajectory_id], self.version)
                   for s in self.groups[gid].members)  # fmt: skip

    def _trained(self, run: _TrainStepRun) -> None:
        batch, started_s = run.batch, run.started_s
        step = self.version
        spans = [self.spans[s.trajectory_id] for s in batch]
        trained = sum(self.bound.trainable_tokens(sp, step) for sp in spans)
        floor = self.bound.oldest_trainable(step)
        versions = [v for sp in spans for v, n in sp if n and v >= floor]
        self.training = None
        sync_s = max(weight_sync_s(self.model, i.spec.tp) for i in self.sim.instances.values())
        self.sim.pause(sync_s, void_kv=not self.keep_kv)
        lent = [b for b in self.sim.blocks() if b.instance_id in run.lent]
        keep = blocks_to_keep(
            lent, min_gpus=self.trainer_gpus, last_wait_s=self.last_wait_s,
            last_step_s=self.sim.now - started_s, join_s=self._join_s(sum(run.lent.values())),
        )  # fmt: skip
        self.kept = {iid: run.lent[iid] for iid in keep}
        for block in lent:  # back to the rollout: an engine restart with the new weights
            if block.instance_id not in self.kept:
                self.sim.give_back(block.instance_id, self.sim.now + max(sync_s, block.restart_s))
        self.idle_since = self.sim.now + sync_s
        for tid, traj in self.sim.trajectories.items():
            if traj.finished_at < 0:
                self._record(tid)
        self.version += 1
        self.steps.append(
            TrainStep(
                step=step,
                trajectory_ids=tuple(s.trajectory_id for s in batch),
                started_s=started_s,
                committed_s=self.sim.now + sync_s,
                trajectories=len(batch),
                generated_tokens=sum(n for sp in spans for _, n in sp),
                trained_tokens=trained,
                max_staleness=step - min(versions, default=step),
                borrowed_gpus=sum(run.lent.values()),
            )
        )
        if self.bound.on_stale == "drop":
            running = {self.group_of[t] for t, traj in self.sim.trajectories.items()
                       if traj.finished_at < 0}  # fmt: skip
            for gid in sorted(g for g in running if not self.groups[g].dropped and self._stale(g)):
                self._drop_group(gid)
        self.sim.call_at(self.sim.now + sync_s, self._synced)
        self._admit()

    def _synced(self) -> None:
        self.trainer_busy = False
        if len(self.steps) >= self.iterations:
            self.sim.stop()
            return
        self._try_train()
        self._admit()


def _groups(batches: Sequence[Sequence[TrajectorySpec]]) -> list[list[TrajectorySpec]]:
    """The data stream: each batch's groups in the order they first appear."""
    out: list[list[TrajectorySpec]] = []
    for batch in batches:
        by_group: dict[str, list[TrajectorySpec]] = {}
        for spec in batch:
            by_group.setdefault(spec.group_id, []).append(spec)
        out += by_group.values()
    return out


def simulate_async_campaign(
    batches: Sequence[Sequence[TrajectorySpec]],
    policy: Policy,
    rollout_shape: ClusterShape,
    *,
    trainer_gpus: int,
    bound: StalenessBound,
    iterations: int,
    keep_kv: bool = False,
    reallocate: bool = False,
) -> AsyncCampaignResult:
    """Run `iterations` train steps of an asynchronous campaign over `batches` (the data,
    in order; more than `iterations` of them, since the rollout runs ahead). With
    `reallocate`, `rollout_shape` is the whole cluster and `trainer_gpus` the trainer's
    floor; without, the trainer has `trainer_gpus` beside the rollout's."""
    return AsyncCampaign(
        batches=batches, policy=policy, rollout_shape=rollout_shape,
        trainer_gpus=trainer_gpus, bound=bound, iterations=iterations, keep_kv=keep_kv,
        reallocate=reallocate,
    ).run()  # fmt: skip
