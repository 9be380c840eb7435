"""The cluster plan as data: the initial split, and changes checked before they run.

Pure (the control workflow's update validator calls it): a change may only retire
instances that exist and must start instances on exactly the retired GPUs, at allowed,
aligned TP degrees, under new ids; anything else is refused with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from heddle.types import BlockMove, ClusterPlan, InstancePlan, PlanChange

ACTIVE, DRAINING, STARTING, TRAINING = "active", "draining", "starting", "training"


def initial_plan(
    instance_ids: Sequence[str], tps: Sequence[int], num_gpus: int, tp_choices: Sequence[int]
) -> ClusterPlan:
    """Instances laid out widest first on contiguous GPUs (offsets then align)."""
    instances, offset = [], 0
    for iid, tp in sorted(zip(instance_ids, tps, strict=True), key=lambda p: -p[1]):
        instances.append(InstancePlan(iid, tp, offset))
        offset += tp
    if offset != num_gpus:
        raise ValueError(f"the split uses {offset} GPUs; the cluster has {num_gpus}")
    return ClusterPlan(num_gpus=num_gpus, tp_choices=list(tp_choices), instances=instances)


def gpus(instances: Sequence[InstancePlan]) -> set[int]:
    return {g for i in instances for g in range(i.first_gpu, i.first_gpu + i.tp)}


def check_change(plan: ClusterPlan, change: PlanChange) -> None:
    """Raise ValueError naming what is wrong with `change` against `plan`."""
    by_id = {i.instance_id: i for i in plan.instances}
    lent = [i.instance_id for i in plan.instances if i.state == TRAINING]
    if lent:
        raise ValueError(f"instance {lent[0]!r} is lent to the trainer: reshape once it is back")
    busy = [i.instance_id for i in plan.instances if i.state != ACTIVE]
    if busy:
        raise ValueError(f"instance {busy[0]!r} is still changing: one reshape at a time")
    if not change.retire and not change.create:
        raise ValueError("the change retires and creates nothing")
    unknown = [i for i in change.retire if i not in by_id]
    if unknown:
        raise ValueError(f"retire: no instance {unknown[0]!r} in plan version {plan.version}")
    if len(set(change.retire)) != len(change.retire):
        raise ValueError("retire: an instance is named twice")
    ids = [c.instance_id for c in change.create]
    reused = [i for i in ids if i in by_id]
    if reused or len(set(ids)) != len(ids):
        raise ValueError(f"create: instance id {(reused or ids)[0]!r} is already taken")
    for c in change.create:
        if c.tp not in plan.tp_choices:
            raise ValueError(f"create: {c.instance_id} has TP {c.tp}, not in {plan.tp_choices}")
        if c.first_gpu % c.tp:
            raise ValueError(
                f"create: {c.instance_id} starts at GPU {c.first_gpu}, not a multiple of TP {c.tp}"
            )
    freed = gpus([by_id[i] for i in change.retire])
    taken = [g for c in change.create for g in range(c.first_gpu, c.first_gpu + c.tp)]
    if len(set(taken)) != len(taken) or set(taken) != freed:
        raise ValueError(
            f"create: the new instances take GPUs {sorted(set(taken))}; "
            f"the retired ones free {sorted(freed)}"
        )


def check_move(plan: ClusterPlan, move: BlockMove) -> None:
    """Raise ValueError naming what is wrong with lending or giving back `move`'s
    instances: lent ones must be active, while nothing else changes, and the rollout
    keeps one; given back ones must be training."""
    by_id = {i.instance_id: i for i in plan.instances}
    if not move.to_trainer and not move.to_rollout:
        raise ValueError("the move lends and gives back nothing")
    named = [*move.to_trainer, *move.to_rollout]
    unknown = [i for i in named if i not in by_id]
    if unknown:
        raise ValueError(f"no instance {unknown[0]!r} in plan version {plan.version}")
    if len(set(named)) != len(named):
        raise ValueError("an instance is named twice")
    back = [i for i in move.to_rollout if by_id[i].state != TRAINING]
    if back:
        raise ValueError(f"to_rollout: {back[0]!r} is {by_id[back[0]].state}, not training")
    if move.to_trainer:
        busy = [i.instance_id for i in plan.instances if i.state not in (ACTIVE, TRAINING)]
        if busy:
            raise ValueError(f"instance {busy[0]!r} is still changing: one change at a time")
        lent = [i for i in move.to_trainer if by_id[i].state != ACTIVE]
        if lent:
            raise ValueError(f"to_trainer: {lent[0]!r} is {by_id[lent[0]].state}, not active")
        active = [i for i in plan.instances if i.state == ACTIVE]
        if len(active) <= len(move.to_trainer):
            raise ValueError("to_trainer: the rollout keeps at least one instance")


def _with(plan: ClusterPlan, instances: list[InstancePlan]) -> ClusterPlan:
    """The plan with `instances`, everything else kept (the owner, the scheduler's
    address: a reshape that dropped it left every other worker's decides failing)."""
    instances = sorted(instances, key=lambda i: i.first_gpu)
    return replace(plan, instances=instances, version=plan.version + 1)


def mark_draining(plan: ClusterPlan, ids: Sequence[str]) -> ClusterPlan:
    """Phase 1 of a reshape: the retiring instances take no new steps."""
    return _with(
        plan,
        [replace(i, state="draining") if i.instance_id in ids else i for i in plan.instances],
    )


def swap_instances(plan: ClusterPlan, change: PlanChange) -> ClusterPlan:
    """Phase 2: the drained instances go, the new ones start on their GPUs."""
    kept = [i for i in plan.instances if i.instance_id not in change.retire]
    return _with(plan, [*kept, *(replace(c, state="starting") for c in change.create)])


def mark_active(plan: ClusterPlan, ids: Sequence[str]) -> ClusterPlan:
    """Phase 3: the started instances take steps."""
    return mark(plan, ids, ACTIVE)


def mark(plan: ClusterPlan, ids: Sequence[str], state: str) -> ClusterPlan:
    """The plan with `ids` in `state` (a lent instance: draining, then training; given
    back: starting, then active)."""
    return _with(
        plan, [replace(i, state=state) if i.instance_id in ids else i for i in plan.instances]
    )


def lent_instances(plan: ClusterPlan) -> list[InstancePlan]:
    """The instances lent to a campaign's trainer."""
    return [i for i in plan.instances if i.state == TRAINING]


def engine_instances(plan: ClusterPlan) -> list[InstancePlan]:
    """The instances that run an engine: all but those lent to the trainer."""
    return [i for i in plan.instances if i.state != TRAINING]


def active_instances(plan: ClusterPlan) -> dict[str, int]:
    """Instance id -> TP degree of the instances that take steps now."""
    return {i.instance_id: i.tp for i in plan.instances if i.state == "active"}
