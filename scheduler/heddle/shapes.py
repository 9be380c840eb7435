"""What the planner knows of each allowed TP degree, from the cluster's one shape."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from engines.costmodel import CostModel
from heddle.hardware import ClusterShape
from scheduler.placement_dp import InstanceModel
from scheduler.resources import SplitPlanner


@dataclass
class InstanceShapes:
    """Per allowed degree: the DP's instance model and the restart cost (computed on
    first use: a policy built for a batch it never plans pays nothing)."""

    cluster: ClusterShape

    def splitter(self, num_gpus: int | None = None) -> SplitPlanner:
        cluster = self.cluster if num_gpus is None else replace(self.cluster, num_gpus=num_gpus)
        return SplitPlanner(cluster)

    @cached_property
    def models(self) -> dict[int, InstanceModel]:
        return self.splitter().models()

    @cached_property
    def restart_s(self) -> dict[int, float]:
        return {tp: CostModel.of(self.cluster, tp).reconfiguration_s() for tp in self.models}
