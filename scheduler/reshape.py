"""Reshaping during rollout: idle narrow instances merge into wide ones for the tail
(beyond the Heddle paper, which reshapes between iterations only).

GPUs are laid out buddy-style: an instance of TP t starts at a multiple of t, so the idle
instances that fill an aligned block of W GPUs (GPUs kW to kW + W - 1) merge into one
TP-W instance on the same GPUs, and an instance of at most 8 GPUs never straddles an
8-GPU node. A block may hold instances of several widths, and eight idle TP-1 instances
become one TP-8 in one restart: a tail whose decodes are worth moving only to the widest
instances gains nothing from a TP-2 first. Whether a merge pays is the presorted DP's
call (`merges_that_pay`): the predicted time of the remaining work on the merged split,
plus the restart, against the split as it is.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from scheduler.placement_dp import KV_SHARE_CAP, InstanceModel, solve

# A merge must cut the predicted remaining makespan by this fraction beyond its restart:
# the forecast is noisy and a restart idles the GPUs it takes.
MIN_GAIN = 0.05


@dataclass
class GpuLayout:
    """Which GPUs each instance holds: its first GPU and its TP degree."""

    first_gpu: dict[str, int] = field(default_factory=dict)
    tp: dict[str, int] = field(default_factory=dict)

    @classmethod
    def pack(cls, instance_ids: Sequence[str], tps: Sequence[int]) -> GpuLayout:
        """Instances in order, widest first, on contiguous GPUs: with power-of-two
        degrees sorted descending every offset is a multiple of its degree."""
        layout = cls()
        offset = 0
        for iid, tp in sorted(zip(instance_ids, tps, strict=True), key=lambda p: -p[1]):
            layout.first_gpu[iid], layout.tp[iid] = offset, tp
            offset += tp
        return layout

    def blocks_within(
        self, instance_ids: Collection[str], widths: Collection[int]
    ) -> list[tuple[tuple[str, ...], int]]:
        """Aligned blocks of an allowed width filled by two or more of `instance_ids`
        (the idle ones, to merge now; all that are up, to choose one to empty), as (their
        ids by first GPU, the block's width): widest first, so a merge that pays at the
        widest degree is taken before the narrower ones inside it."""
        blocks = []
        for width in sorted(widths, reverse=True):
            starts = {self.first_gpu[i] // width * width for i in instance_ids if i in self.tp}
            for start in sorted(starts):
                inside = [i for i, first in self.first_gpu.items()
                          if start <= first < start + width]  # fmt: skip
                if (
                    len(inside) >= 2
                    and all(i in instance_ids for i in inside)
                    and sum(self.tp[i] for i in inside) == width
                ):
                    blocks.append((tuple(sorted(inside, key=self.first_gpu.__getitem__)), width))
        return blocks

    def merge(self, members: Sequence[str], new_id: str) -> None:
        first = min(self.first_gpu[i] for i in members)
        width = sum(self.tp[i] for i in members)
        for i in members:
            self.first_gpu.pop(i)
            self.tp.pop(i)
        self.first_gpu[new_id], self.tp[new_id] = first, width


def merges_that_pay(
    lengths_desc: Sequence[float],
    contexts: Sequence[float],
    current: Sequence[int],
    groups: Sequence[Sequence[int]],
    models: dict[int, InstanceModel],
    restart_s: dict[int, float],
    idle: Collection[int] = (),
    alone: bool = False,
) -> list[int]:
    """Which of `groups` (each indices into `current`, the ready instances' degrees) to
    merge, greedily in the order given: a merge is kept when the DP's makespan with the
    merged instance, plus its restart, beats the makespan without it by `MIN_GAIN`.
    With `alone`, each group is judged on its own against the split as it is (the
    candidates of which one will be chosen), the split's makespan solved once.

    The `idle` instances count as capacity only once merged: the DP would spread the
    tail over them, but a decode does not move to a narrower instance mid-step, so an
    idle narrow instance stays idle while the long decodes crowd the wide ones."""
    if not lengths_desc:
        return []

    def makespan(tps: list[int]) -> float:
        ordered = sorted(tps, reverse=True)
        return solve(
            lengths_desc, contexts, [models[tp] for tp in ordered], exact=96, max_items=256,
            max_kv_share=KV_SHARE_CAP,
        ).makespan_s  # fmt: skip

    kept: list[int] = []
    merged: set[int] = set()
    added: list[int] = []
    base = makespan([tp for i, tp in enumerate(current) if i not in idle])
    for k, group in enumerate(groups):
        if merged.intersection(group):
            continue  # inside a block merged already
        merged_tp = sum(current[i] for i in group)
        trial = [tp for i, tp in enumerate(current) if i not in idle and i not in group]
        time_s = makespan(trial + added + [merged_tp]) + restart_s[merged_tp]
        if time_s < base * (1 - MIN_GAIN):
            kept.append(k)
            if not alone:
                merged |= set(group)
                added.append(merged_tp)
                base = time_s
    return kept
