"""Reshaping during rollout: idle narrow instances merge into wide ones for the tail
(beyond the Heddle paper, which reshapes between iterations only).

GPUs are laid out buddy-style: an instance of TP t starts at a multiple of t, so two idle
buddies (TP t at GPUs 2kt and 2kt + t) merge into one TP-2t instance on the same GPUs,
and an instance of at most 8 GPUs never straddles an 8-GPU node. Whether a merge pays is
the presorted DP's call (`merges_that_pay`): the predicted time of the remaining work on
the merged split, plus the restart, against the split as it is.
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

    def buddy(self, instance_id: str) -> str | None:
        first, tp = self.first_gpu[instance_id], self.tp[instance_id]
        other = first + tp if first % (2 * tp) == 0 else first - tp
        for iid, start in self.first_gpu.items():
            if start == other and self.tp[iid] == tp:
                return iid
        return None

    def idle_pairs(
        self, idle: Collection[str], widths: Collection[int]
    ) -> list[tuple[str, str, int]]:
        """Pairs of idle buddies whose merged degree is allowed, narrowest first, as
        (lower, upper, merged degree)."""
        pairs = []
        for iid in idle:
            if iid not in self.tp or 2 * self.tp[iid] not in widths:
                continue
            if self.first_gpu[iid] % (2 * self.tp[iid]) != 0:
                continue  # the upper buddy; found from its lower one
            other = self.buddy(iid)
            if other is not None and other in idle:
                pairs.append((iid, other, 2 * self.tp[iid]))
        return sorted(pairs, key=lambda p: (p[2], self.first_gpu[p[0]]))

    def merge(self, lower: str, upper: str, new_id: str) -> None:
        first, tp = self.first_gpu.pop(lower), self.tp.pop(lower)
        self.first_gpu.pop(upper)
        self.tp.pop(upper)
        self.first_gpu[new_id], self.tp[new_id] = first, 2 * tp


def merges_that_pay(
    lengths_desc: Sequence[float],
    contexts: Sequence[float],
    current: Sequence[int],
    pairs: Sequence[tuple[int, int]],
    models: dict[int, InstanceModel],
    restart_s: dict[int, float],
) -> list[int]:
    """Which of `pairs` (indices into `current`, the ready instances' degrees) to merge,
    greedily in the order given: a merge is kept when the DP's makespan with the merged
    instance, plus its restart, beats the makespan without it by `MIN_GAIN`."""
    if not lengths_desc:
        return []

    def makespan(tps: list[int]) -> float:
        ordered = sorted(tps, reverse=True)
        return solve(
            lengths_desc, contexts, [models[tp] for tp in ordered], max_items=256,
            max_kv_share=KV_SHARE_CAP,
        ).makespan_s  # fmt: skip

    kept: list[int] = []
    removed: set[int] = set()
    added: list[int] = []
    base = makespan(list(current))
    for k, (a, b) in enumerate(pairs):
        if a in removed or b in removed:
            continue
        merged_tp = current[a] + current[b]
        trial = [tp for i, tp in enumerate(current) if i not in removed and i not in (a, b)]
        time_s = makespan(trial + added + [merged_tp]) + restart_s[merged_tp]
        if time_s < base * (1 - MIN_GAIN):
            kept.append(k)
            removed |= {a, b}
            added.append(merged_tp)
            base = time_s
    return kept
